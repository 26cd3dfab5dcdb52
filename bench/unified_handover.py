"""A GPU stage's handover cost: slot tensors read and written in place (unified memory)
against the copies the TensorRT runner makes today (InfScaler §IV-B, shaped like paper
Fig. 6's "tensor sharing overhead").

Writes ``results/unified_handover.json`` and ``.png`` (ms per handover against MB, one
line per way). Needs pycuda, a CUDA device and nvcc.

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/unified_handover.py`".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.cli import RESULTS_DIR  # noqa: E402
from bench.harness.host import environment  # noqa: E402
from bench.harness.plot import plot as harness_plot  # noqa: E402
from bench.harness.result import percentiles, print_table, write_json  # noqa: E402
from infscaler.shm import (  # noqa: E402
    SlabMap,
    TensorPool,
    TokenKind,
    UnifiedSlabMap,
    allocate_tensors,
    read_tensors,
    unified_memory_available,
    write_tensors,
)

KERNEL = r"""
__global__ void affine(const float *x, float *y, float a, float b, unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
WAYS = ("zero_copy", "dma", "staged", "kernel_only")


def _stats(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1e3
    return {**percentiles(ms, extra=("mean",)), "n": len(ms)}


def measure_size(cuda, affine, n: int, repeats: int, warmup: int) -> dict:
    """Every way for one tensor size; checks each way's y against numpy first."""
    nbytes = n * 4
    slot_bytes = nbytes + 4096
    pool = TensorPool(8 * slot_bytes + (64 << 20), slab_bytes=slot_bytes)
    slabs = SlabMap(pool.service_id)
    unified = UnifiedSlabMap(slabs)
    try:
        src, dst = pool.fault(slot_bytes - 1024, owner=1), pool.fault(slot_bytes - 1024, owner=2)
        tin, tout = src.to_token(TokenKind.DATA), dst.to_token(TokenKind.GRANT)
        x0 = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        write_tensors(slabs.slot_view(tin), {"x": x0})
        x = read_tensors(slabs.slot_view(tin))["x"]
        y = allocate_tensors(slabs.slot_view(tout), {"y": ((n,), np.float32)})["y"]
        want = 2 * x0 + 1

        t0 = time.perf_counter()
        px = unified.device_pointer(tin, x)
        register_s = time.perf_counter() - t0  # one slab: cuMemHostRegister + pointer
        py = unified.device_pointer(tout, y)
        dx, dy = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
        ix, iy = int(dx), int(dy)
        hx = cuda.pagelocked_empty(n, np.float32)
        hy = cuda.pagelocked_empty(n, np.float32)
        stream = cuda.Stream()
        grid = ((n + 255) // 256, 1)

        def run(a, b, s=None):
            affine(
                np.uintp(a),
                np.uintp(b),
                np.float32(2),
                np.float32(1),
                np.uint64(n),
                block=(256, 1, 1),
                grid=grid,
                stream=s,
            )

        def zero_copy():
            run(px, py)
            cuda.Context.synchronize()

        def dma():
            cuda.memcpy_htod(dx, x)
            run(ix, iy)
            cuda.memcpy_dtoh(y, dy)

        def staged():
            np.copyto(hx, x)
            cuda.memcpy_htod_async(dx, hx, stream)
            run(ix, iy, stream)
            cuda.memcpy_dtoh_async(hy, dy, stream)
            stream.synchronize()
            np.copyto(y, hy)

        def kernel_only():
            run(ix, iy)
            cuda.Context.synchronize()

        fns = {"zero_copy": zero_copy, "dma": dma, "staged": staged, "kernel_only": kernel_only}
        row: dict = {"elements": n, "mb": nbytes / 2**20, "register_slab_ms": register_s * 1e3}
        for way in WAYS:
            y.fill(np.nan)
            fns[way]()
            if way != "kernel_only":
                err = float(np.abs(y - want).max())
                if not err <= 1e-5:
                    raise AssertionError(f"{way} at {n} elements: max error {err}")
            for _ in range(warmup):
                fns[way]()
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                fns[way]()
                samples.append(time.perf_counter() - t)
            row[way] = _stats(samples)
        row["effective_gb_per_s"] = {w: 2 * nbytes / (row[w]["p50_ms"] * 1e-3) / 1e9 for w in WAYS}
        dx.free()
        dy.free()
        return row
    finally:
        unified.close()
        slabs.close()
        pool.close()


def plot(path: Path, rows: list[dict], device: str) -> None:
    """P50 ms per handover against MB, one line per way (``harness.plot``)."""
    pts = [{"mb": r["mb"], "way": w, "p50_ms": r[w]["p50_ms"]} for r in rows for w in WAYS]
    harness_plot(pts, path, x="mb", y="p50_ms", by="way", logx=True, logy=True,
                 title=f"GPU stage handover: {device}", ylabel="ms per handover (P50)",
                 xlabel="tensor MB (x in, y out: each this size)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", default="0.25,1,4,16,64", help="tensor sizes, MB")
    ap.add_argument("--repeats", type=int, default=300, help="timed handovers per point")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "unified_handover.json")
    args = ap.parse_args(argv)

    ok, why = unified_memory_available()
    if not ok:
        print(f"unified memory unavailable: {why}", file=sys.stderr)
        return 2
    import pycuda.driver as cuda
    from pycuda.compiler import SourceModule

    dev = cuda.Device(0)
    ctx = dev.retain_primary_context()
    ctx.push()
    affine = None
    try:
        affine = SourceModule(KERNEL).get_function("affine")
        rows = []
        for mb in (float(s) for s in args.sizes_mb.split(",")):
            n = int(mb * 2**20) // 4
            rows.append(measure_size(cuda, affine, n, args.repeats, args.warmup))
            r = rows[-1]
            print(f"{mb:g} MB: " + ", ".join(f"{w} {r[w]['p50_ms']:.3f}" for w in WAYS), flush=True)
        device = {
            "name": dev.name(),
            "integrated": bool(dev.get_attribute(cuda.device_attribute.INTEGRATED)),
            "compute_capability": ".".join(map(str, dev.compute_capability())),
            "cuda_driver_version": cuda.get_driver_version(),
            "unified_memory": why,
        }
    finally:
        affine = None  # unload the kernel's module while its context is current
        ctx.pop()
        ctx.detach()
    print_table(
        ["MB", "register ms", *(f"{w} P50 ms" for w in WAYS)],
        [
            [f"{r['mb']:g}", f"{r['register_slab_ms']:.2f}"]
            + [f"{r[w]['p50_ms']:.3f}" for w in WAYS]
            for r in rows
        ],
    )
    data = {
        "benchmark": "unified_handover",
        "environment": environment(),
        "device": device,
        "ways": list(WAYS),
        "repeats": args.repeats,
        "rows": rows,
        "ratios_vs_staged_p50": {
            f"{r['mb']:g}": {w: r["staged"]["p50_ms"] / r[w]["p50_ms"] for w in WAYS} for r in rows
        },
    }
    write_json(args.out, data)
    plot(args.out.with_suffix(".png"), rows, device["name"])
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
