"""Served throughput and latency of partitioned PP-OCRv4 det vs one onnxruntime session.

PP-OCRv4 det (rapidocr_onnxruntime's trained model, a 1x3x640x640 input from a real
photo: skimage ``astronaut`` through the OCR pipeline's own pre-processing) served by a
fresh ``infscaler serve`` per configuration (``harness.Sut``: whole model with 2 threads,
2 x 1 thread, K = 2, K = 2 with the bottleneck doubled, K = 3), loaded through
``infscaler.api.loadgen`` in the offline scenario with 1 and 4 requests in flight
(binary tensor data over HTTP), against one onnxruntime session in this process on
every usable core (the cpu engine's options, no spinning), measured again right before
each configuration (the VM's speed drifts by up to 30 % in minutes): ratios are taken
against that adjacent run. Each configuration's output is checked against the session's.
The transport split (binary HTTP vs system shared memory) is ``binary_path.py``'s.
More: bench/HISTORY.md, "Serving: serve_det.py".
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import OFFLINE  # noqa: E402

NAME = "det"
#: label, K, instances (per partition), threads
CONFIGS = [("K=1 x1 (2 threads)", 1, 1, 2), ("K=1 x2", 1, 2, 1), ("K=2", 2, 1, 1),
           ("K=2, bottleneck x2", 2, [2, 1], 1), ("K=3", 3, 1, 1)]  # fmt: skip


def det_input() -> np.ndarray:
    from skimage import data as skdata

    from infscaler.pipelines.ocr import det_preprocess

    return np.ascontiguousarray(det_preprocess({"image": skdata.astronaut()})["det_input"])


def session_point(sess: Any, x: np.ndarray, duration_s: float) -> dict[str, Any]:
    """The in-process session, one request at a time for ``duration_s``: req/s, P50 / P99."""
    lat, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < duration_s:
        t = time.perf_counter()
        sess.run(None, {"x": x})
        lat.append((time.perf_counter() - t) * 1e3)
    return {"config": "onnxruntime session", "throughput_rps": round(len(lat) / duration_s, 2),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2)}  # fmt: skip


def config_pipeline(k: int, inst: int | list[int], threads: int) -> dict[str, Any]:
    """PP-OCRv4 det at K partitions, ``inst`` instances, ``threads`` threads, fixed."""
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import MODELS

    cfg = pipeline_for_model("ppocrv4-det", name=NAME, partitions=k if k > 1 else None,
                             shapes=MODELS["ppocrv4-det"].shapes)  # fmt: skip
    raw = cfg.model_dump(mode="json", exclude_none=True)
    raw["stages"][0].update(instances=inst, threads=threads)
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=20.0)
    ap.add_argument("--control-path", default="auto")

    def quick(a: Any) -> None:
        a.configs = "K=2"

    ap.set_defaults(configs=None)
    a = harness.cli.parse(ap, argv, quick)
    from infscaler.api.client import Client
    from infscaler.base.models import resolve_model
    from infscaler.engines.onnxrt.loader import load_session

    res = harness.cli.start("serve_det", a)
    x = det_input()
    sess = load_session(resolve_model("ppocrv4-det"), threads=len(os.sched_getaffinity(0)))
    ref = sess.run(None, {"x": x})[0]
    for label, k, inst, threads in CONFIGS:
        if a.configs and label != a.configs:
            continue
        base = res.add(before=label, **session_point(sess, x, a.duration_s / 2))
        with harness.Sut([config_pipeline(k, inst, threads)],
                         args=["--control-path", a.control_path]) as s:  # fmt: skip
            res.own_pids[:] = [s.pid]
            with Client(s.sock) as c:
                out = next(iter(c.infer(NAME, {"x": x}).outputs.values()))
            err = float(np.abs(out - ref).max())
            for clients in (1, 4):
                p = harness.scenarios.run(s.sock, NAME, {"x": x}, OFFLINE, clients,
                                          duration_s=a.duration_s, warmup_s=2.0)  # fmt: skip
                p.update(config=label, clients=clients, k=k, instances=inst, threads=threads,
                         max_abs_error_vs_session=err,
                         throughput_vs_session=round(p["throughput_rps"] / base["throughput_rps"], 3),
                         p50_vs_session=round(p["p50_ms"] / base["p50_ms"], 3) if p["p50_ms"] else None)  # fmt: skip
                res.add(**p)
                print(f"{label} C={clients}: {p['throughput_rps']} req/s "
                      f"({p['throughput_vs_session']}x the session), P50 {p['p50_ms']} ms", flush=True)  # fmt: skip
    harness.cli.finish(res, a, plot)
    harness.print_table(["config", "C", "req/s", "x session", "P50 ms", "P99 ms", "max err"],
                        [[p["config"], p.get("clients"), p["throughput_rps"],
                          p.get("throughput_vs_session"), p["p50_ms"], p["p99_ms"],
                          p.get("max_abs_error_vs_session")] for p in res.points])  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Served throughput / the adjacent session's against the requests in flight, one line
    per configuration, 1.0 as a line."""
    harness.plot([p for p in data["points"] if "clients" in p], path, x="clients",
                 y="throughput_vs_session", by="config", hlines={"session": 1.0},
                 xlabel="requests in flight", ylabel="throughput / one session's")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
