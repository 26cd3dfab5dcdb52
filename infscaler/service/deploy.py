"""Deploying and undeploying pipelines: :class:`DeployMixin` (of
:class:`~infscaler.service.service.Service`) and :class:`Deployment`, a deployed pipeline.

A deploy plans the pipeline where it is left to the planner, compiles it (partitioning at
deploy when asked, InfScaler §IV-A), checks it fits the device profile beside what is
deployed, starts its instances and makes it visible once all are ready; a deploy that fails
leaves nothing visible or half-started. Undeploying drains, then stops the instances.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.base.config import PipelineConfig
from infscaler.base.device import check_pipeline, load_profile
from infscaler.base.errors import ConfigError, ServiceError
from infscaler.engines import engine_availability
from infscaler.runtime.planning.autoplan import (
    live_plan,
    needs_planning,
    plan_pipeline,
    plan_set,
)
from infscaler.runtime.scaling.monitor import Monitor
from infscaler.runtime.serving.pipeline import CompiledPipeline, compile_pipeline
from infscaler.runtime.serving.route import Route
from infscaler.runtime.serving.stats import PipelineStats

__all__ = ["DeployMixin", "Deployment", "trim_heap"]

log = logging.getLogger("infscaler.service")


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc ``malloc_trim(0)``); best
    effort, a no-op elsewhere (why: docs/serving.md, "`infscaler/service/deploy.py`")."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


@dataclass
class Deployment:
    """A deployed pipeline: its route and when it became ready (its instances are the
    supervisor's, by key: restarts replace them)."""

    pipeline: CompiledPipeline
    route: Any
    deployed_at: float = field(default_factory=time.time)
    #: what the live check compares (:class:`~infscaler.runtime.planning.autoplan.LivePlan`; None:
    #: not a planned pipeline, or its decision has no runner-up recorded)
    live: Any = None

    @property
    def name(self) -> str:
        return self.pipeline.name


def _warm_unit_ms(compiled: Any, stage_ids: list[int], handles: list[Any]) -> list[float | None]:
    """Per unit, the service time its instances measured at load (``warm_ms``, else the
    batch-1 ``batch_ms``), ms; 0 for units run in the front end; None if unknown."""
    out: list[float | None] = []
    for u in compiled.units:
        if not stage_ids[u.index]:
            out.append(0.0)
            continue
        seen = []
        for h in handles:
            if h.key[1] != u.index:
                continue
            ms = h.info.get("warm_ms")
            if ms is None:
                ms = (h.info.get("batch_ms") or {}).get("1")
            if ms is not None:
                seen.append(float(ms))
        out.append(max(seen) if seen else None)
    return out


class DeployMixin:
    """:meth:`deploy` and :meth:`undeploy` of :class:`~infscaler.service.service.Service`."""

    state_dir: Path
    device: Any
    objective: str
    start_timeout_s: float
    supervisor: Any
    frontend: Any
    autoscaler: Any
    _started: bool
    _stopping: bool
    _lock: threading.RLock
    _deploy_lock: threading.Lock
    _deployments: dict[str, Deployment]
    _free_stages: list[int]

    def deploy(
        self,
        cfg: PipelineConfig,
        *,
        replace: bool = False,
        progress: Callable[[str], None] = lambda _m: None,
        allowed_functions: Sequence[str] | None = None,
        live: Any = None,
    ) -> Deployment:
        """Compile and start a pipeline; returns once every instance is ready.

        Args:
            cfg: the validated pipeline.
            replace: swap out a deployed pipeline of the same name (the old one drains
                after the new one is ready).
            progress: called with a line per step.
            allowed_functions: modules function stages may come from (None: any).
            live: ``cfg`` is the live check's configuration (its
                :class:`~infscaler.runtime.planning.autoplan.LivePlan`): deployed as is.

        Raises:
            ServiceError: (409) the name is taken and ``replace`` is false; (503) not
                enough free stage ids; the service is stopping.
            ConfigError / InfScalerError: compile or partitioning failed.
            InstanceStartError: an instance failed to start (message names the unit).
        """
        if not self._started or self._stopping:
            raise ServiceError("the service is not running", 503)
        if live is None:
            cfg, live = self._planned(cfg, progress, allowed_functions)
        with self._deploy_lock:
            with self._lock:
                old = self._deployments.get(cfg.name)
            if old is not None and not replace:
                raise ServiceError(
                    f"a pipeline named {cfg.name!r} is already deployed",
                    409,
                    hint="unload it first, or deploy with replace",
                )
            compiled = compile_pipeline(
                cfg,
                state_dir=self.state_dir,
                device=self.device,
                progress=progress,
                allowed_functions=allowed_functions,
            )
            served = compiled.served_units()
            for w in self._check_fits(compiled, old):
                log.warning("%s: %s", cfg.name, w)
                progress(f"warning: {w}")
            with self._lock:
                if len(served) > len(self._free_stages):
                    raise ServiceError(
                        f"pipeline {cfg.name} needs {len(served)} stages, "
                        f"{len(self._free_stages)} are free",
                        503,
                        hint="unload a pipeline first",
                    )
                ids = [self._free_stages.pop(0) for _ in served]
            stage_ids = [0] * len(compiled.units)
            for u, sid in zip(served, ids, strict=True):
                stage_ids[u.index] = sid
            # the zygote imports the function modules first: its instances share them
            modules = {
                step.function.partition(":")[0]
                for u in served
                for step in (u.steps or [u])
                if isinstance(step.function, str)
            }
            for mod, err in self.supervisor.preload(sorted(modules)).items():
                log.info("%s: function module %s not preloaded: %s", cfg.name, mod, err)
            handles = []
            # its instances start at its level's nice value (Supervisor.set_level)
            self.supervisor.set_level(cfg.name, cfg.priority)
            try:
                for u in served:
                    nxt = compiled.next_unit(u.index)
                    next_stage = 0 if nxt is None else stage_ids[nxt]
                    for _ in range(u.instances):
                        handles.append(
                            self.supervisor.start(
                                (cfg.name, u.index),
                                u,
                                stage_ids[u.index],
                                next_stage,
                                self._cores(u.threads, (cfg.name, u.index)),
                            )
                        )
                progress(f"{cfg.name}: waiting for {len(handles)} instances")
                self.supervisor.wait_ready(handles, self.start_timeout_s)
            except BaseException:
                self.supervisor.stop_all(handles, timeout=5.0)
                self.supervisor.set_level(cfg.name, old.pipeline.config.priority if old else None)
                with self._lock:
                    self._free_stages.extend(ids)
                    self._free_stages.sort()
                raise
            window = cfg.max_inflight or sum(u.instances * u.max_batch for u in served) + 1
            names = [u.name for u in compiled.units]
            # a new configuration of a served pipeline goes on counting where it was
            stats = PipelineStats(names) if old is None else old.route.stats.successor(names)
            route = Route(compiled, stage_ids, stats, window)
            route.instances = [u.instances if stage_ids[u.index] else 1 for u in compiled.units]
            route.seed_compute(_warm_unit_ms(compiled, stage_ids, handles))
            dep = Deployment(compiled, route, live=live)
            with self._lock:
                self._deployments[cfg.name] = dep
            log.info("deployed %s: %d units, %d instances", cfg.name, len(served), len(handles))
        if old is not None:
            self._retire(old)
        trim_heap()
        return dep

    def _planned(
        self,
        cfg: PipelineConfig,
        progress: Callable[[str], None],
        allowed_functions: Sequence[str] | None = None,
    ) -> tuple[PipelineConfig, Any]:
        """``(cfg with the planner's choice, its LivePlan)`` when it is left to the planner and
        the objective is ``auto``, else ``(cfg, None)``.

        Raises:
            InfScalerError: no configuration meets the SLO (the search's reason).
        """

        if self.objective != "auto" or not needs_planning(cfg):
            return cfg, None
        together = getattr(self, "_set_planned", {}).pop(cfg.name, None)
        if together is not None and together[0] == cfg.model_dump_json():
            return together[1], together[2]

        progress(f"planning {cfg.name}: K, cuts, threads and instances for its SLO")
        kw = {
            "device": self.device or load_profile("cpu-host"),
            "state_dir": self.state_dir,
            "allowed_functions": allowed_functions,
            "wake_latency_us": self.cpu_wake_latency_planned_us,
        }
        planned, outcome = plan_pipeline(cfg, progress=progress, **kw)
        if outcome is not None and outcome.best is not None:
            progress(f"{cfg.name}: chosen {outcome.best.line()}")
        return planned, live_plan(cfg, **kw)

    def plan_set(
        self,
        cfgs: Sequence[PipelineConfig],
        progress: Callable[[str], None] = lambda _m: None,
        allowed_functions: Sequence[str] | None = None,
    ) -> list[str]:
        """Plan the pipelines of ``cfgs`` left to the planner together within the device's cap
        (:func:`infscaler.runtime.planning.autoplan.plan_set`; two or more, objective ``auto``):
        a later :meth:`deploy` of each deploys that choice. Returns the names planned together.

        Raises:
            InfScalerError: a pipeline that fits beside the others in no way (named).
        """
        left = [c for c in cfgs if needs_planning(c)]
        if self.objective != "auto" or len(left) < 2:
            return []
        device = self.device or load_profile("cpu-host")
        planned = plan_set(
            left,
            device=device,
            state_dir=self.state_dir,
            allowed_functions=allowed_functions,
            progress=progress,
            wake_latency_us=self.cpu_wake_latency_planned_us,
        )
        kept = getattr(self, "_set_planned", {})
        for c in left:
            kept[c.name] = (c.model_dump_json(), *planned[c.name])
        self._set_planned = kept
        return [c.name for c in left]

    def _check_fits(self, compiled: CompiledPipeline, old: Deployment | None) -> list[str]:
        """Refuse (ConfigError) a pipeline whose engines, precisions, instances, cores or
        memory do not fit the device profile with what is already deployed
        (:func:`infscaler.base.device.check_pipeline`); returns its warnings."""

        others = [
            h
            for h in self.supervisor.handles()
            if h.state in ("starting", "ready") and (old is None or h.key[0] != old.name)
        ]
        engines: dict[str, int] = {}
        cores = 0
        for h in others:
            if h.unit.kind == "model":
                engines[h.unit.engine] = engines.get(h.unit.engine, 0) + 1
                cores += h.unit.threads if h.unit.engine == "cpu" else 0
        try:
            return check_pipeline(
                compiled,
                self.device_profile(),
                used_mb=Monitor(self).memory_used_mb(),
                instances_used=engines,
                cores_used=cores,
            )
        except ConfigError as exc:
            if self.device is not None:
                raise
            # no profile given: say why this host lacks the engines it refused

            why = [
                f"this host has no {kind} engine: {reason}"
                for kind, (ok, reason) in engine_availability().items()
                if not ok and f"'{kind}'" in str(exc)
            ]
            if not why:
                raise
            raise ConfigError(str(exc) + "\n" + "\n".join(why), hint=exc.hint) from None

    def undeploy(self, name: str, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting requests for ``name``, drain, stop its instances.

        Raises:
            ServiceError: (404) no such pipeline.
        """
        with self._lock:
            dep = self._deployments.pop(name, None)
        if dep is None:
            raise ServiceError(f"no pipeline named {name!r} is deployed", 404)
        self._retire(dep, drain_timeout_s)
        if self.supervisor is not None:
            self.supervisor.set_level(name, None)

    def _retire(self, dep: Deployment, drain_timeout_s: float = 30.0) -> None:
        dep.route.accepting = False
        self.frontend.drain(drain_timeout_s, dep.route)
        if self.supervisor is not None:
            self.supervisor.cancel_restarts(dep.route.stage_ids)
        handles = self.supervisor.handles() if self.supervisor else []
        mine = [h for h in handles if h.key[0] == dep.name and h.stage_id in dep.route.stage_ids]
        self.supervisor.stop_all(mine, timeout=10.0)
        with self._lock:
            self._free_stages.extend(s for s in dep.route.stage_ids if s)
            self._free_stages = sorted(set(self._free_stages))
        if self.autoscaler is not None:
            self.autoscaler.forget(dep.name)
        trim_heap()
