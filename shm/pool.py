"""The manager side of the token-based tensor pool: :class:`TensorPool` (InfScaler §IV-B).

The service's allocator of the slots a request's tensors travel in: the sharing manager
answers FAULT with :meth:`TensorPool.fault` (GRANT, or BUSY at the cap), checks tokens
with :meth:`TensorPool.validate`, moves leases with :meth:`TensorPool.transfer` and frees
a dead instance's with :meth:`TensorPool.reclaim`.

Sources: InfScaler §IV-B; POSIX ``shm_open(3)`` / ``shm_unlink(3)``, ``posix_fallocate(3)``.
More (details, why it is so, history, figures): docs/architecture.md, "`shm/pool.py`".
"""

from __future__ import annotations

import _posixshmem
import contextlib
import mmap
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Container, Sequence

from infscaler.ebpf.token import Token, TokenKind
from infscaler.shm.slab import (
    DEFAULT_SIZE_CLASSES,
    MAX_INSTANCE,
    MAX_SLABS,
    SHM_DIR,
    SLAB_HDR,
    SLAB_HEADER_BYTES,
    SLAB_MAGIC,
    SLAB_STATE,
    SLAB_VERSION,
    STATE_LIVE,
    STATE_OFFSET,
    STATE_RELEASED,
    MiB,
    PoolError,
    SlotRef,
    check_service_id,
    slab_name,
)

__all__ = ["TensorPool"]

_U32_MAX = 0xFFFFFFFF
_PAGE = mmap.PAGESIZE


class _Slab:
    """Manager-side state of one slab."""

    __slots__ = (
        "free",
        "generation",
        "id",
        "idle_since",
        "in_use",
        "mm",
        "n_slots",
        "name",
        "nbytes",
        "owners",
        "requests",
        "slot_bytes",
    )

    def __init__(self, slab_id, name, slot_bytes, n_slots, nbytes, mm, generation, now):
        self.id = slab_id
        self.name = name
        self.slot_bytes = slot_bytes
        self.n_slots = n_slots
        self.nbytes = nbytes
        self.mm = mm
        self.generation = generation
        self.owners: list[int | None] = [None] * n_slots
        self.requests: list[int | None] = [None] * n_slots
        self.free: list[int] = list(range(n_slots - 1, -1, -1))  # pop() gives slot 0 first
        self.in_use = 0
        self.idle_since: float | None = now

    def offset(self, slot: int) -> int:
        return SLAB_HEADER_BYTES + slot * self.slot_bytes

    def ref(self, slot: int) -> SlotRef:
        return SlotRef(self.id, slot, self.offset(slot), self.slot_bytes, self.requests[slot])


def _unmap_and_unlink(slab: _Slab) -> None:
    """Mark RELEASED in the shared header, unmap (if no views remain), unlink the name."""
    mm, slab.mm = slab.mm, None
    if mm is not None and not mm.closed:
        SLAB_STATE.pack_into(mm, STATE_OFFSET, STATE_RELEASED)
        with contextlib.suppress(BufferError):  # views still exported: unmapped when they die
            mm.close()
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink(slab.name)


def _finalize(slabs: dict[int, _Slab], pid: int) -> None:
    """GC / atexit: unlink everything (only in the creating process, never in a fork)."""
    if os.getpid() != pid:
        return
    for slab in list(slabs.values()):
        _unmap_and_unlink(slab)
    slabs.clear()


class TensorPool:
    """Manager side of the tensor pool: slabs, slots, token faults, leases (one per service).

    Args:
        cap_bytes: memory cap in bytes: mapped slab bytes (headers included) never exceed it.
        service_id: names the slabs (``/isc-<service_id>-<slab>``); ``[A-Za-z0-9_]{1,64}``;
            default a random 12-hex-digit id, unique per pool.
        size_classes: slot capacities in bytes (header included), ascending, positive
            multiples of 64; default :data:`DEFAULT_SIZE_CLASSES` (4 KiB .. 128 MiB).
        slab_bytes: slab size target in bytes: a class smaller than this gets
            ``slab_bytes // class`` slots per slab, a larger one one slot per slab. A slab
            maps ``4096 + slots * class`` bytes, rounded up to a page.
        idle_release_s: seconds all of a slab's slots must have been free before
            :meth:`release_idle` unmaps it.
        clock: monotonic clock in seconds (injectable for tests).

    Thread-safe: every method takes one lock. Do not use a pool in a forked child.

    Raises:
        PoolError: invalid arguments (bad service id, size classes, a slab above 4 GiB,
            whose offsets would not fit the token's u32 fields).
    """

    def __init__(
        self,
        cap_bytes: int,
        *,
        service_id: str | None = None,
        size_classes: Sequence[int] = DEFAULT_SIZE_CLASSES,
        slab_bytes: int = 16 * MiB,
        idle_release_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(cap_bytes, int) or cap_bytes <= 0:
            raise PoolError(f"cap_bytes must be a positive int, got {cap_bytes!r}")
        classes = tuple(int(c) for c in size_classes)
        if not classes or list(classes) != sorted(set(classes)):
            raise PoolError(f"size_classes must be ascending and distinct, got {classes}")
        if any(c <= 0 or c % 64 for c in classes):
            raise PoolError(f"size classes must be positive multiples of 64 bytes, got {classes}")
        if slab_bytes <= 0:
            raise PoolError(f"slab_bytes must be positive, got {slab_bytes}")
        if idle_release_s < 0:
            raise PoolError(f"idle_release_s must be >= 0, got {idle_release_s}")
        self.service_id = check_service_id(
            secrets.token_hex(6) if service_id is None else service_id
        )
        self.cap_bytes = cap_bytes
        self.size_classes = classes
        self.slab_bytes = slab_bytes
        self.idle_release_s = float(idle_release_s)
        self._clock = clock
        self._geometry = {c: self._slab_geometry(c) for c in classes}
        for c, (_, nbytes) in self._geometry.items():
            if nbytes > _U32_MAX:
                raise PoolError(
                    f"a slab of class {c} would be {nbytes} bytes; token offsets are u32",
                    hint="lower slab_bytes or the largest size class",
                )
        self._lock = threading.RLock()
        self._slabs: dict[int, _Slab] = {}
        self._by_class: dict[int, list[_Slab]] = {c: [] for c in classes}
        self._leases: dict[int, set[tuple[int, int]]] = {}
        self._mapped = 0
        self._generation = 0
        self._closed = False
        self._counters = dict.fromkeys(
            ("faults", "grants", "busy", "rejected", "slabs_mapped", "slabs_released"), 0
        )
        self._bytes_released = 0
        self._rejections: dict[str, int] = {}
        #: called with no argument after each slot is freed (under the pool's lock, in
        #: the freeing thread: keep them short and lock-free); a front end waiting for
        #: room wakes from one instead of polling
        self.free_listeners: list[Callable[[], None]] = []
        self._finalizer = weakref.finalize(self, _finalize, self._slabs, os.getpid())

    # -- geometry ---------------------------------------------------------------------

    def _slab_geometry(self, slot_bytes: int) -> tuple[int, int]:
        n = max(1, self.slab_bytes // slot_bytes)
        nbytes = SLAB_HEADER_BYTES + n * slot_bytes
        return n, (nbytes + _PAGE - 1) // _PAGE * _PAGE

    def size_class(self, nbytes: int) -> int:
        """The smallest slot capacity (bytes) that holds ``nbytes``.

        Raises:
            PoolError: ``nbytes`` negative or above the largest size class.
        """
        if not isinstance(nbytes, int) or nbytes < 0:
            raise PoolError(f"bytes wanted must be a non-negative int, got {nbytes!r}")
        for c in self.size_classes:
            if nbytes <= c:
                return c
        raise PoolError(
            f"{nbytes} bytes requested; the largest slot is {self.size_classes[-1]} bytes",
            hint="add a larger size class, or split the tensors over several slots",
        )

    def slab_name(self, slab: int) -> str:
        """POSIX shm name of slab ``slab`` (``/isc-<service_id>-<slab>``)."""
        return slab_name(self.service_id, slab)

    # -- errors -----------------------------------------------------------------------

    def _reject(self, reason: str, message: str, hint: str | None = None) -> PoolError:
        self._counters["rejected"] += 1
        self._rejections[reason] = self._rejections.get(reason, 0) + 1
        return PoolError(message, hint)

    def _check_open(self) -> None:
        if self._closed:
            raise PoolError(f"tensor pool {self.service_id} is closed")

    def _check_owner(self, owner: int, what: str = "owner") -> None:
        if not isinstance(owner, int) or not 0 <= owner <= MAX_INSTANCE:
            raise self._reject(
                "bad_owner", f"{what} must be an instance id 0..65535, got {owner!r}"
            )

    def _lookup(self, slab: int, slot: int, op: str) -> _Slab:
        s = self._slabs.get(slab)
        if s is None:
            raise self._reject(
                "unknown_slab", f"{op}: unknown slab {slab} (never mapped or released)"
            )
        if not isinstance(slot, int) or not 0 <= slot < s.n_slots:
            raise self._reject(
                "unknown_slot", f"{op}: slab {slab} has slots 0..{s.n_slots - 1}, not {slot}"
            )
        return s

    # -- slabs ------------------------------------------------------------------------

    def _map_slab(self, slot_bytes: int) -> _Slab:
        slab_id = next((i for i in range(MAX_SLABS) if i not in self._slabs), None)
        if slab_id is None:
            raise PoolError(f"all {MAX_SLABS} slab ids are in use", hint="raise slab_bytes")
        n_slots, nbytes = self._geometry[slot_bytes]
        name = self.slab_name(slab_id)
        try:
            fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:
            raise PoolError(
                f"shared memory {name} already exists: another pool uses service id "
                f"{self.service_id!r}, or a killed one left it",
                hint="use another service_id, or remove_stale_slabs(service_id) once it is dead",
            ) from None
        except OSError as exc:
            raise PoolError(f"cannot create shared memory {name}: {exc}") from exc
        try:
            if hasattr(os, "posix_fallocate"):  # commit the pages: ENOSPC now, not SIGBUS later
                os.posix_fallocate(fd, 0, nbytes)
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _posixshmem.shm_unlink(name)
            raise PoolError(
                f"cannot allocate {nbytes} bytes of shared memory for {name}: {exc}",
                hint=f"{SHM_DIR} may be too small for cap_bytes={self.cap_bytes}",
            ) from exc
        finally:
            os.close(fd)
        self._generation += 1
        SLAB_HDR.pack_into(
            mm,
            0,
            SLAB_MAGIC,
            SLAB_VERSION,
            0,  # state written last
            slab_id,
            0,
            n_slots,
            SLAB_HEADER_BYTES,
            slot_bytes,
            nbytes,
            self._generation,
        )
        SLAB_STATE.pack_into(mm, STATE_OFFSET, STATE_LIVE)
        slab = _Slab(
            slab_id, name, slot_bytes, n_slots, nbytes, mm, self._generation, self._clock()
        )
        self._slabs[slab_id] = slab
        self._by_class[slot_bytes].append(slab)
        self._mapped += nbytes
        self._counters["slabs_mapped"] += 1
        return slab

    def _release(self, slab: _Slab) -> int:
        _unmap_and_unlink(slab)
        del self._slabs[slab.id]
        self._by_class[slab.slot_bytes].remove(slab)
        for slot, owner in enumerate(slab.owners):
            if owner is not None:
                self._drop_lease(owner, slab.id, slot)
        self._mapped -= slab.nbytes
        self._counters["slabs_released"] += 1
        self._bytes_released += slab.nbytes
        return slab.nbytes

    def _make_room(self, nbytes: int) -> None:
        """Release fully free slabs (longest idle first) until ``nbytes`` more fit;
        release nothing if even all of them would not make enough room."""
        idle = sorted(
            (s for s in self._slabs.values() if s.in_use == 0),
            key=lambda s: (s.idle_since, s.id),
        )
        if self._mapped - sum(s.nbytes for s in idle) + nbytes > self.cap_bytes:
            return
        for slab in idle:
            if self._mapped + nbytes <= self.cap_bytes:
                break
            self._release(slab)

    # -- leases -----------------------------------------------------------------------

    def _drop_lease(self, owner: int, slab: int, slot: int) -> None:
        held = self._leases.get(owner)
        if held is not None:
            held.discard((slab, slot))
            if not held:
                del self._leases[owner]

    def _grant(self, slab: _Slab, owner: int, request: int | None) -> SlotRef:
        slot = slab.free.pop()
        assert slab.owners[slot] is None, "free list and lease table disagree"
        slab.owners[slot] = owner
        slab.requests[slot] = request
        slab.in_use += 1
        slab.idle_since = None
        self._leases.setdefault(owner, set()).add((slab.id, slot))
        self._counters["grants"] += 1
        return slab.ref(slot)

    def _free(self, slab: _Slab, slot: int) -> None:
        owner = slab.owners[slot]
        assert owner is not None
        slab.owners[slot] = None
        slab.requests[slot] = None
        slab.free.append(slot)
        slab.in_use -= 1
        if slab.in_use == 0:
            slab.idle_since = self._clock()
        self._drop_lease(owner, slab.id, slot)
        for listener in self.free_listeners:
            listener()

    # -- public API -------------------------------------------------------------------

    def fault(self, nbytes: int, owner: int, *, request: int | None = None) -> SlotRef | None:
        """Handle a token fault: a slot of at least ``nbytes`` bytes (header + data,
        :func:`~infscaler.shm.tensors.tensors_nbytes`), leased to instance ``owner`` with
        ``request`` recorded (for :meth:`reclaim`).

        Takes a free slot of the smallest fitting class from the fullest slab; else maps
        a new slab under ``cap_bytes`` (releasing fully free slabs of other classes if
        needed); else returns ``None`` (back-pressure: answer BUSY).

        Raises:
            PoolError: ``nbytes`` negative or above the largest class, a class slab above
                ``cap_bytes``, a bad owner, a closed pool, shared memory not created.
        """
        with self._lock:
            self._check_open()
            self._counters["faults"] += 1
            self._check_owner(owner)
            try:
                cls = self.size_class(nbytes)
            except PoolError as exc:
                raise self._reject("too_large", exc.message, exc.hint) from None
            candidates = [s for s in self._by_class[cls] if s.free]
            if candidates:
                slab = max(candidates, key=lambda s: (s.in_use, -s.id))
                return self._grant(slab, owner, request)
            _, slab_nbytes = self._geometry[cls]
            if slab_nbytes > self.cap_bytes:
                raise self._reject(
                    "above_cap",
                    f"{nbytes} bytes need a slab of {slab_nbytes} bytes (class {cls}), "
                    f"above the pool cap of {self.cap_bytes} bytes",
                    hint="raise cap_bytes or lower slab_bytes",
                )
            if self._mapped + slab_nbytes > self.cap_bytes:
                self._make_room(slab_nbytes)
            if self._mapped + slab_nbytes > self.cap_bytes:
                self._counters["busy"] += 1
                return None
            return self._grant(self._map_slab(cls), owner, request)

    def in_use_bytes(self) -> int:
        """Bytes of the slots leased right now (slot capacities), for admission control:
        a front end that fills the pool with new requests leaves later hops no room
        for their outputs."""
        with self._lock:
            return sum(s.in_use * s.slot_bytes for s in self._slabs.values())

    def free(self, slab: int, slot: int, *, owner: int | None = None) -> None:
        """Return slot ``slot`` of ``slab`` to the pool; with ``owner`` (the FREE token's
        ``instance``) a stale or forged FREE is refused.

        Raises:
            PoolError: unknown slab / slot, a double free, another owner's slot (counted
                in ``stats()["rejected"]``, nothing changed).
        """
        with self._lock:
            self._check_open()
            s = self._lookup(slab, slot, "free")
            current = s.owners[slot]
            if current is None:
                raise self._reject("double_free", f"free: slab {slab} slot {slot} is already free")
            if owner is not None and current != owner:
                raise self._reject(
                    "wrong_owner",
                    f"free: slab {slab} slot {slot} is held by instance {current}, not {owner}",
                )
            self._free(s, slot)

    def transfer(
        self,
        slab: int,
        slot: int,
        new_owner: int,
        *,
        from_owner: int | None = None,
        request: int | None = None,
    ) -> None:
        """Move a slot's lease to ``new_owner`` (a DATA token's handover), requiring
        ``from_owner`` to hold it and recording ``request`` when given.

        Raises:
            PoolError: unknown slab / slot, a free slot, a wrong ``from_owner``, a bad
                ``new_owner``; counted, nothing changed.
        """
        with self._lock:
            self._check_open()
            s = self._lookup(slab, slot, "transfer")
            current = s.owners[slot]
            if current is None:
                raise self._reject("not_leased", f"transfer: slab {slab} slot {slot} is free")
            if from_owner is not None and current != from_owner:
                raise self._reject(
                    "wrong_owner",
                    f"transfer: slab {slab} slot {slot} is held by instance {current}, "
                    f"not {from_owner}",
                )
            self._check_owner(new_owner, "new_owner")
            self._drop_lease(current, slab, slot)
            s.owners[slot] = new_owner
            if request is not None:
                s.requests[slot] = request
            self._leases.setdefault(new_owner, set()).add((slab, slot))

    def owner(self, slab: int, slot: int) -> int | None:
        """The instance holding the slot's lease, ``None`` if free.

        Raises:
            PoolError: unknown slab / slot (counted).
        """
        with self._lock:
            return self._lookup(slab, slot, "owner").owners[slot]

    def held_by(self, owner: int) -> list[SlotRef]:
        """The slots ``owner`` holds, sorted by (slab, slot)."""
        with self._lock:
            return [self._slabs[b].ref(t) for b, t in sorted(self._leases.get(owner, ()))]

    def reclaim(self, owner: int) -> list[SlotRef]:
        """Free every slot a (dead) instance holds.

        Returns:
            the freed slots, sorted, each with the ``request`` recorded with its lease:
            the caller fails or retries those requests; nothing is lost silently.
        """
        with self._lock:
            refs = self.held_by(owner)
            for ref in refs:
                self._free(self._slabs[ref.slab], ref.slot)
            return refs

    def validate(
        self,
        token: Token,
        *,
        hops: Container[int] | None = None,
        check_owner: bool = False,
    ) -> SlotRef:
        """The slot a DATA / FREE / GRANT token names, checked: live, leased (by
        ``token.instance`` with ``check_owner``), for one of ``hops`` when given.

        Raises:
            PoolError: a kind that names no slot, an unknown hop / slab / slot, an offset
                not the slot's, a length above its capacity, a free slot, a wrong owner;
                counted, nothing changed.
        """
        with self._lock:
            self._check_open()
            if token.kind not in (TokenKind.DATA, TokenKind.FREE, TokenKind.GRANT):
                raise self._reject("bad_kind", f"a {token.kind.name} token names no slot")
            if hops is not None and token.hop not in hops:
                raise self._reject(
                    "unknown_stage",
                    f"token for unknown hop {token.hop} (request {token.request})",
                )
            s = self._lookup(token.slab, token.slot, "validate")
            if token.offset != s.offset(token.slot):
                raise self._reject(
                    "bad_offset",
                    f"token offset {token.offset} is not slot {token.slot}'s "
                    f"({s.offset(token.slot)}) in slab {token.slab}",
                )
            if token.length > s.slot_bytes:
                raise self._reject(
                    "bad_length",
                    f"token length {token.length} exceeds the slot capacity {s.slot_bytes}",
                )
            current = s.owners[token.slot]
            if current is None:
                raise self._reject(
                    "freed_slot",
                    f"token names slab {token.slab} slot {token.slot}, which is free "
                    f"(request {token.request})",
                )
            if check_owner and current != token.instance:
                raise self._reject(
                    "wrong_owner",
                    f"slab {token.slab} slot {token.slot} is held by instance {current}, "
                    f"the token comes from {token.instance}",
                )
            return s.ref(token.slot)

    def release_idle(self, now: float | None = None) -> int:
        """Unmap and unlink slabs whose slots have all been free for ``idle_release_s``
        at ``now`` (default ``clock()``); returns the bytes released."""
        with self._lock:
            if self._closed:
                return 0
            now = self._clock() if now is None else now
            idle = [
                s
                for s in self._slabs.values()
                if s.in_use == 0
                and s.idle_since is not None
                and now - s.idle_since >= self.idle_release_s
            ]
            return sum(self._release(s) for s in idle)

    def slot_view(self, ref: SlotRef) -> memoryview:
        """A writable view (``ref.size`` bytes) of a slot through the manager's mapping,
        for the manager's process (others use :class:`~infscaler.shm.slabmap.SlabMap`).

        Raises:
            PoolError: the slab is unknown or the ref does not match its geometry.
        """
        with self._lock:
            self._check_open()
            s = self._lookup(ref.slab, ref.slot, "slot_view")
            if ref.offset != s.offset(ref.slot) or ref.size != s.slot_bytes:
                raise PoolError(f"{ref} does not match slab {ref.slab}'s geometry")
            return memoryview(s.mm)[ref.offset : ref.offset + ref.size]

    def stats(self) -> dict:
        """A snapshot of the pool.

        Returns:
            dict with ``service_id``, ``cap_bytes``, ``mapped_bytes`` (bytes), ``slabs``,
            ``slots_in_use``, ``slots_free``, counters ``faults``, ``grants``, ``busy``
            (faults answered with back-pressure), ``rejected`` (refused operations) and
            ``rejections`` (reason -> count), ``slabs_mapped`` / ``slabs_released``
            (totals), ``bytes_released``, ``owners`` (instance -> slots held), and
            ``classes``: slot bytes -> {``slabs``, ``slots``, ``in_use``, ``free``,
            ``mapped_bytes``} for the classes that have slabs.
        """
        with self._lock:
            classes = {}
            for c, slabs in self._by_class.items():
                if slabs:
                    in_use = sum(s.in_use for s in slabs)
                    slots = sum(s.n_slots for s in slabs)
                    classes[c] = {
                        "slabs": len(slabs),
                        "slots": slots,
                        "in_use": in_use,
                        "free": slots - in_use,
                        "mapped_bytes": sum(s.nbytes for s in slabs),
                    }
            return {
                "service_id": self.service_id,
                "cap_bytes": self.cap_bytes,
                "mapped_bytes": self._mapped,
                "slabs": len(self._slabs),
                "slots_in_use": sum(c["in_use"] for c in classes.values()),
                "slots_free": sum(c["free"] for c in classes.values()),
                **self._counters,
                "bytes_released": self._bytes_released,
                "rejections": dict(self._rejections),
                "owners": {o: len(h) for o, h in sorted(self._leases.items())},
                "classes": classes,
            }

    def close(self) -> None:
        """Unmap and unlink every slab (leases are dropped). Idempotent.

        Also runs when the pool is garbage-collected or at interpreter exit, so no
        ``/dev/shm`` entries leak (not after SIGKILL: see :mod:`infscaler.shm.cleanup`).
        """
        with self._lock:
            if self._closed:
                return
            for slab in list(self._slabs.values()):
                self._release(slab)
            self._closed = True
            self._finalizer.detach()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> TensorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TensorPool(service_id={self.service_id!r}, cap_bytes={self.cap_bytes}, "
            f"mapped_bytes={self._mapped}, slabs={len(self._slabs)})"
        )
