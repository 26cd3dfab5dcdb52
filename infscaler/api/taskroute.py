"""Model-less task queries (INFaaS), the same over HTTP and gRPC: a model name that is a
registered task and not a deployed pipeline is routed by the task router
(:class:`~infscaler.modelless.tasks.TaskRouter`: the selector, INFaaS Algorithm 1, picks
the variant and loads it if needed).

Each transport decodes the request its own way and calls the same functions here on
what it decoded: :func:`task_router` (is the name a task?), :func:`task_specs` (the
task's inputs, to decode against) and :func:`infer_task` (select, load within the
client's budget of variant loads, submit, await). Errors are
:class:`~infscaler.modelless.selector.SelectionError` with an HTTP status (404 unknown
model or task, 400 bad ``latency_ms`` / ``min_accuracy``, 429 over the load budget with
``retry_after_s``), which the gRPC service maps to its codes as it maps every status.

Sources: INFaaS (Romero et al., USENIX ATC 2021) §3-4; KServe v2 ``required_api.md``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infscaler.api.codec import TensorSpec
from infscaler.api.common import slot_arrays
from infscaler.base.security import Peer, is_privileged, quota_uid
from infscaler.modelless.selector import SelectionError
from infscaler.modelless.tasks import TaskRouter, task_interface
from infscaler.modelless.variants import VariantRegistry

__all__ = ["infer_task", "task_metadata", "task_ready", "task_router", "task_specs"]


def task_router(service: Any, holder: dict[str, Any], name: str) -> Any:
    """The task router when ``name`` is a registered task and not a deployed pipeline
    (pipelines keep their names), else None.

    Args:
        service: the :class:`~infscaler.service.service.Service`.
        holder: ``{"router": TaskRouter | None}``, shared by the transports of one
            service; the router is made here on the first query while the variant
            registry (in the service's state dir) exists.
        name: the model name of the request.

    Raises:
        SelectionError: (404) neither a deployed pipeline nor a registered task, once a
            registry exists (the message lists both).
    """
    if any(d.name == name for d in service.deployments()):
        return None
    router = holder.get("router")
    if router is None:
        registry = VariantRegistry(service.state_dir)
        if not registry.path.is_file():
            return None
        router = holder["router"] = TaskRouter(service, registry).start()
    if router.has_task(name):
        return router
    known = ", ".join(sorted(d.name for d in service.deployments())) or "none"
    raise SelectionError(
        f"unknown model or task {name!r} (deployed: {known}; registered tasks: "
        f"{', '.join(router.tasks()) or 'none'})",
        404,
    )


def _interface(router: Any, task: str) -> dict[str, list[dict[str, Any]]]:
    variants = router.catalog().variants(task)
    return task_interface(task, router.variant(variants[0].name) if variants else None)


def task_specs(router: Any, task: str) -> list[TensorSpec]:
    """The task's inputs (name, v2 datatype, shape; -1: any size) to decode a request
    against (its fastest variant's, :func:`~infscaler.modelless.tasks.task_interface`)."""
    return [
        TensorSpec(i["name"], i["datatype"], list(i["shape"]))
        for i in _interface(router, task)["inputs"]
    ]


def task_metadata(router: Any, task: str) -> dict[str, Any]:
    """The task's v2 model metadata: platform ``infscaler_task``, its inputs and
    outputs, and as parameters its ``variants`` (a JSON list of name, ``latency_ms``,
    ``accuracy``, fastest first) and a ``description``."""
    variants = router.catalog().variants(task)
    iface = _interface(router, task)
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


def task_ready(router: Any, task: str) -> list[str]:
    """Why model-less task ``task`` cannot take a query now; [] when it can (v2
    ``/v2/models/{task}/ready`` and gRPC ``ModelReady`` answer ready).

    A task serves a query once the service takes requests and one of its variants can
    run it: a deployed variant that is ready, or one whose model file (its plan
    directory, when partitioned) is on disk, since the selector loads the variant it
    picks on demand (INFaaS §3). A Triton model is ready once loaded; a task is a name
    over loadable variants, so none need be loaded beforehand.

    Returns:
        one line per reason: the service is starting or stopping; no variant can run
        (each one's missing file, or its deployment not ready).
    """
    service = router.service
    if not service.ready():
        return ["the service is starting or stopping"]
    deployed = {d.name for d in service.deployments()}
    missing = []
    for v in router.catalog().variants(task):
        if v.name in deployed:
            if service.ready(v.name):
                return []
            missing.append(f"variant {v.name} is deployed and not ready")
            continue
        var = router.variant(v.name)
        files = [Path(var.plan or var.path)]  # a partitioned variant runs its plan
        gone = [str(f) for f in files if not f.exists()]
        if not gone:
            return []
        missing.append(f"variant {v.name}: {', '.join(gone)} missing")
    return [f"no variant of task {task!r} can run: " + "; ".join(missing or ["none registered"])]


async def infer_task(
    router: Any,
    task: str,
    inputs: Mapping[str, Any],
    parameters: Mapping[str, Any] | None,
    *,
    timeout_s: float | None,
    peer: Peer,
    loads: Any,
) -> tuple[Any, Any, dict[str, Any]]:
    """One model-less query on decoded inputs: the selector picks the variant for the
    request's ``latency_ms`` (ms) and ``min_accuracy`` ([0, 1]) parameters (both
    optional), the variant is loaded if needed, and the request runs on it.

    Args:
        inputs: name -> array, decoded against :func:`task_specs`.
        parameters: the request's parameters (plain values).
        timeout_s: the request's deadline, s (None: the pipeline's).
        peer: the client; one that is not the operator may cause only
            ``loads.per_min`` variant loads a minute, and is held to its share of
            pending requests (``Service.submit``'s ``uid``).
        loads: the :class:`~infscaler.base.quotas.LoadBudget` of variant loads per uid.

    Returns:
        ``(Result, the variant's deployment, the response parameters naming the
        variant)`` (:meth:`~infscaler.modelless.tasks.TaskRouter.parameters`).

    Raises:
        SelectionError: (400) bad requirement values; (429, with ``retry_after_s``) a
            load over the client's budget. ServiceError / RequestError: as
            ``Service.submit``, or the variant failed to load.
    """
    params = dict(parameters or {})

    def before_load(variant: str) -> None:
        """A client that is not the operator may cause only so many variant loads."""
        if is_privileged(peer):
            return
        wait_s = loads.take(peer.uid)
        if wait_s is not None:
            refusal = SelectionError(
                f"task {task!r}: loading variant {variant} for this query would pass your "
                f"budget of variant loads ({loads.per_min:g} a minute per user, "
                "--variant-loads-per-min)",
                429,
                hint="retry after Retry-After seconds, or relax latency_ms / "
                "min_accuracy so that a loaded variant serves the query",
            )
            refusal.retry_after_s = wait_s  # type: ignore[attr-defined]
            raise refusal

    loop = asyncio.get_running_loop()
    fut, sel = await loop.run_in_executor(
        None,
        lambda: router.submit(
            task,
            slot_arrays(dict(inputs)),
            latency_ms=params.get("latency_ms"),
            min_accuracy=params.get("min_accuracy"),
            timeout_s=timeout_s,
            before_load=before_load,
            uid=quota_uid(peer),
        ),
    )
    try:
        result = await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        fut.cancel()
        raise
    dep = router.service.deployment(sel.variant.name)
    return result, dep, router.parameters(sel)
