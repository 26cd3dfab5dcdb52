"""Client shared memory: what reading and writing it with pread / pwrite costs against a
mapping.

The service copies a client's tensors in and out of its registered shm object with
``preadv(2)`` / ``pwrite(2)`` on the object's fd (:mod:`infscaler.api.sysshm`), never
through a mapping, because a client can shrink its object at any moment and a mapped
page past the new end raises SIGBUS in the whole service. The baseline, run in the same
script on the same object, is what the service did before: an ``mmap`` of the region,
then a copy out of it (``np.frombuffer(view).copy()``, as ``tensor_from_bytes`` did) and
a slice assignment into it for outputs.

For each tensor size (4 KB to 64 MB): the median of ``--reps`` copies each way, and the
ratio pread / mapped copy (and pwrite / mapped write): above 1 is what the safety costs.
Both paths copy each byte once; pread adds a syscall and the kernel's page cache walk.
"""

from __future__ import annotations

import mmap
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from infscaler.api.sysshm import SharedMemoryRegion, SystemSharedMemoryRegistry  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _median_ms(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(size: int, reps: int) -> dict[str, Any]:
    key = f"/isc_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with SharedMemoryRegion.create(key, size) as region, SystemSharedMemoryRegistry() as reg:
        region.buf[:] = np.random.default_rng(0).integers(0, 255, size, np.uint8).tobytes()
        reg.register("r", key, 0, size)
        out = np.frombuffer(os.urandom(size), np.uint8)
        fd = os.open("/dev/shm" + key, os.O_RDWR)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        view = memoryview(mm)
        try:
            # the same bytes either way (checked once)
            a = np.frombuffer(reg.read("r", 0, size), np.uint8)
            b = np.frombuffer(view, np.uint8).copy()
            assert np.array_equal(a, b)
            reps_n = max(5, reps if size <= (4 << 20) else reps // 4)
            rows = {
                "pread_ms": _median_ms(
                    lambda: np.frombuffer(reg.read("r", 0, size), np.uint8), reps_n
                ),
                "mapped_read_ms": _median_ms(lambda: np.frombuffer(view, np.uint8).copy(), reps_n),
                "pwrite_ms": _median_ms(lambda: reg.write("r", 0, out.data), reps_n),
                "mapped_write_ms": _median_ms(
                    lambda: view.__setitem__(slice(None), out.data), reps_n
                ),
            }
        finally:
            view.release()
            mm.close()
            os.close(fd)
    rows = {k: round(v, 4) for k, v in rows.items()}
    rows["read_ratio"] = round(rows["pread_ms"] / rows["mapped_read_ms"], 3)
    rows["write_ratio"] = round(rows["pwrite_ms"] / rows["mapped_write_ms"], 3)
    rows["pread_gb_s"] = round(size / rows["pread_ms"] / 1e6, 2)
    return {"bytes": size, "reps": reps_n, **rows}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--reps", type=int, default=200)

    def quick(a: Any) -> None:
        a.reps = 20

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("shm_copy", a)
    res.summary["baseline"] = "mmap of the region + numpy copy out / slice assignment in"
    for size in SIZES:
        res.add(**measure(size, a.reps))
    harness.cli.finish(res, a, plot)
    harness.print_table(list(res.points[0]), [list(r.values()) for r in res.points])
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """pread / mapped copy (inputs) and pwrite / mapped write (outputs) against the size."""
    harness.plot(data["points"], path, x="bytes", y=["read_ratio", "write_ratio"], logx=True,
                 hlines={"the mapping": 1.0}, xlabel="tensor size, bytes",
                 ylabel="time ratio, median")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
