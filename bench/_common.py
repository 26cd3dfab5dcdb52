"""Helpers shared by the partitioner benchmarks (``bench/*.py``).

Nothing here measures anything by itself: each script does its own measurements and
writes them to ``bench/results/``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

#: Tolerance used only when a plan fails verification at the API default rtol (1e-4);
#: every such retry is recorded in the results next to the original failure.
FALLBACK_RTOL = 1e-2


def default_cache_dir() -> None:
    """Use ``/tmp/isc-cache`` for materialised models unless INFSCALER_CACHE_DIR is set."""
    os.environ.setdefault("INFSCALER_CACHE_DIR", "/tmp/isc-cache")


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
    """Host + software versions for the results file."""
    import onnx
    import onnxruntime as ort

    from infscaler.partitioner.profiler import host_description, usable_cores

    return {
        "host": host_description(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "argv": sys.argv,
        "date_utc": now_utc(),
        "load_average_at_start": list(os.getloadavg()),
    }


def cpu_steal_seconds() -> float:
    """CPU time the hypervisor stole from this VM so far (all CPUs, /proc/stat), seconds.

    The difference over a run says how much of it other tenants took: a noise indicator
    for the IPC benchmarks on small VMs. 0.0 where /proc/stat has no steal column.
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def busy_cpu_seconds() -> float:
    """CPU time all processes on this host have used so far (user + nice + system + irq +
    softirq over all CPUs, /proc/stat), seconds; 0.0 where unreadable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def process_cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds of these processes (all their threads) so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """CPU used by processes other than ours over an interval, in cores (0.5 = half a
    core on average): how much other work competed with a benchmark.

    ``own`` returns our CPU seconds so far (this process and the workers we track); a
    child that exits in the interval must be counted by the caller (e.g. with
    ``resource.getrusage(RUSAGE_CHILDREN)``).
    """

    def __init__(self, own: Callable[[], float]) -> None:
        self._own = own
        self.start()

    def start(self) -> None:
        self._t, self._busy, self._mine = time.monotonic(), busy_cpu_seconds(), self._own()

    def cores(self) -> float:
        wall = time.monotonic() - self._t
        other = busy_cpu_seconds() - self._busy - (self._own() - self._mine)
        return round(max(0.0, other) / wall, 3) if wall > 0 else 0.0


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.15, window_s: float = 3.0) -> dict:
    """Wait (up to ``max_wait_s``) until other processes use < ``threshold_cores`` over a
    ``window_s`` window, so a benchmark does not start while other work loads the host.

    Returns:
        {"waited_s", "other_cores" (last window), "quiet" (bool)}.
    """
    t0 = time.monotonic()
    while True:
        fl = ForeignLoad(lambda: process_cpu_seconds([os.getpid()]))
        time.sleep(window_s)
        other = fl.cores()
        waited = time.monotonic() - t0
        if other < threshold_cores or waited >= max_wait_s:
            return {
                "waited_s": round(waited, 1),
                "other_cores": other,
                "quiet": other < threshold_cores,
                "threshold_cores": threshold_cores,
            }


def host_noise(quiet: dict, other_cores: float, steal_at_start: float) -> dict[str, Any]:
    """The ``host_noise`` block of an IPC benchmark's JSON: the wait for a quiet host,
    CPU other processes used during the run (cores), and hypervisor steal (seconds)."""
    return {
        "wait_for_quiet_before_start": quiet,
        "other_processes_cores_during_run": other_cores,
        "per_run": "other_cores in each run: CPU used by other processes, in cores",
        "cpu_steal_seconds": round(cpu_steal_seconds() - steal_at_start, 2),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Compact fixed-width table on stdout."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if j == 0:
            print("  ".join("-" * w for w in widths))


def synthetic_chain(path: Path, blocks: int = 250, channels: int = 16, size: int = 16) -> Path:
    """Write a synthetic deep residual chain with ``4 * blocks`` operators.

    Each block is ``y = Relu(BatchNormalization(Conv3x3(x))); x = Add(x, y)`` on a
    ``1 x channels x size x size`` float32 tensor, with seeded random weights (conv weights
    scaled down so 250 residual additions stay finite). Built with ``onnx.helper``;
    opset 17. Used to exercise the >= 800-operator target; it is not a real model.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = channels
    nodes = []
    inits = []
    x = "x"
    for b in range(blocks):
        w = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * np.float32(0.1 / np.sqrt(c * 9))
        inits += [
            numpy_helper.from_array(w, f"b{b}_w"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_cb"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"b{b}_s"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_bb"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_m"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"b{b}_v"),
        ]
        nodes += [
            helper.make_node(
                "Conv", [x, f"b{b}_w", f"b{b}_cb"], [f"b{b}_conv"], name=f"b{b}_conv", pads=[1] * 4
            ),
            helper.make_node(
                "BatchNormalization",
                [f"b{b}_conv", f"b{b}_s", f"b{b}_bb", f"b{b}_m", f"b{b}_v"],
                [f"b{b}_bn"],
                name=f"b{b}_bn",
            ),
            helper.make_node("Relu", [f"b{b}_bn"], [f"b{b}_relu"], name=f"b{b}_relu"),
            helper.make_node("Add", [x, f"b{b}_relu"], [f"b{b}_out"], name=f"b{b}_add"),
        ]
        x = f"b{b}_out"
    shape = [1, c, size, size]
    graph = helper.make_graph(
        nodes,
        f"synthetic_chain_{blocks}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="infscaler-bench"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
