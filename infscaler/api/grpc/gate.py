"""The public gRPC socket: a gate that knows each client from the kernel (``SO_PEERCRED``),
admits it by the connection quotas and relays its frames to grpcio's server on a private
socket, one fresh bound name per connection (its ``context.peer()``).

How and why: docs/api.md, "`infscaler/api/grpc/gate.py`".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import tempfile
import time
from typing import Any

from infscaler.api.grpc.h2frames import FrameError
from infscaler.api.grpc.relay import Relay
from infscaler.base.quotas import PeerQuotas, admit_connection
from infscaler.base.ratelog import RateLimitedLog
from infscaler.base.security import Peer, peer_of

__all__ = ["NOBODY", "Gate"]

log = logging.getLogger("infscaler.api.grpc")

#: the peer of a call whose connection the gate no longer holds
NOBODY = Peer(-1, -1, -1)


def _peer(sock: socket.socket) -> Peer:
    """The :class:`Peer` of an accepted socket (what ``peer_of`` reads of a request)."""

    class _T:
        def get_extra_info(self, key: str) -> Any:
            return sock if key == "socket" else None

    class _R:
        transport = _T()

    return peer_of(_R())


class Gate:
    """The public gRPC socket's acceptor.

    Args:
        private_dir: a 0700 directory holding ``upstream`` (grpcio's socket) and the
            gate's per-connection names.
        max_connections / quotas: the connection limits and per-uid quotas (as the HTTP
            socket's; ``streams_per_uid``: open calls over all a uid's connections).
        budget: the service's in-flight :class:`~infscaler.runtime.serving.admission.ByteBudget`
            (None: calls are not held to one).
        max_message: grpcio's largest request message, bytes.
        header_timeout_s: seconds for a new connection's preface to arrive.
        body_timeout_s: seconds a partial request, or a client not reading, may go
            without progress before the connection is closed.
        precheck: admission at an inference's message prefix
            (:meth:`~infscaler.service.service.Service.precheck`; None: none).
    """

    def __init__(
        self,
        private_dir: str,
        max_connections: int,
        quotas: PeerQuotas,
        *,
        budget: Any = None,
        max_message: int = 64 << 20,
        header_timeout_s: float = 30.0,
        body_timeout_s: float = 120.0,
        precheck: Any = None,
    ) -> None:
        self.precheck = precheck
        self.private_dir = private_dir
        self.upstream = os.path.join(private_dir, "upstream")
        self.max_connections = max_connections
        self.quotas = quotas
        self.budget = budget if budget is not None else _Unbounded()
        self.max_message = max_message
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self._peers: dict[str, Peer] = {}
        self._by_uid: dict[int, int] = {}
        #: open calls per uid (privileged peers not counted)
        self.streams: dict[int, int] = {}
        self._ids = itertools.count()
        #: connections admitted since the start
        self.accepted = 0
        #: calls the gate refused in the protocol (budget, quota, admission at the prefix)
        self.calls_refused = 0
        self._refusals = RateLimitedLog(log, 10.0)  # one line per cause every 10 s

    @staticmethod
    def make_private_dir(near: str) -> str:
        """A fresh 0700 directory next to ``near`` (the public socket), or in the
        temporary directory when that path would be too long for Unix socket names."""
        parent = os.path.dirname(os.path.abspath(near))
        if len(parent) + 40 > 107:
            return tempfile.mkdtemp(prefix="isc-grpc-")
        return tempfile.mkdtemp(prefix=".isc-grpc-", dir=parent)

    def peer_of(self, context: Any) -> Peer:
        """The peer of a gRPC call (``context.peer()`` is ``unix:<the gate's name>``)."""
        name = context.peer()
        if name.startswith("unix:"):
            return self._peers.get(name[5:], NOBODY)
        return NOBODY

    async def on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: identified, admitted, then relayed to grpcio's socket."""
        sock = writer.get_extra_info("socket")
        peer = _peer(sock) if sock is not None else NOBODY
        why = admit_connection(
            peer.privileged and peer.uid >= 0,
            len(self._peers),
            self._by_uid.get(peer.uid, 0),
            self.max_connections,
            self.quotas,
        )
        if why is not None or peer.uid < 0:
            self._refusals.log(
                logging.WARNING,
                "gRPC connection of %s refused: %s",
                peer.describe(),
                why or "no credentials",
                key="refused",
            )
            writer.close()
            return
        name = os.path.join(self.private_dir, f"c{next(self._ids)}")
        self.accepted += 1
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._peers[name] = peer
        self._by_uid[peer.uid] = self._by_uid.get(peer.uid, 0) + 1
        relay = None
        try:
            up.bind(name)
            up.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(up, self.upstream)
            privileged = peer.privileged
            relay = Relay(
                None if privileged else peer.uid,
                self.budget,
                self.streams,
                None if privileged else self.quotas.streams_per_uid,
                self.max_message,
                self.body_timeout_s,
                time.monotonic,
                self.precheck,
            )
            _, server = await loop.create_unix_connection(_Side, sock=up)
            client = _Side()
            # what the event loop reads goes to the relay as it comes, no stream buffer
            # between; what the reader took before the switch goes first
            writer.transport.set_protocol(client)
            client.connection_made(writer.transport)
            # the client's EOF may have come before the switch (CPython's StreamReader
            # keeps it in _eof); then the relay ends once the early bytes are passed on
            ended = getattr(reader, "_eof", False) or writer.transport.is_closing()
            reader.feed_eof()
            early = await reader.read()  # at EOF with its bytes: returns without waiting
            await self._relay(peer, relay, client, server, early, ended)
        except OSError as exc:
            log.warning("gRPC connection of %s: upstream failed: %s", peer.describe(), exc)
        finally:
            if relay is not None:
                relay.close()
            up.close()
            writer.close()
            del self._peers[name]
            left = self._by_uid[peer.uid] - 1
            if left:
                self._by_uid[peer.uid] = left
            else:
                del self._by_uid[peer.uid]
            with contextlib.suppress(OSError):
                os.unlink(name)

    async def _relay(
        self, peer: Peer, relay: Relay, client: _Side, server: _Side, early: bytes, ended: bool
    ) -> None:
        """Both directions (:func:`_pump`) and the watchdog until one ends (then all do);
        ``early`` / ``ended``: the client's bytes and EOF read before ``client`` took its socket."""
        blocked: list[float | None] = [None]  # since when the write to the client waits
        held = asyncio.Event()  # set when the relay holds a refusal
        _pump(relay, client, server, blocked, peer, self, held)
        tasks = [
            client.done,
            server.done,
            asyncio.ensure_future(self._watch(peer, relay, blocked)),
            asyncio.ensure_future(_held_refusals(relay, client.transport, held)),
        ]
        if early:
            client.data_received(early)
        if ended:
            client.eof_received()
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = None if t.cancelled() else t.exception()
                if isinstance(exc, FrameError) and t is client.done:
                    log.info("gRPC connection of %s closed: %s", peer.describe(), exc)
                elif isinstance(exc, FrameError):
                    log.warning(
                        "gRPC connection of %s: grpcio's bytes are not HTTP/2: %s",
                        peer.describe(),
                        exc,
                    )
                elif exc is not None:
                    log.error("gRPC connection of %s: relay failed", peer.describe(), exc_info=exc)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                server.transport.abort()
            with contextlib.suppress(Exception):  # what is left (a GOAWAY) goes if it can
                if client.transport.get_write_buffer_size():
                    client.transport.abort()
                else:
                    client.transport.close()

    async def _watch(self, peer: Peer, relay: Relay, blocked: list) -> None:
        """Returns (the connection is then closed) when the client sent no preface in time, a
        request went quiet (:meth:`Relay.deadline`), or the client did not read for ``body_timeout_s``."""
        started = time.monotonic()
        while True:
            now = time.monotonic()
            due, why = None, ""
            if not relay.up.preface_done:
                due, why = started + self.header_timeout_s, "no HTTP/2 preface (--header-timeout)"
            d = relay.deadline()
            if d is not None and (due is None or d < due):
                due, why = d, "a request stopped arriving (--body-timeout)"
            b = blocked[0]
            if b is not None and (due is None or b + self.body_timeout_s < due):
                due, why = (
                    b + self.body_timeout_s,
                    "it does not read its responses (--body-timeout)",
                )
            if due is not None and due <= now:
                self._refusals.log(
                    logging.WARNING,
                    "gRPC connection of %s closed: %s",
                    peer.describe(),
                    why,
                    key="timeout",
                )
                return
            # a deadline appearing meanwhile is at least body_timeout_s away
            wake = now + self.body_timeout_s
            await asyncio.sleep((wake if due is None else min(due, wake)) - now)

    def refused(self, peer: Peer, relay: Relay) -> None:
        """Count and log the calls ``relay`` refused (the log rate-limited)."""
        self.calls_refused += len(relay.refusals)
        for why in relay.refusals:
            self._refusals.log(
                logging.INFO, "gRPC call of %s refused: %s", peer.describe(), why, key="call"
            )
        relay.refusals.clear()


class _Unbounded:
    """A budget that admits everything (a gate without the service's)."""

    def reserve(self, nbytes: int, peer: Any = None) -> Any:
        from infscaler.runtime.serving.admission import Admission

        return Admission(True)

    def charge(self, nbytes: int, peer: Any = None) -> None:
        pass

    def release(self, nbytes: int, peer: Any = None) -> None:
        pass


async def _held_refusals(relay: Relay, writer, held: asyncio.Event) -> None:
    """Sends the relay's held refusals as they fall due (:meth:`Relay.release_due`);
    ``held`` wakes it when one is added. Never returns (cancelled with the others)."""
    while True:
        due = relay.next_due()
        if due is None:
            await held.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.wait(), max(0.0, due - time.monotonic()))
        held.clear()
        out = relay.release_due(time.monotonic())
        if out:
            writer.write(out)


class _Side(asyncio.Protocol):
    """One socket of a relayed connection: bytes read go to :attr:`on_data` as they come;
    :attr:`done` resolves when the socket ends (None) or :attr:`on_data` raised (the
    exception). While this side's writes are paused, :attr:`other` stops reading.
    Source: asyncio "Protocols".
    """

    def __init__(self) -> None:
        self.transport: Any = None
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.on_data: Any = None
        self.other: _Side | None = None
        self.on_pause: Any = None
        self.on_resume: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        try:
            self.on_data(data)
        except Exception as exc:  # noqa: BLE001 - ends the connection; _relay logs it
            self.done.set_exception(exc)

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause()
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.on_resume is not None:
            self.on_resume()
        if self.other is not None and self.other.transport is not None:
            with contextlib.suppress(RuntimeError):  # it closed meanwhile
                self.other.transport.resume_reading()


def _pump(
    relay: Relay,
    client: _Side,
    server: _Side,
    blocked: list,
    peer: Peer,
    gate: Gate,
    held: asyncio.Event,
) -> None:
    """Wire the two sides through :meth:`Relay.from_client` / :meth:`Relay.from_server`;
    ``blocked[0]``: since when a write to the client waits; a write to grpcio that waits
    over 10 ms calls :meth:`Relay.stalled`."""
    to_client, to_server = client.transport, server.transport
    client.other, server.other = server, client
    up_paused: list[float | None] = [None]

    def from_client(chunk: bytes) -> None:
        pieces, back = relay.from_client(chunk)
        if back:
            to_client.write(back)
        if relay.refusals:
            if relay.holding:
                held.set()
            gate.refused(peer, relay)
        if len(pieces) == 1:
            to_server.write(pieces[0])
        else:
            to_server.writelines(pieces)

    def from_server(chunk: bytes) -> None:
        pieces = relay.from_server(chunk)
        if len(pieces) == 1:
            to_client.write(pieces[0])
        else:
            to_client.writelines(pieces)

    def server_paused() -> None:
        up_paused[0] = time.monotonic()

    def server_resumed() -> None:
        since, up_paused[0] = up_paused[0], None
        now = time.monotonic()
        if since is not None and now - since > 0.01:
            relay.stalled(now)

    def client_paused() -> None:
        blocked[0] = time.monotonic()

    def client_resumed() -> None:
        blocked[0] = None

    client.on_data, server.on_data = from_client, from_server
    server.on_pause, server.on_resume = server_paused, server_resumed
    client.on_pause, client.on_resume = client_paused, client_resumed
