"""The control channel: token handover and token faults (InfScaler §IV-B, Fig. 4), as
``ebpf`` (:class:`~infscaler.ebpf.sockmap.EbpfChannel`) or ``userspace``
(:class:`~infscaler.ebpf.userspace.UserspaceChannel`), chosen by
:func:`~infscaler.ebpf.probe.open_channel`.

Sources: InfScaler §IV-B; shared/notes/ebpf.md; kernel Documentation/bpf/map_sockmap.rst.
More: docs/architecture.md, "`ebpf/channel.py`".
"""

from __future__ import annotations

import errno
import logging
import math
import select
import socket
import struct
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from infscaler.ebpf.errors import ChannelClosed, ChannelError
from infscaler.ebpf.token import NO_SLAB, TOKEN_FORMAT, TOKEN_MAGIC, TOKEN_SIZE, Token, TokenKind

log = logging.getLogger("infscaler.ebpf")

POLICIES = ("least-loaded", "round-robin")
#: Hops 0 .. MAX_HOPS-1 (the eBPF object's TB_MAX_STAGES).
MAX_HOPS = 64
#: Live instances per hop (TB_PER_STAGE).
MAX_PER_HOP = 16
#: Instance ids are the token's u16 ``instance`` field.
MAX_INSTANCE_ID = 0xFFFF
#: DATA tokens in flight over all instances (TB_MAX_TRACKED).
MAX_TRACKED = 65536
#: Tokens per send (4096 bytes): one kernel sk_msg, routed token by token.
MAX_BATCH = 128

REJECT_REASONS = ("bad_magic", "bad_crc", "bad_kind", "short", "unknown_stage")


def build_stats(
    kind: str,
    policy: str,
    counters: dict[str, int],
    rejected: dict[str, int],
    instances: dict[int, dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """The :meth:`Channel.stats` dict both channels return, from ``counters``, ``rejected`` per
    reason, ``instances`` and channel-specific ``extra`` keys.
    """
    hops: dict[int, dict[str, Any]] = {}
    for iid, row in instances.items():
        st = hops.setdefault(row["stage"], {"instances": [], "delivered": 0, "inflight": 0})
        if row["live"]:
            st["instances"].append(iid)
        st["delivered"] += row["delivered"]
        st["inflight"] += row["inflight"]
    keys = (
        "delivered",
        "acked",
        "to_manager",
        "direct",
        "no_instance",
        "redirect_failed",
        "inflight_full",
        "inflight_duplicate",
        "dead_letters",
    )
    return {
        "kind": kind,
        "policy": policy,
        **{k: counters[k] for k in keys},
        "rejected": dict(rejected),
        "rejected_total": sum(rejected.values()),
        **extra,
        "instances": instances,
        "stages": hops,
    }


_RECV_BUF = 64 * 1024
_SEND_RETRIES = 3


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _remaining_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


_FRAME = struct.Struct("<" + TOKEN_FORMAT[1:] + "I")  # the 32 bytes, CRC included
_BODY = struct.Struct(TOKEN_FORMAT)
_CRC = struct.Struct("<I")


def pack_frame(
    kind: int,
    hop: int = 0,
    slab: int = NO_SLAB,
    instance: int = 0,
    slot: int = 0,
    offset: int = 0,
    length: int = 0,
    request: int = 0,
) -> bytes:
    """``Token(...).pack()``'s 32 bytes without building a :class:`Token`; struct.error when out of range."""
    body = _BODY.pack(TOKEN_MAGIC, kind, hop, slab, instance, slot, offset, length, request)
    return body + _CRC.pack(zlib.crc32(body))


def frame_fields(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, ...]:
    """(magic, kind, hop, slab, instance, slot, offset, length, request, crc) of the
    frame at ``offset``, unchecked: for frames from :meth:`Endpoint.recv_bytes`."""
    return _FRAME.unpack_from(data, offset)


def valid_frame(view: bytes | bytearray | memoryview, off: int = 0) -> bool:
    """True if the 32 bytes at ``off`` are a token: magic, kind 1..6, CRC-32."""
    return (
        view[off] == TOKEN_MAGIC
        and 1 <= view[off + 1] <= 6
        and zlib.crc32(view[off : off + 28]) == _CRC.unpack_from(view, off + 28)[0]
    )


class Endpoint:
    """One side of a control connection over ``sock`` from :meth:`Channel.add_instance`, in any
    process; non-blocking, waits in ``poll(2)``. Invalid frames are counted in
    :attr:`rejected`, a partial frame at EOF in :attr:`truncated`.
    """

    def __init__(self, sock: socket.socket | int, instance: int | None = None) -> None:
        if isinstance(sock, int):
            sock = socket.socket(fileno=sock)
        self._sock = sock
        self._sock.setblocking(False)
        self.instance = instance
        self.rejected = 0
        self.truncated = 0
        self._ready = bytearray()  # validated frames not yet returned
        self._head = 0  # read offset into _ready
        self._partial = b""
        self._rx = bytearray(_RECV_BUF)
        self._rxv = memoryview(self._rx)
        self._poll = select.poll()
        self._poll.register(self._sock.fileno(), select.POLLIN)
        self._closed = False

    # -- sending -------------------------------------------------------------------------
    def send(self, token: Token, timeout: float | None = None) -> None:
        """Send one token. See :meth:`send_bytes` for errors."""
        self.send_bytes(token.pack(), timeout)

    def send_many(self, tokens: Iterable[Token], timeout: float | None = None) -> None:
        """Send tokens, :data:`MAX_BATCH` per send call; raises as :meth:`send_bytes`."""
        self.send_bytes(b"".join(t.pack() for t in tokens), timeout)

    def send_bytes(
        self, data: bytes | bytearray | memoryview, timeout: float | None = None
    ) -> None:
        """Send packed tokens, :data:`MAX_BATCH` per call, waiting while the buffer is full up to
        ``timeout`` s (None: no limit).

        Raises:
            ValueError: ``len(data)`` is not a multiple of 32.
            TimeoutError: the send buffer stayed full past ``timeout``.
            ChannelClosed: the connection is gone (EPIPE, ECONNRESET, EACCES).
            ChannelError: the kernel split a frame.
        """
        view = memoryview(data).cast("B")
        if len(view) % TOKEN_SIZE:
            raise ValueError(f"send whole {TOKEN_SIZE}-byte tokens, got {len(view)} bytes")
        deadline = _deadline(timeout)
        step = MAX_BATCH * TOKEN_SIZE
        for start in range(0, len(view), step):
            self._send_chunk(view[start : start + step], deadline)

    def _send_chunk(self, view: memoryview, deadline: float | None) -> None:
        failures = 0
        while view:
            try:
                n = self._sock.send(view)
            except BlockingIOError:
                self._wait(select.POLLOUT, deadline, "send")
                continue
            except InterruptedError:
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                # eBPF: EPIPE also reports a redirect target that vanished after the
                # program chose it (the token was not queued): resending re-routes it.
                failures += 1
                if failures >= _SEND_RETRIES:
                    raise ChannelClosed(f"control connection closed: {exc}") from None
                time.sleep(0.001 * failures)
                continue
            except PermissionError:
                raise ChannelClosed(
                    "the eBPF router refused the send (EACCES): the channel is closed"
                ) from None
            except OSError as exc:
                if exc.errno in (errno.ENOMEM, errno.ENOBUFS) and failures < _SEND_RETRIES:
                    failures += 1
                    time.sleep(0.001 * failures)
                    continue
                raise ChannelError(f"send failed: {exc}") from None
            if n % TOKEN_SIZE:
                raise ChannelError(f"the kernel accepted {n} bytes: a token was split")
            view = view[n:]

    # -- receiving -----------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> Token:
        """The next token within ``timeout`` s (None: forever); TimeoutError, or ChannelClosed."""
        toks = self.recv_many(1, timeout)
        if not toks:
            raise TimeoutError(f"no token within {timeout} s")
        return toks[0]

    def recv_many(self, max_tokens: int = MAX_BATCH, timeout: float | None = None) -> list[Token]:
        """Up to ``max_tokens`` arrived tokens, oldest first, waiting up to ``timeout`` s for the first
        (0: no wait); ``[]`` on timeout; ChannelClosed when closed and drained.
        """
        data = self.recv_bytes(max_tokens, timeout)
        unpack = Token.unpack
        return [unpack(data[i : i + TOKEN_SIZE]) for i in range(0, len(data), TOKEN_SIZE)]

    def recv_bytes(self, max_tokens: int = MAX_BATCH, timeout: float | None = None) -> bytes:
        """As :meth:`recv_many`, the validated frames as one ``bytes`` (``32 * n``)."""
        if self._head >= len(self._ready):
            deadline = _deadline(timeout)
            while not self._fill():
                if deadline is not None and time.monotonic() >= deadline:
                    return b""
                self._wait(select.POLLIN, deadline, None)
        end = min(len(self._ready), self._head + max_tokens * TOKEN_SIZE)
        out = bytes(self._ready[self._head : end])
        self._head = end
        if self._head >= len(self._ready):
            self._ready.clear()
            self._head = 0
        return out

    def pending(self) -> int:
        """Tokens already received and buffered (returned without a system call)."""
        return (len(self._ready) - self._head) // TOKEN_SIZE

    def _fill(self) -> bool:
        """One non-blocking read; True if frames are ready afterwards."""
        try:
            n = self._sock.recv_into(self._rx)
        except (BlockingIOError, InterruptedError):
            return self._head < len(self._ready)
        except ConnectionResetError:
            n = 0
        if n == 0:
            if self._partial:
                self.truncated += 1
                self._partial = b""
            if self._head < len(self._ready):
                return True
            raise ChannelClosed("control connection closed by the peer")
        data: bytes | memoryview = self._rxv[:n]
        if self._partial:
            data = memoryview(self._partial + bytes(data))
            self._partial = b""
        full = len(data) - len(data) % TOKEN_SIZE
        if full < len(data):
            self._partial = bytes(data[full:])
        ready = self._ready
        crc32 = zlib.crc32
        crc_at = _CRC.unpack_from
        for off in range(0, full, TOKEN_SIZE):
            if (
                data[off] == TOKEN_MAGIC
                and 1 <= data[off + 1] <= 6
                and crc32(data[off : off + 28]) == crc_at(data, off + 28)[0]
            ):
                ready += data[off : off + TOKEN_SIZE]
            else:
                self.rejected += 1
        return self._head < len(self._ready)

    def _wait(self, events: int, deadline: float | None, what: str | None) -> None:
        self._poll.modify(self._sock.fileno(), events)
        ms = _remaining_ms(deadline)
        ready = self._poll.poll(ms)
        if not ready and what is not None and deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{what} blocked past its timeout")

    def fileno(self) -> int:
        """The socket's fd (for selectors)."""
        return self._sock.fileno()

    @property
    def socket(self) -> socket.socket:
        """The wrapped socket (tests use it to send raw, malformed bytes)."""
        return self._sock

    def close(self) -> None:
        """Close the socket (an instance that closes simply stops receiving)."""
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_policy(policy: str) -> str:
    """``policy`` if in :data:`POLICIES`, else ChannelError listing them."""
    if policy not in POLICIES:
        raise ChannelError(f"unknown routing policy {policy!r}", hint=f"use one of {POLICIES}")
    return policy


class Channel(ABC):
    """Manager side of the control path: ``kind`` (``'ebpf'`` / ``'userspace'``), ``policy`` and
    ``reason`` (the probe's verdict).
    """

    kind: str = ""

    def __init__(self, policy: str) -> None:
        self.policy = check_policy(policy)
        self.reason = ""
        self._hop_of: dict[int, int] = {}

    # -- membership ------------------------------------------------------------------------
    @abstractmethod
    def add_instance(self, hop: int, instance: int, *, live: bool = True) -> socket.socket:
        """Create ``instance``'s connection and route DATA for ``hop`` to it (once :meth:`set_live`
        when ``live`` is False); returns the instance-side socket (close the caller's copy).

        Raises:
            ChannelError: hop or instance id out of range, instance already added, or the hop
                full (:data:`MAX_PER_HOP`).
        """

    @abstractmethod
    def set_live(self, instance: int) -> None:
        """Start routing DATA to ``instance`` (no-op when live); ChannelError when unknown."""

    @abstractmethod
    def remove_instance(self, instance: int) -> list[Token]:
        """Stop routing to (stopped) ``instance`` and return its unacknowledged DATA tokens for
        :meth:`route`; ChannelError when unknown.
        """

    def instances(self) -> dict[int, int]:
        """Registered instances: id -> hop."""
        return dict(self._hop_of)

    # -- manager traffic --------------------------------------------------------------------
    def manager_recv(self, timeout: float | None = None) -> Token | None:
        """The next token for the manager within ``timeout`` s, None on timeout; ChannelClosed."""
        toks = self.manager_recv_many(1, timeout)
        return toks[0] if toks else None

    def manager_recv_many(
        self, max_tokens: int = MAX_BATCH, timeout: float | None = None
    ) -> list[Token]:
        """Up to ``max_tokens`` tokens for the manager; [] on timeout. See :meth:`manager_recv`."""
        data = self.manager_recv_bytes(max_tokens, timeout)
        return [Token.unpack(data[i : i + TOKEN_SIZE]) for i in range(0, len(data), TOKEN_SIZE)]

    @abstractmethod
    def manager_recv_bytes(
        self, max_tokens: int = MAX_BATCH, timeout: float | None = None
    ) -> bytes:
        """:meth:`manager_recv_many` as validated 32-byte frames (the high-rate path)."""

    def manager_send(self, instance: int, token: Token) -> None:
        """Send ``token`` to ``instance`` (its ``instance`` field set); ChannelError when unknown."""
        self.manager_send_many(instance, [token])

    def manager_send_many(self, instance: int, tokens: Iterable[Token]) -> None:
        """:meth:`manager_send` for several tokens (one system call per :data:`MAX_BATCH`)."""
        self.manager_send_bytes(instance, self._pack_direct(instance, tokens))

    @abstractmethod
    def manager_send_bytes(self, instance: int, data: bytes) -> None:
        """Send packed tokens addressed to ``instance``.

        Raises:
            ChannelError: unknown instance, or a frame addressed to another instance.
            ValueError: ``len(data)`` not a multiple of 32.
        """

    def route(self, token: Token) -> None:
        """Inject a DATA token for its hop, routed by the policy; ChannelError for other kinds."""
        self.route_many([token])

    @abstractmethod
    def route_many(self, tokens: Iterable[Token]) -> None:
        """:meth:`route` for several tokens."""

    # -- introspection ----------------------------------------------------------------------
    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters, the same keys for both implementations.

        - ``kind``, ``policy``
        - ``delivered``: DATA delivered to instances (routed + :meth:`manager_send`)
        - ``acked``: in-flight tokens acknowledged
        - ``to_manager``: tokens handed to the manager (FAULT, FREE, undeliverable DATA)
        - ``direct``: tokens the manager sent to one instance
        - ``rejected``: {``bad_magic``, ``bad_crc``, ``bad_kind``, ``short``,
          ``unknown_stage``}; ``rejected_total``: their sum
        - ``no_instance``: DATA for a registered hop without a live instance
        - ``redirect_failed``: the chosen instance vanished under the router (eBPF)
        - ``inflight_full``: in-flight table full (:data:`MAX_TRACKED`)
        - ``inflight_duplicate``: same (request, instance) already in flight
        - ``dead_letters``: non-DATA tokens for an instance whose socket had closed
        - ``instances``: {id: {``stage`` (its hop), ``live``, ``delivered``, ``acked``,
          ``inflight``}, plus ``reclaimed`` once removed}
        - ``stages``: {hop: {``instances`` (live ids), ``delivered``, ``inflight``}}

        The eBPF channel adds diagnostics: ``pulled`` (tokens that straddled two pages,
        linearised in the kernel), ``unregistered``, ``trash_bytes``.
        """

    @abstractmethod
    def close(self) -> None:
        """Tear down: instances see EOF. Idempotent."""

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared validation -------------------------------------------------------------------
    def _check_new(self, hop: int, instance: int) -> None:
        if not 0 <= hop < MAX_HOPS:
            raise ChannelError(f"hop {hop} outside 0..{MAX_HOPS - 1}")
        if not 0 <= instance <= MAX_INSTANCE_ID:
            raise ChannelError(f"instance id {instance} outside 0..{MAX_INSTANCE_ID}")
        if instance in self._hop_of:
            raise ChannelError(f"instance {instance} is already registered")

    def _check_known(self, instance: int) -> int:
        try:
            return self._hop_of[instance]
        except KeyError:
            raise ChannelError(f"unknown instance {instance}") from None

    @staticmethod
    def _pack_route(tokens: Iterable[Token]) -> bytes:
        out = []
        for t in tokens:
            if t.kind != TokenKind.DATA:
                raise ChannelError(f"route() takes DATA tokens, got {t.kind.name}")
            out.append(t.pack())
        return b"".join(out)

    @staticmethod
    def _check_addressed(instance: int, data: bytes) -> None:
        if len(data) % TOKEN_SIZE:
            raise ValueError(f"send whole {TOKEN_SIZE}-byte tokens, got {len(data)} bytes")
        lo, hi = instance & 0xFF, instance >> 8
        for off in range(0, len(data), TOKEN_SIZE):
            if data[off + 6] != lo or data[off + 7] != hi:
                raise ChannelError(
                    f"frame {off // TOKEN_SIZE} is addressed to instance "
                    f"{data[off + 6] | data[off + 7] << 8}, not {instance}"
                )

    @staticmethod
    def _pack_direct(instance: int, tokens: Iterable[Token]) -> bytes:
        return b"".join(
            Token(t.kind, t.hop, t.slab, instance, t.slot, t.offset, t.length, t.request).pack()
            for t in tokens
        )
