"""The instance side of the tensor pool: :class:`SlabMap` maps a service's slabs by name.

Role on the request path: every process that reads or writes a slot through a token
(the instances, :mod:`infscaler.runtime.serving.instance` via :mod:`infscaler.shm.client`, and
the front end's client, :mod:`infscaler.runtime.serving.frontend`) turns the token into a
zero-copy view with :meth:`SlabMap.slot_view`; the manager's allocator
(:mod:`infscaler.shm.pool`) creates the slabs and leases the slots.

A mapped slab is never served stale: before the manager unlinks a slab it sets the
header's state to RELEASED in the shared pages (:data:`~infscaler.shm.slab.SLAB_STATE`),
which every process still mapping the old object sees; :class:`SlabMap` checks the state
on each access and re-attaches by name (checking the new header's slab id and geometry).
Attaching never unlinks and bypasses ``multiprocessing``'s resource tracker.

Sources: InfScaler §IV-B (tokens name slots; zero-copy handover); POSIX ``shm_open(3)``,
Python ``mmap``.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import mmap
import os
import threading

from infscaler.ebpf.token import Token
from infscaler.shm.slab import (
    SLAB_HDR,
    SLAB_MAGIC,
    SLAB_STATE,
    SLAB_VERSION,
    STATE_LIVE,
    STATE_OFFSET,
    STATE_RELEASED,
    PoolError,
    check_service_id,
    slab_name,
)

__all__ = ["SlabMap"]


class _Attached:
    """One slab as mapped in this process, with the geometry its header gave."""

    __slots__ = ("first_offset", "generation", "mm", "n_slots", "nbytes", "slot_bytes")

    def __init__(self, mm, n_slots, first_offset, slot_bytes, nbytes, generation):
        self.mm = mm
        self.n_slots = n_slots
        self.first_offset = first_offset
        self.slot_bytes = slot_bytes
        self.nbytes = nbytes
        self.generation = generation

    def live(self) -> bool:
        return SLAB_STATE.unpack_from(self.mm, STATE_OFFSET)[0] == STATE_LIVE

    def drop(self) -> None:
        with contextlib.suppress(BufferError):  # views still exported: unmapped when they die
            self.mm.close()


class SlabMap:
    """Instance side: attach a service's slabs by name in any process, zero copy.

    Mappings are cached per slab id. On every access the slab header's state is checked
    in the shared pages; a slab the manager has released (and perhaps re-created under
    the same id) is re-attached by name, so a stale mapping never serves a new slab.
    Attaching never unlinks and does not involve ``multiprocessing``'s resource tracker.

    Args:
        service_id: the pool's ``service_id``.

    Raises:
        PoolError: invalid service id.
    """

    def __init__(self, service_id: str) -> None:
        self.service_id = check_service_id(service_id)
        self._maps: dict[int, _Attached] = {}
        self._lock = threading.Lock()

    def _attach(self, slab: int) -> _Attached:
        name = slab_name(self.service_id, slab)
        try:
            fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise PoolError(
                f"slab {slab} ({name}) does not exist (released, or wrong service id)"
            ) from None
        except OSError as exc:
            raise PoolError(f"cannot open shared memory {name}: {exc}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < SLAB_HDR.size:
                raise PoolError(f"{name} is {size} bytes, too small for a slab header")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, state, slab_id, _, n_slots, first, slot_bytes, nbytes, gen = (
            SLAB_HDR.unpack_from(mm, 0)
        )
        problem = None
        if magic != SLAB_MAGIC or version != SLAB_VERSION:
            problem = "not an InfScaler slab (bad magic or version)"
        elif state != STATE_LIVE:
            problem = "released by the manager" if state == STATE_RELEASED else "not initialised"
        elif slab_id != slab:
            problem = f"its header names slab {slab_id}"
        elif nbytes != size or slot_bytes == 0 or first + n_slots * slot_bytes > size:
            problem = "its header does not match its size"
        if problem:
            mm.close()
            raise PoolError(f"cannot attach {name}: {problem}")
        return _Attached(mm, n_slots, first, slot_bytes, nbytes, gen)

    def _get(self, slab: int) -> _Attached:
        with self._lock:
            att = self._maps.get(slab)
            if att is not None and att.live():
                return att
            if att is not None:
                del self._maps[slab]
                att.drop()
            att = self._attach(slab)
            self._maps[slab] = att
            return att

    def view(self, slab: int, offset: int, size: int) -> memoryview:
        """A writable view of ``size`` bytes at ``offset`` in slab ``slab``.

        Attaches the slab on first use and caches the mapping.

        Raises:
            PoolError: the slab does not exist / was released, or the range is outside
                its slot area.
        """
        att = self._get(slab)
        if offset < att.first_offset or size < 0 or offset + size > att.nbytes:
            raise PoolError(
                f"range [{offset}, {offset + size}) is outside slab {slab}'s slots "
                f"[{att.first_offset}, {att.nbytes})"
            )
        return memoryview(att.mm)[offset : offset + size]

    def slot_view(self, token: Token) -> memoryview:
        """The whole slot a token names (its capacity, at least ``token.length`` bytes).

        Checks the token against the slab header: the offset is slot ``token.slot``'s,
        and ``token.length`` fits the slot.

        Raises:
            PoolError: the slab does not exist / was released, or the token's slot,
                offset or length do not match the slab.
        """
        att = self._get(token.slab)
        expected = att.first_offset + token.slot * att.slot_bytes
        if token.slot >= att.n_slots or token.offset != expected or token.length > att.slot_bytes:
            raise PoolError(
                f"token (slab {token.slab}, slot {token.slot}, offset {token.offset}, "
                f"length {token.length}) does not match the slab: {att.n_slots} slots of "
                f"{att.slot_bytes} bytes from offset {att.first_offset}"
            )
        return memoryview(att.mm)[expected : expected + att.slot_bytes]

    def slab_view(self, slab: int) -> memoryview:
        """The whole slab mapping (header included), e.g. to register it with CUDA
        (:class:`~infscaler.shm.unified.UnifiedSlab`); token offsets index into it.

        Raises:
            PoolError: the slab does not exist / was released.
        """
        return memoryview(self._get(slab).mm)

    def forget(self, slab: int) -> None:
        """Drop the cached mapping of ``slab`` (unmapped once no views of it remain)."""
        with self._lock:
            att = self._maps.pop(slab, None)
        if att is not None:
            att.drop()

    def prune(self) -> int:
        """Drop mappings of slabs the manager has released; returns how many."""
        with self._lock:
            dead = [b for b, att in self._maps.items() if not att.live()]
            for b in dead:
                self._maps.pop(b).drop()
        return len(dead)

    def attached(self) -> list[int]:
        """Slab ids currently mapped in this process."""
        with self._lock:
            return sorted(self._maps)

    def close(self) -> None:
        """Drop every mapping (never unlinks anything)."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for att in maps.values():
            att.drop()

    def __enter__(self) -> SlabMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
