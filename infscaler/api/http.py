"""Connection-level hardening of the API server against slow or stuck clients: a header
deadline, a body deadline, an idle keep-alive timeout, a cap on open connections (503),
and v2 error JSON for HTTP that cannot be parsed or is cut short by a half-close.

Sources: RFC 9110 sections 15.5.9 (408), 15.6.4 (503) and 10.2.3 (Retry-After);
aiohttp ``web_protocol.RequestHandler``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import resource
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from infscaler.api.common import error_response
from infscaler.base.errors import InfScalerError
from infscaler.base.quotas import PeerQuotas, admit_connection, plan_fds
from infscaler.base.ratelog import RateLimitedLog
from infscaler.base.security import is_privileged_uid, peer_of_socket

log = logging.getLogger("infscaler.api.server")
#: refusals come in floods under attack: one line per cause every 10 s, with a count
_refusal_log = RateLimitedLog(log, interval_s=10.0)


@dataclass(frozen=True)
class HttpLimits:
    """Connection-level limits of the API server, each enforced per connection.

    Attributes:
        header_timeout_s: a request's line and headers must arrive within this many
            seconds of its first byte (or of the connection opening); else 408 and close.
        body_timeout_s: its body must arrive within this many seconds of its headers;
            else 408 and close.
        keepalive_timeout_s: an idle keep-alive connection is closed after this.
        max_connections: connections open at once; one more gets 503 (``Retry-After: 1``)
            and is closed (per uid: :attr:`quotas`).
        max_json_mb: the most JSON an inference request may carry, MB (413 beyond, before
            the body is read; JSON takes up to 20x its size decoded).
        quotas: the per-uid limits (:class:`~infscaler.base.quotas.PeerQuotas`).
        max_line_size / max_field_size / max_headers: aiohttp's parser limits (400 beyond).
    """

    header_timeout_s: float = 30.0
    body_timeout_s: float = 120.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 512
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 128
    max_json_mb: float = 16.0
    quotas: PeerQuotas = field(default_factory=PeerQuotas)

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise InfScalerError(f"HttpLimits.{name} must be a number > 0, got {v!r}")
        if not (
            isinstance(self.max_json_mb, int | float)
            and math.isfinite(self.max_json_mb)
            and self.max_json_mb > 0
        ):
            raise InfScalerError(f"HttpLimits.max_json_mb must be > 0, got {self.max_json_mb!r}")
        if not (isinstance(self.max_connections, int) and self.max_connections >= 1):
            raise InfScalerError(
                f"HttpLimits.max_connections must be >= 1, got {self.max_connections!r}"
            )


class BodyTimeout(Exception):
    """A request body did not arrive within :attr:`HttpLimits.body_timeout_s` (408)."""


class BodyTruncated(Exception):
    """The client half-closed the connection before the request body was complete (400)."""


def raw_error(
    status: int, reason: str, message: str, extra: str = "", code: str | None = None
) -> bytes:
    doc = {"error": message} if code is None else {"error": message, "code": code}
    body = json.dumps(doc).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    ).encode() + body


class EdgeRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with :class:`HttpLimits` and v2 error JSON for HTTP
    it cannot parse. A header deadline runs from the connection's start (and each later
    request's first byte) until the headers are parsed (past it: 408 and close); then a body
    deadline until the payload is complete (past it the handler's read fails: 408, close).
    """

    def __init__(self, manager: Any, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._edge_phase: str | None = None
        self._edge_payload: Any = None
        self._edge_timer: asyncio.TimerHandle | None = None
        self._edge_refused = False
        self._edge_bytes = 0  # bytes of the request whose headers are being read
        self._edge_done = 0  # responses finished (vs. aiohttp's _request_count: parsed)

    # phases -------------------------------------------------------------------------------
    def _edge_arm(self, phase: str | None, payload: Any = None) -> None:
        if self._edge_timer is not None:
            self._edge_timer.cancel()
            self._edge_timer = None
        self._edge_phase, self._edge_payload = phase, payload
        if phase is not None:
            delay = (
                self._limits.header_timeout_s if phase == "header" else self._limits.body_timeout_s
            )
            self._edge_timer = self._loop.call_later(delay, self._edge_expired)

    def _edge_expired(self) -> None:
        self._edge_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._edge_phase == "header" and self._request_count > self._edge_done:
            # a pipelined request started while the previous one is still being handled:
            # its clock starts once the server is free to read it
            self._edge_arm("header")
            return
        if self._edge_phase == "header":
            log.info("closing a connection: request headers not received in time")
            transport.write(
                raw_error(
                    408,
                    "Request Timeout",
                    f"request headers not received within {self._limits.header_timeout_s:g} s",
                )
            )
            transport.close()
        elif self._edge_phase == "body":
            payload = self._edge_payload
            if payload is not None and payload.is_eof():
                self._edge_arm(None)
                return
            log.info("closing a connection: request body not received in time")
            self.close()  # no keep-alive after the 408
            if payload is not None:
                payload.set_exception(
                    BodyTimeout(
                        f"request body not received within {self._limits.body_timeout_s:g} s "
                        "of its headers"
                    )
                )
            # the handler answers 408; the transport goes even if it does not
            self._loop.call_later(5.0, transport.close)
        self._edge_phase = None

    # asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        self._edge_uid: int | None = None
        #: the client (read once: a connection's credentials are fixed at connect)
        self.edge_peer = peer_of_socket(transport.get_extra_info("socket"))
        if manager is not None:
            uid = self.edge_peer.uid
            by_uid = manager.edge_by_uid  # type: ignore[attr-defined]
            why = admit_connection(
                is_privileged_uid(uid) and uid >= 0,
                len(manager.connections),
                by_uid.get(uid, 0),
                self._limits.max_connections,
                self._limits.quotas,
            )
            if why is not None:
                self._edge_refused = True
                _refusal_log.warning("refusing connections: %s", why, key=why.split("(")[0])
                transport.write(  # type: ignore[attr-defined]
                    raw_error(503, "Service Unavailable", why, "Retry-After: 1\r\n", "connections")
                )
                transport.close()
                return
            self._edge_uid = uid
            by_uid[uid] = by_uid.get(uid, 0) + 1
        super().connection_made(transport)
        self._edge_arm("header")

    def eof_received(self) -> bool | None:
        """The client half-closed: mid-headers 400 and close; mid-body the read fails with
        :class:`BodyTruncated` (400); after a complete request the client is gone, so its
        handler is cancelled and the request dropped."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._edge_refused:
            return None
        busy = self._request_count > self._edge_done  # a parsed request not yet answered
        if self._edge_phase == "header" and self._edge_bytes and not busy:
            self._edge_arm(None)
            transport.write(
                raw_error(
                    400,
                    "Bad Request",
                    "request truncated: the connection was half-closed before the request "
                    "line and headers were complete",
                )
            )
            return None
        if self._edge_phase == "body":
            payload = self._edge_payload
            self._edge_arm(None)
            self.close()
            if payload is not None and not payload.is_eof():
                payload.set_exception(
                    BodyTruncated(
                        "request truncated: the connection was half-closed before the body "
                        "was complete (Content-Length promised more)"
                    )
                )
            self._loop.call_later(5.0, transport.close)
            return True
        return None

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """Our :class:`BodyTimeout` / :class:`BodyTruncated`, already answered, logged at debug
        (not as aiohttp's "Unhandled exception"), so truncated requests cannot fill the journal."""
        exc = kw.get("exc_info")
        if isinstance(exc, BodyTimeout | BodyTruncated):
            self.log_debug("request body cut short (answered already): %s", exc)
            return
        super().log_exception(*args, **kw)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._edge_arm(None)
        if self._edge_refused:
            return
        uid = getattr(self, "_edge_uid", None)
        manager = self._manager
        if uid is not None and manager is not None:
            by_uid = manager.edge_by_uid  # type: ignore[attr-defined]
            left = by_uid.get(uid, 0) - 1
            if left > 0:
                by_uid[uid] = left
            else:
                by_uid.pop(uid, None)
            self._edge_uid = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._edge_refused:
            return
        if self._edge_phase is None and data:
            self._edge_arm("header")
        self._edge_bytes += len(data) if self._edge_phase == "header" else 0
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._edge_bytes = 0
        if self._request_count != before and self._messages:
            _msg, payload = self._messages[-1]
            if payload is not None and not payload.is_eof():
                self._edge_arm("body", payload)
            else:
                self._edge_arm(None)
        elif self._edge_phase == "body" and self._edge_payload.is_eof():
            self._edge_arm(None)

    async def finish_response(self, request: Any, resp: Any, start_time: Any) -> Any:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._edge_done += 1

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's hook for requests it could not parse or handle: v2 error JSON."""
        if request.writer.output_size > 0:
            raise ConnectionError("the response was sent already")
        if status >= 500:
            log.error("error handling a request", exc_info=exc)
            text = "internal error"
        else:
            log.debug("malformed HTTP request: %s", message or exc)
            text = f"malformed HTTP request: {message or exc or 'unparsable'}"[:500]
        resp = error_response(text, status)
        resp.force_close()
        return resp


class _EdgeServer(web.Server):
    """aiohttp's low-level server making :class:`EdgeRequestHandler` connections."""

    limits: HttpLimits
    edge_by_uid: dict[int, int]  # open connections per peer uid

    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(self, loop=self._loop, limits=self.limits, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """An ``AppRunner`` whose server makes :class:`EdgeRequestHandler` connections."""

    def __init__(self, app: web.Application, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            keepalive_timeout=limits.keepalive_timeout_s,
            max_line_size=limits.max_line_size,
            max_field_size=limits.max_field_size,
            max_headers=limits.max_headers,
            **kwargs,
        )
        self._limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _EdgeServer
        server.limits = self._limits  # type: ignore[attr-defined]
        server.edge_by_uid = {}  # type: ignore[attr-defined]
        return server


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (what servers do at
    start: the soft default, 1024, is for interactive shells); returns the soft limit
    now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def fit_to_fd_limit(limits: HttpLimits, grpc: bool = False) -> HttpLimits:
    """``limits`` with ``max_connections`` and the region quota lowered where need be so what
    clients can make the service hold fits the fd limit (raised to the hard one first) with
    :data:`~infscaler.base.quotas.FD_RESERVE` left (:func:`~infscaler.base.quotas.plan_fds`;
    ``grpc``: the gRPC socket too). Logs what it lowers.

    Raises:
        InfScalerError: the fd limit is too low to serve at all.
    """
    plan = plan_fds(raise_fd_limit(), limits.max_connections, limits.quotas.regions, grpc=grpc)
    if not plan.warning:
        return limits
    log.warning("%s", plan.warning)
    regions = min(limits.quotas.regions, plan.regions)
    quotas = dataclasses.replace(
        limits.quotas,
        regions=regions,
        regions_per_uid=min(limits.quotas.regions_per_uid, regions),
    )
    return dataclasses.replace(limits, max_connections=plan.max_connections, quotas=quotas)
