"""Re-pinning a running instance process to a core set: every thread it has.

Linux keeps a cpu affinity per thread (``sched_setaffinity(2)``: a thread id changes that
thread alone; a thread created later takes its creator's), so a process is re-pinned
thread by thread from ``/proc/PID/task``. A process of the same user needs no privilege
(another user's needs ``CAP_SYS_NICE``); a core outside the caller's cpuset is refused
(``EINVAL``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def repin_process(pid: int, cores: Sequence[int]) -> str | None:
    """Pin every thread of process ``pid`` to ``cores`` (not empty).

    Returns:
        None when every thread now runs on ``cores``; else why not (the process is gone,
        or the kernel refused a thread: its errno text), for the caller to log.
    """
    want = {int(c) for c in cores}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return f"process {pid} is gone"
    refused: list[str] = []
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) != want:
                os.sched_setaffinity(tid, want)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as exc:
            refused.append(f"thread {tid}: {exc.strerror or exc}")
    if refused:
        return f"process {pid} not pinned to cores {sorted(want)}: {'; '.join(refused[:3])}"
    return None
