"""The ``inference.GRPCInferenceService`` methods over the same service, shared memory
registry and security checks as the HTTP routes.

Sources: Triton ``grpc_service.proto``, ``model_config.proto``, KServe v2
``required_api.md``, Triton's extension docs. More: docs/api.md, "`infscaler/api/grpc/handlers.py`".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

import infscaler
from infscaler.api.codec import ProtocolError, TensorSpec, parse_timeout_ms
from infscaler.api.codec_json import parse_queue_params
from infscaler.api.common import (
    EXTENSIONS,
    VERSION,
    error_code,
    hold_refusal,
    infer_parameters,
    model_stats,
    shm_limits,
    slot_arrays,
    status_of,
)
from infscaler.api.grpc.mapping import decode_message, encode_model_infer, grpc_code
from infscaler.api.grpc.wire import NotQuick, decode_limit, decode_work, scan_model_infer
from infscaler.api.modelconfig import model_config
from infscaler.api.taskroute import (
    infer_task,
    task_metadata,
    task_ready,
    task_router,
    task_specs,
)
from infscaler.base.errors import InfScalerError
from infscaler.base.security import Peer, is_privileged, quota_uid, redact, require_privileged
from infscaler.proto import grpc_service_pb2 as pb

__all__ = ["SERVICE_NAME", "Handlers"]

log = logging.getLogger("infscaler.api.grpc")

SERVICE_NAME = "inference.GRPCInferenceService"

_UNIMPLEMENTED = {
    "ModelStreamInfer": (pb.ModelInferRequest, "stream", "ModelStreamInfer (decoupled models)"),
    "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, None, "CUDA shared memory"),
    "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, None, "CUDA shared memory"),
    "CudaSharedMemoryUnregister": (
        pb.CudaSharedMemoryUnregisterRequest,
        None,
        "CUDA shared memory",
    ),
    "TraceSetting": (pb.TraceSettingRequest, None, "trace settings"),
    "LogSettings": (pb.LogSettingsRequest, None, "log settings"),
}


#: methods served to a call whose connection the gate no longer holds (peer uid -1)
_ANY_PEER = frozenset({"ServerLive", "ServerReady"})
#: ModelInfer's work on the event loop (which serves the HTTP socket too), at most: a
#: message is scanned inline if no longer than INLINE_SCAN_BYTES and of at most
#: INLINE_SCAN_FIELDS fields (~2 ms of walking), else in a worker thread; parsed and
#: decoded inline if its wire.decode_work is at most INLINE_DECODE_WORK (~1 ms), else
#: in a worker thread. A hop to a thread costs ~40 us; a decode at least ~100 us.
INLINE_SCAN_BYTES = 1 << 20
INLINE_SCAN_FIELDS = 2048
INLINE_DECODE_WORK = 1 << 14


#: the trailing metadata key of a refusal's reason code (the HTTP error JSON's ``code``)
CODE_METADATA = "infscaler-code"


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _request_class(method: str) -> Any:
    desc = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[method]
    return getattr(pb, desc.input_type.name)


def _method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A handler of the call's raw message bytes: refuses a call of a connection the gate no
    longer holds (UNAVAILABLE; not ``ServerLive`` / ``ServerReady``) and a message over the
    control body limit (RESOURCE_EXHAUSTED), parses the rest (``ModelInfer`` its own), and
    turns failures into gRPC statuses (``retry after N s`` in the message, a refusal's code
    as ``infscaler-code`` trailing metadata; anything else INTERNAL, logged).
    """
    name = fn.__name__
    cls = None if name == "ModelInfer" else _request_class(name)

    @functools.wraps(fn)
    async def wrapper(self: Handlers, message: bytes, context: Any) -> Any:
        trailing: tuple[tuple[str, str], ...] = ()
        try:
            peer = self.peer_of(context)
            if peer.uid < 0 and name not in _ANY_PEER:
                raise _Abort(grpc.StatusCode.UNAVAILABLE, "the connection is gone; reconnect")
            request = message if cls is None else self._parse(cls, message)
            return await fn(self, request, context, peer)
        except _Abort as exc:
            code, message = exc.code, str(exc)
        except asyncio.CancelledError:
            raise
        except InfScalerError as exc:
            code, message = grpc_code(status_of(exc, 400)), str(exc)
            reason = error_code(exc)
            if reason is not None:
                trailing = ((CODE_METADATA, reason),)
            retry = getattr(exc, "retry_after_s", None)
            if retry is not None:
                message += f" (retry after {max(1, round(retry))} s)"
        except Exception as exc:  # noqa: BLE001 - logged; the client gets INTERNAL
            if type(exc).__module__.startswith("infscaler") and status_of(exc, 0):
                code, message = grpc_code(status_of(exc, 500)), str(exc)
            else:
                log.exception("internal error in %s", name)
                code, message = (
                    grpc.StatusCode.INTERNAL,
                    f"internal error: {type(exc).__name__}: {exc}",
                )
        if trailing:
            await context.abort(code, message, trailing)
        await context.abort(code, message)

    return wrapper


def _check_version(name: str, version: str) -> None:
    if version and version != VERSION:
        raise ProtocolError(
            f"model {name!r} has no version {version[:40]!r}; only version {VERSION} exists "
            "(or leave the version empty)",
            404,
        )


class Handlers:
    """The service's methods for one gRPC server.

    Args:
        service: the :class:`~infscaler.service.service.Service`.
        shm: the :class:`~infscaler.api.sysshm.SystemSharedMemoryRegistry` of the HTTP app.
        peer_of: ``context`` -> :class:`Peer` (the gate's table).
        tasks: ``{"router": TaskRouter | None}``, the HTTP app's (default: a fresh holder).
        loads: the HTTP app's :class:`~infscaler.base.quotas.LoadBudget` (default: new).
        quotas: the :class:`~infscaler.base.quotas.PeerQuotas`: a message of a method other
            than ``ModelInfer`` takes at most ``control_body_kb``.
        gate_reserves: the gate reserves twice each message's length before grpcio reads
            it; False: ``ModelInfer`` reserves that itself.
    """

    def __init__(
        self,
        service: Any,
        shm: Any,
        peer_of: Callable[[Any], Peer],
        *,
        tasks: dict[str, Any] | None = None,
        loads: Any = None,
        quotas: Any = None,
        gate_reserves: bool = False,
    ) -> None:
        from infscaler.base.quotas import LoadBudget, PeerQuotas

        self.service = service
        self.shm = shm
        self.peer_of = peer_of
        self.tasks = tasks if tasks is not None else {"router": None}
        self.quotas = quotas if quotas is not None else PeerQuotas()
        self.loads = loads if loads is not None else LoadBudget(self.quotas.variant_loads_per_min)
        self.gate_reserves = gate_reserves

    def _parse(self, cls: Any, message: bytes) -> Any:
        """``message`` parsed as ``cls``, if no longer than the control body limit.

        Raises:
            ProtocolError: (413) longer; (400) protobuf cannot parse it.
        """
        limit = self.quotas.control_body_bytes
        if len(message) > limit:
            raise ProtocolError(
                f"{cls.__name__} message too large: {len(message)} bytes; at most "
                f"{limit // 1024} KB (the control body limit)",
                413,
            )
        try:
            return cls.FromString(message)
        except DecodeError as exc:
            raise ProtocolError(f"not a valid {cls.__name__} message: {exc}") from None

    # -- health and metadata -------------------------------------------------------------

    @_method
    async def ServerLive(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    @_method
    async def ServerReady(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=bool(self.service.ready()))

    @_method
    async def ModelReady(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        router = task_router(self.service, self.tasks, request.name)
        if router is not None:  # a model-less task: ready when a query can be served
            _check_version(request.name, request.version)
            return pb.ModelReadyResponse(ready=not task_ready(router, request.name))
        self.service.deployment(request.name)
        _check_version(request.name, request.version)
        return pb.ModelReadyResponse(ready=bool(self.service.ready(request.name)))

    @_method
    async def ServerMetadata(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        return pb.ServerMetadataResponse(
            name="infscaler", version=infscaler.__version__, extensions=EXTENSIONS
        )

    @_method
    async def ModelMetadata(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        tm = pb.ModelMetadataResponse.TensorMetadata
        router = task_router(self.service, self.tasks, request.name)
        if router is not None:  # a model-less task: its inputs and outputs
            _check_version(request.name, request.version)
            md = task_metadata(router, request.name)
            return pb.ModelMetadataResponse(
                name=md["name"],
                versions=md["versions"],
                platform=md["platform"],
                inputs=[
                    tm(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                    for t in md["inputs"]
                ],
                outputs=[
                    tm(name=t["name"], datatype=t["datatype"] or "UNKNOWN", shape=t["shape"] or [])
                    for t in md["outputs"]
                ],
            )
        dep = self.service.deployment(request.name)
        _check_version(request.name, request.version)
        p = dep.pipeline
        return pb.ModelMetadataResponse(
            name=dep.name,
            versions=[VERSION],
            platform="infscaler_pipeline",
            inputs=[tm(name=i.name, datatype=i.datatype, shape=list(i.shape)) for i in p.inputs],
            outputs=[
                tm(
                    name=o["name"],
                    datatype=o["datatype"] or "UNKNOWN",
                    shape=list(o["shape"] or []),
                )
                for o in p.outputs
            ],
        )

    @_method
    async def ModelConfig(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        """The model's ``ModelConfig`` (:func:`~infscaler.api.modelconfig.model_config`:
        a Triton repository model's served config.pbtxt, else the pipeline's view)."""
        dep = self.service.deployment(request.name)
        _check_version(request.name, request.version)
        return pb.ModelConfigResponse(config=model_config(dep))

    @_method
    async def ModelStatistics(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        if request.name:
            deps = [self.service.deployment(request.name)]
            _check_version(request.name, request.version)
        else:
            deps = self.service.deployments()
        resp = pb.ModelStatisticsResponse()
        for dep in deps:
            s = model_stats(self.service, dep)
            if not is_privileged(peer):
                s = redact(s)
            m = resp.model_stats.add(
                name=s["name"],
                version=s["version"],
                last_inference=s["last_inference"],
                inference_count=s["inference_count"],
                execution_count=s["execution_count"],
            )
            for key, d in s["inference_stats"].items():
                getattr(m.inference_stats, key).CopyFrom(
                    pb.StatisticDuration(count=d["count"], ns=d["ns"])
                )
            for b in s["batch_stats"]:  # Triton's InferBatchStatistics, one per size
                entry = m.batch_stats.add(batch_size=b["batch_size"])
                for key in ("compute_input", "compute_infer", "compute_output"):
                    getattr(entry, key).CopyFrom(
                        pb.StatisticDuration(count=b[key]["count"], ns=b[key]["ns"])
                    )
        return resp

    # -- inference -----------------------------------------------------------------------

    @_method
    async def ModelInfer(self, message: bytes, context: Any, peer: Peer) -> Any:  # noqa: N802
        """One inference on a deployed pipeline or a model-less task's variant
        (:mod:`infscaler.api.taskroute`); the message is scanned
        (:func:`~infscaler.api.grpc.wire.scan_model_infer`) before it is parsed, in a worker
        thread when large (:data:`INLINE_DECODE_WORK`).
        """
        arrived = time.monotonic()
        service = self.service
        limit = decode_limit(len(message))
        scan = None
        if len(message) <= INLINE_SCAN_BYTES:
            with contextlib.suppress(NotQuick):
                scan = scan_model_infer(message, limit=limit, quick=INLINE_SCAN_FIELDS)
        if scan is None:
            scan = await self._off_loop(True, scan_model_infer, message, limit=limit)
        name = scan.model_name
        router = task_router(service, self.tasks, name)
        dep = None if router is not None else service.deployment(name)
        _check_version(name, scan.model_version)
        nbytes = max(0, scan.held - 2 * len(message))
        if not self.gate_reserves:
            nbytes += 2 * len(message)
        uid = quota_uid(peer)
        if nbytes:
            service.reserve_bytes(nbytes, uid)
        # shared memory reads: charged to the client and bounded by the pool, as over HTTP
        shm = self.shm.for_peer(peer, **shm_limits(service))
        try:
            if dep is not None:
                specs = [TensorSpec(i.name, i.datatype, list(i.shape)) for i in dep.pipeline.inputs]
            else:
                specs = task_specs(router, name)
            big = decode_work(scan, len(message)) > INLINE_DECODE_WORK
            req = await self._off_loop(big, decode_message, message, scan, specs, shm)
            del message
            timeout_s = parse_timeout_ms(req.parameters)
            remaining = context.time_remaining()
            if remaining is not None and (timeout_s is None or remaining < timeout_s):
                timeout_s = max(remaining, 1e-3)
            if dep is None:
                result, dep, extra = await infer_task(
                    router,
                    name,
                    req.inputs,
                    req.parameters,
                    timeout_s=timeout_s,
                    peer=peer,
                    loads=self.loads,
                )
            else:
                result, extra = await self._submit(dep, req, timeout_s, arrived, uid), {}
            return encode_model_infer(
                model_name=name,
                request_id=req.id,
                outputs=result.outputs,
                requested=req.outputs,
                parameters=infer_parameters(result, dep, extra),
                shm=shm,
            )
        finally:
            shm.release()
            if nbytes:
                service.release_bytes(nbytes, uid)

    @staticmethod
    async def _off_loop(thread: bool, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)``: in the loop's default executor if ``thread`` (a
        cancelled call waits for it to end: what it holds stays reserved until then),
        else inline."""
        if not thread:
            return fn(*args, **kw)
        fut = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kw))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    async def _submit(
        self, dep: Any, req: Any, timeout_s: float | None, arrived: float, uid: int | None
    ) -> Any:
        """``req`` submitted to the pipeline ``dep`` with its queue parameters, held to
        ``uid``'s share of pending requests (None: the operator); its Result (the call
        cancelled: the request too)."""
        priority, queue_timeout_us = parse_queue_params(req.parameters)
        try:
            fut = self.service.submit(
                dep.name,
                slot_arrays(req.inputs),
                timeout_s,
                arrived,
                priority=priority,
                queue_timeout_us=queue_timeout_us,
                uid=uid,
            )
        except InfScalerError as exc:  # a latency refusal is held before it is answered
            await hold_refusal(exc)
            raise
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise

    # -- system shared memory ------------------------------------------------------------

    @_method
    async def SystemSharedMemoryStatus(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        resp = pb.SystemSharedMemoryStatusResponse()
        for r in self.shm.status(request.name or None, peer):
            resp.regions[r["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r["name"], key=r["key"], offset=r["offset"], byte_size=r["byte_size"]
                )
            )
        return resp

    @_method
    async def SystemSharedMemoryRegister(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        if not request.name or not request.key:
            raise ProtocolError("register needs a region name and a shared memory key")
        self.shm.register(request.name, request.key, request.offset, request.byte_size, peer)
        return pb.SystemSharedMemoryRegisterResponse()

    @_method
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        self.shm.unregister(request.name or None, peer)
        return pb.SystemSharedMemoryUnregisterResponse()

    # -- model repository ----------------------------------------------------------------

    @_method
    async def RepositoryIndex(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        require_privileged(peer, "the model repository index")
        resp = pb.RepositoryIndexResponse()
        for d in self.service.deployments():
            state = "READY" if self.service.ready(d.name) else "UNAVAILABLE"
            resp.models.add(name=d.name, version=VERSION, state=state, reason="")
        return resp

    @_method
    async def RepositoryModelLoad(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        require_privileged(peer, "loading a model")
        raise _Abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "loading a model is served on the HTTP socket only: POST "
            "/v2/repository/models/{name}/load, or `infscaler deploy`",
        )

    @_method
    async def RepositoryModelUnload(self, request: Any, context: Any, peer: Peer) -> Any:  # noqa: N802
        require_privileged(peer, "unloading a model")
        raise _Abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "unloading a model is served on the HTTP socket only: POST "
            "/v2/repository/models/{name}/unload, or `infscaler undeploy`",
        )

    # -- the method table ----------------------------------------------------------------

    def generic_handler(self) -> Any:
        """The ``grpc.GenericRpcHandler`` of every method of the service."""
        methods: dict[str, Any] = {}
        for name, desc in pb.DESCRIPTOR.services_by_name[
            "GRPCInferenceService"
        ].methods_by_name.items():
            resp_cls = _message_class(desc.output_type.name)
            if name in _UNIMPLEMENTED:
                fn = _unimplemented(_UNIMPLEMENTED[name][2])
            else:
                fn = getattr(self, name)
            make = (
                grpc.stream_stream_rpc_method_handler
                if desc.client_streaming
                else grpc.unary_unary_rpc_method_handler
            )
            methods[name] = make(fn, response_serializer=resp_cls.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


def _message_class(name: str) -> Any:
    return getattr(pb, name)


def _unimplemented(what: str) -> Callable[..., Any]:
    async def handler(request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{what} is not supported by InfScaler's gRPC service (use ModelInfer; "
            "system shared memory for zero-copy inputs)",
        )

    return handler
