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
``GET  /v2/infscaler/status``                             control path, pool, instances
``POST /v2/repository/index``                             model repository extension
``POST /v2/repository/models/{name}/load|unload``         deploy (config in parameters)
``GET  /v2/systemsharedmemory[/region/{name}]/status``    system shared memory extension
``POST /v2/systemsharedmemory/region/{name}/register``
``POST /v2/systemsharedmemory[/region/{name}]/unregister``
========================================================  ==============================

Errors are ``{"error": "..."}`` with 400 (bad request), 404 (unknown model / region),
409 (name taken), 413 (body too large), 500 (a stage failed on the request) and 503
(not ready, overloaded, stopping, or the request could not finish). A bad request
fails alone: the server, the pipeline and every other request go on.

Sources: KServe / Triton ``protocol/`` docs (v2 REST, ``extension_binary_data.md``,
``extension_shared_memory.md``, ``extension_statistics.md``,
``extension_model_repository.md``); aiohttp ``web.UnixSite``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from aiohttp import web

import infscaler
from infscaler.errors import InfScalerError

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


def _json(data: Any, status: int = 200) -> web.Response:
    from infscaler.protocol import json_default

    return web.Response(
        body=json.dumps(data, default=json_default).encode(),
        status=status,
        content_type="application/json",
    )


def error_response(message: str, status: int) -> web.Response:
    """A v2 error: ``{"error": message}``."""
    return _json({"error": message}, status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure becomes v2 error JSON with the right status; nothing escapes."""
    from infscaler.protocol import ProtocolError
    from infscaler.runtime.frontend import RequestError
    from infscaler.service import ServiceError

    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(
            f"request body too large: {exc.text or ''} (the limit is "
            f"{request.app[_MAX_BODY]} MB; pass large tensors through system shared "
            "memory instead)",
            413,
        )
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.reason or exc.text or "error", exc.status)
        raise
    except ProtocolError as exc:
        return error_response(str(exc), getattr(exc, "status", 400))
    except (ServiceError, RequestError) as exc:
        return error_response(str(exc), exc.status)
    except InfScalerError as exc:
        return error_response(str(exc), getattr(exc, "status", 400))
    except Exception as exc:  # noqa: BLE001 - logged with its traceback; the client gets 500
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


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
    service: Any, *, shm: Any = None, max_body_mb: int = 64, tasks: Any = None
) -> web.Application:
    """The aiohttp application for ``service`` (:class:`~infscaler.service.Service`).

    Args:
        shm: a :class:`~infscaler.sysshm.SystemSharedMemoryRegistry` (created if None).
        max_body_mb: request body limit, MB (413 beyond it).
        tasks: a :class:`~infscaler.tasks.TaskRouter` for model-less queries (default:
            one over the variant registry in the service's state dir, made on the first
            query that names a registered task).
    """
    from infscaler.sysshm import SystemSharedMemoryRegistry

    app = web.Application(middlewares=[_errors, _admission], client_max_size=max_body_mb << 20)
    app[_SERVICE] = service
    app[_SHM] = shm if shm is not None else SystemSharedMemoryRegistry()
    app[_MAX_BODY] = max_body_mb
    app[_TASKS] = {"router": tasks}
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
    r.add_get("/v2/models/{name}/versions/{version}/stats", stats_one)
    r.add_post("/v2/models/{name}/versions/{version}/infer", infer)
    r.add_get("/v2/infscaler/status", service_status)
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


def _task_router(request: web.Request, name: str) -> Any:
    """The task router when ``name`` is a registered task and not a deployed pipeline
    (pipelines keep their names), else None."""
    service = request.app[_SERVICE]
    if any(d.name == name for d in service.deployments()):
        return None
    holder = request.app[_TASKS]
    router = holder.get("router")
    if router is None:
        from infscaler.variants import VariantRegistry

        registry = VariantRegistry(service.state_dir)
        if not registry.path.is_file():
            return None
        from infscaler.tasks import TaskRouter

        router = holder["router"] = TaskRouter(service, registry).start()
    if router.has_task(name):
        return router
    from infscaler.selector import SelectionError

    known = ", ".join(sorted(d.name for d in service.deployments())) or "none"
    raise SelectionError(
        f"unknown model or task {name!r} (deployed: {known}; registered tasks: "
        f"{', '.join(router.tasks()) or 'none'})",
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
    service = request.app[_SERVICE]
    router = _task_router(request, request.match_info["name"])
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
    from infscaler.tasks import task_interface

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
    if service.ready(name):
        return _json({"name": name, "ready": True})
    return error_response(f"model {name} is not ready", 503)


# -- inference ----------------------------------------------------------------------------


async def infer(request: web.Request) -> web.Response:
    from infscaler.protocol import TensorSpec, decode_infer_request

    service = request.app[_SERVICE]
    name = request.match_info["name"]
    router = _task_router(request, name)
    if router is not None:
        return await _infer_task(request, router, name)
    dep = service.deployment(name)
    body = await request.read()
    header = request.headers.get("Inference-Header-Content-Length")
    try:
        header_length = int(header) if header is not None else None
    except ValueError:
        return error_response(
            f"Inference-Header-Content-Length must be an integer, got {header!r}", 400
        )
    specs = [TensorSpec(i.name, i.datatype, list(i.shape)) for i in dep.pipeline.inputs]
    req = decode_infer_request(
        body, header_length=header_length, input_specs=specs, shm=request.app[_SHM]
    )
    timeout_s = None
    if "timeout_ms" in (req.parameters or {}):
        try:
            timeout_s = float(req.parameters["timeout_ms"]) / 1e3
        except (TypeError, ValueError):
            return error_response("parameter timeout_ms must be a number", 400)
    fut = service.submit(name, _slot_arrays(req.inputs), timeout_s, request.get(_ARRIVED))
    result = await asyncio.wrap_future(fut)
    return _infer_response(request, req, name, dep, result, {})


async def _infer_task(request: web.Request, router: Any, task: str) -> web.Response:
    """A model-less query: ``POST /v2/models/{task}/infer`` with parameters
    ``latency_ms`` and ``min_accuracy`` (both optional). The selector (INFaaS Algorithm 1)
    picks the variant, which is loaded if needed; the response's parameters name it
    (``variant``, ``meets_requirements``, ``selection``, ``selection_reason``, ...)."""
    from infscaler.protocol import TensorSpec, decode_infer_request
    from infscaler.tasks import task_interface

    body = await request.read()
    header = request.headers.get("Inference-Header-Content-Length")
    try:
        header_length = int(header) if header is not None else None
    except ValueError:
        return error_response(
            f"Inference-Header-Content-Length must be an integer, got {header!r}", 400
        )
    variants = router.catalog().variants(task)
    iface = task_interface(task, router.variant(variants[0].name) if variants else None)
    specs = [TensorSpec(i["name"], i["datatype"], list(i["shape"])) for i in iface["inputs"]]
    req = decode_infer_request(
        body, header_length=header_length, input_specs=specs, shm=request.app[_SHM]
    )
    params = dict(req.parameters or {})
    timeout_s = None
    if "timeout_ms" in params:
        try:
            timeout_s = float(params["timeout_ms"]) / 1e3
        except (TypeError, ValueError):
            return error_response("parameter timeout_ms must be a number", 400)
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
    snap = dep.route.stats.snapshot()
    lat = snap["latency"]

    def dur(count: int, total_ms: float) -> dict[str, int]:
        return {"count": int(count), "ns": int(total_ms * 1e6)}

    compute = [u["compute"] for u in snap["units"]]
    queue = [u["queue"] for u in snap["units"]]
    status = service.pipeline_status(dep)
    return {
        "name": dep.name,
        "version": "1",
        "inference_count": snap["success"],
        "execution_count": snap["success"],
        "inference_stats": {
            "success": dur(snap["success"], lat["total_ms"]),
            "fail": dur(sum(snap["fail"].values()), 0.0),
            "queue": dur(sum(q["count"] for q in queue), sum(q["total_ms"] for q in queue)),
            "compute_infer": dur(
                sum(c["count"] for c in compute), sum(c["total_ms"] for c in compute)
            ),
        },
        "latency_ms": {k: lat[k] for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")},
        "fail_by_status": {str(k): v for k, v in snap["fail"].items()},
        "rejected": snap["rejected"],
        "arrival_rate_per_s": snap["arrival_rate_per_s"],
        "units": status["units"],
    }


async def stats_one(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    dep = service.deployment(request.match_info["name"])
    return _json({"model_stats": [_model_stats(service, dep)]})


async def stats_all(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    return _json({"model_stats": [_model_stats(service, d) for d in service.deployments()]})


async def service_status(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    status = service.status()
    status["system_shared_memory"] = request.app[_SHM].status()
    return _json(status)


# -- model repository ---------------------------------------------------------------------


async def repository_index(request: web.Request) -> web.Response:
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
    raw = await request.read()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise web.HTTPBadRequest(reason=f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(reason="the body must be a JSON object")
    return data


async def repository_load(request: web.Request) -> web.Response:
    """Deploy a pipeline: ``{"parameters": {"config": "<pipeline as JSON or YAML>"}}``;
    the config's name is set to the URL's. Replaces a deployed pipeline of that name once
    the new one is ready (Triton's reload)."""
    from infscaler.config import load_pipeline

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
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    await loop.run_in_executor(None, lambda: service.deploy(cfg, replace=True))
    return _json({"name": name, "loaded": True, "seconds": round(time.perf_counter() - t0, 2)})


async def repository_unload(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    name = request.match_info["name"]
    service.deployment(name)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, service.undeploy, name)
    return _json({"name": name, "unloaded": True})


# -- system shared memory -----------------------------------------------------------------


async def shm_status(request: web.Request) -> web.Response:
    return _json(request.app[_SHM].status(request.match_info.get("name")))


async def shm_register(request: web.Request) -> web.Response:
    data = await _body_json(request)
    try:
        key, offset, size = data["key"], int(data.get("offset", 0)), int(data["byte_size"])
    except (KeyError, TypeError, ValueError):
        return error_response('register needs {"key": str, "offset": int, "byte_size": int}', 400)
    request.app[_SHM].register(request.match_info["name"], str(key), offset, size)
    return _json({})


async def shm_unregister(request: web.Request) -> web.Response:
    request.app[_SHM].unregister(request.match_info.get("name"))
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


async def start_unix_server(app: web.Application, path: str | os.PathLike[str], mode: int = 0o660):
    """Serve ``app`` on the Unix socket ``path`` (mode ``mode``). Returns the runner
    (``await runner.cleanup()`` to stop)."""
    p = prepare_socket_path(path)
    # handler_cancellation: a client that goes away cancels its handler, which cancels
    # the request's future: the front end drops the request (frees its slots)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.UnixSite(runner, str(p), backlog=LISTEN_BACKLOG)
    await site.start()
    os.chmod(p, mode)
    return runner


class ServerThread:
    """The API served from a background thread with its own event loop: for the demo,
    tests and benchmarks that drive a :class:`~infscaler.service.Service` in-process.

    Args:
        service: a started service. socket_path: where to listen. max_body_mb: body limit.
    """

    def __init__(self, service: Any, socket_path: str | os.PathLike[str], max_body_mb: int = 64):
        import threading

        self.service = service
        self.socket_path = str(socket_path)
        self._app = create_app(service, max_body_mb=max_body_mb)
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="infscaler-api", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = self._loop.run_until_complete(
                start_unix_server(self._app, self.socket_path)
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
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
        shm=request.app[_SHM],
    )
    return web.Response(body=body, headers=headers)
