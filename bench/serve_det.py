"""Served throughput and latency of partitioned PP-OCRv4 det vs one onnxruntime session.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``serve_det.py``.
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


TRANSPORTS = ("binary", "shm", "binary, one joined body")


def det_shaped(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    """A stage with PP-OCRv4 det's tensor sizes and almost no compute: x (1x3xHxW) ->
    y (1x1xHxW), channel 0 copied."""
    return {"y": np.ascontiguousarray(np.asarray(tensors["x"])[:, :1])}


def transport_calls(c: Any, raw: Any, rout: Any, name: str, x: np.ndarray, out_name: str,
                    out_bytes: int) -> dict[str, Any]:  # fmt: skip
    """One request per transport (``TRANSPORTS``) as a callable returning the output."""
    from infscaler.api.client import ShmOutput, ShmTensor
    from infscaler.api.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request

    def shm() -> np.ndarray:
        c.infer(name, {"x": ShmTensor("in", "FP32", list(x.shape), x.nbytes)},
                outputs={out_name: ShmOutput("out", out_bytes)})  # fmt: skip
        return rout.get(np.float32, (1, 1, *x.shape[2:]))

    def joined() -> np.ndarray:
        body, headers = encode_infer_request({"x": x}, binary_output=True)
        r = raw.post(f"/v2/models/{name}/infer", content=bytes(body), headers=headers)
        r.raise_for_status()
        return decode_infer_response(r.content, header_length=int(r.headers[HEADER_LENGTH])).outputs[out_name]  # fmt: skip

    return {"binary": lambda: c.infer(name, {"x": x}).outputs[out_name], "shm": shm,
            "binary, one joined body": joined}  # fmt: skip


def measure_transports(sock: str, name: str, x: np.ndarray, out_name: str, n: int) -> dict:
    """``n`` requests per transport, interleaved (binary, shm, joined, binary, ...) so the
    host's drift hits all alike; per transport n, P50 / P90 / mean / min (ms), the P50
    ratios against shm and binary's extra ms (median of pairs).

    Raises:
        AssertionError: the transports' outputs differ.
    """
    import httpx

    from infscaler.api.client import Client
    from infscaler.api.sysshm import SharedMemoryRegion

    out_bytes = int(np.prod(x.shape[2:])) * 4
    key_in, key_out = f"isc_bp_in_{os.getpid()}", f"isc_bp_out_{os.getpid()}"
    lat: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    with (Client(sock) as c,
          httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://infscaler", timeout=60) as raw,
          SharedMemoryRegion.create(key_in, x.nbytes) as rin,
          SharedMemoryRegion.create(key_out, out_bytes) as rout):  # fmt: skip
        rin.set(x)
        c.register_system_shm("in", key_in, x.nbytes)
        c.register_system_shm("out", key_out, out_bytes)
        fns = transport_calls(c, raw, rout, name, x, out_name, out_bytes)
        ref = fns["binary"]()
        for f in fns.values():  # warm-up, and every transport gives the same output
            for _ in range(3):
                out = f()
            assert np.array_equal(out, ref), "transports disagree"
        for _ in range(n):
            for t, f in fns.items():
                t0 = time.perf_counter()
                f()
                lat[t].append((time.perf_counter() - t0) * 1e3)
        c.unregister_system_shm()
    rows = {t: {"n": len(v), **{f"p{q}_ms": round(float(np.percentile(v, q)), 3) for q in (50, 90)},
                "mean_ms": round(float(np.mean(v)), 3), "min_ms": round(min(v), 3)}
            for t, v in lat.items()}  # fmt: skip
    shm50 = rows["shm"]["p50_ms"]
    return {"transports": rows,
            "ratio_binary_vs_shm_p50": round(rows["binary"]["p50_ms"] / shm50, 3),
            "ratio_joined_vs_shm_p50": round(rows["binary, one joined body"]["p50_ms"] / shm50, 3),
            "binary_extra_ms_median_of_pairs": round(float(np.median(np.array(lat["binary"]) - np.array(lat["shm"]))), 3)}  # fmt: skip


def run_transports(a: Any) -> int:
    """``--transports``: det and ``det-shaped`` (the same tensor sizes, almost no compute)
    in one ``Sut``, each reached one request at a time by binary HTTP, shm and one joined
    body; writes ``serve_det_transports[_quick]``."""
    from infscaler.api.client import Client

    res = harness.cli.start("serve_det_transports", a)
    x = harness.models.model_inputs("ppocrv4-det")["x"]
    det = {**config_pipeline(1, 1, 2), "name": NAME}
    shaped = {"name": "det-shaped", "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape)}],
              "outputs": ["y"], "stages": [{"name": "copy", "function": "serve_det:det_shaped",
                                            "inputs": ["x"], "outputs": ["y"]}]}  # fmt: skip
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    with harness.Sut([det, shaped], args=["--control-path", a.control_path],
                     env={"PYTHONPATH": path}) as s:  # fmt: skip
        res.own_pids[:] = [s.pid]
        for name in (NAME, "det-shaped"):
            with Client(s.sock) as c:
                out_name = c.model_metadata(name)["outputs"][0]["name"]
            r = measure_transports(s.sock, name, x, out_name, a.n)
            for t, row in r["transports"].items():
                res.add(pipeline=name, transport=t, **row)
            res.summary[name] = {k: v for k, v in r.items() if k != "transports"}
            print(f"{name}: binary / shm P50 = {r['ratio_binary_vs_shm_p50']}; binary costs "
                  f"{r['binary_extra_ms_median_of_pairs']} ms more (median of pairs)")  # fmt: skip
    res.summary.update(input_bytes=int(x.nbytes), output_bytes=int(x.nbytes // 3))
    harness.cli.finish(res, a, lambda d, p: harness.plot(
        [{**q, "i": TRANSPORTS.index(q["transport"])} for q in d["points"]], p, x="i",
        y=["p50_ms", "p90_ms"], by="pipeline", ylabel="ms, one client, requests interleaved",
        xlabel=" | ".join(f"{i}: {t}" for i, t in enumerate(TRANSPORTS))))  # fmt: skip
    harness.print_table(["pipeline", "transport", "P50 ms", "P90 ms", "mean ms"],
                        [[p["pipeline"], p["transport"], p["p50_ms"], p["p90_ms"], p["mean_ms"]]
                         for p in res.points])  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=20.0)
    ap.add_argument("--control-path", default="auto")
    ap.add_argument("--transports", action="store_true", help="binary HTTP vs shm, 6.5 MB")
    ap.add_argument("-n", type=int, default=300, help="--transports: requests per transport")

    def quick(a: Any) -> None:
        a.configs, a.n = "K=2", 30

    ap.set_defaults(configs=None)
    a = harness.cli.parse(ap, argv, quick)
    if a.transports:
        return run_transports(a)
    from infscaler.api.client import Client
    from infscaler.base.models import resolve_model
    from infscaler.engines.onnxrt.loader import load_session

    res = harness.cli.start("serve_det", a)
    x = harness.models.model_inputs("ppocrv4-det")["x"]
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
