"""renice_process sets every thread of a process, as setpriority(2) works per thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from infscaler.runtime.processes.nice import renice_process


def process_nice(pid: int) -> int | None:
    """The nice value of process ``pid``'s main thread (None: gone)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except (ProcessLookupError, PermissionError):
        return None


# a child with three threads besides its main one, then asleep
CHILD = (
    "import threading, time\n"
    "ev = threading.Event()\n"
    "ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(3)]\n"
    "[t.start() for t in ts]\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def thread_nices(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.append(int(f.read().rsplit(")", 1)[1].split()[16]))  # field 19: nice
    return out


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield proc
    proc.kill()
    proc.wait()


def test_every_thread_takes_the_nice_value(child: subprocess.Popen) -> None:
    base = process_nice(os.getpid())
    assert base is not None and base < 15
    assert len(thread_nices(child.pid)) == 4
    assert renice_process(child.pid, 15) is None
    assert thread_nices(child.pid) == [15] * 4
    assert process_nice(child.pid) == 15


def test_lowering_it_again_needs_the_privilege(child: subprocess.Popen) -> None:
    assert renice_process(child.pid, 12) is None
    why = renice_process(child.pid, 4)
    if os.geteuid() == 0:
        assert why is None and thread_nices(child.pid) == [4] * 4
    else:  # the kernel refuses: the value stays and the reason says what it needs
        assert why is not None and "CAP_SYS_NICE" in why
        assert thread_nices(child.pid) == [12] * 4


def test_a_process_that_is_gone_is_named() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    assert renice_process(proc.pid, 5) == f"process {proc.pid} is gone"
    assert process_nice(proc.pid) is None
