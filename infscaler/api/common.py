"""What every handler of the inference API shares: app keys, JSON and error responses.

The base of the server modules and what the HTTP routes and the gRPC methods
(:mod:`infscaler.api.grpc.handlers`) both use: the app keys, v2 error JSON, the model
version check, the peer's view of shared memory and status, :func:`slot_arrays`,
:func:`model_stats` and :func:`hold_refusal`.

Sources: KServe / Triton ``protocol/`` docs (v2 REST error object); RFC 9110 section
10.2.3 (``Retry-After``); aiohttp ``web.AppKey`` / ``web.RequestKey``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

import numpy as np
from aiohttp import web

from infscaler.api.codec import ProtocolError, json_default, unit_ms_parameters
from infscaler.base.security import is_privileged, peer_of, redact
from infscaler.runtime.serving.batching import ExecCounts, counting_unit

EXTENSIONS = [
    "binary_tensor_data",
    "system_shared_memory",
    "statistics",
    "model_repository",
    "infscaler_status",
]
#: the :class:`~infscaler.service.service.Service` the app serves
SERVICE = web.AppKey("service", object)
#: the :class:`~infscaler.api.sysshm.SystemSharedMemoryRegistry`
SHM = web.AppKey("shm", object)
#: the request body limit, MB
MAX_BODY = web.AppKey("max_body_mb", int)
#: ``{"router": TaskRouter | None}`` (made on the first model-less query)
TASKS = web.AppKey("tasks", object)
#: the :class:`~infscaler.base.security.SecurityPolicy` for pipelines loaded through the API
SECURITY = web.AppKey("security", object)
#: the Prometheus registry behind ``GET /metrics``
METRICS = web.AppKey("metrics", object)
#: the :class:`~infscaler.api.http.HttpLimits`
LIMITS = web.AppKey("limits", object)
#: the :class:`~infscaler.base.quotas.LoadBudget` of variant loads per client uid
LOADS = web.AppKey("loads", object)
#: ``{"socket": path | None}``: the gRPC socket served beside the app
#: (:func:`infscaler.api.server.start_grpc_server`)
GRPC = web.AppKey("grpc", dict)
#: when an inference request arrived (``time.monotonic()`` s, before its body was read)
ARRIVED = web.RequestKey("arrived_s", float)
#: the request's :class:`~infscaler.api.sysshm.PeerRegistry` (:func:`shm_of`)
SHM_VIEW = web.RequestKey("shm_view", object)
#: The only model version there is.
VERSION = "1"


def json_response(data: Any, status: int = 200) -> web.Response:
    """``data`` as a JSON response (numpy values and bytes through ``json_default``)."""
    return web.Response(
        body=json.dumps(data, default=json_default).encode(),
        status=status,
        content_type="application/json",
    )


def error_response(
    message: str, status: int, retry_after_s: float | None = None, code: str | None = None
) -> web.Response:
    """A v2 error: ``{"error": message}``, with ``"code": code`` when there is one (a
    refusal's reason code, :func:`error_code`; clients that read only ``error``, as
    tritonclient, are not affected); with ``Retry-After: <ceil seconds>`` (at least 1)
    when ``retry_after_s`` is a finite number >= 0 (RFC 9110 section 10.2.3)."""
    doc = {"error": message} if code is None else {"error": message, "code": code}
    resp = json_response(doc, status)
    if retry_after_s is not None:
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            if math.isfinite(retry_after_s) and retry_after_s >= 0:
                resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return resp


def error_code(exc: BaseException) -> str | None:
    """``exc.code`` when it is a reason code (a short lower-case word, at most 32
    characters: :class:`~infscaler.runtime.serving.requests.RequestError`'s), else None."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and 0 < len(code) <= 32 and code.replace("_", "a").isalpha():
        return code if code.islower() else None
    return None


def status_of(exc: BaseException, default: int) -> int:
    """``exc.status`` when it is an HTTP error status (400-599), else ``default``."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        return status
    return default


def shm_of(request: web.Request) -> Any:
    """The shared memory registry as this request's client sees it (its own regions),
    one per request: its reads are charged to the client's in-flight budget and bounded
    by what the tensor pool can hold (:class:`~infscaler.api.sysshm.PeerRegistry`);
    the admission middleware releases them once the request is answered."""
    view = request.get(SHM_VIEW)
    if view is None:
        service = request.app[SERVICE]
        view = request[SHM_VIEW] = request.app[SHM].for_peer(
            lambda: peer_of(request), **shm_limits(service)
        )
    return view


def shm_limits(service: Any) -> dict[str, Any]:
    """``budget`` and ``max_read_bytes`` of a request's shared memory view
    (:meth:`~infscaler.api.sysshm.SystemSharedMemoryRegistry.for_peer`) for ``service``."""
    limit = getattr(service, "max_input_bytes", None)
    return {
        "budget": service if hasattr(service, "reserve_bytes") else None,
        "max_read_bytes": limit if isinstance(limit, int) else None,
    }


def for_peer(request: web.Request, data: Any) -> Any:
    """``data`` as is for the service's user and root, without file paths for others."""
    return data if is_privileged(peer_of(request)) else redact(data)


def check_version(request: web.Request) -> None:
    """404 unless the URL's ``{version}`` (when it has one) is the only version, "1"."""
    version = request.match_info.get("version")
    if version is not None and version != VERSION:
        raise ProtocolError(
            f"model {request.match_info['name']!r} has no version {version[:40]!r}; "
            f"only version {VERSION} exists (or leave /versions/... out of the URL)",
            404,
        )


def slot_arrays(inputs: dict[str, Any]) -> dict[str, Any]:
    """BYTES inputs arrive as object arrays of ``bytes``; pool slots hold plain dtypes
    only, so they travel as fixed-width ``S`` arrays (numpy strips trailing NUL bytes)."""
    out = {}
    for k, v in inputs.items():
        if v.dtype.kind == "O":
            v = np.array([bytes(x) for x in v.reshape(-1)], dtype=np.bytes_).reshape(v.shape)
        out[k] = v
    return out


def infer_parameters(result: Any, dep: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """An infer response's parameters, every one a scalar (KServe v2 / Triton
    parameters: string, int64, bool or double), the same over HTTP and gRPC:
    ``latency_ms`` (double, the request's end-to-end ms in the service), one
    ``unit_ms.<unit>`` per served unit of ``dep``'s pipeline (double, ms summed over the
    request's items: :func:`~infscaler.api.codec.unit_ms_parameters`), ``items`` (int64,
    a fan-out's item count, when there is one) and ``extra`` (the chosen variant of a
    model-less task)."""
    params: dict[str, Any] = {
        "latency_ms": round(float(result.latency_ms), 3),
        **unit_ms_parameters(result.unit_ms([u.name for u in dep.pipeline.units])),
        **(extra or {}),
    }
    if result.items is not None:
        params["items"] = int(result.items)
    return params


def exec_counts(service: Any, dep: Any) -> ExecCounts:
    """What ``dep``'s instances ran, as Triton counts one model: the executions, items and
    per batch size counts and ns of its counting unit
    (:func:`~infscaler.runtime.serving.batching.counting_unit`: the unit that batches,
    else its first model unit), summed over every instance it ran since the service started;
    empty when nothing ran or there is no supervisor. Instances report when they go
    idle and every second under load, so the counts trail the answers by that much."""
    sup = getattr(service, "supervisor", None)
    unit = counting_unit(dep.pipeline.units)
    if sup is None or unit is None or not hasattr(sup, "exec_totals"):
        return ExecCounts()
    return sup.exec_totals.get((dep.name, unit.index))


def model_stats(service: Any, dep: Any) -> dict[str, Any]:
    """One ``model_stats`` entry (Triton ``extension_statistics.md``): ``name``,
    ``version``, ``last_inference`` (ms since the epoch; 0: none yet),
    ``inference_count`` (items inferred: a request of batch dim 4 counts 4),
    ``execution_count`` (engine runs: a dynamic batch counts 1; both from
    :func:`exec_counts`), ``inference_stats`` (``success``, ``fail``,
    ``queue``, ``compute_input``, ``compute_infer``, ``compute_output``, ``cache_hit``,
    ``cache_miss``, each ``{count, ns}``: cumulative ns) and ``batch_stats`` (per batch
    size run: ``batch_size``, ``compute_input`` (stacking the inputs),
    ``compute_infer``, ``compute_output`` (splitting and handing on the outputs), each
    ``{count, ns}``), then
    InfScaler's own fields (``latency_ms`` percentiles, ``fail_by_status``,
    ``rejected``, ``refused_by_code`` (the refusal codes of docs/api.md, counted),
    ``configurations`` (how many have served it), ``arrival_rate_per_s``, ``units``).

    The counts and durations are cumulative over the pipeline's life, as Triton's: a
    switch of configuration (units replaced, K changed, instances added or removed)
    does not reset them (:class:`~infscaler.runtime.serving.stats.PipelineLife`); the
    percentiles and the arrival rate are over the configuration serving now.

    What is not measured reads 0 rather than a guess: the duration of failed requests
    (``fail.ns``), ``compute_input`` / ``compute_output`` (copying tensors in and out of
    the pool is inside ``success.ns``) and the response cache (there is none)."""
    snap = dep.route.stats.snapshot()
    lat = snap["latency"]

    def dur(count: int, total_ms: float) -> dict[str, int]:
        return {"count": int(count), "ns": int(total_ms * 1e6)}

    status = service.pipeline_status(dep)
    ran = exec_counts(service, dep)
    return {
        "name": dep.name,
        "version": VERSION,
        "last_inference": int(snap.get("last_inference_ms", 0)),
        "inference_count": ran.items,
        "execution_count": ran.executions,
        "inference_stats": {
            "success": dur(snap["success"], snap["latency_ms"]),
            "fail": dur(sum(snap["fail"].values()), 0.0),
            "queue": dur(snap["queue_count"], snap["queue_ms"]),
            "compute_input": dur(0, 0.0),
            "compute_infer": dur(snap["compute_count"], snap["compute_ms"]),
            "compute_output": dur(0, 0.0),
            "cache_hit": dur(0, 0.0),
            "cache_miss": dur(0, 0.0),
        },
        "batch_stats": ran.batch_stats(),
        "latency_ms": {k: lat[k] for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")},
        "fail_by_status": {str(k): v for k, v in snap["fail"].items()},
        "rejected": snap["rejected"],
        "refused_by_code": snap["refused"],
        "configurations": snap["configurations"],
        "arrival_rate_per_s": snap["arrival_rate_per_s"],
        "units": status["units"],
    }


async def hold_refusal(exc: BaseException) -> None:
    """Wait the ``hold_s`` seconds a refusal asks to be held before it is answered (an
    admission refusal of a request that would miss its SLO:
    :func:`~infscaler.runtime.serving.admission.refusal_hold_s`); return at once for any
    other exception. The caller then raises ``exc``."""
    hold = getattr(exc, "hold_s", 0.0)
    if isinstance(hold, int | float) and 0 < hold < math.inf:
        await asyncio.sleep(hold)
