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
(``det-shaped``), which shows the transport's own cost in ms. Both pipelines are served
by one ``infscaler serve`` (``harness.Sut``). The figure of merit is ``ratio`` =
P50(binary) / P50(shm) on the det model (target: <= 1.1).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

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


def measure(sock: str, name: str, x: np.ndarray, out_name: str, n: int) -> dict:
    """``n`` requests per transport, interleaved; returns per transport P50 etc."""
    import httpx

    from infscaler.api.client import Client, ShmOutput, ShmTensor
    from infscaler.api.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request
    from infscaler.api.sysshm import SharedMemoryRegion

    out_shape = (1, 1, *x.shape[2:])
    out_bytes = int(np.prod(out_shape)) * 4
    key_in, key_out = f"isc_bp_in_{os.getpid()}", f"isc_bp_out_{os.getpid()}"
    lat: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
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

        fns = {"binary": binary, "shm": shm, "binary, one joined body": joined}
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
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("-n", type=int, default=300, help="requests per transport and pipeline")
    ap.add_argument("--control-path", default="auto")

    def quick(a) -> None:
        a.n = 30

    a = harness.cli.parse(ap, argv, quick)
    from serve_det import config_pipeline, det_input

    res = harness.cli.start("binary_path", a)
    x = det_input()
    det = {**config_pipeline(1, 1, 2), "name": "det"}
    shaped = {"name": "det-shaped", "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape)}],
              "outputs": ["y"], "stages": [{"name": "copy", "function": "binary_path:det_shaped",
                                            "inputs": ["x"], "outputs": ["y"]}]}  # fmt: skip
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    with harness.Sut([det, shaped], args=["--control-path", a.control_path],
                     env={"PYTHONPATH": path}) as s:  # fmt: skip
        res.own_pids[:] = [s.pid]
        for name, out_name in (("det", None), ("det-shaped", "y")):
            if out_name is None:
                from infscaler.api.client import Client

                with Client(s.sock) as c:
                    out_name = c.model_metadata(name)["outputs"][0]["name"]
            r = measure(s.sock, name, x, out_name, a.n)
            for t, row in r["transports"].items():
                res.add(pipeline=name, transport=t, **row)
            res.summary[name] = {k: v for k, v in r.items() if k != "transports"}
            print(f"{name}: binary / shm P50 = {r['ratio_binary_vs_shm_p50']}; binary costs "
                  f"{r['binary_extra_ms_median_of_pairs']} ms more (median of pairs)")  # fmt: skip
    res.summary.update(input_bytes=int(x.nbytes), output_bytes=int(x.nbytes // 3))
    harness.cli.finish(res, a, plot)
    harness.print_table(["pipeline", "transport", "P50 ms", "P90 ms", "mean ms"],
                        [[p["pipeline"], p["transport"], p["p50_ms"], p["p90_ms"], p["mean_ms"]]
                         for p in res.points])  # fmt: skip
    return 0


def plot(data: dict, path: Path) -> None:
    """P50 and P90 per transport, one line per pipeline (6.5 MB per request)."""
    pts = [{**p, "i": TRANSPORTS.index(p["transport"])} for p in data["points"]]
    harness.plot(pts, path, x="i", y=["p50_ms", "p90_ms"], by="pipeline",
                 xlabel=" | ".join(f"{i}: {t}" for i, t in enumerate(TRANSPORTS)),
                 ylabel="ms, one client, requests interleaved")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
