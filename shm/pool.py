"""The token-based tensor pool on POSIX shared memory (InfScaler §IV-B, Fig. 4).

The manager side, :class:`TensorPool` (one per service instance), owns *slabs*: POSIX
shared-memory objects carved into equal *slots* by size class. A 32-byte
:class:`~infscaler.ebpf.token.Token` names a slot (slab, slot, offset); handing the token
over hands the slot over, zero copy.

- **Lazy allocation (token faults).** A producer whose OutToken queue is empty sends a
  FAULT for ``length`` bytes; :meth:`TensorPool.fault` returns a free slot of the
  smallest fitting class, or maps a new slab if that fits under the memory cap, or
  returns ``None`` (back-pressure: the manager answers BUSY and the producer retries).
  Memory never grows beyond ``cap_bytes``. Freed slots go back to the pool; slabs whose
  slots have all been free for ``idle_release_s`` are unmapped and unlinked
  (:meth:`TensorPool.release_idle`), and fully free slabs of other classes are released
  at once when a fault would otherwise hit the cap.
- **Leases (MPMC without data races).** Every slot in use has exactly one owner (an
  instance id, the token's u16 ``instance``); :meth:`TensorPool.transfer` moves it on a
  handover, :meth:`TensorPool.reclaim` frees everything a dead instance held and returns
  it so the caller fails or retries those requests.
- **Instance side.** :class:`SlabMap` attaches slabs by name in any process, caches the
  mappings and never unlinks.

Slab layout (bytes)::

    0      48    slab header: magic b"ISCSLAB1", version, state (LIVE / RELEASED), slab id,
                 slot count, first-slot offset, slot bytes, slab bytes, generation
    4096   ...   slot 0, slot 1, ... each ``slot_bytes`` long (page-aligned when the size
                 class is a multiple of 4 KiB)

Slab names are ``/isc-<service_id>-<slab>`` (mode 0600, created exclusively). Slab ids
are u16 and reused after release (lowest free id). An attached :class:`SlabMap` never
serves a new slab from a stale mapping of an old one with the same id: before a slab is
unlinked, the manager sets its header's state to RELEASED in the shared pages, which
every process still mapping the old object sees; :class:`SlabMap` checks the state on
each access and re-attaches by name (and checks the new header's slab id and geometry).

Sources: InfScaler §IV-B (tokens, token faults, OutToken queue, lazy allocation, MPMC);
POSIX ``shm_open(3)`` / ``shm_unlink(3)``, Python ``mmap``; ``posix_fallocate(3)``
commits the slab's pages up front so a full ``/dev/shm`` is an error here, not a SIGBUS
later.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import mmap
import os
import re
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from infscaler.base.errors import InfScalerError
from infscaler.ebpf.token import NO_SLAB, Token, TokenKind

__all__ = [
    "DEFAULT_SIZE_CLASSES",
    "SLAB_HEADER_BYTES",
    "PoolError",
    "SlabMap",
    "SlotRef",
    "TensorPool",
    "record_pool",
    "remove_stale_pools",
    "remove_stale_slabs",
    "slab_name",
    "unrecord_pool",
]

KiB = 1024
MiB = 1024 * KiB
#: Slot capacities (bytes, header included): powers of two from 4 KiB to 128 MiB.
DEFAULT_SIZE_CLASSES: tuple[int, ...] = tuple(4 * KiB << i for i in range(16))
#: Bytes before the first slot of a slab (one page: slot 0 starts page-aligned).
SLAB_HEADER_BYTES = 4096
MAX_SLABS = NO_SLAB  # slab ids 0..0xFFFE; 0xFFFF means "no slab" in a token
MAX_INSTANCE = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_PAGE = mmap.PAGESIZE

_SLAB_MAGIC = b"ISCSLAB1"
_SLAB_VERSION = 1
# magic, version, state, slab, reserved, n_slots, first_offset, slot_bytes, nbytes, generation
_SLAB_HDR = struct.Struct("<8sHHHHIIQQQ")
_STATE = struct.Struct("<H")
_STATE_OFFSET = 10
_LIVE = 1
_RELEASED = 2
_SERVICE_ID = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_SHM_DIR = "/dev/shm"


class PoolError(InfScalerError):
    """A pool operation was refused: bad token / slot / owner, a closed pool, a request
    above the largest size class, or shared memory that cannot be created or attached."""


def _check_service_id(service_id: str) -> str:
    if not isinstance(service_id, str) or not _SERVICE_ID.match(service_id):
        raise PoolError(
            f"invalid service id {service_id!r}",
            hint="use 1-64 characters from [A-Za-z0-9_] (no '-', it separates name parts)",
        )
    return service_id


def slab_name(service_id: str, slab: int) -> str:
    """The POSIX shared-memory name of slab ``slab`` of a service: ``/isc-<id>-<slab>``.

    Raises:
        PoolError: invalid service id (allowed: ``[A-Za-z0-9_]{1,64}``).
    """
    return f"/isc-{_check_service_id(service_id)}-{int(slab)}"


#: Name suffix of the front end's deadline table (:mod:`infscaler.shm.deadlines`).
DEADLINES_SUFFIX = "deadlines"
#: Shared-memory objects of a service besides its numbered slabs: ``isc-<id>-<suffix>``.
SERVICE_OBJECT_SUFFIXES = (DEADLINES_SUFFIX,)


def remove_stale_slabs(service_id: str) -> list[str]:
    """Unlink the ``/dev/shm/isc-<service_id>-<n>`` slabs and the service's other objects
    (:data:`SERVICE_OBJECT_SUFFIXES`): what a killed manager left.

    For a supervisor restarting a crashed manager under the same service id; never call
    it while a pool with that id is alive. Linux only (lists ``/dev/shm``).

    Returns:
        the names unlinked.
    """
    prefix = slab_name(service_id, 0)[1:-1]  # "isc-<id>-"
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(_SHM_DIR)):
            rest = entry[len(prefix) :]
            if entry.startswith(prefix) and (rest.isdigit() or rest in SERVICE_OBJECT_SUFFIXES):
                with contextlib.suppress(FileNotFoundError):
                    _posixshmem.shm_unlink("/" + entry)
                    removed.append("/" + entry)
    return removed


#: Where a service records its pools, under its state dir (one JSON file per pool).
POOLS_DIR = "pools"


def _process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (psutil ``create_time``, s since the epoch), or
    None when no such process exists (or it cannot be read)."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001 - gone, a zombie, or unreadable: treat as gone
        return None


def record_pool(state_dir: str | os.PathLike[str], service_id: str, pid: int | None = None) -> str:
    """Record that process ``pid`` (default: this one) owns the slabs of ``service_id``:
    ``<state_dir>/pools/<service_id>.json`` with the pid and its start time, written
    atomically (a temporary file renamed over it, ``rename(2)``), so a later start on the
    same state dir can find what a killed run left (:func:`remove_stale_pools`).

    Returns:
        the path written.

    Raises:
        PoolError: invalid service id; OSError: the state dir is not writable.
    """
    import json

    _check_service_id(service_id)
    pid = os.getpid() if pid is None else int(pid)
    folder = os.path.join(os.fspath(state_dir), POOLS_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{service_id}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    body = {"service_id": service_id, "pid": pid, "started": _process_start(pid)}
    with open(tmp, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def unrecord_pool(state_dir: str | os.PathLike[str], service_id: str) -> None:
    """Remove the record :func:`record_pool` wrote (after a clean close)."""
    _check_service_id(service_id)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(os.fspath(state_dir), POOLS_DIR, f"{service_id}.json"))


def remove_stale_pools(state_dir: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Unlink the slabs of earlier runs recorded in ``state_dir`` whose process is gone.

    For each ``<state_dir>/pools/<id>.json`` (:func:`record_pool`): when its pid is not
    alive, or is alive but started at another time (the pid was reused by another
    process), its ``/dev/shm/isc-<id>-<n>`` objects are unlinked
    (:func:`remove_stale_slabs`: our prefix and that service id only; nothing else is
    touched) and the record removed. A record whose process still runs is left alone (a
    service sharing the state dir). Unreadable records are removed with a warning in
    the result under ``"?<file name>"`` (no slab is touched for them).

    Returns:
        ``{service_id: [slab names unlinked]}`` for every stale record found.
    """
    import json

    folder = os.path.join(os.fspath(state_dir), POOLS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, list[str]] = {}
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".tmp"):  # a record interrupted while being written
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if not name.endswith(".json"):
            continue
        try:
            with open(path) as f:
                rec = json.load(f)
            sid = _check_service_id(rec["service_id"])
            pid = int(rec["pid"])
            started = rec.get("started")
        except (OSError, ValueError, KeyError, TypeError, PoolError):
            out[f"?{name}"] = []
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        now_started = _process_start(pid)
        alive = now_started is not None and (
            started is None or abs(float(started) - now_started) < 1.0
        )
        if alive:
            continue
        out[sid] = remove_stale_slabs(sid)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return out


@dataclass(frozen=True, slots=True, order=True)
class SlotRef:
    """One slot of the pool.

    Attributes:
        slab: slab id (u16, < 0xFFFF).
        slot: slot index inside the slab (u32).
        offset: byte offset of the slot inside the slab (u32).
        size: slot capacity in bytes (the size class, header included).
        request: the request id recorded with the slot's lease when this ref was made
            (by :meth:`TensorPool.fault`, :meth:`~TensorPool.held_by`,
            :meth:`~TensorPool.reclaim`, :meth:`~TensorPool.validate`), else ``None``.
            Not part of equality or hashing: a ref names a slot.
    """

    slab: int
    slot: int
    offset: int
    size: int
    request: int | None = field(default=None, compare=False)

    def to_token(
        self,
        kind: TokenKind | int,
        hop: int = 0,
        instance: int = 0,
        length: int | None = None,
        request: int | None = None,
    ) -> Token:
        """A token naming this slot.

        Args:
            kind: e.g. ``TokenKind.GRANT`` (manager) or ``TokenKind.DATA`` (producer).
            hop: destination hop.
            instance: sending instance id (u16).
            length: bytes used (DATA) or granted; default: the slot capacity.
            request: request id (u64); default :attr:`request`, or 0.
        """
        if request is None:
            request = 0 if self.request is None else self.request
        return Token(
            TokenKind(kind),
            hop,
            self.slab,
            instance,
            self.slot,
            self.offset,
            self.size if length is None else length,
            request,
        )


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
        _STATE.pack_into(mm, _STATE_OFFSET, _RELEASED)
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
        self.service_id = _check_service_id(
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
                hint=f"{_SHM_DIR} may be too small for cap_bytes={self.cap_bytes}",
            ) from exc
        finally:
            os.close(fd)
        self._generation += 1
        _SLAB_HDR.pack_into(
            mm,
            0,
            _SLAB_MAGIC,
            _SLAB_VERSION,
            0,  # state written last
            slab_id,
            0,
            n_slots,
            SLAB_HEADER_BYTES,
            slot_bytes,
            nbytes,
            self._generation,
        )
        _STATE.pack_into(mm, _STATE_OFFSET, _LIVE)
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

    # -- public API -------------------------------------------------------------------

    def fault(self, nbytes: int, owner: int, *, request: int | None = None) -> SlotRef | None:
        """Handle a token fault: a slot of at least ``nbytes`` bytes, leased to ``owner``.

        Takes a free slot of the smallest fitting class (from the fullest slab, so
        others drain and can be released); else maps a new slab if it fits under
        ``cap_bytes`` (first releasing fully free slabs of other classes if needed); else
        returns ``None``: back-pressure, answer BUSY and let the producer retry.

        Args:
            nbytes: bytes wanted (slot header + data, :func:`tensors_nbytes
                <infscaler.shm.tensors.tensors_nbytes>`).
            owner: instance id (u16) that will hold the lease.
            request: request id to record with the lease (the FAULT token's
                ``request``), so :meth:`reclaim` can say which requests a dead instance
                held.

        Returns:
            the granted :class:`SlotRef`, or ``None`` at the cap.

        Raises:
            PoolError: ``nbytes`` above the largest class or negative, a slab of that
                class larger than ``cap_bytes`` (could never be served), a bad owner,
                a closed pool, shared memory that cannot be created.
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
        """Return a slot to the pool (a FREE token, or the consumer is done).

        Args:
            slab: slab id. slot: slot index.
            owner: if given, the instance that must hold the lease (pass the FREE
                token's ``instance``: a stale or forged FREE is then refused).

        Raises:
            PoolError: unknown slab / slot, a slot already free (double free), a slot
                held by another owner; counted in ``stats()["rejected"]``, nothing changed.
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
        """Move a slot's lease to ``new_owner`` (the handover of a DATA token).

        Args:
            slab: slab id. slot: slot index. new_owner: instance id (u16).
            from_owner: if given, the instance that must hold the lease now.
            request: if given, the request id now recorded with the lease.

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
        """Check that a DATA / FREE / GRANT token names a live, leased slot consistently.

        Args:
            token: the token received.
            hops: if given, the hops that exist; a token for another hop is refused.
            check_owner: also require ``token.instance`` to hold the lease.

        Returns:
            the slot the token names.

        Raises:
            PoolError: wrong kind (FAULT / BUSY / ERROR name no slot), unknown hop,
                unknown slab / slot, offset not the slot's, length above the slot
                capacity, a free slot, a wrong owner; counted, nothing changed.
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
        """Unmap and unlink slabs all of whose slots have been free for ``idle_release_s``.

        Args:
            now: the clock's time in seconds; default ``clock()``.

        Returns:
            bytes released.
        """
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
        """A writable view of a slot through the manager's own mapping (``ref.size`` bytes).

        For code in the manager's process (e.g. the front end writing request inputs);
        other processes use :class:`SlabMap`.

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
        ``/dev/shm`` entries leak (not after SIGKILL: see :func:`remove_stale_slabs`).
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


class _Attached:
    __slots__ = ("first_offset", "generation", "mm", "n_slots", "nbytes", "slot_bytes")

    def __init__(self, mm, n_slots, first_offset, slot_bytes, nbytes, generation):
        self.mm = mm
        self.n_slots = n_slots
        self.first_offset = first_offset
        self.slot_bytes = slot_bytes
        self.nbytes = nbytes
        self.generation = generation

    def live(self) -> bool:
        return _STATE.unpack_from(self.mm, _STATE_OFFSET)[0] == _LIVE

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
        self.service_id = _check_service_id(service_id)
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
            if size < _SLAB_HDR.size:
                raise PoolError(f"{name} is {size} bytes, too small for a slab header")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, state, slab_id, _, n_slots, first, slot_bytes, nbytes, gen = (
            _SLAB_HDR.unpack_from(mm, 0)
        )
        problem = None
        if magic != _SLAB_MAGIC or version != _SLAB_VERSION:
            problem = "not an InfScaler slab (bad magic or version)"
        elif state != _LIVE:
            problem = "released by the manager" if state == _RELEASED else "not initialised"
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
