"""Monitor.cores_busy: CPU seconds of the front end and the live instances over wall
seconds (the scaler's saturation bound, runtime/scaling/cores.SATURATED_FREE_PER_THREAD)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import infscaler.runtime.scaling.monitor as monitor
from infscaler.runtime.scaling.monitor import Monitor


def _service(handles: list) -> SimpleNamespace:
    return SimpleNamespace(supervisor=SimpleNamespace(handles=lambda: handles))


def test_cores_busy_counts_this_process_cpu_seconds(monkeypatch) -> None:
    monkeypatch.setattr(monitor, "BUSY_MIN_S", 0.3)
    mon = Monitor(_service([]))
    assert mon.cores_busy() is None  # the first call only samples
    t0 = time.monotonic()
    x = 0
    while time.monotonic() - t0 < 0.6:  # one busy thread: about 1 core (less on a loaded host)
        x += 1
    busy = mon.cores_busy()
    assert busy is not None and 0.2 < busy <= len(os.sched_getaffinity(0)) + 0.1


def test_cores_busy_ignores_processes_that_are_gone_or_not_running(monkeypatch) -> None:
    monkeypatch.setattr(monitor, "BUSY_MIN_S", 0.0)
    gone = SimpleNamespace(pid=2**22 + 12345, state="ready")  # no such pid
    stopped = SimpleNamespace(pid=1, state="stopped")  # not starting / ready: not read
    mon = Monitor(_service([gone, stopped]))
    mon.cores_busy()
    time.sleep(0.2)  # idle: this process sleeps
    busy = mon.cores_busy()
    assert busy is not None and 0.0 <= busy < 0.5


def test_a_process_started_since_the_oldest_sample_counts_its_cpu_over_its_age(
    monkeypatch,
) -> None:
    # an instance forked after the first sample (a scale-out) is not in it: its CPU
    # seconds over its age count, so it reads busy at once instead of idle
    monkeypatch.setattr(monitor, "BUSY_MIN_S", 0.0)
    handles: list = []
    mon = Monitor(_service(handles))
    mon.cores_busy()

    class _Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def cpu_times(self):
            if self.pid == 4242:
                return SimpleNamespace(user=1.5, system=0.5)  # 2 s of CPU ...
            return real(self.pid).cpu_times()

        def create_time(self) -> float:
            if self.pid == 4242:
                return time.time() - 4.0  # ... in its 4 s of life: half a core
            return real(self.pid).create_time()

    real = monitor.psutil.Process
    monkeypatch.setattr(monitor.psutil, "Process", _Proc)
    time.sleep(0.2)
    idle = mon.cores_busy()
    handles.append(SimpleNamespace(pid=4242, state="ready"))
    time.sleep(0.2)
    busy = mon.cores_busy()
    assert idle is not None and busy is not None
    assert busy - idle > 0.4, (idle, busy)
