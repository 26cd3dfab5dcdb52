"""Served throughput and latency of partitioned PP-OCRv4 det vs one onnxruntime session.

The runtime issue's benchmark: PP-OCRv4 det (rapidocr_onnxruntime's trained model,
1x3x640x640 input from a real photo, skimage ``astronaut.png`` through the OCR
pipeline's own pre-processing) served by the InfScaler service over its Unix-socket API
(binary tensor data) against one onnxruntime session in this process using every
usable core (``intra_op_num_threads`` = cores, spinning off: the same options as
``chain_latency.py``).

Writes ``results/serve_det.json`` and ``results/serve_det.png`` (``_quick`` with --quick).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/serve_det.py`".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    default_cache_dir,
    environment,
    print_table,
    write_json,
)


def det_input() -> np.ndarray:
    from skimage import data as skdata

    from infscaler.pipelines.ocr import det_preprocess

    img = skdata.astronaut()
    return np.ascontiguousarray(det_preprocess({"image": img})["det_input"])


def pct(ms: list[float]) -> dict:
    a = np.array(ms)
    return {
        "n": int(a.size),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "mean_ms": round(float(a.mean()), 2),
    }


class Baseline:
    """One onnxruntime session on the whole model in this process, every usable core."""

    def __init__(self, x: np.ndarray) -> None:
        from infscaler.base.models import resolve_model
        from infscaler.engines.onnxrt.loader import load_session

        # the cpu engine's session options on every usable core (no spinning)
        self.sess = load_session(resolve_model("ppocrv4-det"), threads=len(os.sched_getaffinity(0)))
        self.x = x
        self.ref = self.sess.run(None, {"x": x})[0]
        for _ in range(3):
            self.sess.run(None, {"x": x})

    def measure(self, n: int, budget_s: float) -> dict:
        lat = []
        t0 = time.perf_counter()
        while len(lat) < n and time.perf_counter() - t0 < budget_s:
            t = time.perf_counter()
            self.sess.run(None, {"x": self.x})
            lat.append((time.perf_counter() - t) * 1e3)
        wall = time.perf_counter() - t0
        return {
            "config": "onnxruntime session",
            "clients": 1,
            "throughput_rps": round(len(lat) / wall, 2),
            **pct(lat),
        }


def drive(
    sock: str, name: str, x: np.ndarray, clients: int, n: int, budget_s: float, ref: np.ndarray
) -> dict:
    from infscaler.api.client import Client

    lat: list[float] = []
    errors: list[str] = []
    max_err = [0.0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + budget_s

    def worker() -> None:
        with Client(sock) as c:
            while True:
                with lock:
                    if len(lat) >= n or time.perf_counter() > stop_at:
                        return
                t = time.perf_counter()
                try:
                    res = c.infer(name, {"x": x})
                except Exception as exc:  # noqa: BLE001 - counted in the results
                    errors.append(str(exc))
                    continue
                ms = (time.perf_counter() - t) * 1e3
                out = next(iter(res.outputs.values()))
                e = float(np.abs(out - ref).max())
                with lock:
                    lat.append(ms)
                    max_err[0] = max(max_err[0], e)

    with Client(sock) as c:  # warm-up
        for _ in range(2):
            c.infer(name, {"x": x})
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "throughput_rps": round(len(lat) / wall, 2),
        **pct(lat),
        "errors": len(errors),
        "max_abs_error_vs_session": max_err[0],
    }


def transports(svc, sock: str, name: str, x: np.ndarray, n: int) -> list[dict]:
    """One client, one request at a time: the same deployment reached in-process (the
    front end directly), over the API with binary tensor data, and over the API with the
    input and output in system shared memory. Splits the served latency into engine,
    token pipeline and HTTP transfer."""
    from infscaler.api.client import Client, ShmOutput, ShmTensor
    from infscaler.api.sysshm import SharedMemoryRegion

    rows = []
    lat, eng = [], []
    for _ in range(n):
        t = time.perf_counter()
        r = svc.infer(name, {"x": x})
        lat.append((time.perf_counter() - t) * 1e3)
        eng.append(float(sum(r.trace[:, 3] - r.trace[:, 2])) / 1e6)
    rows.append(
        {
            "transport": "in-process (front end)",
            **pct(lat),
            "engine_p50_ms": round(float(np.median(eng)), 2),
        }
    )
    with Client(sock) as c:
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            c.infer(name, {"x": x})
            lat.append((time.perf_counter() - t) * 1e3)
        rows.append({"transport": "API, binary tensor data", **pct(lat)})
        out_bytes = 1 * 1 * 640 * 640 * 4
        key_in, key_out = f"isc_bench_in_{os.getpid()}", f"isc_bench_out_{os.getpid()}"
        with (
            SharedMemoryRegion.create(key_in, x.nbytes) as rin,
            SharedMemoryRegion.create(key_out, out_bytes),
        ):
            rin.set(x)
            c.register_system_shm("in", key_in, x.nbytes)
            c.register_system_shm("out", key_out, out_bytes)
            out_name = svc.deployment(name).pipeline.output_names[0]
            lat = []
            for _ in range(n):
                t = time.perf_counter()
                c.infer(
                    name,
                    {"x": ShmTensor("in", "FP32", list(x.shape), x.nbytes)},
                    outputs={out_name: ShmOutput("out", out_bytes)},
                )
                lat.append((time.perf_counter() - t) * 1e3)
            c.unregister_system_shm()
        rows.append({"transport": "API, system shared memory", **pct(lat)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests, K=2 only")
    ap.add_argument("--control-path", default="auto")
    ap.add_argument("--replot", type=Path, help="redraw the PNG of a results JSON and exit")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        plot(json.loads(args.replot.read_text())["results"], args.replot.with_suffix(".png"))
        return 0
    default_cache_dir()
    from infscaler.api.server import ServerThread
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import MODELS
    from infscaler.service.service import Service

    n, budget = (20, 15.0) if args.quick else (60, 40.0)
    trows: list[dict] = []
    x = det_input()
    baseline = Baseline(x)
    ref = baseline.ref
    rows: list[dict] = []
    configs = (
        [("K=2", 2, 1, 1)]
        if args.quick
        else [
            ("K=1 x1 (2 threads)", 1, 1, 2),
            ("K=1 x2", 1, 2, 1),
            ("K=2", 2, 1, 1),
            ("K=2, bottleneck x2", 2, [2, 1], 1),
            ("K=3", 3, 1, 1),
        ]
    )
    state = Path(os.environ["INFSCALER_CACHE_DIR"]) / "bench-state"
    env = environment()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Service(state_dir=state, control_path=args.control_path, pool_mb=256) as svc,
    ):
        sock = str(Path(tmp) / "bench.sock")
        with ServerThread(svc, sock, max_body_mb=16):
            for label, k, inst, threads in configs:
                cfg = pipeline_for_model(
                    "ppocrv4-det",
                    name=f"det-{k}-{inst}-{threads}",
                    partitions=k if k > 1 else None,
                    shapes=MODELS["ppocrv4-det"].shapes,
                )
                raw = cfg.model_dump()
                raw["stages"][0]["instances"] = inst
                raw["stages"][0]["threads"] = threads
                from infscaler.base.config import load_pipeline

                cfg = load_pipeline(raw)
                dep = svc.deploy(cfg)
                cuts = [u.name for u in dep.pipeline.units]
                # the baseline again right before each configuration: this VM's speed
                # drifts by up to 30 % over minutes, ratios are taken against this run
                base = baseline.measure(n, budget)
                base["before"] = label
                rows.append(base)
                print(f"baseline session: {base['throughput_rps']} req/s, P50 {base['p50_ms']} ms")
                if label.startswith("K=1 x1"):
                    trows = transports(svc, sock, cfg.name, x, n)
                    for t in trows:
                        print(f"  {t['transport']}: P50 {t['p50_ms']} ms")
                for clients in (1, 4):
                    r = drive(sock, cfg.name, x, clients, n, budget, ref)
                    r.update(
                        config=label,
                        k=k,
                        instances=inst,
                        threads=threads,
                        units=cuts,
                        bottleneck=[u.bottleneck for u in dep.pipeline.units],
                        control_path=svc.channel.kind,
                    )
                    r["throughput_vs_session"] = round(
                        r["throughput_rps"] / base["throughput_rps"], 3
                    )
                    r["p50_vs_session"] = round(r["p50_ms"] / base["p50_ms"], 3)
                    rows.append(r)
                    print(
                        f"{label} C={clients}: {r['throughput_rps']} req/s "
                        f"({r['throughput_vs_session']}x), P50 {r['p50_ms']} ms"
                    )
                svc.undeploy(cfg.name)
    env["load_average_at_end"] = list(os.getloadavg())
    print_table(
        ["config", "C", "req/s", "x session", "P50 ms", "P99 ms", "errors"],
        [
            [
                r["config"],
                r["clients"],
                r["throughput_rps"],
                r.get("throughput_vs_session", 1.0),
                r["p50_ms"],
                r["p99_ms"],
                r.get("errors", 0),
            ]
            for r in rows
        ],
    )
    stem = "serve_det_quick" if args.quick else "serve_det"
    write_json(
        RESULTS_DIR / f"{stem}.json",
        {
            "environment": env,
            "requests_per_config": n,
            "budget_s": budget,
            "results": rows,
            "transports": trows,
        },
    )
    plot(rows, RESULTS_DIR / f"{stem}.png")
    print(f"wrote {RESULTS_DIR / stem}.json and .png")
    return 0


def plot(rows: list[dict], path: Path) -> None:
    """Left: served throughput / the adjacent session's, per configuration, C = 1 and 4.
    Right: P50 and P99 latency at C = 1, the session's for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [r for r in rows if r["config"] != "onnxruntime session"]
    configs = list(dict.fromkeys(r["config"] for r in served))
    by = {(r["config"], r["clients"]): r for r in served}
    sessions = [r for r in rows if r["config"] == "onnxruntime session"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    ys = np.arange(len(configs))
    for off, c, color in ((-0.2, 1, "#7ab"), (0.2, 4, "#3a7")):
        vals = [by[(k, c)]["throughput_vs_session"] if (k, c) in by else 0 for k in configs]
        a.barh(ys + off, vals, 0.4, color=color, label=f"C = {c} clients")
        for y, v in zip(ys + off, vals, strict=True):
            a.text(v + 0.01, y, f"{v:.2f}", va="center", fontsize=8)
    a.axvline(1.0, color="k", lw=0.8, ls="--")
    a.set_yticks(ys, configs)
    a.invert_yaxis()
    a.set_xlabel("throughput / one onnxruntime session (2 threads), same minute")
    a.set_title("PP-OCRv4 det 1x3x640x640, served over the Unix-socket API")
    a.legend(loc="center right", fontsize=8)
    p50 = [by[(k, 1)]["p50_ms"] if (k, 1) in by else 0 for k in configs]
    p99 = [by[(k, 1)]["p99_ms"] if (k, 1) in by else 0 for k in configs]
    b.barh(ys - 0.2, p50, 0.4, label="P50", color="#58c")
    b.barh(ys + 0.2, p99, 0.4, label="P99", color="#e94")
    if sessions:
        b.axvline(
            float(np.median([s["p50_ms"] for s in sessions])),
            color="k",
            lw=0.8,
            ls="--",
            label="session P50",
        )
    b.set_yticks(ys, configs)
    b.invert_yaxis()
    b.set_xlabel("ms, one client")
    b.set_title("latency")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
