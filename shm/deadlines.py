"""The deadline table: which requests are still worth computing, in shared memory.

A 32-byte token carries only the request id, so the front end (the one writer) keeps one
table per service in POSIX shared memory and every instance checks a token's request in
it before running it and before handing its outputs on; a request past its deadline or
cancelled is dropped through the normal ``InstanceClient.done`` path.

More (details, why it is so, history, figures): docs/architecture.md, "`shm/deadlines.py`".
"""

from __future__ import annotations

import _posixshmem
import contextlib
import mmap
import os
import time

import numpy as np

from infscaler.shm.slab import DEADLINES_SUFFIX, check_service_id

ENTRIES = 1 << 16
NO_DEADLINE = (1 << 64) - 1
CANCELLED = 0
_ITEM_BITS = (
    16  # infscaler.runtime.serving.runners.ITEM_BITS (not imported: shm sits below runtime)
)
_BYTES = ENTRIES * 16


def table_name(service_id: str) -> str:
    """POSIX shared-memory name of a service's deadline table."""
    return f"/isc-{check_service_id(service_id)}-{DEADLINES_SUFFIX}"


class DeadlineTable:
    """One service's deadline table (see the module docstring).

    Args:
        service_id: the pool's service id.
        create: True in the front end (creates it, the only writer; replaces a stale
            one a killed service left); False in instances (attach lazily, read only).
    """

    def __init__(self, service_id: str, *, create: bool = False) -> None:
        self.name = table_name(service_id)
        self.owner = create
        self._mm: mmap.mmap | None = None
        self._words: np.ndarray | None = None
        self._next_attach = 0.0
        if create:
            with contextlib.suppress(FileNotFoundError):
                _posixshmem.shm_unlink(self.name)
            fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            try:
                os.ftruncate(fd, _BYTES)
                self._map(fd)
            finally:
                os.close(fd)

    def _map(self, fd: int) -> None:
        self._mm = mmap.mmap(fd, _BYTES)
        self._words = np.frombuffer(self._mm, dtype="<u8").reshape(ENTRIES, 2)

    def _attach(self) -> bool:
        if self._words is not None:
            return True
        now = time.monotonic()
        if now < self._next_attach:
            return False
        self._next_attach = now + 1.0  # not there yet: try again in a second
        try:
            fd = _posixshmem.shm_open(self.name, os.O_RDWR, mode=0o600)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size != _BYTES:
                return False
            self._map(fd)
        finally:
            os.close(fd)
        return True

    # -- writer (the front end) ------------------------------------------------------------
    def set(self, seq: int, deadline_s: float | None) -> None:
        """Request ``seq`` must be done by ``deadline_s`` (``time.monotonic()`` seconds;
        None: no deadline)."""
        if self._words is None:
            return
        ns = NO_DEADLINE if deadline_s is None else max(1, int(deadline_s * 1e9))
        row = self._words[seq % ENTRIES]
        row[0] = 0
        row[1] = min(ns, NO_DEADLINE)
        row[0] = seq

    def cancel(self, seq: int) -> None:
        """Request ``seq`` is answered (failed, expired, cancelled): drop what is left of it."""
        if self._words is None:
            return
        row = self._words[seq % ENTRIES]
        if int(row[0]) == seq:
            row[1] = CANCELLED

    # -- readers (instances, the manager) --------------------------------------------------
    def dead(self, request: int, now_ns: int | None = None) -> bool:
        """True when ``request`` (a token's request id, ``seq << 16 | item``) is past its
        deadline or cancelled; False when it is live or not in the table."""
        if not self._attach():
            return False
        assert self._words is not None
        seq = request >> _ITEM_BITS
        row = self._words[seq % ENTRIES]
        if int(row[0]) != seq:
            return False
        deadline = int(row[1])
        if int(row[0]) != seq:
            return False
        if deadline == CANCELLED:
            return True
        return deadline <= (time.monotonic_ns() if now_ns is None else now_ns)

    def remaining_s(self, request: int) -> float | None:
        """Seconds left before ``request``'s deadline (None: unknown or no deadline; 0
        when dead)."""
        if not self._attach():
            return None
        assert self._words is not None
        seq = request >> _ITEM_BITS
        row = self._words[seq % ENTRIES]
        if int(row[0]) != seq:
            return None
        deadline = int(row[1])
        if deadline == NO_DEADLINE:
            return None
        return max(0.0, (deadline - time.monotonic_ns()) / 1e9)

    def close(self) -> None:
        """Unmap (and unlink, for the owner)."""
        self._words = None
        if self._mm is not None:
            with contextlib.suppress(BufferError, ValueError):
                self._mm.close()
            self._mm = None
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                _posixshmem.shm_unlink(self.name)
