"""Setting an instance process's CPU weight: the nice value of every thread it has.

Linux keeps a nice value per thread (``setpriority(2)``: ``PRIO_PROCESS`` with a thread
id changes that thread alone; a thread created later takes its creator's), so a process
is reniced thread by thread from ``/proc/PID/task``. Raising a nice value needs no
privilege; lowering it needs ``CAP_SYS_NICE`` or a ``RLIMIT_NICE`` that allows it
(systemd's ``LimitNICE=``), else the kernel answers ``EPERM`` and the value stays.
"""

from __future__ import annotations

import os


def renice_process(pid: int, nice: int) -> str | None:
    """Set every thread of process ``pid`` to ``nice`` (-20..19).

    Returns:
        None when every thread now runs at ``nice``; else why not (the process is gone,
        or lowering the value was refused: ``EPERM``), for the caller to log.
    """
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
