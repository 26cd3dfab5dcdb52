"""The gRPC socket: a gate that knows each client from the kernel, in front of grpcio's
server on a private socket (grpcio's Python API gives no peer credentials: a Unix
socket's ``context.peer()`` is ``unix:``, and there is no hook on the accepted socket).

1. It accepts a connection on the public socket (0660, ``--socket-group``) and reads
   ``SO_PEERCRED`` / ``SO_PEERGROUPS`` (:func:`~infscaler.base.security.peer_of`);
2. admits it by the HTTP socket's connection quotas
   (:func:`~infscaler.base.quotas.admit_connection`; refused: closed, UNAVAILABLE);
3. connects to grpcio in a private 0700 directory from a socket bound to a fresh,
   never reused name there, which is every call's ``context.peer()``
   (:meth:`Gate.peer_of`; a name no longer held maps to uid -1, owning nothing);
4. relays both ways frame by frame (:mod:`~infscaler.api.grpc.relay`: bytes held
   against the in-flight budget as message prefixes pass, calls refused in the
   protocol) and closes the connection when it sends no preface within
   ``header_timeout_s``, a request or frame gets no byte, or the client reads nothing,
   for ``body_timeout_s``. Idle connections are grpcio's to close (``server_options``).

Cost: one more copy of every byte and a few Python steps per frame on the event loop;
three fds a connection (:func:`~infscaler.base.quotas.plan_fds`).

Sources: ``unix(7)`` (SO_PEERCRED, bound and unnamed addresses); grpc's
``grpc_sockaddr_to_uri`` (``unix:<path>`` peers); grpcio ``grpc.aio`` server.
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
_CHUNK = 1 << 18


def _peer(sock: socket.socket) -> Peer:
    """The :class:`Peer` of an accepted socket (what ``peer_of`` reads of a request)."""

    class _T:
        def get_extra_info(self, key: str) -> Any:
            return sock if key == "socket" else None

    class _R:
        transport = _T()

    return peer_of(_R())


class Gate:
    """The public gRPC socket's acceptor (see the module).

    Args:
        private_dir: a directory only the service's user may enter (0700), holding
            ``upstream`` (grpcio's socket) and the gate's per-connection names.
        max_connections / quotas: the connection limits (as the HTTP socket's) and the
            per-uid quotas (``streams_per_uid``: open calls over all a uid's connections).
        budget: the service's in-flight :class:`~infscaler.runtime.serving.admission.ByteBudget`
            (None: calls are not held to one).
        max_message: grpcio's largest request message, bytes.
        header_timeout_s: seconds for a new connection's preface to arrive.
        body_timeout_s: seconds a partial request, or a client not reading, may go
            without progress before the connection is closed.
        precheck: admission at an inference's message prefix (the relay's
            ``precheck``: :meth:`~infscaler.service.service.Service.precheck`; None:
            none there).
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

    @property
    def open_connections(self) -> int:
        return len(self._peers)

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
            await asyncio.get_running_loop().sock_connect(up, self.upstream)
            up_reader, up_writer = await asyncio.open_unix_connection(sock=up, limit=_CHUNK)
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
            await self._relay(peer, relay, reader, writer, up_reader, up_writer)
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

    async def _relay(self, peer: Peer, relay: Relay, reader, writer, up_reader, up_writer) -> None:
        """Both directions and the watchdog, until one of them ends (then all do)."""
        blocked: list[float | None] = [None]  # since when the write to the client waits
        held = asyncio.Event()  # set when the relay holds a refusal
        tasks = [
            asyncio.ensure_future(_upstream(relay, reader, writer, up_writer, peer, self, held)),
            asyncio.ensure_future(_downstream(relay, up_reader, writer, blocked, peer, self)),
            asyncio.ensure_future(self._watch(peer, relay, blocked)),
            asyncio.ensure_future(_held_refusals(relay, writer, held)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.error(
                        "gRPC connection of %s: relay failed",
                        peer.describe(),
                        exc_info=t.exception(),
                    )
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                up_writer.transport.abort()
            with contextlib.suppress(Exception):  # what is left (a GOAWAY) goes if it can
                if writer.transport.get_write_buffer_size():
                    writer.transport.abort()
                else:
                    writer.close()

    async def _watch(self, peer: Peer, relay: Relay, blocked: list) -> None:
        """Returns (the connection is closed) when the client sent no preface within
        ``header_timeout_s``, a request went quiet (:meth:`Relay.deadline`), or the
        client did not read for ``body_timeout_s``."""
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


async def _upstream(
    relay: Relay, reader, writer, up_writer, peer: Peer, gate: Gate, held: asyncio.Event
) -> None:
    """Client -> grpcio, scanned; frames the relay makes for the client go to it."""
    loop = asyncio.get_running_loop()
    try:
        while chunk := await reader.read(_CHUNK):
            pieces, back = relay.from_client(chunk)
            if back:
                writer.write(back)
            if relay.refusals:
                if relay.holding:
                    held.set()
                gate.refused(peer, relay)
            if len(pieces) == 1:
                up_writer.write(pieces[0])
            else:
                up_writer.writelines(pieces)
            if up_writer.transport.get_write_buffer_size():
                t0 = loop.time()
                await up_writer.drain()
                if loop.time() - t0 > 0.01:
                    relay.stalled(time.monotonic())
    except FrameError as exc:
        log.info("gRPC connection of %s closed: %s", peer.describe(), exc)
    except (ConnectionError, OSError):
        pass


async def _downstream(
    relay: Relay, up_reader, writer, blocked: list, peer: Peer, gate: Gate
) -> None:
    """grpcio -> client, scanned; ``blocked[0]`` says since when a write waits."""
    try:
        while chunk := await up_reader.read(_CHUNK):
            pieces = relay.from_server(chunk)
            if len(pieces) == 1:
                writer.write(pieces[0])
            else:
                writer.writelines(pieces)
            if writer.transport.get_write_buffer_size():
                blocked[0] = time.monotonic()
                await writer.drain()
                blocked[0] = None
    except FrameError as exc:
        log.warning(
            "gRPC connection of %s: grpcio's bytes are not HTTP/2: %s", peer.describe(), exc
        )
    except (ConnectionError, OSError):
        pass
