"""Threads named in the kernel too (``prctl(PR_SET_NAME)``, 15 bytes, ``/proc/PID/task/TID/comm``)
so ``top -H`` and ``py-spy`` tell them apart; the service's names begin with ``isc-``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import threading

__all__ = ["COMM_MAX", "NamedThread", "named_executor", "set_os_thread_name"]

#: the kernel keeps this many bytes of a thread's name (TASK_COMM_LEN - 1)
COMM_MAX = 15
_PR_SET_NAME = 15


def set_os_thread_name(name: str) -> None:
    """Name the calling thread in the kernel: ``name`` UTF-8 encoded and cut to
    :data:`COMM_MAX` bytes. Best effort: nothing happens where ``prctl`` is missing
    (not Linux)."""
    raw = name.encode("utf-8", "replace")[:COMM_MAX]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)


class NamedThread(threading.Thread):
    """A :class:`threading.Thread` that gives the kernel its ``name`` when it starts
    (:func:`set_os_thread_name`); same arguments. Pass a ``name`` of at most
    :data:`COMM_MAX` bytes so both show the same."""

    def run(self) -> None:
        set_os_thread_name(self.name)
        super().run()


def _name_current() -> None:
    set_os_thread_name(threading.current_thread().name)


def named_executor(prefix: str, max_workers: int | None = None) -> concurrent.futures.Executor:
    """A :class:`~concurrent.futures.ThreadPoolExecutor` whose threads are named
    ``{prefix}_{i}`` in Python and in the kernel (cut to :data:`COMM_MAX` bytes).
    ``max_workers``: as the executor's (None: its default)."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers, thread_name_prefix=prefix, initializer=_name_current
    )
