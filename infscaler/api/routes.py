"""The inference API's routes for clients: health, model metadata, inference, statistics,
status and metrics (the handlers; :func:`infscaler.api.server.create_app` maps the URLs).

An inference request (``POST /v2/models/{name}/infer``, :func:`infer`): the body is read
once into a buffer of its ``Content-Length`` (:func:`read_body`), or, binary tensor data
of fixed-size datatypes for a pipeline, its JSON part first and then each input's bytes
straight into the request's first pool slot (:func:`read_into_slot`), decoded against the
pipeline's inputs (:func:`infscaler.api.codec.decode_infer_request`: JSON, binary tensor
data or system shared memory), submitted to the service (a future of the front end's
:class:`~infscaler.runtime.serving.route.Result`), and the result encoded
(:func:`infscaler.api.codec.encode_infer_response`). A name that is a registered
model-less task and not a deployed pipeline goes to the task router instead
(:func:`_infer_task`, :mod:`infscaler.api.taskroute`: the selector picks the variant).

Sources: KServe / Triton ``protocol/`` docs (v2 REST health, metadata and inference,
``extension_statistics.md``); Prometheus text exposition format.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import numpy as np
from aiohttp import web

import infscaler
from infscaler.api.codec import (
    ProtocolError,
    TensorSpec,
    binary_inputs,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
    parse_queue_params,
    parse_timeout_ms,
)
from infscaler.api.common import (
    ARRIVED,
    EXTENSIONS,
    GRPC,
    LIMITS,
    LOADS,
    MAX_BODY,
    METRICS,
    SERVICE,
    TASKS,
    check_version,
    error_response,
    for_peer,
    hold_refusal,
    infer_parameters,
    json_response,
    model_stats,
    shm_of,
    slot_arrays,
)
from infscaler.api.metrics import CONTENT_TYPE, exposition
from infscaler.api.taskroute import (
    infer_task,
    task_metadata,
    task_ready,
    task_router,
    task_specs,
)
from infscaler.base.errors import InfScalerError
from infscaler.base.security import peer_of, quota_uid

# -- health / metadata -----------------------------------------------------------------


async def server_metadata(request: web.Request) -> web.Response:
    return json_response(
        {"name": "infscaler", "version": infscaler.__version__, "extensions": EXTENSIONS}
    )


async def live(request: web.Request) -> web.Response:
    return json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if service.ready():
        return json_response({"ready": True})
    failure = getattr(getattr(service, "frontend", None), "failure", None)
    why = (
        "stopping"
        if service.stopping
        else f"the front end failed: {failure}"
        if failure
        else "pipelines are not ready"
    )
    return error_response(f"not ready: {why}", 503)


def model_entry(service: Any, dep: Any) -> dict[str, Any]:
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
    service = request.app[SERVICE]
    return json_response({"models": [model_entry(service, d) for d in service.deployments()]})


async def model_metadata(request: web.Request) -> web.Response:
    """``GET /v2/models/{name}[/versions/{v}]``: v2 model metadata (name, versions,
    platform, inputs, outputs with their datatypes and shapes; -1: any size)."""
    service = request.app[SERVICE]
    router = task_router(service, request.app[TASKS], request.match_info["name"])
    check_version(request)
    if router is not None:
        return json_response(task_metadata(router, request.match_info["name"]))
    dep = service.deployment(request.match_info["name"])
    p = dep.pipeline
    return json_response(
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


async def model_config(request: web.Request) -> web.Response:
    """``GET /v2/models/{name}[/versions/{v}]/config``: the model's ``ModelConfig`` as
    Triton's JSON (:mod:`infscaler.api.modelconfig`: a Triton repository model's served
    config.pbtxt, else the pipeline's name, platform, inputs and outputs)."""
    from infscaler.api.modelconfig import config_json
    from infscaler.api.modelconfig import model_config as config_of

    dep = request.app[SERVICE].deployment(request.match_info["name"])
    check_version(request)
    return json_response(config_json(config_of(dep)))


async def model_ready(request: web.Request) -> web.Response:
    """``GET /v2/models/{name}[/versions/{v}]/ready``: 200 ``{"name", "ready": true}``,
    or 503 with why not (a degraded pipeline's units; for a model-less task,
    :func:`~infscaler.api.taskroute.task_ready`); 404 for a name that is neither."""
    service = request.app[SERVICE]
    name = request.match_info["name"]
    router = task_router(service, request.app[TASKS], name)
    if router is not None:
        check_version(request)
        why = task_ready(router, name)
        if not why:
            return json_response({"name": name, "ready": True})
        # the variants' file paths are the operator's to see (redact: ``<path>``)
        return error_response(
            for_peer(request, f"task {name} is not ready; " + "; ".join(why)), 503
        )
    service.deployment(name)
    check_version(request)
    if service.ready(name):
        return json_response({"name": name, "ready": True})
    why = service.degraded(name) if hasattr(service, "degraded") else []
    return error_response(f"model {name} is not ready" + "".join(f"; {w}" for w in why), 503)


# -- inference -------------------------------------------------------------------------


async def infer(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["name"]
    router = task_router(service, request.app[TASKS], name)
    if router is not None:
        check_version(request)
        return await _infer_task(request, router, name)
    dep = service.deployment(name)
    check_version(request)
    uid = quota_uid(peer_of(request))  # held to pending_per_uid
    specs = [TensorSpec(i.name, i.datatype, list(i.shape)) for i in dep.pipeline.inputs]
    req, slot = await _read_infer_request(request, specs, _lender(service, dep))
    try:
        timeout_s = parse_timeout_ms(req.parameters)
        priority, queue_timeout_us = parse_queue_params(req.parameters)
        try:
            fut = service.submit(
                name,
                slot_arrays(req.inputs),
                timeout_s,
                request.get(ARRIVED),
                priority=priority,
                queue_timeout_us=queue_timeout_us,
                uid=uid,
                **({} if slot is None else {"slot": slot}),
            )
        except InfScalerError as exc:
            if slot is not None:
                slot.release()
            await hold_refusal(exc)
            raise
    except BaseException:
        if slot is not None:  # the service did not take it (release is idempotent)
            slot.release()
        raise
    result = await asyncio.wrap_future(fut)
    return _infer_response(request, req, name, dep, result, {})


async def _infer_task(request: web.Request, router: Any, task: str) -> web.Response:
    """A model-less query: ``POST /v2/models/{task}/infer`` with parameters
    ``latency_ms`` and ``min_accuracy`` (both optional), decoded against the task's
    inputs and routed by :func:`~infscaler.api.taskroute.infer_task` (as gRPC's
    ModelInfer routes it); the response's parameters name the variant (``variant``,
    ``meets_requirements``, ``selection``, ``selection_reason``, ...)."""
    req, _ = await _read_infer_request(request, task_specs(router, task))
    result, dep, extra = await infer_task(
        router,
        task,
        req.inputs,
        req.parameters,
        timeout_s=parse_timeout_ms(req.parameters),
        peer=peer_of(request),
        loads=request.app[LOADS],
    )
    return _infer_response(request, req, task, dep, result, extra)


def _lender(service: Any, dep: Any) -> Any:
    """``inputs -> LentSlot | None`` for ``dep``'s first slot (the front end's
    :meth:`~infscaler.runtime.serving.frontend.FrontEnd.lend_first_slot`), or None for a
    service without one."""
    lend = getattr(getattr(service, "frontend", None), "lend_first_slot", None)
    route = getattr(dep, "route", None)
    if lend is None or route is None:
        return None
    return lambda inputs: lend(route, inputs)


async def _read_infer_request(
    request: web.Request, specs: list[Any], lend: Any = None
) -> tuple[Any, Any]:
    """``(request, slot)``: the request's body, read (:func:`read_body`, or with
    ``lend`` :func:`read_into_slot` where it applies) and decoded against the input
    ``specs`` (JSON, binary tensor data after ``Inference-Header-Content-Length``, or
    this client's shared memory regions); binary inputs are views of the body, or of
    ``slot`` (a :class:`~infscaler.runtime.serving.frontend.LentSlot`, else None), which
    the caller passes on or releases.

    Raises:
        ProtocolError: (400) a malformed header, body or tensor.
    """
    header_length = parse_header_length(request.headers.get("Inference-Header-Content-Length"))
    if lend is not None and header_length is not None:
        read = await read_into_slot(request, specs, header_length, lend)
        if read is not None:
            return read
    body = await read_body(request, binary=header_length is not None)
    json_limit = int(request.app[LIMITS].max_json_mb * (1 << 20))
    json_size = len(body) if header_length is None else min(header_length, len(body))
    if json_size > json_limit:  # a chunked body: its length is known only now
        raise ProtocolError(json_too_large(json_size, json_limit), 413)
    req = decode_infer_request(
        body, header_length=header_length, input_specs=specs, shm=shm_of(request), copy=False
    )
    return req, None


class _BodyReader:
    """A body of Content-Length ``n`` read in order into the caller's buffers, chunk by
    chunk as it arrives (a chunk that spans two buffers is split between them); its
    errors are :func:`read_body`'s."""

    def __init__(self, request: web.Request, n: int) -> None:
        self.content, self.n, self.pos = request.content, n, 0
        self.rest = memoryview(b"")

    async def into(self, view: memoryview) -> None:
        """Fill ``view`` (bytes) with the body's next ``len(view)`` bytes.

        Raises:
            HTTPBadRequest: the body ended, or the connection was lost, first.
        """
        filled, want = 0, len(view)
        while filled < want:
            if not self.rest:
                try:
                    chunk = await self.content.readany()
                except (ConnectionError, EOFError) as exc:  # the client went away mid-body
                    raise web.HTTPBadRequest(
                        reason=f"the connection was lost after {self.pos} of the body's "
                        f"{self.n} bytes ({exc})"
                    ) from None
                if not chunk:
                    raise web.HTTPBadRequest(
                        reason=f"the body ended after {self.pos} of its Content-Length "
                        f"{self.n} bytes"
                    )
                self.rest = memoryview(chunk)
            k = min(want - filled, len(self.rest))
            view[filled : filled + k] = self.rest[:k]
            self.rest = self.rest[k:]
            filled += k
            self.pos += k

    def check_end(self) -> None:
        """Every byte was taken (the HTTP parser holds a body to its Content-Length).

        Raises:
            HTTPBadRequest: bytes past it.
        """
        if self.rest:
            raise web.HTTPBadRequest(reason=f"the body is longer than its Content-Length {self.n}")


async def read_into_slot(
    request: web.Request, specs: list[Any], header_length: int, lend: Any
) -> tuple[Any, Any] | None:
    """A binary tensor data request read with its tensors' bytes going straight into
    the request's first pool slot: its JSON part is read first; when every input is
    binary data of a fixed-size datatype (:func:`~infscaler.api.codec.binary_inputs`,
    their sizes adding up to the rest of the body) and ``lend`` gives a slot for them,
    each input's bytes are read into its place in the slot and the request is decoded
    from those views (``(request, slot)``); else the rest is read after the JSON into
    one buffer as :func:`read_body` does (``(request, None)``). None, with nothing read:
    a body this does not take (no Content-Length, over a limit, a JSON part over
    ``max_json_mb`` or past the body: :func:`read_body`'s path answers it as before).
    The slot is released on any error; decoding and its errors are those of
    :func:`~infscaler.api.codec.decode_infer_request`.

    Raises:
        HTTPBadRequest: (400) the body ended before its Content-Length, or the connection
            was lost meanwhile; ProtocolError: (400) as decoding.
    """
    n = request.content_length
    limit = request.app[MAX_BODY] << 20
    json_limit = int(request.app[LIMITS].max_json_mb * (1 << 20))
    if (
        n is None
        or request.can_read_body is False
        or (limit and n > limit)
        or not 0 < header_length <= min(n, json_limit)
    ):
        return None
    reader = _BodyReader(request, n)
    header = bytearray(header_length)
    await reader.into(memoryview(header))
    plan = binary_inputs(header)
    slot = None
    if plan is not None and sum(size for *_, size in plan) == n - header_length:
        slot = lend({name: (shape, dtype) for name, dtype, shape, _ in plan})
    shm = shm_of(request)
    if slot is None:
        body = memoryview(np.empty(n, np.uint8).data)
        body[:header_length] = header
        await reader.into(body[header_length:])
        reader.check_end()
        req = decode_infer_request(
            body, header_length=header_length, input_specs=specs, shm=shm, copy=False
        )
        return req, None
    try:
        for name, *_ in plan:
            await reader.into(slot.views[name])
        reader.check_end()
        req = decode_infer_request(
            bytes(header),
            header_length=header_length,
            input_specs=specs,
            shm=shm,
            copy=False,
            parts=[slot.views[name] for name, *_ in plan],
        )
    except BaseException:
        slot.release()
        raise
    return req, slot


def json_part_of(request: web.Request) -> int | None:
    """The length of an inference request's JSON part from its
    ``Inference-Header-Content-Length`` (None: the whole body is JSON, or the header is
    malformed, which decoding refuses with 400)."""
    try:
        return parse_header_length(request.headers.get("Inference-Header-Content-Length"))
    except ProtocolError:
        return None


def json_too_large(size: int, limit: int) -> str:
    """The 413 message for ``size`` bytes of JSON over ``limit``."""
    return (
        f"the request carries {size / 1e6:.1f} MB of JSON; at most {limit / 1e6:.1f} MB "
        "is decoded (JSON takes up to 20x its size in memory once decoded, --max-json-mb): "
        "send large tensors as binary tensor data (Inference-Header-Content-Length) or "
        "through system shared memory"
    )


def _too_large(request: web.Request, limit: int, declared: int | None = None) -> Exception:
    """413 for a body over ``limit``: aiohttp's (its message names ``--max-body-mb``) for
    the app's own limit, a :class:`ProtocolError` naming the route's otherwise."""
    if limit == request.app[MAX_BODY] << 20:
        return web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared or limit + 1)
    size = f"{declared} bytes" if declared is not None else f"more than {limit} bytes"
    return ProtocolError(
        f"request body too large: {size}; {request.method} {request.path[:120]} takes at "
        f"most {limit // 1024} KB",
        413,
    )


async def discard_body(request: web.Request, limit: int) -> None:
    """Read what is left of ``request``'s body, at most ``limit`` bytes, in 64 KB chunks
    that are dropped at once (never held, never decoded), so a client still sending it
    reads the answer instead of a reset; a read error ends it quietly."""
    with contextlib.suppress(Exception):
        seen = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            seen += len(chunk)
            if seen > limit:
                break


async def read_body(
    request: web.Request, limit: int | None = None, *, binary: bool = False
) -> bytearray | bytes | memoryview:
    """The request body, read once into a buffer of its ``Content-Length`` (no growing
    buffer, no final ``bytes`` copy as in aiohttp's ``request.read()``); the binary
    tensor data inputs are then zero-copy views of it (``decode_infer_request(...,
    copy=False)``) until the front end copies them into pool slots. A body without a
    Content-Length (chunked) is read in chunks up to ``limit``.

    Args:
        limit: the most bytes it may have (default: the app's ``max_body_mb``).
        binary: the body carries binary tensor data: its buffer is not zeroed first
            (``numpy.empty``; a bytearray is, at ~16 GB/s: 0.3 ms for a 4.9 MB body) and
            it is returned as a ``memoryview`` (uint8). Every byte is written before it
            is returned, or it raises.

    Raises:
        HTTPRequestEntityTooLarge / ProtocolError: (413) beyond ``limit`` (before reading
            when the length is declared, else as soon as it passes it).
        HTTPBadRequest: the body ended before its Content-Length (or the connection was
            lost meanwhile).
    """
    n = request.content_length
    if limit is None:
        limit = request.app[MAX_BODY] << 20
    if request.can_read_body is False:
        return b""
    if n is None:
        chunks = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            chunks += chunk
            if limit and len(chunks) > limit:
                raise _too_large(request, limit)
        return chunks
    if limit and n > limit:
        raise _too_large(request, limit, n)
    buf: bytearray | memoryview = np.empty(n, np.uint8).data if binary else bytearray(n)
    reader = _BodyReader(request, n)
    await reader.into(memoryview(buf))
    reader.check_end()
    return buf


def _infer_response(
    request: web.Request, req: Any, model_name: str, dep: Any, result: Any, extra: dict
) -> web.Response:
    """The v2 infer response for ``result``: its outputs, and as parameters the
    latency, per-unit ms, fan-out items and ``extra`` (the chosen variant, for tasks):
    :func:`~infscaler.api.common.infer_parameters`."""
    params = infer_parameters(result, dep, extra)
    body, headers = encode_infer_response(
        model_name=model_name,
        model_version="1",
        request_id=req.id,
        outputs=result.outputs,
        requested=req.outputs,
        binary_default=req.binary_output_default,
        parameters=params,
        shm=shm_of(request),
    )
    return web.Response(body=body, headers=headers)


# -- statistics, status, metrics -------------------------------------------------------


async def stats_one(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    dep = service.deployment(request.match_info["name"])
    check_version(request)
    return json_response(for_peer(request, {"model_stats": [model_stats(service, dep)]}))


async def stats_all(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    stats = {"model_stats": [model_stats(service, d) for d in service.deployments()]}
    return json_response(for_peer(request, stats))


async def service_status(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    status = service.status()
    status["system_shared_memory"] = shm_of(request).status()
    status["grpc_socket"] = request.app[GRPC]["socket"]
    return json_response(for_peer(request, status))


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the Prometheus text format (:mod:`infscaler.api.metrics`)."""
    return web.Response(
        body=exposition(request.app[METRICS]), headers={"Content-Type": CONTENT_TYPE}
    )
