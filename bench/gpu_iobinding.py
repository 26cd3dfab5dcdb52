"""The gpu engine's onnxruntime path: plain ``session.run`` against IOBinding
(:class:`~infscaler.engines.gpu.iobinding.BoundSession`), per tensor size.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``gpu_iobinding.py``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
WAYS = ("run", "bound_pageable", "bound_pinned")


class _Pinned:
    """Page-aligned anonymous memory registered with CUDA (the way pool slabs are)."""

    integrated = False

    def __init__(self, driver, ctx, nbytes: int) -> None:
        self.mm = mmap.mmap(-1, nbytes)
        self.buf = np.frombuffer(self.mm, np.uint8)
        self.addr = int(self.buf.ctypes.data)
        self.driver, self.ctx = driver, ctx
        self.dptr = driver.host_register(ctx, self.addr, nbytes, 0x01 | 0x02)

    def pointer_of(self, array: np.ndarray) -> int | None:
        a = int(array.ctypes.data)
        return self.dptr + (a - self.addr) if self.addr <= a < self.addr + self.buf.nbytes else None

    def close(self) -> None:
        self.driver.host_unregister(self.ctx, self.addr)


def _model(path: Path, n: int) -> None:
    from onnx import helper

    harness.models.save_model(
        path, [helper.make_node("Add", ["X", "X"], ["Y"])], {"X": [n]}, {"Y": [n]}
    )


def _time(fn, repeats: int) -> dict[str, float]:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return {"median_ms": statistics.median(ts), "p90_ms": ts[int(0.9 * (len(ts) - 1))]}


def _measure(session, plain, fast, x, px, py, y_out, repeats: int) -> dict[str, dict[str, float]]:
    return {
        "run": _time(lambda: session.run(["Y"], {"X": x}), repeats),
        "bound_pageable": _time(lambda: plain.run({"X": x}, ["Y"], out={"Y": y_out}), repeats),
        "bound_pinned": _time(lambda: fast.run({"X": px}, ["Y"], out={"Y": py}), repeats),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "gpu_iobinding.json"
    )
    args = ap.parse_args()
    from infscaler.engines import available, engine_backend

    ok, why = available("gpu")
    backend = engine_backend("gpu") if ok else None
    if backend not in ("onnxruntime-cuda", "onnxruntime-trt"):
        print(f"gpu_iobinding: not run: the gpu engine has no onnxruntime backend here ({why})")
        return 2
    from infscaler.engines.gpu.iobinding import BoundSession
    from infscaler.engines.gpu.loader import open_ort_gpu_session
    from infscaler.engines.tensorrt.cuda import CudaDriver

    tmp = args.out.parent / "gpu_iobinding_models"
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    for nbytes in SIZES:
        n = nbytes // 4
        path = tmp / f"add_{n}.onnx"
        _model(path, n)
        driver, session, _ = open_ort_gpu_session(path, engine="gpu", threads=1, device_index=0)
        ctx = CudaDriver().retain_primary(0)
        pinned = _Pinned(driver, ctx, 2 * nbytes)
        try:
            x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
            px = pinned.buf[:nbytes].view(np.float32)
            py = pinned.buf[nbytes:].view(np.float32)
            px[:] = x
            y_out = np.empty(n, np.float32)
            plain = BoundSession(session)
            fast = BoundSession(session, host_memory=pinned)
            np.testing.assert_array_equal(session.run(["Y"], {"X": x})[0], x + x)
            np.testing.assert_array_equal(fast.run({"X": px}, ["Y"], out={"Y": py})["Y"], x + x)
            row = {
                "bytes": nbytes,
                **_measure(session, plain, fast, x, px, py, y_out, args.repeats),
            }
            row["ratio"] = row["run"]["median_ms"] / row["bound_pinned"]["median_ms"]
            rows.append(row)
            print(f"{nbytes >> 10:>7} KB  run {row['run']['median_ms']:.3f} ms  bound_pageable "
                  f"{row['bound_pageable']['median_ms']:.3f}  bound_pinned "
                  f"{row['bound_pinned']['median_ms']:.3f}  ratio {row['ratio']:.2f}")  # fmt: skip
        finally:
            pinned.close()
            session = plain = fast = None
            driver.release_primary(0)
            driver.release_primary(0)
    result = {
        "bench": "gpu_iobinding",
        "backend": backend,
        "device": driver.device_name(0),
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    pts = [
        {"mb": r["bytes"] / 2**20, "way": w, "ms": r[w]["median_ms"]} for r in rows for w in WAYS
    ]
    harness.plot(pts, args.out.with_suffix(".png"), x="mb", y="ms", by="way", logx=True, logy=True,
                 title=f"{result['device']}: session.run vs IOBinding ({backend})",
                 xlabel="tensor MB (input; output the same)", ylabel="ms per call (median)")  # fmt: skip
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
