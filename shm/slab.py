"""The slab format both sides of the tensor pool share (InfScaler §IV-B, Fig. 4): slab
names, the header, size classes, :class:`SlotRef` and :class:`PoolError`, for the
allocator (:mod:`infscaler.shm.pool`) and the mappings (:mod:`infscaler.shm.slabmap`).
Nothing here opens shared memory.

Slab layout (bytes)::

    0      48    slab header (:data:`SLAB_HDR`): magic b"ISCSLAB1", version, state
                 (LIVE / RELEASED), slab id, slot count, first-slot offset, slot bytes,
                 slab bytes, generation
    4096   ...   slot 0, slot 1, ... each ``slot_bytes`` long

Names: ``/isc-<service_id>-<slab>`` (:func:`slab_name`), other objects
``/isc-<service_id>-<suffix>`` (:data:`SERVICE_OBJECT_SUFFIXES`). Slab ids are u16
(0xFFFF: "no slab"). Sources: InfScaler §IV-B; POSIX ``shm_open(3)``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from infscaler.base.errors import InfScalerError
from infscaler.ebpf.token import NO_SLAB, Token, TokenKind

__all__ = [
    "DEFAULT_SIZE_CLASSES",
    "SLAB_HEADER_BYTES",
    "PoolError",
    "SlotRef",
    "check_service_id",
    "slab_name",
]

KiB = 1024
MiB = 1024 * KiB
#: Slot capacities (bytes, header included): powers of two from 4 KiB to 128 MiB.
DEFAULT_SIZE_CLASSES: tuple[int, ...] = tuple(4 * KiB << i for i in range(16))
#: Bytes before the first slot of a slab (one page: slot 0 starts page-aligned).
SLAB_HEADER_BYTES = 4096
MAX_SLABS = NO_SLAB  # slab ids 0..0xFFFE; 0xFFFF means "no slab" in a token
MAX_INSTANCE = 0xFFFF

#: First 8 bytes of every slab and the layout version after them.
SLAB_MAGIC = b"ISCSLAB1"
SLAB_VERSION = 1
#: The slab header (48 bytes, little-endian): magic, version, state, slab id, reserved,
#: slot count, first-slot offset, slot bytes, slab bytes, generation.
SLAB_HDR = struct.Struct("<8sHHHHIIQQQ")
#: The header's state field (u16 at byte :data:`STATE_OFFSET`): :data:`STATE_LIVE` once
#: the manager has written the header, :data:`STATE_RELEASED` before it unlinks the slab.
SLAB_STATE = struct.Struct("<H")
STATE_OFFSET = 10
STATE_LIVE = 1
STATE_RELEASED = 2
_SERVICE_ID = re.compile(r"^[A-Za-z0-9_]{1,64}$")
#: Where Linux shows POSIX shared-memory objects (for listing; names are opened by
#: ``shm_open(3)``).
SHM_DIR = "/dev/shm"


class PoolError(InfScalerError):
    """A pool operation was refused: bad token / slot / owner, a closed pool, a request
    above the largest size class, or shared memory that cannot be created or attached."""


def check_service_id(service_id: str) -> str:
    """``service_id`` itself when it can name shared-memory objects (``[A-Za-z0-9_]{1,64}``).

    Raises:
        PoolError: anything else (with what is allowed).
    """
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
    return f"/isc-{check_service_id(service_id)}-{int(slab)}"


#: Name suffix of the front end's deadline table (:mod:`infscaler.shm.deadlines`).
DEADLINES_SUFFIX = "deadlines"
#: Shared-memory objects of a service besides its numbered slabs: ``isc-<id>-<suffix>``.
SERVICE_OBJECT_SUFFIXES = (DEADLINES_SUFFIX,)


@dataclass(frozen=True, slots=True, order=True)
class SlotRef:
    """One slot of the pool: ``slab`` id (u16, < 0xFFFF), ``slot`` index (u32), its byte
    ``offset`` in the slab (u32), ``size`` (the class's capacity, header included), and
    the ``request`` recorded with its lease when the ref was made, else None (not part of
    equality or hashing)."""

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
        """A token of ``kind`` naming this slot, for ``hop`` from ``instance``;
        ``length`` defaults to the capacity, ``request`` to :attr:`request` or 0."""
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
