"""The gRPC socket: a gate that knows each client from the kernel, in front of grpcio's
server on a private socket.

grpcio's Python API does not give a call's peer credentials: ``context.peer()`` of a Unix
socket connection is ``unix:`` (the client's unnamed address) and
``grpc.local_server_credentials(LocalConnectionType.UDS)`` adds only
``transport_security_type: local`` to the auth context; there is no hook on the
accepted socket. So the public socket (mode 0660, the ``--socket-group``: bound as the
HTTP one, :func:`~infscaler.api.sockets.bind_unix_socket`) is served by this gate:

1. it accepts a connection and reads the peer's uid, gid, pid and groups
   (``SO_PEERCRED``, ``SO_PEERGROUPS``: :func:`~infscaler.base.security.peer_of`);
2. it admits it or not by the same connection quotas as the HTTP socket
   (:func:`~infscaler.base.quotas.admit_connection`: per uid, the operator's share;
   a refused connection is closed at once: the client sees UNAVAILABLE);
3. it connects to grpcio's server, listening in a private 0700 directory only the
   service's user can enter, from a socket *bound to a fresh name in that directory*:
   ``context.peer()`` of every call on it is then ``unix:<that name>``, which the gate
   maps to the peer (:meth:`Gate.peer_of`);
4. it copies bytes both ways until either side closes (HTTP/2 frames, not parsed).

A name is never reused, and one no longer in the table (the connection is gone) maps
to a peer with uid -1, which is never privileged and owns nothing.

Cost: one more copy of every byte through the service's event loop (the HTTP socket
has none); large tensors should go through system shared memory either way.

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
from typing import Any

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
        max_connections / quotas: the connection limits (as the HTTP socket's).
    """

    def __init__(self, private_dir: str, max_connections: int, quotas: PeerQuotas) -> None:
        self.private_dir = private_dir
        self.upstream = os.path.join(private_dir, "upstream")
        self.max_connections = max_connections
        self.quotas = quotas
        self._peers: dict[str, Peer] = {}
        self._by_uid: dict[int, int] = {}
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
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
        """One client connection: identified, admitted, then spliced to grpcio's socket."""
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
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._peers[name] = peer
        self._by_uid[peer.uid] = self._by_uid.get(peer.uid, 0) + 1
        try:
            up.bind(name)
            up.setblocking(False)
            await asyncio.get_running_loop().sock_connect(up, self.upstream)
            up_reader, up_writer = await asyncio.open_unix_connection(sock=up, limit=_CHUNK)
            await asyncio.gather(
                _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
            )
        except OSError as exc:
            log.warning("gRPC connection of %s: upstream failed: %s", peer.describe(), exc)
        finally:
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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of file, then close ``writer``; a full
    writer holds the reader (``drain``), so the gate holds at most a few chunks."""
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
