"""System shared memory for request tensors: the server's region registry and a client helper.

More (details, why it is so, history, figures): docs/api.md, "`infscaler/api/sysshm.py`".
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infscaler.api.codec_tensors import (
    DATATYPES,
    ProtocolError,
    datatype_of,
    tensor_from_bytes,
    tensor_to_bytes,
)
from infscaler.api.codec_tensors import parse_bytes as _parse_bytes
from infscaler.base.errors import InfScalerError
from infscaler.base.security import (
    Peer,
    is_privileged,
    is_privileged_uid,
    may_read_write,
    quota_uid,
)

try:
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX
    _posixshmem = None

__all__ = [
    "MAX_REGIONS",
    "MAX_REGIONS_PER_UID",
    "RESERVED_PREFIXES",
    "PeerRegistry",
    "SharedMemoryRegion",
    "SystemSharedMemoryRegistry",
    "normalize_key",
]

#: Key prefixes clients may not register (the runtime's tensor pool slabs: ``/isc-<id>-<n>``).
RESERVED_PREFIXES: tuple[str, ...] = ("isc-",)
_NAME_MAX = 255
#: Longest region name, bytes of UTF-8 (as a key's).
REGION_NAME_MAX = _NAME_MAX


def normalize_key(key: str, reserved: Sequence[str] = RESERVED_PREFIXES) -> str:
    """``key`` as an ``shm_open`` name with its leading ``/``.

    Raises:
        ProtocolError: (400) empty, not one path component (a ``/`` inside), ``.`` /
            ``..``, a NUL byte, longer than 255 bytes, or a reserved prefix.
    """
    if not isinstance(key, str):
        raise ProtocolError(f"shared memory key must be a string, got {type(key).__name__}")
    name = key[1:] if key.startswith("/") else key
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ProtocolError(
            f'bad shared memory key {key!r}: use a POSIX shm name, "/name" or "name" '
            "(one component, no '/' inside)"
        )
    if len(name.encode()) > _NAME_MAX:
        raise ProtocolError(f"shared memory key {key!r:.40}... is longer than {_NAME_MAX} bytes")
    for prefix in reserved:
        if name.startswith(prefix):
            raise ProtocolError(
                f"shared memory key {key!r} is reserved: '{prefix}*' objects belong to the "
                "InfScaler runtime's tensor pool",
                hint="create your region under another name",
            )
    return "/" + name


def _shm_open(key: str, flags: int, mode: int = 0o600) -> int:
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if _posixshmem is not None:
        return _posixshmem.shm_open(key, flags, mode=mode)
    return os.open("/dev/shm" + key, flags, mode)  # pragma: no cover


def _shm_unlink(key: str) -> None:
    if _posixshmem is not None:
        _posixshmem.shm_unlink(key)
    else:  # pragma: no cover
        os.unlink("/dev/shm" + key)


def _close_map(mm: mmap.mmap) -> None:
    # BufferError: a view is still exported; the map goes when the last view does
    with contextlib.suppress(BufferError):
        mm.close()


def _pread_into(fd: int, buf: memoryview, pos: int) -> int:
    """Fill ``buf`` from ``fd`` at ``pos`` with ``preadv(2)``; returns the bytes read
    (fewer than ``len(buf)`` only where the object ends: it shrank)."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], pos + got)
        if n == 0:
            break
        got += n
    return got


def _pwrite_from(fd: int, data: memoryview, pos: int) -> None:
    """Write all of ``data`` to ``fd`` at ``pos`` with ``pwrite(2)``."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], pos + done)


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    owner_uid: int | None = None  # the registering peer's uid; None: in-process
    users: int = 0  # reads / writes in progress (the fd stays open until they end)
    closed: bool = False  # unregistered: close the fd once ``users`` is 0

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


#: Regions one client uid may hold registered at once (each holds one fd of the service).
MAX_REGIONS_PER_UID = 64
#: Regions all clients that are not privileged may hold registered at once.
MAX_REGIONS = 256


class SystemSharedMemoryRegistry:
    """The server's registered system shared memory regions (Triton's
    ``extension_shared_memory.md``: Status / Register / Unregister). Thread-safe.

    Each region holds one fd of its object and no mapping: tensors are copied in with
    ``preadv(2)`` and out with ``pwrite(2)``. Regions outlive the connection that registered
    them, so the number one uid may hold is capped.

    Args:
        reserved_prefixes: shm names clients may not register (default: the tensor pool's).
        max_regions_per_uid / max_regions: regions one uid / all uids that are not
            privileged may hold (then 429); the service's user and root are held to neither.
    """

    def __init__(
        self,
        reserved_prefixes: Sequence[str] = RESERVED_PREFIXES,
        *,
        max_regions_per_uid: int = MAX_REGIONS_PER_UID,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self._reserved = tuple(reserved_prefixes)
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self.max_regions_per_uid = int(max_regions_per_uid)
        self.max_regions = int(max_regions)
        self.refused = 0  # registrations refused by the quota

    def _check_quota(self, name: str, peer: Peer | None) -> None:
        """429 when ``peer`` (not privileged) is at its region quota or all are at theirs."""
        if is_privileged(peer):
            return
        assert peer is not None
        unprivileged = [r for r in self._regions.values() if not is_privileged_uid(r.owner_uid)]
        mine = sum(1 for r in unprivileged if r.owner_uid == peer.uid)
        if mine >= self.max_regions_per_uid:
            self.refused += 1
            raise ProtocolError(
                f"region '{name}': you ({peer.describe()}) hold {mine} registered shared "
                f"memory regions, the most one user may (--max-regions-per-uid "
                f"{self.max_regions_per_uid})",
                429,
                hint="unregister regions you no longer use (POST "
                "/v2/systemsharedmemory/unregister), or register one larger region and "
                "use offsets inside it",
            )
        others = len(unprivileged)
        if others >= self.max_regions:
            self.refused += 1
            raise ProtocolError(
                f"region '{name}': the service holds {others} registered shared memory "
                f"regions of its clients, the most it keeps (--max-regions "
                f"{self.max_regions})",
                429,
                hint="retry later, or ask the operator to raise --max-regions",
            )

    def register(
        self, name: str, key: str, offset: int, byte_size: int, peer: Peer | None = None
    ) -> None:
        """Open the shm object ``key`` and register ``byte_size`` bytes at ``offset`` of it as
        region ``name``, owned by ``peer`` (None: in-process). A peer that is not privileged
        must be able to open the object for reading and writing itself.

        Raises:
            ProtocolError: (400) a bad name (empty, over :data:`REGION_NAME_MAX` bytes, '/' or a
                control character), a bad or reserved key, a negative offset, byte_size < 1, a
                name taken, a missing object or one the service may not open, a range beyond
                the object; (403) an object ``peer`` could not open itself; (429) over a quota.
        """
        if (
            not isinstance(name, str)
            or not name
            or "/" in name
            or len(name.encode("utf-8", "replace")) > REGION_NAME_MAX
            or any(c < " " or c == "\x7f" for c in name)
        ):
            raise ProtocolError(
                f"bad shared memory region name {name!r:.80}: a non-empty string of at most "
                f"{REGION_NAME_MAX} bytes (UTF-8), without '/' or control characters"
            )
        key = normalize_key(key, self._reserved)
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ProtocolError(f"region '{name}': {what} must be an integer, got {v!r}")
        if offset < 0:
            raise ProtocolError(f"region '{name}': offset must be >= 0, got {offset}")
        if byte_size < 1:
            raise ProtocolError(f"region '{name}': byte_size must be >= 1, got {byte_size}")
        with self._lock:
            if name in self._regions:
                r = self._regions[name]
                detail = (
                    f" (key {r.key}, offset {r.offset}, byte_size {r.byte_size})"
                    if self._mine(r, peer)
                    else " by another user"
                )
                raise ProtocolError(
                    f"shared memory region '{name}' is already registered{detail}",
                    hint="unregister it first, or choose another name",
                )
            self._check_quota(name, peer)
            try:
                # O_NONBLOCK: a FIFO planted in /dev/shm must not block the server
                fd = _shm_open(key, os.O_RDWR | os.O_NONBLOCK)
            except FileNotFoundError:
                raise ProtocolError(
                    f"region '{name}': shared memory object {key} does not exist",
                    hint="create it first (shm_open, or SharedMemoryRegion.create)",
                ) from None
            except PermissionError:
                raise ProtocolError(
                    f"region '{name}': the service may not open shared memory object {key} "
                    "(permission denied)",
                    hint="create it readable and writable by the service's user or group "
                    "(SharedMemoryRegion.create(..., group=True) gives mode 0660)",
                ) from None
            except OSError as exc:
                status = 503 if exc.errno in (errno.EMFILE, errno.ENFILE) else 400
                raise ProtocolError(
                    f"region '{name}': cannot open shared memory object {key}: {exc}", status
                ) from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ProtocolError(f"region '{name}': {key} is not a shared memory object")
                if not is_privileged(peer) and not may_read_write(st, peer):
                    raise ProtocolError(
                        f"region '{name}': you ({peer.describe()}) may not read and write "
                        f"shared memory object {key} yourself (owner uid {st.st_uid}, group "
                        f"{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}); the service "
                        "opens only objects its client could open itself",
                        403,
                        hint="create the object yourself (SharedMemoryRegion.create(..., "
                        "group=True) gives mode 0660)",
                    )
                if offset + byte_size > st.st_size:
                    raise ProtocolError(
                        f"region '{name}': offset {offset} + byte_size {byte_size} = "
                        f"{offset + byte_size} is beyond shared memory object {key} "
                        f"({st.st_size} bytes)"
                    )
            except BaseException:
                os.close(fd)
                raise
            owner = None if peer is None else peer.uid
            self._regions[name] = _Region(name, key, offset, byte_size, fd, owner)

    @staticmethod
    def _mine(r: _Region, peer: Peer | None) -> bool:
        """Whether ``peer`` may see and use region ``r`` (its registrant, or privileged)."""
        return is_privileged(peer) or (peer is not None and r.owner_uid == peer.uid)

    def _refuse_foreign(self, r: _Region, peer: Peer | None) -> None:
        if not self._mine(r, peer):
            assert peer is not None
            raise ProtocolError(
                f"shared memory region '{r.name}' was registered by another user; you "
                f"({peer.describe()}) may use only your own regions",
                403,
            )

    @staticmethod
    def _drop(r: _Region) -> None:
        """Close ``r``'s fd once no read or write uses it (call with the lock held)."""
        r.closed = True
        if r.users == 0 and r.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(r.fd)
            r.fd = -1

    def unregister(self, name: str | None = None, peer: Peer | None = None) -> None:
        """Unregister region ``name``, or every region ``peer`` may see (None); a name not
        registered is ignored (as Triton). The objects stay; a read or write in progress
        finishes on its fd first.

        Raises:
            ProtocolError: (403) ``name`` is another user's region.
        """
        with self._lock:
            if name is None:
                names = [n for n, r in self._regions.items() if self._mine(r, peer)]
            else:
                names = [name]
                if name in self._regions:
                    self._refuse_foreign(self._regions[name], peer)
            for n in names:
                r = self._regions.pop(n, None)
                if r is not None:
                    self._drop(r)

    def status(self, name: str | None = None, peer: Peer | None = None) -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]`` for region ``name`` or all that
        ``peer`` may see (in registration order): ``$system_shared_memory_status_response``.

        Raises:
            ProtocolError: (404) ``name`` is not registered; (403) it is another user's.
        """
        with self._lock:
            if name is None:
                return [r.status() for r in self._regions.values() if self._mine(r, peer)]
            r = self._regions.get(name)
            if r is None:
                raise ProtocolError(f"shared memory region '{name}' is not registered", 404)
            self._refuse_foreign(r, peer)
            return [r.status()]

    def for_peer(
        self,
        peer: Peer | None | Callable[[], Any],
        *,
        budget: Any = None,
        max_read_bytes: int | None = None,
    ) -> PeerRegistry:
        """This registry as ``peer`` sees it for one request (what the codec gets);
        ``peer`` may be a function giving it, called on first use. ``budget`` /
        ``max_read_bytes``: see :class:`PeerRegistry`."""
        return PeerRegistry(self, peer, budget=budget, max_read_bytes=max_read_bytes)

    def _acquire(self, name: str, offset: int, byte_size: int, peer: Peer | None) -> _Region:
        """Region ``name`` checked for ``peer`` and the range, its fd held open until
        :meth:`_release`."""
        with self._lock:
            r = self._regions.get(name)
            if r is None:
                raise ProtocolError(
                    f"shared memory region '{name}' is not registered",
                    hint="register it with POST /v2/systemsharedmemory/region/{name}/register",
                )
            self._refuse_foreign(r, peer)
            if offset < 0 or byte_size < 0 or offset + byte_size > r.byte_size:
                raise ProtocolError(
                    f"offset {offset} + byte_size {byte_size} is beyond shared memory region "
                    f"'{name}' ({r.byte_size} bytes)"
                )
            r.users += 1
            return r

    def _release(self, r: _Region) -> None:
        with self._lock:
            r.users -= 1
            if r.closed:
                self._drop(r)

    @staticmethod
    def _shrank(r: _Region, size: int | str) -> ProtocolError:
        return ProtocolError(
            f"shared memory region '{r.name}': object {r.key} shrank to {size} bytes, below "
            f"the registered range (offset {r.offset}, byte_size {r.byte_size})",
            hint="keep the object at least as large as the registered range while it is "
            "registered (or unregister and register it again)",
        )

    def check(self, name: str, offset: int, byte_size: int, peer: Peer | None = None) -> None:
        """That ``peer`` may use ``byte_size`` bytes at ``offset`` of region ``name``.

        Raises:
            ProtocolError: as :meth:`read`, without touching the object.
        """
        self._release(self._acquire(name, offset, byte_size, peer))

    def read(
        self,
        name: str,
        offset: int,
        byte_size: int,
        peer: Peer | None = None,
        before: Callable[[int], None] | None = None,
    ) -> memoryview:
        """A copy of ``byte_size`` bytes at ``offset`` within region ``name`` (a writable
        ``memoryview`` of its own buffer), read with ``preadv(2)``: an object that shrank gives
        a short read (400), never SIGBUS. ``before(byte_size)`` runs once the range is checked,
        before the buffer is allocated (what it raises is raised).

        Raises:
            ProtocolError: (400) not registered, a range beyond it, the object shrank, the read
                failed; (403) another user's region.
        """
        r = self._acquire(name, offset, byte_size, peer)
        try:
            if before is not None:
                before(byte_size)
            # np.empty: no zero-fill of a buffer pread fills anyway (bytearray's is a memset)
            buf = memoryview(np.empty(byte_size, np.uint8)).cast("B")
            try:
                got = _pread_into(r.fd, buf, r.offset + offset)
            except OSError as exc:
                raise ProtocolError(
                    f"shared memory region '{name}': cannot read object {r.key}: {exc}"
                ) from None
            if got < byte_size:
                raise self._shrank(r, f"{r.offset + offset + got} (or fewer)")
            return buf
        finally:
            self._release(r)

    def write(self, name: str, offset: int, data: Any, peer: Peer | None = None) -> None:
        """Write ``data`` (bytes-like) at ``offset`` within region ``name`` with ``pwrite(2)``;
        the object must cover the range when the write starts (one that shrinks meanwhile is
        grown back, at most to the range's end).

        Raises:
            ProtocolError: (400) as :meth:`read`, or the write failed (``/dev/shm`` full);
                (403) another user's region.
        """
        mv = memoryview(data).cast("B")
        r = self._acquire(name, offset, len(mv), peer)
        try:
            try:
                size = os.fstat(r.fd).st_size
                if size < r.offset + offset + len(mv):
                    raise self._shrank(r, size)
                _pwrite_from(r.fd, mv, r.offset + offset)
            except OSError as exc:
                raise ProtocolError(
                    f"shared memory region '{name}': cannot write object {r.key}: {exc}"
                ) from None
        finally:
            self._release(r)

    def counts(self) -> dict[str, int]:
        """``{"regions", "client_regions", "fds", "refused"}``: regions registered, of
        them those of peers that are not privileged, fds held, quota refusals."""
        with self._lock:
            return {
                "regions": len(self._regions),
                "client_regions": sum(
                    1 for r in self._regions.values() if not is_privileged_uid(r.owner_uid)
                ),
                "fds": sum(1 for r in self._regions.values() if r.fd >= 0),
                "refused": self.refused,
            }

    def close(self) -> None:
        """Unregister every region."""
        self.unregister(None)

    def __len__(self) -> int:
        return len(self._regions)

    def __enter__(self) -> SystemSharedMemoryRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PeerRegistry:
    """A :class:`SystemSharedMemoryRegistry` bound to one client and one request (what the
    codec gets): only the client's regions (any, for the service's user and root).

    Before each read's buffer is allocated, the request's reads so far plus this one must
    be within ``max_read_bytes`` (else 413), and twice the read is reserved from ``budget``
    under the client's uid; :meth:`release` gives it back (idempotent).

    Args:
        budget: with ``reserve_bytes(nbytes, uid)`` and ``release_bytes(nbytes, uid)``:
            the :class:`~infscaler.service.service.Service` (None: reads are not charged).
        max_read_bytes: the most bytes one request may read, in all (None: no bound).
    """

    def __init__(
        self,
        registry: SystemSharedMemoryRegistry,
        peer: Peer | None | Callable[[], Any],
        *,
        budget: Any = None,
        max_read_bytes: int | None = None,
    ) -> None:
        self.registry = registry
        self._peer = peer  # or a function giving it: looked up on first use
        self.budget = budget
        self.max_read_bytes = max_read_bytes
        self.read_bytes = 0  # read by this request so far
        self.reserved = 0  # of the budget, held for it
        self._uid: int | None = None

    def _charge(self, nbytes: int) -> None:
        """Check and reserve a read of ``nbytes`` (before its buffer exists)."""
        limit = self.max_read_bytes
        if limit is not None and self.read_bytes + nbytes > limit:
            raise ProtocolError(
                f"the request reads {self.read_bytes + nbytes} bytes from shared memory; "
                f"at most {limit} bytes a request fit the service's tensor pool",
                413,
                hint="send a smaller batch, or split it over several requests",
            )
        if self.budget is not None:
            uid = quota_uid(self.peer)
            self.budget.reserve_bytes(2 * nbytes, uid)
            self._uid = uid
            self.reserved += 2 * nbytes
        self.read_bytes += nbytes

    def release(self) -> None:
        """Give back what this request's reads reserved."""
        if self.reserved and self.budget is not None:
            self.budget.release_bytes(self.reserved, self._uid)
        self.reserved = 0

    @property
    def peer(self) -> Peer | None:
        if callable(self._peer):
            self._peer = self._peer()
        return self._peer

    def check(self, name: str, offset: int, byte_size: int) -> None:
        self.registry.check(name, offset, byte_size, self.peer)

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        return self.registry.read(name, offset, byte_size, self.peer, self._charge)

    def write(self, name: str, offset: int, data: Any) -> None:
        self.registry.write(name, offset, data, self.peer)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        return self.registry.status(name, self.peer)


def _to_dtype(dtype: Any) -> tuple[str, np.dtype]:
    """(v2 datatype, numpy dtype) from a v2 name or anything numpy reads as a dtype."""
    if isinstance(dtype, str) and dtype in DATATYPES:
        return dtype, DATATYPES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InfScalerError(f"not a dtype or v2 datatype: {dtype!r}") from exc
    datatype = datatype_of(dt)
    return datatype, DATATYPES[datatype]


class SharedMemoryRegion:
    """A POSIX shared memory object the client creates and fills (as
    ``tritonclient.utils.shared_memory``), to register with
    :meth:`~infscaler.api.client.Client.register_system_shm`.

    Attributes:
        key: the ``shm_open`` name, with its leading ``/``.
        byte_size: its size in bytes.
        buf: a writable ``memoryview`` of all of it.
    """

    def __init__(self, key: str, byte_size: int, fd: int, mm: mmap.mmap, owner: bool) -> None:
        self.key = key
        self.byte_size = byte_size
        self._fd = fd
        self._mm = mm
        self._owner = owner
        self.buf: memoryview | None = memoryview(mm)

    @classmethod
    def create(
        cls,
        key: str,
        byte_size: int,
        *,
        group: bool = False,
        mode: int | None = None,
        gid: int | None = None,
    ) -> SharedMemoryRegion:
        """Create a new shm object ``key`` of ``byte_size`` bytes, pages committed up front (a
        full ``/dev/shm`` fails here, not later with SIGBUS).

        Args:
            group: mode 0660 instead of 0600.
            mode: an explicit mode (overrides ``group``; the umask does not apply).
            gid: give the object to this group (None: your own).

        Raises:
            InfScalerError: a bad key, byte_size < 1, the object exists, or no space.
        """
        key = normalize_key(key, ())
        if isinstance(byte_size, bool) or not isinstance(byte_size, int) or byte_size < 1:
            raise InfScalerError(
                f"shared memory byte_size must be an integer >= 1, got {byte_size!r}"
            )
        mode = mode if mode is not None else (0o660 if group else 0o600)
        try:
            fd = _shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
        except FileExistsError:
            raise InfScalerError(
                f"shared memory object {key} already exists",
                hint="choose another key, or SharedMemoryRegion.attach() it",
            ) from None
        except OSError as exc:
            raise InfScalerError(f"cannot create shared memory object {key}: {exc}") from None
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, byte_size)
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, byte_size)
            mm = mmap.mmap(
                fd, byte_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                _shm_unlink(key)
            raise InfScalerError(
                f"cannot size shared memory object {key} to {byte_size} bytes: {exc}"
            ) from None
        return cls(key, byte_size, fd, mm, owner=True)

    @classmethod
    def attach(cls, key: str) -> SharedMemoryRegion:
        """Map an existing shm object (all of it); ``close()`` then does not unlink it by default.

        Raises:
            InfScalerError: a bad key, or the object is missing / cannot be opened.
        """
        key = normalize_key(key, ())
        try:
            fd = _shm_open(key, os.O_RDWR)
        except OSError as exc:
            raise InfScalerError(f"cannot open shared memory object {key}: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 1:
                raise InfScalerError(f"shared memory object {key} is empty")
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(key, size, fd, mm, owner=False)

    def _check(self, offset: int, n: int, what: str) -> None:
        if self.buf is None:
            raise InfScalerError(f"shared memory region {self.key} is closed")
        if offset < 0 or offset + n > self.byte_size:
            raise InfScalerError(
                f"{what} of {n} bytes at offset {offset} does not fit shared memory {self.key} "
                f"({self.byte_size} bytes)"
            )

    def set(self, arrays: Sequence[np.ndarray] | np.ndarray, offset: int = 0) -> int:
        """Write ``arrays`` one after another from ``offset`` in the binary tensor layout;
        returns the bytes written.

        Raises:
            InfScalerError: they do not fit, or a dtype with no v2 datatype.
        """
        if isinstance(arrays, np.ndarray):
            arrays = [arrays]
        blobs = [tensor_to_bytes(np.asarray(a)) for a in arrays]
        total = sum(len(b) for b in blobs)
        self._check(offset, total, "writing")
        pos = offset
        for b in blobs:
            self.buf[pos : pos + len(b)] = b
            pos += len(b)
        return total

    def get(self, dtype: Any, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """A copy of the tensor at ``offset``: ``dtype`` a numpy dtype or v2 name (BYTES: an
        ``object`` array of ``bytes``).

        Raises:
            InfScalerError: the tensor would run past the region's end.
        """
        datatype, dt = _to_dtype(dtype)
        shape = [int(d) for d in shape]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if datatype == "BYTES":
            self._check(offset, 0, "reading")
            arr, _ = _parse_bytes(
                self.buf[offset:], count, f"shared memory {self.key}", exact=False
            )
            return arr.reshape(shape)
        n = count * dt.itemsize
        self._check(offset, n, "reading")
        return tensor_from_bytes(self.buf[offset : offset + n], datatype, shape)

    def close(self, unlink: bool | None = None) -> None:
        """Unmap; unlink the object too if ``unlink`` (default: if this created it).
        Idempotent."""
        if unlink is None:
            unlink = self._owner
        if self.buf is not None:
            self.buf.release()
            self.buf = None
            _close_map(self._mm)
            with contextlib.suppress(OSError):
                os.close(self._fd)
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                _shm_unlink(self.key)
            self._owner = False

    def __enter__(self) -> SharedMemoryRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.buf is None else "open"
        return f"SharedMemoryRegion({self.key!r}, byte_size={self.byte_size}, {state})"
