"""The gRPC service's server: grpcio's ``aio`` server on a private socket behind the
:class:`~infscaler.api.grpc.gate.Gate`, in the running event loop, with the HTTP
socket's limits. Limits and why: docs/api.md, "`infscaler/api/grpc/server.py`"."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from typing import Any

from grpc import aio

from infscaler.api.grpc.gate import Gate
from infscaler.api.grpc.handlers import Handlers
from infscaler.api.http import HttpLimits
from infscaler.api.sockets import bind_unix_socket, prepare_socket_path

__all__ = ["MAX_STREAMS", "GrpcServer", "server_options"]

#: concurrent calls one connection may have open (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``)
MAX_STREAMS = 64


def server_options(max_message: int, limits: Any) -> list[tuple[str, int]]:
    """grpcio's server options: the largest request message, bytes; :data:`MAX_STREAMS`;
    idle connections closed after ``limits.keepalive_timeout_s``; a keepalive PING every
    ``keepalive_timeout_s``, answered within 20 s."""
    keepalive_ms = int(limits.keepalive_timeout_s * 1000)
    return [
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        ("grpc.max_connection_idle_ms", keepalive_ms),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class GrpcServer:
    """The gRPC service on a Unix socket, in the running event loop.

    Args:
        service: the :class:`~infscaler.service.service.Service`.
        shm: the HTTP app's :class:`~infscaler.api.sysshm.SystemSharedMemoryRegistry`.
        path: the public socket (mode ``mode``, group ``group``).
        max_body_mb: the largest request message, MB.
        limits: the :class:`~infscaler.api.http.HttpLimits`.
        tasks / loads: the HTTP app's task router holder and variant load budget (default:
            their own).
    """

    def __init__(
        self,
        service: Any,
        shm: Any,
        path: str,
        *,
        max_body_mb: int = 64,
        limits: Any = None,
        mode: int = 0o660,
        group: str | int | None = None,
        tasks: dict[str, Any] | None = None,
        loads: Any = None,
    ) -> None:
        self.service = service
        self.shm = shm
        self.path = str(path)
        self.max_body_mb = max_body_mb
        self.limits = limits if limits is not None else HttpLimits()
        self.mode = mode
        self.group = group
        self.tasks = tasks
        self.loads = loads
        self._server: Any = None
        self._gate_server: Any = None
        self._dir: str | None = None
        self.gate: Any = None

    async def start(self) -> GrpcServer:
        """Listen on :attr:`path`; returns once it accepts connections.

        Raises:
            InfScalerError: the path is taken by a live server or is not a socket, or
                the socket cannot be made (path too long, group not allowed).
        """
        prepare_socket_path(self.path)
        self._dir = Gate.make_private_dir(self.path)
        limit = self.max_body_mb << 20
        budget = getattr(self.service, "inflight", None)  # the in-flight ByteBudget
        gate = self.gate = Gate(
            self._dir,
            self.limits.max_connections,
            self.limits.quotas,
            budget=budget,
            max_message=limit,
            header_timeout_s=self.limits.header_timeout_s,
            body_timeout_s=self.limits.body_timeout_s,
            precheck=getattr(self.service, "precheck", None),
        )
        self._server = aio.server(
            options=server_options(limit, self.limits),
            maximum_concurrent_rpcs=self.limits.max_connections * 4,
        )
        handlers = Handlers(
            self.service,
            self.shm,
            gate.peer_of,
            tasks=self.tasks,
            loads=self.loads,
            quotas=self.limits.quotas,
            # the gate reserves twice each message before grpcio reads it
            gate_reserves=budget is not None,
        )
        self._server.add_generic_rpc_handlers((handlers.generic_handler(),))
        if self._server.add_insecure_port(f"unix:{gate.upstream}") == 0:
            raise OSError(f"grpc could not listen on {gate.upstream}")
        await self._server.start()
        try:
            sock = bind_unix_socket(self.path, self.mode, self.group)
            self._gate_server = await asyncio.start_unix_server(gate.on_connect, sock=sock)
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting, end the calls (after ``grace_s``), remove the sockets."""
        if self._gate_server is not None:
            self._gate_server.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._gate_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._gate_server.wait_closed(), 2.0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._server = self._gate_server = self._dir = None
