"""The inference API: Open Inference Protocol (KServe v2) over HTTP on a Unix socket.

Errors are ``{"error": "..."}`` JSON with 400, 403, 404, 405, 408, 409, 413, 429 / 503
(with ``Retry-After`` when the refusal says when to retry) or 500 (docs/api.md,
"Errors"); a bad request fails alone. Connection-level limits: :class:`HttpLimits`.

Sources: KServe / Triton ``protocol/`` docs (v2 REST and its extensions); aiohttp
``web.UnixSite``. More: docs/api.md, "`infscaler/api/server.py`".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from typing import Any

from aiohttp import web

from infscaler.api.common import (
    ARRIVED,
    GRPC,
    LIMITS,
    LOADS,
    MAX_BODY,
    METRICS,
    SECURITY,
    SERVICE,
    SHM,
    SHM_VIEW,
    TASKS,
    error_code,
    error_response,
    hold_refusal,
    status_of,
)
from infscaler.api.http import (
    BodyTimeout,
    BodyTruncated,
    EdgeRunner,
    HttpLimits,
    fit_to_fd_limit,
)
from infscaler.api.metrics import make_registry
from infscaler.api.repo import (
    repository_index,
    repository_load,
    repository_unload,
    shm_register,
    shm_status,
    shm_unregister,
)
from infscaler.api.routes import (
    discard_body,
    infer,
    json_part_of,
    json_too_large,
    live,
    metrics,
    model_config,
    model_metadata,
    model_ready,
    models,
    ready,
    server_metadata,
    service_status,
    stats_all,
    stats_one,
)
from infscaler.api.sockets import bind_unix_socket, prepare_socket_path, resolve_group
from infscaler.api.sysshm import SystemSharedMemoryRegistry
from infscaler.base.errors import InfScalerError
from infscaler.base.quotas import LoadBudget
from infscaler.base.security import SecurityPolicy, is_privileged_uid, peer_of
from infscaler.base.threads import NamedThread, named_executor
from infscaler.runtime.serving.admission import request_reservation

__all__ = [
    "ACCEPT_BATCH",
    "LISTEN_BACKLOG",
    "HttpLimits",
    "ServerThread",
    "bind_unix_socket",
    "create_app",
    "create_metrics_app",
    "metrics_registry",
    "prepare_socket_path",
    "resolve_group",
    "start_grpc_server",
    "start_metrics_server",
    "start_unix_server",
]

log = logging.getLogger("infscaler.api.server")

#: pending connections the listening socket queues (``listen(2)`` backlog; the kernel caps
#: it at ``net.core.somaxconn``): an overload burst waits in it for an answer instead of
#: being refused at connect
LISTEN_BACKLOG = 4096
#: connections asyncio accepts in one event loop tick (it passes the ``backlog`` of
#: ``create_server`` as this batch, ``selector_events._accept_connection``): each holds
#: an fd before the connection cap can refuse it, so a flood of connects could take a
#: whole fd limit in one tick with the batch at :data:`LISTEN_BACKLOG`. The socket is
#: then ``listen``-ed again with the full backlog for the kernel's queue.
ACCEPT_BATCH = 32


# -- the app ---------------------------------------------------------------------------


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure becomes v2 error JSON; nothing escapes. Our exceptions (and any other
    ``infscaler`` exception with an int ``status``) answer with their ``status`` (default
    400), ``Retry-After`` from ``retry_after_s``, and their reason ``code`` as the JSON's."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(
            f"request body too large: {exc.text or ''} (the limit is "
            f"{request.app[MAX_BODY]} MB; pass large tensors through system shared "
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
        return error_response(
            str(exc), status_of(exc, 400), getattr(exc, "retry_after_s", None), error_code(exc)
        )
    except Exception as exc:  # noqa: BLE001 - logged with its traceback; the client gets 500
        if type(exc).__module__.startswith("infscaler") and status_of(exc, 0):
            # one of ours that is not an InfScalerError but says how to answer
            return error_response(
                str(exc), status_of(exc, 500), getattr(exc, "retry_after_s", None)
            )
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


@web.middleware
async def _admission(request: web.Request, handler: Any) -> web.StreamResponse:
    """Bytes in flight (:mod:`infscaler.runtime.serving.admission`), on every route that reads a
    body: a request reserves bytes from the service's budget, and from its client's
    (peer uid) share of it, *before* its body is read, and gives them back once
    answered (or cancelled). An inference reserves twice its declared binary part (the
    body and its decoded tensors) and 20 times its JSON part (what ``json.loads`` makes
    of it: :func:`~infscaler.runtime.serving.admission.request_reservation`; the body limit is
    assumed when no length is declared), and a JSON part over ``max_json_mb`` is 413 at
    once; any other POST (shared memory register, repository load) its declared
    length, at most the control body limit
    (:attr:`~infscaler.base.quotas.PeerQuotas.control_body_kb`; a longer declared body
    is 413 at once). Over a budget: 503 with ``retry_after_s``; the body is then read and
    thrown away in small chunks (never held), so the client, still sending it, gets the
    answer instead of a reset. The service's own user and root are held to the
    service-wide budget only."""
    service = request.app[SERVICE]
    if request.method != "POST" or not hasattr(service, "reserve_bytes"):
        return await handler(request)
    infer = request.path.endswith("/infer")
    declared = request.content_length
    if infer:
        request[ARRIVED] = time.monotonic()  # deadlines count from here, not the submit
        limit = request.app[MAX_BODY] << 20
        json_bytes = json_part_of(request)
        json_limit = int(request.app[LIMITS].max_json_mb * (1 << 20))
        known = declared if json_bytes is None else json_bytes
        if known is not None and min(known, limit) > json_limit:
            resp = error_response(json_too_large(min(known, limit), json_limit), 413)
            resp.force_close()  # the body is never read
            return resp
        nbytes = request_reservation(declared, limit, json_bytes)
    else:
        limit = request.app[LIMITS].quotas.control_body_bytes
        if declared is not None and declared > limit:
            resp = error_response(
                f"request body too large: {declared} bytes; {request.method} "
                f"{request.path[:120]} takes at most {limit // 1024} KB",
                413,
            )
            resp.force_close()  # the rest of the body is never read
            return resp
        nbytes = limit if declared is None else declared
    uid = peer_of(request).uid
    peer = None if is_privileged_uid(uid) and uid >= 0 else uid
    if infer:
        await _refuse_on_headers(request, service, peer, limit)
    try:
        service.reserve_bytes(nbytes, peer)
    except InfScalerError:
        await discard_body(request, limit)
        raise
    try:
        return await handler(request)
    finally:
        service.release_bytes(nbytes, peer)
        view = request.get(SHM_VIEW)
        if view is not None:  # what the request read from shared memory
            view.release()


async def _refuse_on_headers(request: web.Request, service: Any, peer: Any, limit: int) -> None:
    """Admission on an inference's headers, before its bytes are reserved or its body is
    read (:meth:`~infscaler.service.service.Service.precheck`): a refusal is raised once
    the body was dropped (read in chunks, never decoded) and the refusal's ``hold_s``
    passed; else nothing (the request is read and judged again when submitted)."""
    precheck = getattr(service, "precheck", None)
    name = request.match_info.get("name")
    refusal = None if precheck is None or name is None else precheck(name, peer)
    if refusal is not None:
        await discard_body(request, limit)
        await hold_refusal(refusal)
        raise refusal


def create_app(
    service: Any,
    *,
    shm: Any = None,
    max_body_mb: int = 64,
    tasks: Any = None,
    security: Any = None,
    limits: HttpLimits | None = None,
    grpc: bool = False,
) -> web.Application:
    """The aiohttp application for ``service`` (:class:`~infscaler.service.service.Service`).

    Args:
        shm: a :class:`~infscaler.api.sysshm.SystemSharedMemoryRegistry` (created if None).
        max_body_mb: request body limit, MB (413 beyond it).
        tasks: a :class:`~infscaler.modelless.tasks.TaskRouter` for model-less queries
            (default: one over the state dir's variant registry, made on first use).
        security: the :class:`~infscaler.base.security.SecurityPolicy` for pipelines loaded
            through the API (default: bundled function modules only, no model repository).
        limits: :class:`HttpLimits` (default: its defaults), fitted to the fd limit
            (:func:`~infscaler.api.http.fit_to_fd_limit`; ``grpc``: counting the gRPC socket).
    """
    app = web.Application(
        middlewares=[errors_middleware, _admission], client_max_size=max_body_mb << 20
    )
    limits = fit_to_fd_limit(limits if limits is not None else HttpLimits(), grpc=grpc)
    quotas = limits.quotas
    app[SERVICE] = service
    app[SHM] = (
        shm
        if shm is not None
        else SystemSharedMemoryRegistry(
            max_regions_per_uid=quotas.regions_per_uid, max_regions=quotas.regions
        )
    )
    app[LOADS] = LoadBudget(quotas.variant_loads_per_min)
    app[MAX_BODY] = max_body_mb
    app[TASKS] = {"router": tasks}
    app[SECURITY] = security if security is not None else SecurityPolicy()
    app[METRICS] = make_registry(service)
    app[LIMITS] = limits
    app[GRPC] = {"socket": None}  # set by start_grpc_server
    r = app.router
    r.add_get("/v2", server_metadata)
    r.add_get("/v2/health/live", live)
    r.add_get("/v2/health/ready", ready)
    r.add_get("/v2/models", models)
    r.add_get("/v2/models/stats", stats_all)
    for m in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_get(m, model_metadata)
        r.add_get(f"{m}/ready", model_ready)
        r.add_get(f"{m}/config", model_config)
        r.add_get(f"{m}/stats", stats_one)
        r.add_post(f"{m}/infer", infer)
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
        app[SHM].close()
    router = app[TASKS].get("router")
    if router is not None:
        with contextlib.suppress(Exception):
            router.close()


# -- metrics on a TCP port -------------------------------------------------------------


def metrics_registry(app: web.Application) -> Any:
    """The Prometheus registry behind ``app``'s ``GET /metrics``."""
    return app[METRICS]


def create_metrics_app(service: Any, registry: Any = None) -> web.Application:
    """An application serving only ``GET /metrics`` of ``service`` (for
    ``--metrics-port``; ``registry``: share the API app's)."""
    app = web.Application(middlewares=[errors_middleware])
    app[METRICS] = registry if registry is not None else make_registry(service)
    app[MAX_BODY] = 0
    app.router.add_get("/metrics", metrics)
    return app


async def start_metrics_server(
    app: web.Application, port: int, host: str = "127.0.0.1"
) -> tuple[Any, int]:
    """Serve ``app`` (:func:`create_metrics_app`) on ``host``:``port`` (``0.0.0.0`` only in a
    container's own network namespace; port 0: a free one). Returns ``(runner, port)``.

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


# -- serving on a Unix socket ----------------------------------------------------------


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
    runner = EdgeRunner(
        app, app[LIMITS], access_log=None, handle_signals=False, handler_cancellation=True
    )
    await runner.setup()
    sock = bind_unix_socket(p, mode, group)
    site = web.SockSite(runner, sock, backlog=ACCEPT_BATCH)
    await site.start()
    sock.listen(LISTEN_BACKLOG)  # the kernel queues a burst; asyncio takes ACCEPT_BATCH a tick
    return runner


async def start_grpc_server(
    app: web.Application, path: str | os.PathLike[str], group: str | int | None = None
) -> Any:
    """Serve the gRPC protocol on ``path`` beside ``app`` (:func:`create_app`), sharing its
    service, shared memory registry, limits, task router and variant load budget; returns
    the :class:`~infscaler.api.grpc.server.GrpcServer`."""
    from infscaler.api.grpc.server import GrpcServer  # grpcio loads only when asked for

    server = GrpcServer(
        app[SERVICE],
        app[SHM],
        str(path),
        max_body_mb=app[MAX_BODY],
        limits=app[LIMITS],
        group=group,
        tasks=app[TASKS],
        loads=app[LOADS],
    )
    await server.start()
    app[GRPC]["socket"] = server.path
    return server


class ServerThread:
    """The API served from a background thread with its own event loop (the demo, tests and
    benchmarks that drive a :class:`~infscaler.service.service.Service` in-process);
    arguments as :func:`create_app` and :func:`start_unix_server`."""

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
        grpc_socket: str | os.PathLike[str] | None = None,
    ):
        self.service = service
        self.socket_path = str(socket_path)
        self.socket_group = socket_group
        #: the gRPC socket beside it (None: none), :class:`~infscaler.api.grpc.server.GrpcServer`
        self.grpc_socket = None if grpc_socket is None else str(grpc_socket)
        self._app = create_app(
            service,
            max_body_mb=max_body_mb,
            security=security,
            limits=limits,
            grpc=self.grpc_socket is not None,
        )
        self._grpc: Any = None
        #: ``GET /metrics`` also on 127.0.0.1:metrics_port (0: a free port, set on start)
        self.metrics_port = metrics_port
        self._metrics_runner: Any = None
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = NamedThread(target=self._run, name="isc-api", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_default_executor(named_executor("isc-api-exec"))
        try:
            self._runner = self._loop.run_until_complete(
                start_unix_server(self._app, self.socket_path, group=self.socket_group)
            )
            if self.grpc_socket is not None:
                self._grpc = self._loop.run_until_complete(
                    start_grpc_server(self._app, self.grpc_socket, self.socket_group)
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
        if self._grpc is not None:
            self._loop.run_until_complete(self._grpc.stop())
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
