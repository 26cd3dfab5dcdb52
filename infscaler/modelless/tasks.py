"""Model-less serving: route a task query to a variant on a running service (INFaaS).

:class:`TaskRouter` reads the task's variants' state from the service, asks the selector,
deploys the chosen variant if needed and submits the request to it.

More: docs/variants.md, "`infscaler/modelless/tasks.py`".
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import ConfigError, ServiceError
from infscaler.base.threads import NamedThread
from infscaler.modelless.selector import (
    Catalog,
    Query,
    ScalingConfig,
    SelectorConfig,
    classify,
    select,
    validate_query,
    vertical_scale,
)
from infscaler.modelless.stages import REC_MIN_WIDTH
from infscaler.modelless.variants import VariantRegistry
from infscaler.runtime.scaling.control import DeploymentView, ScaledService

log = logging.getLogger("infscaler.modelless.tasks")

# -- pipelines for variants ----------------------------------------------------------------


def variant_pipeline(
    variant: Any,
    *,
    slo_ms: float | None = None,
    autoscale: Mapping[str, Any] | bool = True,
    max_instances: int = 4,
) -> dict[str, Any]:
    """The ``pipeline.yaml`` mapping that serves ``variant`` with its task's interface; with
    ``slo_ms`` it gets that SLO, ``autoscale`` and ``max_instances``.
    """
    io = variant.io
    model: dict[str, Any] = {"name": "model", "engine": variant.engine}
    if variant.plan:
        model["plan"] = variant.plan
    else:
        model["model"] = variant.path
        if variant.shapes:
            model["shapes"] = variant.shapes
    if variant.precision in ("fp16",):
        model["precision"] = variant.precision
    if variant.batch > 1:
        model["batching"] = {"max_batch": variant.batch, "max_delay_ms": 2.0, "policy": "fixed"}
    cfg: dict[str, Any] = {"name": variant.name, "description": f"{variant.task}: {variant.name}"}
    if variant.task == "text-recognition":
        model["inputs"] = {io["input"]: "rec_input"}
        model["outputs"] = {io["output"]: "rec_prob"}
        cfg["inputs"] = [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}]
        cfg["outputs"] = ["text", "score"]
        cfg["stages"] = [
            {
                "name": "prep",
                "function": "infscaler.modelless.stages:rec_input",
                "params": {"min_width": int(io.get("min_width", REC_MIN_WIDTH))},
                "inputs": ["image"],
                "outputs": ["rec_input"],
            },
            model,
            {
                "name": "decode",
                "function": "infscaler.modelless.stages:ctc_decode",
                "params": {"charset": io["charset"]},
                "inputs": ["rec_prob"],
                "outputs": ["text", "score"],
            },
        ]
    elif variant.task == "text-embedding":
        names = list(io["inputs"])
        model["inputs"] = {n: n for n in names}
        model["outputs"] = {io["output"]: "tokens"}
        cfg["inputs"] = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        cfg["outputs"] = ["embedding"]
        cfg["stages"] = [
            {
                "name": "tokenize",
                "function": "infscaler.modelless.stages:tokenize",
                "params": {
                    "tokenizer": io["tokenizer"],
                    "max_length": int(io.get("max_length", 128)),
                    "token_type_ids": "token_type_ids" in names,
                },
                "inputs": ["text"],
                "outputs": names,
            },
            model,
            {
                "name": "pool",
                "function": "infscaler.modelless.stages:mean_pool",
                "inputs": ["tokens", "attention_mask"],
                "outputs": ["embedding"],
            },
        ]
    elif variant.task == "text-detection":
        model["inputs"] = {io["input"]: "det_input"}
        model["outputs"] = {io["output"]: "det_map"}
        cfg["inputs"] = [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}]
        cfg["outputs"] = ["det_map", "det_meta"]
        cfg["stages"] = [
            {
                "name": "prep",
                "function": "infscaler.pipelines.ocr:det_preprocess",
                "params": {"side": int(io.get("side", 640))},
                "inputs": ["image"],
                "outputs": ["det_input", "det_meta"],
            },
            model,
        ]
    else:
        cfg["stages"] = [model]
    if slo_ms is not None and math.isfinite(slo_ms):
        cfg["slo"] = f"{slo_ms:g}ms"
        cfg["autoscale"] = dict(autoscale) if isinstance(autoscale, Mapping) else True
        model["max_instances"] = int(max_instances)
    return cfg


def task_interface(task: str, variant: Any | None = None) -> dict[str, list[dict[str, Any]]]:
    """The v2 metadata (``inputs``, ``outputs``) of a task."""
    if task == "text-recognition":
        return {
            "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
            "outputs": [
                {"name": "text", "datatype": "BYTES", "shape": [1]},
                {"name": "score", "datatype": "FP32", "shape": [1]},
            ],
        }
    if task == "text-embedding":
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}],
        }
    if task == "text-detection":
        return {
            "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
            "outputs": [
                {"name": "det_map", "datatype": "FP32", "shape": [1, 1, -1, -1]},
                {"name": "det_meta", "datatype": "INT32", "shape": [4]},
            ],
        }
    io = variant.io if variant is not None else {}
    return {
        "inputs": list(io.get("model_inputs", [])),
        "outputs": list(io.get("model_outputs", [])),
    }


# -- the router ----------------------------------------------------------------------------


@dataclass
class TaskResult:
    """What :meth:`TaskRouter.infer` returns: the result and the selection behind it."""

    result: Any
    selection: Any
    pipeline: str

    @property
    def parameters(self) -> dict[str, Any]:
        """The response parameters naming the variant (see :meth:`TaskRouter.parameters`)."""
        return TaskRouter.parameters(self.selection)


class RoutedService(ScaledService, Protocol):
    """The service as the task router uses it (PEP 544): the control loop's view plus deploy,
    undeploy and submit.
    """

    state_dir: Path

    @property
    def stopping(self) -> bool:
        """True once the service is shutting down."""
        ...

    def deploy(self, cfg: Any, *, replace: bool = False) -> Any:
        """Deploy a pipeline config; its deployment."""
        ...

    def undeploy(self, name: str, drain_timeout_s: float = 30.0) -> None:
        """Stop a deployed pipeline after draining it."""
        ...

    def deployment(self, name: str) -> DeploymentView:
        """A deployed pipeline by name (ServiceError 404 when unknown)."""
        ...

    def submit(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        timeout_s: float | None = None,
        *,
        uid: int | None = None,
    ) -> concurrent.futures.Future:
        """Start a request on a deployed pipeline (``uid``: the client's, held to its
        share of pending requests; None: the operator); a future of its result."""
        ...


class TaskRouter:
    """Routes task queries to variants on a started ``service``.

    Args:
        registry: default: the service's state dir's.
        selector_config / scaling_config: :func:`classify`'s / :func:`vertical_scale`'s tuning.
        autoscale: deploy with the query's ``latency_ms`` as SLO (None: :attr:`autoscale_default`).
        deploy_timeout_s: how long a query waits for its variant to load, s.
        rebalance_interval_s: period of :meth:`rebalance` (None: no loop).
        autoscale_options: the variants' ``autoscale`` mapping.
        max_replicas: model instances per variant; beyond, :meth:`rebalance` upgrades.
    """

    #: ``autoscale`` when not given (the API server's router is made with the default).
    autoscale_default = True
    #: vertical scaling keeps the strictest requirements of this many seconds of queries.
    requirements_window_s = 60.0
    #: how long a reading of a variant's arrival rate and service time is reused, s.
    stats_ttl_s = 0.5
    #: the window of the measured service time, s.
    stats_window_s = 10.0
    #: how often the registry file is looked at for changes (a stat), s; a query naming
    #: a task or variant the cached catalog lacks re-reads it at once.
    catalog_check_s = 0.5

    def __init__(
        self,
        service: RoutedService,
        registry: Any = None,
        *,
        selector_config: Any = None,
        scaling_config: Any = None,
        autoscale: bool | None = None,
        deploy_timeout_s: float = 120.0,
        rebalance_interval_s: float | None = 2.0,
        autoscale_options: Mapping[str, Any] | None = None,
        max_replicas: int = 4,
    ) -> None:

        self.service = service
        self.registry = registry if registry is not None else VariantRegistry(service.state_dir)
        self.selector_config = selector_config or SelectorConfig()
        self.scaling_config = scaling_config or ScalingConfig()
        self.autoscale = self.autoscale_default if autoscale is None else autoscale
        self.deploy_timeout_s = deploy_timeout_s
        self.rebalance_interval_s = rebalance_interval_s
        self.autoscale_options = dict(autoscale_options) if autoscale_options else None
        self.max_replicas = int(max_replicas)
        self._lock = threading.RLock()
        self._catalog: Any = None
        self._checked = -math.inf
        self._plans: dict[int, tuple[Any, str, tuple[int, ...], tuple[int, ...]]] = {}
        self._variants: dict[str, Any] = {}
        self._stamp: Any = None
        self._deploying: dict[str, threading.Event] = {}
        self._errors: dict[str, str] = {}
        self._changed: dict[str, float] = {}
        self._wants: dict[str, collections.deque[tuple[float, float | None, float | None]]] = {}
        self.actions: list[dict[str, Any]] = []
        self._stats_cache: dict[tuple[str, int], tuple[float, tuple[float, float | None, int]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    # -- catalog -----------------------------------------------------------------------------
    def catalog(self, *, fresh: bool = False) -> Any:
        """The registry's variants as a :class:`~infscaler.modelless.selector.Catalog`, re-read
        when the registry file changed (looked at every :attr:`catalog_check_s` at most;
        ``fresh``: now)."""
        now = time.monotonic()
        cat = self._catalog
        if cat is not None and not fresh and now - self._checked < self.catalog_check_s:
            return cat
        stamp = self.registry.stamp()
        with self._lock:
            self._checked = now
            if self._catalog is None or stamp != self._stamp:
                variants = self.registry.variants(generated_only=True)
                self._variants = {v.name: v for v in variants}
                self._catalog = Catalog([v.profile() for v in variants])
                self._stamp = stamp
            return self._catalog

    def tasks(self) -> list[str]:
        return self.catalog().tasks

    def has_task(self, name: str) -> bool:
        return name in self.catalog().by_task or name in self.catalog(fresh=True).by_task

    def variant(self, name: str) -> Any:
        self.catalog()
        v = self._variants.get(name)
        if v is None:
            self.catalog(fresh=True)
            v = self._variants[name]
        return v

    # -- state -------------------------------------------------------------------------------
    def loads(self, task: str) -> dict[str, Any]:
        """Variant -> :class:`~infscaler.modelless.selector.VariantLoad` for the deployed ones; rate
        and service time refreshed at most every :attr:`stats_ttl_s`.
        """
        return self._loads(task, self.catalog())

    def _plan(self, dep: Any) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
        """``(name, served unit indices, model unit indices)`` of a deployment, computed
        once per deployment object (a redeploy makes a new one)."""
        hit = self._plans.get(id(dep))
        if hit is not None and hit[0] is dep:
            return hit[1], hit[2], hit[3]
        units = dep.pipeline.units
        plan = (
            dep.name,
            tuple(u.index for u in units if not u.fan_in),
            tuple(u.index for u in units if u.kind == "model"),
        )
        if len(self._plans) > 256:
            self._plans.clear()
        self._plans[id(dep)] = (dep, *plan)
        return plan

    def _loads(self, task: str, catalog: Any) -> dict[str, Any]:

        variants = catalog.by_task.get(task, ())
        deps = self.service.deployments()
        if not deps or not variants:
            return {}
        deployed = {}
        for d in deps:
            plan = self._plan(d)
            deployed[plan[0]] = (d, plan)
        mine = [(p, deployed[p.name]) for p in variants if p.name in deployed]
        if not mine:
            return {}
        # ready instances per (pipeline, unit): one pass over the supervisor's handles
        sup = self.service.supervisor
        ready_at: dict[tuple[str, int], int] = {}
        for h in sup.handles() if sup is not None else ():
            if h.state == "ready":
                k = h.key
                ready_at[k] = ready_at.get(k, 0) + 1
        out = {}
        now = time.monotonic()
        pending = self.service.frontend.pending
        config = self.selector_config
        for p, (dep, (name, served, models)) in mine:
            if any((name, i) not in ready_at for i in served):
                ready = 0
            else:
                ready = min((ready_at.get((name, i), 0) for i in models), default=0)
            rate, service_ms, samples = self._slow_stats(dep, now)
            route = dep.route
            out[p.name] = classify(
                p,
                ready=ready,
                pending=pending(route),
                rate=rate,
                service_ms=service_ms,
                samples=samples,
                shedding=route.queue_limit is not None,
                config=config,
            )
        return out

    def _slow_stats(self, dep: Any, now: float) -> tuple[float, float | None, int]:
        """(offered rate /s incl. refused, summed model-unit P50 ms, samples), cached for
        :attr:`stats_ttl_s` per deployment.
        """
        key = (dep.name, id(dep))
        hit = self._stats_cache.get(key)
        if hit is not None and now - hit[0] < self.stats_ttl_s:
            return hit[1]
        stats = dep.route.stats
        service_ms: float | None = None
        samples = 0
        with stats._lock:  # as the monitor reads it (runtime.monitor.Monitor.pipeline)
            offered = getattr(stats, "offered", None)
            rate = float(stats.arrivals.rate(now))
            if offered is not None:
                rate = max(rate, float(offered.rate(now)))
            for u in dep.pipeline.units:
                if u.kind != "model":
                    continue
                comp = stats.compute[u.index].summary(now, self.stats_window_s)
                if comp.get("p50_ms") is not None:
                    service_ms = (service_ms or 0.0) + float(comp["p50_ms"])
                    samples = max(samples, int(comp.get("window_count") or comp.get("count") or 0))
        value = (rate, service_ms, samples)
        self._stats_cache[key] = (now, value)
        return value

    # -- selection and routing ---------------------------------------------------------------
    def select(
        self, task: str, latency_ms: float | None = None, min_accuracy: float | None = None
    ) -> Any:
        """INFaaS Algorithm 1 over the registry and the service's state.

        Raises:
            SelectionError: unknown task (404), bad requirement values (400).
        """

        catalog = self.catalog()
        if task not in catalog.by_task:  # registered since the last look?
            catalog = self.catalog(fresh=True)
        q = validate_query(Query(task, latency_ms, min_accuracy), catalog.by_task)
        return select(q, catalog, self._loads(q.task, catalog), validated=True)

    def ensure_active(self, name: str, slo_ms: float | None = None) -> str:
        """Deploy variant ``name`` unless deployed (one deploy at a time); returns the pipeline name.

        Raises:
            ServiceError / InfScalerError: the deploy failed.
        """

        with self._lock:
            if any(d.name == name for d in self.service.deployments()):
                return name
            event = self._deploying.get(name)
            owner = event is None
            if owner:
                event = self._deploying[name] = threading.Event()
                self._errors.pop(name, None)
        assert event is not None
        if not owner:
            if not event.wait(self.deploy_timeout_s):
                raise ServiceError(f"variant {name} is still loading", 503)
            with self._lock:
                err = self._errors.get(name)
            if err:
                raise ServiceError(f"variant {name} failed to load: {err}", 503)
            return name
        try:
            self._call_in_worker(lambda: self._activate(name, slo_ms)).result(self.deploy_timeout_s)
            return name
        except Exception as exc:
            with self._lock:
                self._errors[name] = str(exc)
            raise
        finally:
            with self._lock:
                self._deploying.pop(name, None)
            event.set()

    def _activate(self, name: str, slo_ms: float | None) -> None:
        """Deploy variant ``name`` now (on the deploy thread); a no-op when deployed."""

        if any(d.name == name for d in self.service.deployments()):
            return
        variant = self.variant(name)
        slo = slo_ms if self.autoscale else None
        spec = variant_pipeline(
            variant,
            slo_ms=slo,
            autoscale=self.autoscale_options or True,
            max_instances=self.max_replicas,
        )
        cfg = validate_pipeline(spec, f"variant {name}")
        log.info("activating variant %s (%s)", name, variant.task)
        with contextlib.suppress(ServiceError):  # 409: deployed meanwhile
            self.service.deploy(cfg)
        with self._lock:
            self._changed[name] = time.monotonic()

    def _call_in_worker(self, fn: Any) -> concurrent.futures.Future:
        """Run ``fn`` on the router's deploy thread, which lives as long as the process:
        an instance dies with the thread that started it (``PR_SET_PDEATHSIG``), so
        deploys never run on a short-lived thread (an executor's or a request's)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._worker is None:
                self._worker = NamedThread(target=self._work, name="isc-task-deploy", daemon=True)
                self._worker.start()
        self._queue.put((fn, fut))
        return fut

    def _work(self) -> None:
        while True:
            fn, fut = self._queue.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def submit(
        self,
        task: str,
        inputs: dict[str, np.ndarray],
        *,
        latency_ms: float | None = None,
        min_accuracy: float | None = None,
        timeout_s: float | None = None,
        before_load: Callable[[str], None] | None = None,
        uid: int | None = None,
    ) -> tuple[Any, Any]:
        """Select a variant, activate it if needed, submit the request to it.

        Args:
            before_load: called with the variant's name before this query loads it (raise to refuse).
            uid: the client's uid (None: the operator).

        Returns:
            ``(future of Result, Selection)``.

        Raises:
            SelectionError: a bad query. ServiceError / RequestError: as :meth:`Service.submit`.
        """
        sel = self.select(task, latency_ms, min_accuracy)
        with self._lock:
            recent = self._wants.setdefault(task, collections.deque(maxlen=256))
            recent.append((time.monotonic(), latency_ms, min_accuracy))
        name = sel.variant.name
        slo = latency_ms if latency_ms is not None else None
        if sel.state.value == "inactive":
            if before_load is not None and not any(
                d.name == name for d in self.service.deployments()
            ):
                before_load(name)
            self.ensure_active(name, slo)
        return self.service.submit(name, inputs, timeout_s, uid=uid), sel

    def infer(self, task: str, inputs: dict[str, np.ndarray], **kw: Any) -> TaskResult:
        """Blocking :meth:`submit` (tests and scripts)."""
        fut, sel = self.submit(task, inputs, **kw)
        return TaskResult(fut.result(), sel, sel.variant.name)

    @staticmethod
    def parameters(selection: Any) -> dict[str, Any]:
        """Response parameters: ``variant``, ``model``, ``meets_requirements``,
        ``selection`` (the branch of Algorithm 1), ``variant_state``, ``selection_reason``,
        ``variant_latency_ms``, ``variant_accuracy``."""
        v = selection.variant
        return {
            "variant": v.name,
            "model": v.model,
            "meets_requirements": bool(selection.meets_requirements),
            "selection": selection.step,
            "variant_state": selection.state.value,
            "selection_reason": selection.reason,
            "variant_latency_ms": round(v.latency_ms, 3),
            "variant_accuracy": round(v.accuracy, 4),
        }

    # -- vertical scaling (INFaaS §4.2) ------------------------------------------------------
    def rebalance(self, now: float | None = None) -> list[Any]:
        """One pass of the model-vertical scaler over every deployed variant (see the
        module docstring). Returns the :class:`~infscaler.modelless.selector.ScalingAction` s
        started."""

        now = time.monotonic() if now is None else now
        catalog = self.catalog()
        actions = []
        deployed = {d.name: d for d in self.service.deployments()}
        for task in catalog.tasks:
            loads = self.loads(task)
            latency, accuracy = self.requirements(task, now)
            for name, load in loads.items():
                if load.instances == 0 or name in self._deploying:
                    continue
                current = catalog.get(name)
                dep = deployed.get(name)
                if current is None or dep is None:
                    continue
                can_replicate = (
                    dep.pipeline.config.autoscale is not None and dep.route.queue_limit is None
                )
                action = vertical_scale(
                    current,
                    load,
                    catalog.variants(task),
                    slo_ms=latency,
                    min_accuracy=accuracy,
                    can_replicate=can_replicate,
                    since_change_s=now - self._changed.get(name, -math.inf),
                    config=self.scaling_config,
                )
                if action is None:
                    continue
                if action.target in deployed and (
                    action.action != "downgrade" or action.target in self._deploying
                ):
                    continue  # an upgrade already made (new queries go there)
                actions.append(action)
                self._apply(action, latency)
        return actions

    def requirements(self, task: str, now: float | None = None) -> tuple[Any, Any]:
        """The strictest ``(latency_ms, min_accuracy)`` of the task's queries over the
        last :attr:`requirements_window_s` (None: none asked)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            recent = [
                w for w in self._wants.get(task, ()) if now - w[0] <= self.requirements_window_s
            ]
        lat = [float(w[1]) for w in recent if w[1] is not None]
        acc = [float(w[2]) for w in recent if w[2] is not None]
        return (min(lat) if lat else None, max(acc) if acc else None)

    def _apply(self, action: Any, slo_ms: float | None) -> None:
        entry = {"time": time.time(), **action.__dict__}
        with self._lock:
            self.actions.append(entry)
            del self.actions[:-100]
        log.info("%s %s -> %s: %s", action.action, action.current, action.target, action.reason)

        def work() -> None:

            try:
                # a no-op when the target is deployed (a downgrade to a variant an upgrade
                # loaded: the current one is only undeployed)
                try:
                    self._activate(action.target, slo_ms)
                except ConfigError as exc:
                    # the device is at its cap (the scaler filled it before shedding): the
                    # variant being replaced gives back its extra replicas first, its scaler
                    # paused meanwhile so that it does not take them back
                    if action.action != "upgrade":
                        raise
                    auto = getattr(self.service, "autoscaler", None)
                    if auto is not None:
                        auto.pause(action.current, self.deploy_timeout_s)
                    try:
                        if not self._make_room(action.current):
                            raise exc from None
                        log.info(
                            "upgrade %s -> %s: %s; retrying with %s at one instance per unit",
                            action.current,
                            action.target,
                            exc,
                            action.current,
                        )
                        self._activate(action.target, slo_ms)
                    finally:
                        if auto is not None:
                            auto.resume(action.current)
                if action.action == "downgrade":
                    self.service.undeploy(action.current)
                    with self._lock:
                        self._changed[action.current] = time.monotonic()
            except Exception:  # noqa: BLE001 - logged; the next pass tries again
                log.exception("%s to %s failed", action.action, action.target)

        self._call_in_worker(work)

    def _make_room(self, name: str) -> bool:
        """Scale every unit of deployment ``name`` in to one instance (blocking); True when one
        stopped.
        """
        try:
            dep = self.service.deployment(name)
        except Exception:  # noqa: BLE001 - undeployed meanwhile: nothing to free
            return False
        stopped = False
        for u in dep.pipeline.served_units():
            for h in [h for h in self.service.supervisor.handles() if h.key == (name, u.index)]:
                if h.state not in ("starting", "ready"):
                    continue
                stopped |= bool(self.service.scale_in(dep, u.index, h.unit.engine))
        return stopped

    def start(self) -> TaskRouter:
        """Start the background :meth:`rebalance` loop (every ``rebalance_interval_s``)."""
        if self.rebalance_interval_s and self._thread is None:
            self._thread = NamedThread(target=self._run, name="isc-tasks", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        assert self.rebalance_interval_s
        while not self._stop.wait(self.rebalance_interval_s):
            try:
                if self.service.stopping:
                    return
                self.rebalance()
            except Exception:  # noqa: BLE001 - the loop must survive a bad reading
                log.exception("rebalance failed")
