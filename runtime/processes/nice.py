"""Renice an instance process thread by thread from ``/proc/PID/task`` (``setpriority(2)`` is
per thread); lowering needs ``CAP_SYS_NICE`` or ``RLIMIT_NICE``, else ``EPERM``.
"""

from __future__ import annotations

import os


def renice_process(pid: int, nice: int) -> str | None:
    """Set every thread of ``pid`` to ``nice`` (-20..19); None on success, else why not."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return f"process {pid} is gone"
    refused = 0
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except PermissionError:
            refused += 1
    if refused:
        return (
            f"process {pid}: {refused} thread(s) kept a higher nice value than {nice} "
            "(lowering it needs CAP_SYS_NICE or LimitNICE=)"
        )
    return None
