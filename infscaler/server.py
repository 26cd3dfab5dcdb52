"""The inference API: Open Inference Protocol (KServe v2) over HTTP on a Unix socket.

Endpoints (Triton's REST layout, so its users find what they know):

========================================================  ==============================
``GET  /v2``                                              server metadata + extensions
``GET  /v2/health/live``, ``/v2/health/ready``            200, or 503 while not ready
``GET  /v2/models``                                       deployed pipelines
``GET  /v2/models/{name}``, ``/v2/models/{name}/ready``   metadata (inputs, outputs), ready
``POST /v2/models/{name}/infer``                          JSON, binary tensor data, or
                                                          system shared memory in / out
``GET  /v2/models/stats``, ``/v2/models/{name}/stats``    statistics extension (+ P50/P99,
                                                          per unit: instances, queue)
``.../models/{name}/versions/{v}[/ready|/infer|/stats]``  the same for version ``v``; only
                                                          ``1`` exists (404 for others)
``GET  /v2/infscaler/status``                             control path, pool, instances
``GET  /metrics``                                         Prometheus text format (Triton's
                                                          ``nv_inference_*`` + ``infscaler_*``)
``POST /v2/repository/index``                             model repository extension
``POST /v2/repository/models/{name}/load|unload``         deploy (config in parameters)
``GET  /v2/systemsharedmemory[/region/{name}]/status``    system shared memory extension
``POST /v2/systemsharedmemory/region/{name}/register``
``POST /v2/systemsharedmemory[/region/{name}]/unregister``
========================================================  ==============================

Who may call what (:mod:`infscaler.base.security`): the repository endpoints answer only the
service's own user and root (403 for others, by the socket's peer credentials); system
shared memory regions belong to the uid that registered them; the status hides file
paths from other clients.

Errors are ``{"error": "..."}`` (``Content-Type: application/json``) with 400 (bad
request, a function stage's :class:`~infscaler.runtime.instance.StageInputError`, or
malformed HTTP), 403 (not allowed), 404 (unknown route / model / version / region), 405, 408 (request not
received in time), 409 (name taken), 413 (body too large), 429 / 503 (overloaded, not
ready, stopping; with ``Retry-After`` when the refusal says when to retry), 500 (a stage
failed on a valid request). A bad request fails alone: the server, the pipeline and
every other request go on. Connection-level limits (:class:`HttpLimits`): header and
body read timeouts, an idle keep-alive timeout and a cap on open connections.

Sources: KServe / Triton ``protocol/`` docs (v2 REST, ``extension_binary_data.md``,
``extension_shared_memory.md``, ``extension_statistics.md``,
``extension_model_repository.md``); aiohttp ``web.UnixSite``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

import infscaler
from infscaler.base.errors import InfScalerError

log = logging.getLogger("infscaler.server")

EXTENSIONS = [
    "binary_tensor_data",
    "system_shared_memory",
    "statistics",
    "model_repository",
    "infscaler_status",
]
_SERVICE = web.AppKey("service", object)
_SHM = web.AppKey("shm", object)
_MAX_BODY = web.AppKey("max_body_mb", int)
_TASKS = web.AppKey("tasks", object)
_SECURITY = web.AppKey("security", object)
_METRICS = web.AppKey("metrics", object)
_LIMITS = web.AppKey("limits", object)
#: The only model version there is.
VERSION = "1"


def _json(data: Any, status: int = 200) -> web.Response:
    from infscaler.protocol import json_default

    return web.Response(
        body=json.dumps(data, default=json_default).encode(),
        status=status,
        content_type="application/json",
    )


def error_response(message: str, status: int, retry_after_s: float | None = None) -> web.Response:
    """A v2 error: ``{"error": message}``; with ``Retry-After: <ceil seconds>`` (at least
    1) when ``retry_after_s`` is a finite number >= 0 (RFC 9110 section 10.2.3)."""
    resp = _json({"error": message}, status)
    if retry_after_s is not None:
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            if math.isfinite(retry_after_s) and retry_after_s >= 0:
                resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return resp


def _status_of(exc: BaseException, default: int) -> int:
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        return status
    return default


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure becomes v2 error JSON with the right status; nothing escapes.

    Our exceptions (:class:`~infscaler.base.errors.InfScalerError` and subclasses: protocol,
    service, request, selection errors; and any other ``infscaler`` exception with an
    int ``status``) answer with their ``status`` (default 400) and, when they carry
    ``retry_after_s``, a ``Retry-After`` header."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(
            f"request body too large: {exc.text or ''} (the limit is "
            f"{request.app[_MAX_BODY]} MB; pass large tensors through system shared "
            "memory instead)",
            413,
        )
    except web.HTTPNotFound as exc:
        if getattr(request.match_info, "http_exception", None) is None:  # a handler's 404
            return error_response(exc.reason or exc.text or "not found", 404)
        return error_response(
            f"no such route: {request.method} {request.path[:200]} (the v2 API is under "
            "/v2; GET /v2/models lists the models)",
            404,
        )
    except web.HTTPMethodNotAllowed as exc:
        return error_response(
            f"{request.method} is not allowed on {request.path[:200]} (allowed: "
            f"{', '.join(sorted(exc.allowed_methods))})",
            405,
        )
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.reason or exc.text or "error", exc.status)
        raise
    except BodyTimeout as exc:
        return error_response(str(exc), 408)
    except BodyTruncated as exc:
        return error_response(str(exc), 400)
    except ConnectionError as exc:  # the client went away mid-request: nobody to answer
        log.debug("client gone on %s %s: %s", request.method, request.path, exc)
        return error_response(f"the connection was lost: {exc}", 400)
    except InfScalerError as exc:  # ServiceError, RequestError, ProtocolError, ...
        return error_response(str(exc), _status_of(exc, 400), getattr(exc, "retry_after_s", None))
    except Exception as exc:  # noqa: BLE001 - logged with its traceback; the client gets 500
        if type(exc).__module__.startswith("infscaler") and _status_of(exc, 0):
            # one of ours that is not an InfScalerError but says how to answer
            return error_response(
                str(exc), _status_of(exc, 500), getattr(exc, "retry_after_s", None)
            )
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


# -- HTTP-level hardening -----------------------------------------------------------------


@dataclass(frozen=True)
class HttpLimits:
    """Connection-level limits of the API server (defences against slow or stuck
    clients, "slowloris"); each is enforced per connection.

    Attributes:
        header_timeout_s: a request's line and headers must arrive within this many
            seconds of its first byte (or of the connection opening); else the server
            answers 408 and closes the connection.
        body_timeout_s: its body must arrive within this many seconds of its headers;
            else 408 and the connection is closed.
        keepalive_timeout_s: an idle keep-alive connection is closed after this.
        max_connections: connections open at once; one more is answered 503 (with
            ``Retry-After: 1``) and closed.
        max_line_size / max_field_size / max_headers: request line and header limits
            (aiohttp's parser; beyond them: 400).

    Sources: RFC 9110 sections 15.5.9 (408), 15.6.4 (503) and 10.2.3 (Retry-After);
    aiohttp ``web_protocol.RequestHandler`` (``keepalive_timeout``, parser limits,
    ``handle_error``).
    """

    header_timeout_s: float = 30.0
    body_timeout_s: float = 120.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 512
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 128

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise InfScalerError(f"HttpLimits.{name} must be a number > 0, got {v!r}")
        if not (isinstance(self.max_connections, int) and self.max_connections >= 1):
            raise InfScalerError(
                f"HttpLimits.max_connections must be >= 1, got {self.max_connections!r}"
            )


class BodyTimeout(Exception):
    """A request body did not arrive within :attr:`HttpLimits.body_timeout_s` (408)."""


class BodyTruncated(Exception):
    """The client half-closed the connection before the request body was complete (400)."""


def _raw_error(status: int, reason: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    ).encode() + body


class EdgeRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with the API's limits (:class:`HttpLimits`)
    and v2 error JSON for HTTP it cannot parse (aiohttp's ``handle_error`` hook, which
    otherwise answers ``text/plain``).

    Read deadlines: a *header* deadline runs from the connection's start, and from the
    first byte of each later request, until aiohttp has parsed the request's headers;
    then a *body* deadline until its payload is complete. Past the header deadline the
    server writes 408 JSON and closes; past the body deadline the handler's read fails
    (408 JSON through the middleware) and the connection is closed soon after.
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
                _raw_error(
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
        if manager is not None and len(manager.connections) >= self._limits.max_connections:
            self._edge_refused = True
            log.warning(
                "refusing a connection: %d open (limit %d)",
                len(manager.connections),
                self._limits.max_connections,
            )
            transport.write(  # type: ignore[attr-defined]
                _raw_error(
                    503,
                    "Service Unavailable",
                    f"too many connections (at most {self._limits.max_connections}); retry",
                    "Retry-After: 1\r\n",
                )
            )
            transport.close()
            return
        super().connection_made(transport)
        self._edge_arm("header")

    def eof_received(self) -> bool | None:
        """The client half-closed the connection (``shutdown(SHUT_WR)``).

        Mid-headers: 400 JSON, then close. Mid-body: the handler's read fails with
        :class:`BodyTruncated` (400 JSON through the middleware), then close. After a
        complete request: the client is gone (a client that closed its socket and one
        that only shut its write side look the same here, and the first is far more
        common), so aiohttp closes the connection and, with ``handler_cancellation``,
        cancels the handler: the request is dropped and its slots freed, never computed
        for nobody (issue 13: cancellation when the client goes away)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._edge_refused:
            return None
        busy = self._request_count > self._edge_done  # a parsed request not yet answered
        if self._edge_phase == "header" and self._edge_bytes and not busy:
            self._edge_arm(None)
            transport.write(
                _raw_error(
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
        """aiohttp logs what its lingering read of an unread body raises as "Unhandled
        exception" with a traceback; our own :class:`BodyTimeout` / :class:`BodyTruncated`
        there were already answered (408 / 400), so they are logged at debug: a client
        sending truncated requests cannot fill the journal."""
        exc = kw.get("exc_info")
        if isinstance(exc, BodyTimeout | BodyTruncated):
            self.log_debug("request body cut short (answered already): %s", exc)
            return
        super().log_exception(*args, **kw)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._edge_arm(None)
        if self._edge_refused:
            return
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

    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(self, loop=self._loop, limits=self.limits, **self._kwargs)


class _EdgeRunner(web.AppRunner):
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
        return server


#: pending connections the listening socket queues (``listen(2)`` backlog; the kernel caps
#: it at ``net.core.somaxconn``): an overload burst waits in it for an answer instead of
#: being refused at connect
LISTEN_BACKLOG = 4096
_ARRIVED = web.RequestKey("arrived_s", float)


@web.middleware
async def _admission(request: web.Request, handler: Any) -> web.StreamResponse:
    """Bytes in flight (:mod:`infscaler.runtime.admission`): an inference request
    reserves twice its declared ``Content-Length`` (the body and its decoded tensors;
    the body limit when none is declared) from the service's budget *before* its body
    is read, and gives it back once answered (or cancelled). Over the budget: 503 with
    ``retry_after_s``; the body is then read and thrown away in small chunks (never
    held), so the client, still sending it, gets the answer instead of a reset."""
    service = request.app[_SERVICE]
    if (
        request.method != "POST"
        or not request.path.endswith("/infer")
        or not hasattr(service, "reserve_bytes")
    ):
        return await handler(request)
    request[_ARRIVED] = time.monotonic()  # deadlines count from here, not from the submit
    limit = request.app[_MAX_BODY] << 20
    declared = request.content_length
    nbytes = 2 * (limit if declared is None else min(declared, limit))
    try:
        service.reserve_bytes(nbytes)
    except InfScalerError:
        with contextlib.suppress(Exception):
            seen = 0
            async for chunk in request.content.iter_chunked(1 << 16):
                seen += len(chunk)
                if seen > limit:
                    break
        raise
    try:
        return await handler(request)
    finally:
        service.release_bytes(nbytes)


def create_app(
    service: Any,
    *,
    shm: Any = None,
    max_body_mb: int = 64,
    tasks: Any = None,
    security: Any = None,
    limits: HttpLimits | None = None,
) -> web.Application:
    """The aiohttp application for ``service`` (:class:`~infscaler.service.Service`).

    Args:
        shm: a :class:`~infscaler.sysshm.SystemSharedMemoryRegistry` (created if None).
        max_body_mb: request body limit, MB (413 beyond it).
        tasks: a :class:`~infscaler.modelless.tasks.TaskRouter` for model-less queries (default:
            one over the variant registry in the service's state dir, made on the first
            query that names a registered task).
        security: the :class:`~infscaler.base.security.SecurityPolicy` for pipelines loaded
            through the API (default: bundled function modules only, no model repository).
        limits: connection-level limits (:class:`HttpLimits`; default: its defaults),
            applied by :func:`start_unix_server`.
    """
    from infscaler.base.security import SecurityPolicy
    from infscaler.sysshm import SystemSharedMemoryRegistry

    app = web.Application(middlewares=[_errors, _admission], client_max_size=max_body_mb << 20)
    app[_SERVICE] = service
    app[_SHM] = shm if shm is not None else SystemSharedMemoryRegistry()
    app[_MAX_BODY] = max_body_mb
    app[_TASKS] = {"router": tasks}
    app[_SECURITY] = security if security is not None else SecurityPolicy()
    from infscaler.metrics import make_registry

    app[_METRICS] = make_registry(service)
    app[_LIMITS] = limits if limits is not None else HttpLimits()
    r = app.router
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2/models", models)
    r.add_get("/v2/models/stats", stats_all)
    r.add_get("/v2/models/{name}", model_metadata)
    r.add_get("/v2/models/{name}/ready", model_ready)
    r.add_post("/v2/models/{name}/infer", infer)
    r.add_get("/v2/models/{name}/stats", stats_one)
    r.add_get("/v2/models/{name}/versions/{version}", model_metadata)
    r.add_get("/v2/models/{name}/versions/{version}/ready", model_ready)
    r.add_get("/v2/models/{name}/versions/{version}/stats", stats_one)
    r.add_post("/v2/models/{name}/versions/{version}/infer", infer)
    r.add_get("/v2/infscaler/status", service_status)
    r.add_get("/metrics", metrics)
    r.add_post("/v2/repository/index", repository_index)
    r.add_post("/v2/repository/models/{name}/load", repository_load)
    r.add_post("/v2/repository/models/{name}/unload", repository_unload)
    r.add_get("/v2/systemsharedmemory/status", shm_status)
    r.add_get("/v2/systemsharedmemory/region/{name}/status", shm_status)
    r.add_post("/v2/systemsharedmemory/region/{name}/register", shm_register)
    r.add_post("/v2/systemsharedmemory/region/{name}/unregister", shm_unregister)
    r.add_post("/v2/systemsharedmemory/unregister", shm_unregister)
    app.on_cleanup.append(_cleanup)
    return app


async def _cleanup(app: web.Application) -> None:
    with contextlib.suppress(Exception):
        app[_SHM].close()
    router = app[_TASKS].get("router")
    if router is not None:
        with contextlib.suppress(Exception):
            router.close()


def _shm(request: web.Request) -> Any:
    """The shared memory registry as this request's client sees it (its own regions)."""
    from infscaler.base.security import peer_of

    return request.app[_SHM].for_peer(lambda: peer_of(request))


def _task_router(request: web.Request, name: str) -> Any:
    """The task router when ``name`` is a registered task and not a deployed pipeline
    (pipelines keep their names), else None."""
    service = request.app[_SERVICE]
    if any(d.name == name for d in service.deployments()):
        return None
    holder = request.app[_TASKS]
    router = holder.get("router")
    if router is None:
        from infscaler.modelless.variants import VariantRegistry

        registry = VariantRegistry(service.state_dir)
        if not registry.path.is_file():
            return None
        from infscaler.modelless.tasks import TaskRouter

        router = holder["router"] = TaskRouter(service, registry).start()
    if router.has_task(name):
        return router
    from infscaler.modelless.selector import SelectionError

    known = ", ".join(sorted(d.name for d in service.deployments())) or "none"
    raise SelectionError(
        f"unknown model or task {name!r} (deployed: {known}; registered tasks: "
        f"{', '.join(router.tasks()) or 'none'})",
        404,
    )


def _check_version(request: web.Request) -> None:
    """404 unless the URL's ``{version}`` (when it has one) is the only version, "1"."""
    version = request.match_info.get("version")
    if version is not None and version != VERSION:
        from infscaler.protocol import ProtocolError

        raise ProtocolError(
            f"model {request.match_info['name']!r} has no version {version[:40]!r}; "
            f"only version {VERSION} exists (or leave /versions/... out of the URL)",
            404,
        )


# -- health / metadata --------------------------------------------------------------------


async def server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "infscaler", "version": infscaler.__version__, "extensions": EXTENSIONS})


async def live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    if service.ready():
        return _json({"ready": True})
    failure = getattr(getattr(service, "frontend", None), "failure", None)
    why = (
        "stopping"
        if service.stopping
        else f"the front end failed: {failure}"
        if failure
        else "pipelines are not ready"
    )
    return error_response(f"not ready: {why}", 503)


def _model_entry(service: Any, dep: Any) -> dict[str, Any]:
    ok = service.ready(dep.name)
    return {
        "name": dep.name,
        "versions": ["1"],
        "platform": "infscaler_pipeline",
        "state": "READY" if ok else "UNAVAILABLE",
        "ready": ok,
        "description": dep.pipeline.config.description,
    }


async def models(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    return _json({"models": [_model_entry(service, d) for d in service.deployments()]})


async def model_metadata(request: web.Request) -> web.Response:
    """``GET /v2/models/{name}[/versions/{v}]``: v2 model metadata (name, versions,
    platform, inputs, outputs with their datatypes and shapes; -1: any size)."""
    service = request.app[_SERVICE]
    router = _task_router(request, request.match_info["name"])
    _check_version(request)
    if router is not None:
        return _json(_task_metadata(router, request.match_info["name"]))
    dep = service.deployment(request.match_info["name"])
    p = dep.pipeline
    return _json(
        {
            "name": dep.name,
            "versions": ["1"],
            "platform": "infscaler_pipeline",
            "inputs": [
                {"name": i.name, "datatype": i.datatype, "shape": i.shape} for i in p.inputs
            ],
            "outputs": [
                {"name": o["name"], "datatype": o["datatype"] or "UNKNOWN", "shape": o["shape"]}
                for o in p.outputs
            ],
            "parameters": {
                "stages": json.dumps([u.name for u in p.units]),
                "description": p.config.description,
            },
        }
    )


def _task_metadata(router: Any, task: str) -> dict[str, Any]:
    from infscaler.modelless.tasks import task_interface

    variants = router.catalog().variants(task)
    iface = task_interface(task, router.variant(variants[0].name) if variants else None)
    return {
        "name": task,
        "versions": ["1"],
        "platform": "infscaler_task",
        "inputs": iface["inputs"],
        "outputs": iface["outputs"],
        "parameters": {
            "variants": json.dumps(
                [
                    {
                        "name": v.name,
                        "latency_ms": round(v.latency_ms, 3),
                        "accuracy": round(v.accuracy, 4),
                    }
                    for v in variants
                ]
            ),
            "description": "model-less task: infer with parameters latency_ms, min_accuracy",
        },
    }


async def model_ready(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    name = request.match_info["name"]
    service.deployment(name)
    _check_version(request)
    if service.ready(name):
        return _json({"name": name, "ready": True})
    why = service.degraded(name) if hasattr(service, "degraded") else []
    return error_response(f"model {name} is not ready" + "".join(f"; {w}" for w in why), 503)


# -- inference ----------------------------------------------------------------------------


async def _read_infer_request(request: web.Request, specs: list[Any]) -> Any:
    """The request's body, read (:func:`read_body`) and decoded against the input
    ``specs`` (JSON, binary tensor data after ``Inference-Header-Content-Length``, or
    this client's shared memory regions); binary inputs are views of the body.

    Raises:
        ProtocolError: (400) a malformed header, body or tensor.
    """
    from infscaler.protocol import decode_infer_request, parse_header_length

    header_length = parse_header_length(request.headers.get("Inference-Header-Content-Length"))
    body = await read_body(request)
    return decode_infer_request(
        body, header_length=header_length, input_specs=specs, shm=_shm(request), copy=False
    )


async def infer(request: web.Request) -> web.Response:
    from infscaler.protocol import TensorSpec, parse_timeout_ms

    service = request.app[_SERVICE]
    name = request.match_info["name"]
    router = _task_router(request, name)
    if router is not None:
        _check_version(request)
        return await _infer_task(request, router, name)
    dep = service.deployment(name)
    _check_version(request)
    specs = [TensorSpec(i.name, i.datatype, list(i.shape)) for i in dep.pipeline.inputs]
    req = await _read_infer_request(request, specs)
    timeout_s = parse_timeout_ms(req.parameters)
    fut = service.submit(name, _slot_arrays(req.inputs), timeout_s, request.get(_ARRIVED))
    result = await asyncio.wrap_future(fut)
    return _infer_response(request, req, name, dep, result, {})


async def _infer_task(request: web.Request, router: Any, task: str) -> web.Response:
    """A model-less query: ``POST /v2/models/{task}/infer`` with parameters
    ``latency_ms`` and ``min_accuracy`` (both optional). The selector (INFaaS Algorithm 1)
    picks the variant, which is loaded if needed; the response's parameters name it
    (``variant``, ``meets_requirements``, ``selection``, ``selection_reason``, ...)."""
    from infscaler.modelless.tasks import task_interface
    from infscaler.protocol import TensorSpec, parse_timeout_ms

    variants = router.catalog().variants(task)
    iface = task_interface(task, router.variant(variants[0].name) if variants else None)
    specs = [TensorSpec(i["name"], i["datatype"], list(i["shape"])) for i in iface["inputs"]]
    req = await _read_infer_request(request, specs)
    params = dict(req.parameters or {})
    timeout_s = parse_timeout_ms(params)
    loop = asyncio.get_running_loop()
    fut, sel = await loop.run_in_executor(
        None,
        lambda: router.submit(
            task,
            _slot_arrays(req.inputs),
            latency_ms=params.get("latency_ms"),
            min_accuracy=params.get("min_accuracy"),
            timeout_s=timeout_s,
        ),
    )
    result = await asyncio.wrap_future(fut)
    dep = request.app[_SERVICE].deployment(sel.variant.name)
    return _infer_response(request, req, task, dep, result, router.parameters(sel))


async def read_body(request: web.Request) -> bytearray | bytes:
    """The request body, read once into a buffer of its ``Content-Length`` (no growing
    buffer, no final ``bytes`` copy as in aiohttp's ``request.read()``); the binary
    tensor data inputs are then zero-copy views of it (``decode_infer_request(...,
    copy=False)``) until the front end copies them into pool slots. A body without a
    Content-Length (chunked) goes through ``request.read()``.

    Raises:
        HTTPRequestEntityTooLarge: beyond the app's ``max_body_mb`` (413, before reading).
        HTTPBadRequest: the body ended before its Content-Length (or the connection was
            lost meanwhile).
    """
    n = request.content_length
    if n is None or request.can_read_body is False:
        return await request.read()
    limit = request.app[_MAX_BODY] << 20
    if limit and n > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=n)
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    content = request.content
    while pos < n:
        try:
            chunk = await content.readany()
        except (ConnectionError, EOFError) as exc:  # the client went away mid-body
            raise web.HTTPBadRequest(
                reason=f"the connection was lost after {pos} of the body's {n} bytes ({exc})"
            ) from None
        if not chunk:
            break
        end = pos + len(chunk)
        if end > n:  # the HTTP parser holds a body to its Content-Length; never here
            raise web.HTTPBadRequest(reason=f"the body is longer than its Content-Length {n}")
        view[pos:end] = chunk
        pos = end
    if pos != n:
        raise web.HTTPBadRequest(
            reason=f"the body ended after {pos} of its Content-Length {n} bytes"
        )
    return buf


def _slot_arrays(inputs: dict[str, Any]) -> dict[str, Any]:
    """BYTES inputs arrive as object arrays of ``bytes``; pool slots hold plain dtypes
    only, so they travel as fixed-width ``S`` arrays (numpy strips trailing NUL bytes)."""
    import numpy as np

    out = {}
    for k, v in inputs.items():
        if v.dtype.kind == "O":
            v = np.array([bytes(x) for x in v.reshape(-1)], dtype=np.bytes_).reshape(v.shape)
        out[k] = v
    return out


# -- statistics ---------------------------------------------------------------------------


def _model_stats(service: Any, dep: Any) -> dict[str, Any]:
    """One ``model_stats`` entry (Triton ``extension_statistics.md``): ``name``,
    ``version``, ``last_inference`` (ms since the epoch; 0: none yet),
    ``inference_count``, ``execution_count``, ``inference_stats`` (``success``, ``fail``,
    ``queue``, ``compute_input``, ``compute_infer``, ``compute_output``, ``cache_hit``,
    ``cache_miss``, each ``{count, ns}``: cumulative ns) and ``batch_stats``, then
    InfScaler's own fields (``latency_ms`` percentiles, ``fail_by_status``,
    ``rejected``, ``arrival_rate_per_s``, ``units``).

    What is not measured reads 0 rather than a guess: the duration of failed requests
    (``fail.ns``), ``compute_input`` / ``compute_output`` (copying tensors in and out of
    the pool is inside ``success.ns``), the response cache (there is none) and
    ``batch_stats`` (instances batch on their own; per-unit counts are in ``units``)."""
    snap = dep.route.stats.snapshot()
    lat = snap["latency"]

    def dur(count: int, total_ms: float) -> dict[str, int]:
        return {"count": int(count), "ns": int(total_ms * 1e6)}

    compute = [u["compute"] for u in snap["units"]]
    queue = [u["queue"] for u in snap["units"]]
    status = service.pipeline_status(dep)
    return {
        "name": dep.name,
        "version": VERSION,
        "last_inference": int(snap.get("last_inference_ms", 0)),
        "inference_count": snap["success"],
        "execution_count": snap["success"],
        "inference_stats": {
            "success": dur(snap["success"], lat["total_ms"]),
            "fail": dur(sum(snap["fail"].values()), 0.0),
            "queue": dur(sum(q["count"] for q in queue), sum(q["total_ms"] for q in queue)),
            "compute_input": dur(0, 0.0),
            "compute_infer": dur(
                sum(c["count"] for c in compute), sum(c["total_ms"] for c in compute)
            ),
            "compute_output": dur(0, 0.0),
            "cache_hit": dur(0, 0.0),
            "cache_miss": dur(0, 0.0),
        },
        "batch_stats": [],
        "latency_ms": {k: lat[k] for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")},
        "fail_by_status": {str(k): v for k, v in snap["fail"].items()},
        "rejected": snap["rejected"],
        "arrival_rate_per_s": snap["arrival_rate_per_s"],
        "units": status["units"],
    }


async def stats_one(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    dep = service.deployment(request.match_info["name"])
    _check_version(request)
    return _json(_for_peer(request, {"model_stats": [_model_stats(service, dep)]}))


async def stats_all(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    stats = {"model_stats": [_model_stats(service, d) for d in service.deployments()]}
    return _json(_for_peer(request, stats))


def _for_peer(request: web.Request, data: Any) -> Any:
    """``data`` as is for the service's user and root, without file paths for others."""
    from infscaler.base.security import is_privileged, peer_of, redact

    return data if is_privileged(peer_of(request)) else redact(data)


async def service_status(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    status = service.status()
    status["system_shared_memory"] = _shm(request).status()
    return _json(_for_peer(request, status))


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the Prometheus text format (:mod:`infscaler.metrics`)."""
    from infscaler.metrics import CONTENT_TYPE, exposition

    return web.Response(
        body=exposition(request.app[_METRICS]), headers={"Content-Type": CONTENT_TYPE}
    )


def metrics_registry(app: web.Application) -> Any:
    """The Prometheus registry behind ``app``'s ``GET /metrics``."""
    return app[_METRICS]


def create_metrics_app(service: Any, registry: Any = None) -> web.Application:
    """An application serving only ``GET /metrics`` of ``service`` (for
    ``--metrics-port``; ``registry``: share the API app's)."""
    from infscaler.metrics import make_registry

    app = web.Application(middlewares=[_errors])
    app[_METRICS] = registry if registry is not None else make_registry(service)
    app[_MAX_BODY] = 0
    app.router.add_get("/metrics", metrics)
    return app


async def start_metrics_server(
    app: web.Application, port: int, host: str = "127.0.0.1"
) -> tuple[Any, int]:
    """Serve ``app`` (:func:`create_metrics_app`) on ``host``:``port``: 127.0.0.1 by
    default (a local Prometheus or node agent); ``0.0.0.0`` is for a container with its
    own network namespace (a Kubernetes pod scraped by the cluster's Prometheus: the
    chart in deploy/). Port 0 picks a free one. Returns ``(runner, port)``.

    Raises:
        InfScalerError: the port is taken or not allowed.
    """
    if not 0 <= int(port) <= 65535:
        raise InfScalerError(f"--metrics-port {port} is not a TCP port (0-65535)")
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, int(port), reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise InfScalerError(
            f"cannot listen for metrics on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --metrics-port",
        ) from None
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, int(bound)


# -- model repository ---------------------------------------------------------------------


def _owner_only(request: web.Request, what: str) -> None:
    from infscaler.base.security import peer_of, require_privileged

    require_privileged(peer_of(request), what)


async def repository_index(request: web.Request) -> web.Response:
    _owner_only(request, "the model repository index")
    service = request.app[_SERVICE]
    return _json(
        [
            {
                "name": d.name,
                "version": "1",
                "state": _model_entry(service, d)["state"],
                "reason": "",
            }
            for d in service.deployments()
        ]
    )


async def _body_json(request: web.Request) -> dict[str, Any]:
    from infscaler.protocol import parse_json_object

    raw = await request.read()
    if not raw:
        return {}
    return parse_json_object(raw, "body")  # strict UTF-8, bounded depth; else 400


async def repository_load(request: web.Request) -> web.Response:
    """Deploy a pipeline: ``{"parameters": {"config": "<pipeline as JSON or YAML>"}}``;
    the config's name is set to the URL's. Replaces a deployed pipeline of that name once
    the new one is ready (Triton's reload)."""
    from infscaler.base.config import load_pipeline

    _owner_only(request, "loading a model")
    service = request.app[_SERVICE]
    name = request.match_info["name"]
    data = await _body_json(request)
    config = (data.get("parameters") or {}).get("config")
    if not isinstance(config, str) or not config.strip():
        return error_response(
            "load needs the pipeline in parameters.config (a JSON or YAML string)", 400
        )
    import yaml

    try:
        parsed = yaml.safe_load(config)
    except yaml.YAMLError as exc:
        return error_response(f"parameters.config is not valid JSON / YAML: {exc}", 400)
    if isinstance(parsed, dict):
        parsed["name"] = name
    cfg = load_pipeline(parsed if isinstance(parsed, dict) else config)
    policy = request.app[_SECURITY]
    policy.check_pipeline(cfg)  # 403 before anything of it is read or imported
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    await loop.run_in_executor(
        None,
        lambda: service.deploy(cfg, replace=True, allowed_functions=policy.function_modules),
    )
    return _json({"name": name, "loaded": True, "seconds": round(time.perf_counter() - t0, 2)})


async def repository_unload(request: web.Request) -> web.Response:
    _owner_only(request, "unloading a model")
    service = request.app[_SERVICE]
    name = request.match_info["name"]
    service.deployment(name)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, service.undeploy, name)
    return _json({"name": name, "unloaded": True})


# -- system shared memory -----------------------------------------------------------------


async def shm_status(request: web.Request) -> web.Response:
    return _json(_shm(request).status(request.match_info.get("name")))


async def shm_register(request: web.Request) -> web.Response:
    data = await _body_json(request)
    try:
        key, offset, size = data["key"], int(data.get("offset", 0)), int(data["byte_size"])
    except (KeyError, TypeError, ValueError):
        return error_response('register needs {"key": str, "offset": int, "byte_size": int}', 400)
    from infscaler.base.security import peer_of

    request.app[_SHM].register(request.match_info["name"], str(key), offset, size, peer_of(request))
    return _json({})


async def shm_unregister(request: web.Request) -> web.Response:
    from infscaler.base.security import peer_of

    request.app[_SHM].unregister(request.match_info.get("name"), peer_of(request))
    return _json({})


# -- serving on a Unix socket -------------------------------------------------------------


def prepare_socket_path(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` usable for a new server: create its directory, remove a stale
    socket left by a dead server.

    Raises:
        InfScalerError: another server answers on it, or the path is not a socket.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() or p.is_symlink():
        if not stat.S_ISSOCK(p.lstat().st_mode):
            raise InfScalerError(f"{p} exists and is not a socket", hint="choose another --socket")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(p))
        except OSError:
            p.unlink()  # stale: nobody listens
        else:
            raise InfScalerError(
                f"another InfScaler service is listening on {p}",
                hint="stop it first, or pass a different --socket",
            )
        finally:
            s.close()
    return p


def resolve_group(group: str | int) -> int:
    """A group name or number as a gid.

    Raises:
        InfScalerError: no such group.
    """
    import grp

    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise InfScalerError(
            f"--socket-group {group!r}: no such group", hint="give a group name or a gid"
        ) from None


def bind_unix_socket(
    path: str | os.PathLike[str], mode: int = 0o660, group: str | int | None = None
) -> socket.socket:
    """A listening Unix stream socket at ``path`` whose mode (and group) are final before
    anyone can reach it: bound inside a fresh private (0700) directory next to ``path``,
    chmod-ed, chown-ed to ``group`` if given, then renamed into place (``rename(2)`` is
    atomic). Nothing touches the process-wide umask, so other threads are unaffected.

    Raises:
        InfScalerError: the group cannot be set (not root and not a member), or the
            path is too long for a Unix socket.
    """
    import tempfile

    p = Path(path)
    gid = None if group is None else resolve_group(group)
    tmp_dir = tempfile.mkdtemp(prefix=".isc", dir=p.parent)  # mode 0700
    tmp = os.path.join(tmp_dir, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(tmp)
        except OSError as exc:
            raise InfScalerError(
                f"cannot create the socket next to {p}: {exc}",
                hint="use a shorter --socket path (a Unix socket path has at most 107 bytes)",
            ) from None
        sock.listen(128)  # accept as soon as the path appears (the site listens again)
        os.chmod(tmp, mode)
        if gid is not None:
            try:
                os.chown(tmp, -1, gid)
            except PermissionError:
                raise InfScalerError(
                    f"cannot give the socket to group {group} (gid {gid}): permission denied",
                    hint="run the service as root or as a member of that group",
                ) from None
        os.rename(tmp, p)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(tmp_dir)
    return sock


async def start_unix_server(
    app: web.Application,
    path: str | os.PathLike[str],
    mode: int = 0o660,
    group: str | int | None = None,
):
    """Serve ``app`` on the Unix socket ``path`` (mode ``mode``, group ``group`` if
    given: :func:`bind_unix_socket`, never wider than ``mode``). Returns the runner
    (``await runner.cleanup()`` to stop)."""
    p = prepare_socket_path(path)
    # handler_cancellation: a client that goes away cancels its handler, which cancels
    # the request's future: the front end drops the request (frees its slots)
    runner = _EdgeRunner(
        app, app[_LIMITS], access_log=None, handle_signals=False, handler_cancellation=True
    )
    await runner.setup()
    site = web.SockSite(runner, bind_unix_socket(p, mode, group), backlog=LISTEN_BACKLOG)
    await site.start()
    return runner


class ServerThread:
    """The API served from a background thread with its own event loop: for the demo,
    tests and benchmarks that drive a :class:`~infscaler.service.Service` in-process.

    Args:
        service: a started service. socket_path: where to listen. max_body_mb: body limit.
        security: a :class:`~infscaler.base.security.SecurityPolicy` (see :func:`create_app`).
        socket_group: give the socket to this group (name or gid).
        limits: connection-level limits (:class:`HttpLimits`).
    """

    def __init__(
        self,
        service: Any,
        socket_path: str | os.PathLike[str],
        max_body_mb: int = 64,
        *,
        security: Any = None,
        socket_group: str | int | None = None,
        metrics_port: int | None = None,
        limits: HttpLimits | None = None,
    ):
        import threading

        self.service = service
        self.socket_path = str(socket_path)
        self.socket_group = socket_group
        self._app = create_app(service, max_body_mb=max_body_mb, security=security, limits=limits)
        #: ``GET /metrics`` also on 127.0.0.1:metrics_port (0: a free port, set on start)
        self.metrics_port = metrics_port
        self._metrics_runner: Any = None
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="infscaler-api", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = self._loop.run_until_complete(
                start_unix_server(self._app, self.socket_path, group=self.socket_group)
            )
            if self.metrics_port is not None:
                mapp = create_metrics_app(self.service, metrics_registry(self._app))
                self._metrics_runner, self.metrics_port = self._loop.run_until_complete(
                    start_metrics_server(mapp, self.metrics_port)
                )
        except BaseException as exc:  # noqa: BLE001 - re-raised in start()
            self._error = exc
            if self._runner is not None:  # the metrics port failed: free the socket too
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(self._runner.cleanup())
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        if self._metrics_runner is not None:
            self._loop.run_until_complete(self._metrics_runner.cleanup())
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def start(self) -> ServerThread:
        """Start serving; returns once the socket accepts connections.

        Raises:
            InfScalerError: the socket path is taken (see :func:`prepare_socket_path`).
        """
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _infer_response(
    request: web.Request, req: Any, model_name: str, dep: Any, result: Any, extra: dict
) -> web.Response:
    """The v2 infer response for ``result``: its outputs, and as parameters the
    latency, per-unit ms, fan-out items and ``extra`` (the chosen variant, for tasks)."""
    from infscaler.protocol import encode_infer_response

    params: dict[str, Any] = {
        "latency_ms": round(result.latency_ms, 3),
        "unit_ms": json.dumps(result.unit_ms([u.name for u in dep.pipeline.units])),
        **extra,
    }
    if result.items is not None:
        params["items"] = result.items
    body, headers = encode_infer_response(
        model_name=model_name,
        model_version="1",
        request_id=req.id,
        outputs=result.outputs,
        requested=req.outputs,
        binary_default=req.binary_output_default,
        parameters=params,
        shm=_shm(request),
    )
    return web.Response(body=body, headers=headers)
