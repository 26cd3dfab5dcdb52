"""The 32-byte token (InfScaler §IV-B, Fig. 4).

A token names a slot of the shared tensor pool; handing the token over hands the slot's
contents over, zero-copy. Tokens travel on the control path (:mod:`infscaler.ebpf`):
producers send them, the eBPF SK_MSG program (or the user-space router) reads the
destination hop at a fixed offset and delivers them to one consumer instance.

Wire layout, little-endian, 32 bytes (``struct`` format :data:`TOKEN_FORMAT`)::

    offset size field        meaning
    0      1    magic        0xA5: anything else is not a token
    1      1    kind         :class:`TokenKind`
    2      2    hop          destination hop (DATA), or the hop a fault is for
    4      2    slab         slab index in the pool
    6      2    instance     sending instance id (for in-flight accounting / leases)
    8      4    slot         slot index inside the slab
    12     4    offset       byte offset of the slot inside the slab
    16     4    length       bytes used in the slot (header + tensors), or bytes wanted (FAULT)
    20     8    request      request id (u64)
    28     4    check        CRC-32 of bytes 0..27: a torn or corrupted token is rejected

The eBPF program (``ebpf/tokenbus.bpf.c``) reads ``kind`` at offset 1, ``hop`` at 2 (it
calls it ``stage``) and ``instance`` at 6; keep them in sync.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

TOKEN_SIZE = 32
TOKEN_MAGIC = 0xA5
TOKEN_FORMAT = "<BBHHHIIIQ"  # without the trailing u32 check
_BODY = struct.Struct(TOKEN_FORMAT)
_CHECK = struct.Struct("<I")
assert _BODY.size + _CHECK.size == TOKEN_SIZE

NO_SLAB = 0xFFFF


class TokenKind(enum.IntEnum):
    """What a token means: ``DATA`` (a filled slot for ``hop``), ``FAULT`` (asks for a slot of
    at least ``length`` bytes), ``GRANT`` (an empty slot now owned by the asker), ``FREE`` (a
    slot back to the pool), ``BUSY`` (at the memory cap: retry), ``ERROR`` (``request``
    failed).
    """

    DATA = 1
    FAULT = 2
    GRANT = 3
    FREE = 4
    BUSY = 5
    ERROR = 6


class TokenError(ValueError):
    """Bytes that are not a valid token (wrong size, magic, kind or checksum)."""


@dataclass(frozen=True, slots=True)
class Token:
    """A decoded token (wire layout: the module docstring); copy with ``dataclasses.replace``.

    ``hop``: the routing address of a group of interchangeable instances; ``slab``:
    ``NO_SLAB`` for tokens without a slot; ``length``: bytes used, for FAULT bytes wanted.
    """

    kind: TokenKind
    hop: int = 0
    slab: int = NO_SLAB
    instance: int = 0
    slot: int = 0
    offset: int = 0
    length: int = 0
    request: int = 0

    def pack(self) -> bytes:
        """The 32 wire bytes; struct.error for a field out of range."""
        body = _BODY.pack(
            TOKEN_MAGIC,
            int(self.kind),
            self.hop,
            self.slab,
            self.instance,
            self.slot,
            self.offset,
            self.length,
            self.request,
        )
        return body + _CHECK.pack(zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Token:
        """Decode 32 wire bytes; TokenError for wrong size, magic, kind or checksum."""
        if len(data) != TOKEN_SIZE:
            raise TokenError(f"a token is {TOKEN_SIZE} bytes, got {len(data)}")
        data = bytes(data)
        body = data[: _BODY.size]
        (check,) = _CHECK.unpack_from(data, _BODY.size)
        fields = _BODY.unpack(body)
        if fields[0] != TOKEN_MAGIC:
            raise TokenError(f"bad token magic 0x{fields[0]:02x}")
        if zlib.crc32(body) != check:
            raise TokenError("token checksum mismatch (torn or corrupted token)")
        try:
            kind = TokenKind(fields[1])
        except ValueError:
            raise TokenError(f"unknown token kind {fields[1]}") from None
        return cls(kind, *fields[2:])
