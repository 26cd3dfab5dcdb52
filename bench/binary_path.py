"""What the binary tensor data path costs over system shared memory, one request at a time.

PP-OCRv4 det (1x3x640x640 FP32 input, 4.9 MB; 1x1x640x640 output, 1.6 MB: 6.5 MB per
request, a real photo through the OCR pipeline's pre-processing, as ``serve_det.py``)
served whole by one instance with 2 threads, reached by one client over the Unix-socket
API in three ways, the requests interleaved (binary, shm, joined, binary, shm, ...) so
that the host's drift hits all alike:

- ``binary``: binary tensor data (``Inference-Header-Content-Length``) as the client
  sends it (the body in 256 KiB zero-copy pieces with a Content-Length);
- ``shm``: the input and output in registered system shared memory regions (no tensor
  bytes in HTTP);
- ``binary, one joined body``: binary tensor data sent as one ``bytes`` body (the client
  before this change: httpcore re-slices what is left of it after every partial send).

And the same three on a function stage with the same tensor sizes and almost no compute
(``det-shaped``), which shows the transport's own cost in ms. The in-process front end
(no HTTP) is measured for reference, interleaved too. The figure of merit is ``ratio`` = P50(binary) /
P50(shm) on the det model (issue 13's target: <= 1.1).

Writes ``results/binary_path.json`` and ``.png`` (``_quick`` with --quick).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, default_cache_dir, environment, print_table, write_json  # noqa: E402

TRANSPORTS = ("binary", "shm", "binary, one joined body")


def det_shaped(tensors):
    """A stage with PP-OCRv4 det's tensor sizes and almost no compute: x (1x3xHxW) ->
    y (1x1xHxW), channel 0 copied."""
    return {"y": np.ascontiguousarray(np.asarray(tensors["x"])[:, :1])}


def pct(ms: list[float]) -> dict:
    a = np.array(ms)
    return {
        "n": int(a.size),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p90_ms": round(float(np.percentile(a, 90)), 3),
        "mean_ms": round(float(a.mean()), 3),
        "min_ms": round(float(a.min()), 3),
    }


def measure(svc, sock: str, name: str, x: np.ndarray, out_name: str, n: int) -> dict:
    """``n`` requests per transport, interleaved; returns per transport P50 etc."""
    import httpx

    from infscaler.api.client import Client, ShmOutput, ShmTensor
    from infscaler.api.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request
    from infscaler.api.sysshm import SharedMemoryRegion

    out_shape = (1, 1, *x.shape[2:])
    out_bytes = int(np.prod(out_shape)) * 4
    key_in, key_out = f"isc_bp_in_{os.getpid()}", f"isc_bp_out_{os.getpid()}"
    lat: dict[str, list[float]] = {t: [] for t in ("in-process (front end)", *TRANSPORTS)}
    with (
        Client(sock) as c,
        httpx.Client(
            transport=httpx.HTTPTransport(uds=sock), base_url="http://infscaler", timeout=60
        ) as raw,
        SharedMemoryRegion.create(key_in, x.nbytes) as rin,
        SharedMemoryRegion.create(key_out, out_bytes) as rout,
    ):
        rin.set(x)
        c.register_system_shm("in", key_in, x.nbytes)
        c.register_system_shm("out", key_out, out_bytes)

        def binary() -> np.ndarray:
            return c.infer(name, {"x": x}).outputs[out_name]

        def shm() -> np.ndarray:
            c.infer(
                name,
                {"x": ShmTensor("in", "FP32", list(x.shape), x.nbytes)},
                outputs={out_name: ShmOutput("out", out_bytes)},
            )
            return rout.get(np.float32, out_shape)

        def joined() -> np.ndarray:
            body, headers = encode_infer_request({"x": x}, binary_output=True)
            r = raw.post(f"/v2/models/{name}/infer", content=bytes(body), headers=headers)
            r.raise_for_status()
            res = decode_infer_response(r.content, header_length=int(r.headers[HEADER_LENGTH]))
            return res.outputs[out_name]

        def inproc() -> np.ndarray:
            return svc.infer(name, {"x": x}).outputs[out_name]

        fns = {
            "in-process (front end)": inproc,
            "binary": binary,
            "shm": shm,
            "binary, one joined body": joined,
        }
        ref = binary()
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
    rows = {t: pct(v) for t, v in lat.items()}
    diff = np.array(lat["binary"]) - np.array(lat["shm"])
    return {
        "transports": rows,
        "ratio_binary_vs_shm_p50": round(rows["binary"]["p50_ms"] / rows["shm"]["p50_ms"], 3),
        "ratio_joined_vs_shm_p50": round(
            rows["binary, one joined body"]["p50_ms"] / rows["shm"]["p50_ms"], 3
        ),
        "binary_extra_ms_median_of_pairs": round(float(np.median(diff)), 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="30 requests per transport (~1 min)")
    ap.add_argument("-n", type=int, help="requests per transport and pipeline (default 300)")
    ap.add_argument("--control-path", default="auto")
    args = ap.parse_args(argv)
    default_cache_dir()
    from serve_det import det_input

    from infscaler.api.server import ServerThread
    from infscaler.base.config import load_pipeline, pipeline_for_model
    from infscaler.base.models import MODELS
    from infscaler.service.service import Service

    n = args.n or (30 if args.quick else 300)
    x = det_input()
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{here}{os.pathsep}{old}" if old else here
    env = environment()
    results = {}
    state = Path(os.environ["INFSCALER_CACHE_DIR"]) / "bench-state"
    with (
        tempfile.TemporaryDirectory() as tmp,
        Service(state_dir=state, control_path=args.control_path, pool_mb=256) as svc,
    ):
        sock = str(Path(tmp) / "bench.sock")
        det = pipeline_for_model("ppocrv4-det", name="det", shapes=MODELS["ppocrv4-det"].shapes)
        raw = det.model_dump()
        raw["stages"][0]["threads"] = 2
        det = load_pipeline(raw)
        shaped = load_pipeline(
            {
                "name": "det-shaped",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape)}],
                "outputs": ["y"],
                "stages": [
                    {
                        "name": "copy",
                        "function": "binary_path:det_shaped",
                        "inputs": ["x"],
                        "outputs": ["y"],
                    }
                ],
            }
        )
        with ServerThread(svc, sock, max_body_mb=16):
            for cfg in (det, shaped):
                dep = svc.deploy(cfg)
                out_name = dep.pipeline.output_names[0]
                r = measure(svc, sock, cfg.name, x, out_name, n)
                results[cfg.name] = r
                svc.undeploy(cfg.name)
                for t, row in r["transports"].items():
                    print(f"{cfg.name}: {t}: P50 {row['p50_ms']} ms")
                print(
                    f"{cfg.name}: binary / shm P50 = {r['ratio_binary_vs_shm_p50']} "
                    f"(one joined body: {r['ratio_joined_vs_shm_p50']}); binary costs "
                    f"{r['binary_extra_ms_median_of_pairs']} ms more (median of pairs)"
                )
    env["load_average_at_end"] = list(os.getloadavg())
    print_table(
        ["pipeline", "transport", "P50 ms", "P90 ms", "mean ms"],
        [
            [p, t, row["p50_ms"], row["p90_ms"], row["mean_ms"]]
            for p, r in results.items()
            for t, row in r["transports"].items()
        ],
    )
    stem = "binary_path_quick" if args.quick else "binary_path"
    write_json(
        RESULTS_DIR / f"{stem}.json",
        {
            "environment": env,
            "requests_per_transport": n,
            "input_bytes": int(x.nbytes),
            "output_bytes": int(x.nbytes // 3),
            "results": results,
        },
    )
    plot(results, RESULTS_DIR / f"{stem}.png")
    print(f"wrote {RESULTS_DIR / stem}.json and .png")
    return 0


def plot(results: dict, path: Path) -> None:
    """P50 per transport, one group per pipeline, the binary / shm ratio in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 3.6), squeeze=False)
    colors = ["#999", "#58c", "#3a7", "#e94"]
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        rows = r["transports"]
        labels = list(rows)
        vals = [rows[k]["p50_ms"] for k in labels]
        ys = np.arange(len(labels))
        ax.barh(ys, vals, color=colors[: len(labels)])
        for y, v in zip(ys, vals, strict=True):
            ax.text(v, y, f" {v:.1f}", va="center", fontsize=8)
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        ax.set_xlabel("P50 ms, one client, requests interleaved")
        ax.set_title(
            f"{name}: binary / shm = {r['ratio_binary_vs_shm_p50']:.3f}, "
            f"joined body {r['ratio_joined_vs_shm_p50']:.3f}",
            fontsize=9,
        )
    fig.suptitle("6.5 MB per request (4.9 MB in, 1.6 MB out) over the Unix-socket API", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
