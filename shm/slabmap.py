"""The instance side of the tensor pool: :class:`SlabMap` maps a service's slabs by name
and turns a token into a zero-copy view (:meth:`SlabMap.slot_view`), in the instances and
the front end; the manager's :mod:`infscaler.shm.pool` creates the slabs.

A mapped slab is never served stale: the header's state (RELEASED before the manager
unlinks it, :data:`~infscaler.shm.slab.SLAB_STATE`) is checked on each access and the
slab re-attached by name. Attaching never unlinks and bypasses ``multiprocessing``'s
resource tracker. Sources: InfScaler §IV-B; POSIX ``shm_open(3)``, Python ``mmap``.
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
    """Instance side: attach a service's slabs by name in any process, zero copy
    (mappings cached per slab id, re-attached when the header says released).

    Raises:
        PoolError: invalid ``service_id``.
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
        """A writable view of ``size`` bytes at ``offset`` in slab ``slab`` (attached and
        cached on first use).

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
        """The whole slot a token names (its capacity, >= ``token.length`` bytes),
        checked against the slab header.

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
