"""The host a benchmark runs on: its description and versions, whether it is quiet, and
how much CPU other processes take during a run.

CPU figures come from ``/proc/stat`` and ``/proc/<pid>/stat`` (proc(5)); they read 0.0
where those files are unreadable. Units: seconds of CPU, or cores (CPU seconds per
wall second: 0.5 = half a core on average).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

#: the packages whose versions every result records (absent ones are left out)
VERSIONED = ("infscaler", "numpy", "onnx", "onnxruntime", "aiohttp", "uvloop")


def now_utc() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """Python and each installed package of :data:`VERSIONED`, name -> version."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def environment() -> dict[str, Any]:
    """The ``environment`` block of a result: the host (the package's
    ``partitioner.profiler.host_description``: fingerprint, CPU model, cores, engines),
    usable cores (this process's affinity), memory, versions, argv, start time and load
    average."""
    from infscaler.partitioner.profiler import host_description, usable_cores

    try:
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError):
        mem_mb = None
    return {
        "host": host_description(),
        "usable_cores": usable_cores(),
        "memory_mb": round(mem_mb) if mem_mb else None,
        "kernel": platform.release(),
        "versions": versions(),
        "argv": list(sys.argv),
        "date_utc": now_utc(),
        "load_average_at_start": list(os.getloadavg()),
    }


def cpu_steal_seconds() -> float:
    """CPU time the hypervisor stole from this VM so far (all CPUs), s; 0.0 without a
    steal column."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def busy_cpu_seconds() -> float:
    """CPU time every process on the host used so far (user + nice + system + irq +
    softirq, all CPUs), s."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def process_cpu_seconds(pids: list[int]) -> float:
    """user + system CPU time of these processes (all their threads) so far, s; a pid
    that is gone counts 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(extra_pids: list[int] | None = None) -> float:
    """CPU time of this process, its reaped children and ``extra_pids``, s."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = process_cpu_seconds([os.getpid(), *(extra_pids or [])])
    return me + kids.ru_utime + kids.ru_stime


class ForeignLoad:
    """CPU that processes other than ours used since :meth:`start`, in cores.

    ``own`` returns our CPU seconds so far (this process and what the benchmark runs).
    """

    def __init__(self, own: Callable[[], float]) -> None:
        self._own = own
        self.start()

    def start(self) -> None:
        """Restart the interval now."""
        self._t, self._busy, self._mine = time.monotonic(), busy_cpu_seconds(), self._own()

    def cores(self) -> float:
        """Other processes' CPU since :meth:`start`, cores (>= 0)."""
        wall = time.monotonic() - self._t
        other = busy_cpu_seconds() - self._busy - (self._own() - self._mine)
        return round(max(0.0, other) / wall, 3) if wall > 0 else 0.0


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.15, window_s: float = 3.0) -> dict:
    """Wait up to ``max_wait_s`` until other processes use < ``threshold_cores`` over a
    ``window_s`` window. Returns ``{"waited_s", "other_cores" (last window), "quiet",
    "threshold_cores"}``; ``max_wait_s`` <= 0 measures one window and does not wait."""
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


def default_cache_dir() -> None:
    """Materialise models under ``/tmp/isc-cache`` unless INFSCALER_CACHE_DIR is set."""
    os.environ.setdefault("INFSCALER_CACHE_DIR", "/tmp/isc-cache")


class TreeCpu:
    """CPU seconds of a server's process tree over an interval, the tree read anew every
    ``interval_s`` (psutil): a process started during it counts from 0, one that exited
    counts up to its last reading (at most ``interval_s`` of it lost).

    ``server``: the pids counted as the serving process (the rest of the tree: its model
    instances / python backend stubs)."""

    def __init__(self, root: int, server: list[int], interval_s: float = 0.5) -> None:
        self._root, self._server, self._interval = root, set(server), interval_s
        self._t0 = time.time()
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._read()
        self._thread = threading.Thread(target=self._loop, name="vs-triton-cpu", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        import psutil

        try:
            root = psutil.Process(self._root)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    born = p.create_time()
            except psutil.Error:
                continue
            cpu = t.user + t.system
            with self._lock:
                if p.pid not in self._base:  # born during the interval: all of it counts
                    self._base[p.pid] = 0.0 if born >= self._t0 else cpu
                self._last[p.pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._read()

    def total(self) -> tuple[float, float]:
        """``(serving process, the rest of the tree)`` CPU seconds since the start."""
        self._read()
        with self._lock:
            d = {pid: self._last[pid] - b for pid, b in self._base.items()}
        server = sum(v for pid, v in d.items() if pid in self._server)
        return server, sum(v for pid, v in d.items() if pid not in self._server)

    def pids(self) -> int:
        """Processes of the tree seen so far."""
        with self._lock:
            return len(self._base)

    def stop(self) -> tuple[float, float]:
        out = self.total()
        self._stop.set()
        self._thread.join(5)
        return out
