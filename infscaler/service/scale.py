"""Scale actuation: :class:`ScaleMixin`, the part of :class:`~infscaler.service.service.Service`
that applies the autoscaler's decisions (InfScaler's asymmetric scaling): one more or one
fewer instance of a unit, an instance replaced by one with other intra-op threads
(make-before-break), a switch to another configuration, and a pipeline's queue bound.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import ServiceError
from infscaler.runtime.scaling.placement import LIVE_STATES, core_load, scale_in_victim
from infscaler.service.deploy import Deployment

__all__ = ["ScaleMixin"]

log = logging.getLogger("infscaler.service")


class ScaleMixin:
    """The scaling actions the autoscaler (:class:`~infscaler.runtime.scaling.control.ScaledService`)
    calls on :class:`~infscaler.service.service.Service`."""

    start_timeout_s: float
    supervisor: Any
    _lock: threading.RLock
    _deployments: dict[str, Deployment]

    def _live(self, dep: Deployment, unit: int | None = None) -> list[Any]:
        """``dep``'s live instances (starting or ready) of its current stages, of unit
        ``unit`` (None: of every unit)."""
        return [
            h
            for h in self.supervisor.handles()
            if h.key[0] == dep.name
            and h.stage_id in dep.route.stage_ids
            and (unit is None or h.key[1] == unit)
            and h.state in LIVE_STATES
        ]

    def _resize_window(self, dep: Deployment) -> None:
        """The in-flight window: enough to keep every instance busy with full batches."""
        live = self._live(dep)
        if dep.pipeline.config.max_inflight is None:
            dep.route.max_inflight = sum(h.unit.max_batch for h in live) + 1
            frontend = getattr(self, "frontend", None)
            if frontend is not None:  # requests waiting for the window start now
                frontend.wake()
        dep.route.instances = [
            max(1, sum(1 for h in live if h.key[1] == u.index)) for u in dep.pipeline.units
        ]

    def _served_unit(self, dep: Deployment, unit: int) -> tuple[Any, int, int]:
        """``(unit, its stage id, the stage it hands over to)`` for an instance of unit ``unit``.

        Raises:
            ServiceError: (404) the pipeline was undeployed; (409) the unit runs in the front end.
        """
        with self._lock:
            if self._deployments.get(dep.name) is not dep:
                raise ServiceError(f"pipeline {dep.name!r} is no longer deployed", 404)
        u = dep.pipeline.units[unit]
        sid = dep.route.stage_ids[unit]
        if not sid:
            raise ServiceError(f"unit {u.name} of {dep.name} runs in the front end", 409)
        nxt = dep.pipeline.next_unit(unit)
        return u, sid, 0 if nxt is None else dep.route.stage_ids[nxt]

    def scale_out(self, dep: Deployment, unit: int, engine: str) -> Any:
        """Start one more instance of unit ``unit`` of ``dep`` on ``engine``; returns its
        handle at once (it serves once loaded).

        Raises:
            ServiceError: (404) the pipeline was undeployed; (409) no such served unit.
        """
        u, sid, next_stage = self._served_unit(dep, unit)
        if engine != u.engine:
            u = dataclasses.replace(u, engine=engine)
        cores = self._cores(u.threads, (dep.name, unit)) if engine == "cpu" else []
        h = self.supervisor.start((dep.name, unit), u, sid, next_stage, cores)
        self._resize_window(dep)
        log.info("scaled out %s/%s on %s: instance %d", dep.name, u.name, engine, h.iid)
        return h

    def scale_in(self, dep: Deployment, unit: int, engine: str) -> bool:
        """Stop one instance of unit ``unit`` on ``engine`` gracefully (never the last
        one). Blocks until it exited. Returns False when there was none to stop."""
        mine = [h for h in self._live(dep, unit) if h.unit.engine == engine]
        if not mine or len(self._live(dep, unit)) <= 1:
            return False
        # the one on the cores most shared with its unit's other instances, then the
        # youngest (the oldest have warm caches and the lowest instance ids)
        load = core_load(self.supervisor.handles(), (dep.name, unit))
        victim = scale_in_victim(mine, load)
        self.supervisor.stop(victim, timeout=10.0)
        self._resize_window(dep)
        log.info("scaled in %s unit %d on %s: instance %d", dep.name, unit, engine, victim.iid)
        return True

    def scale_threads(
        self, dep: Deployment, unit: int, threads: int, from_threads: int | None = None
    ) -> bool:
        """Replace one cpu instance of unit ``unit`` (running ``from_threads`` threads; None:
        any) by one running ``threads``, make-before-break: the new one is routed to once ready,
        then the old one stops gracefully (its queued tokens re-routed). Blocks until it exited.

        Returns:
            False when no such instance runs (nothing was started).

        Raises:
            ServiceError: (404) the pipeline was undeployed; (409) no such served unit, or
                ``threads`` < 1.
            InstanceStartError: the new instance failed to load (the old one keeps serving).
        """
        u, sid, next_stage = self._served_unit(dep, unit)
        if int(threads) < 1:
            raise ServiceError(f"threads must be >= 1, got {threads}", 409)
        mine = [
            h
            for h in self._live(dep, unit)
            if h.unit.engine == "cpu" and (from_threads is None or h.unit.threads == from_threads)
        ]
        if not mine:
            return False
        new_u = dataclasses.replace(u, engine="cpu", threads=int(threads))
        h = self.supervisor.start(
            (dep.name, unit), new_u, sid, next_stage, self._cores(threads, (dep.name, unit))
        )
        self._resize_window(dep)
        try:
            self.supervisor.wait_ready([h], self.start_timeout_s)
        except BaseException:
            self.supervisor.stop(h, timeout=5.0)
            self._resize_window(dep)
            raise
        live = [x for x in mine if x.state in LIVE_STATES]
        if live:
            # the youngest first, as scale_in: the oldest have warm caches
            victim = max(live, key=lambda x: x.started)
            self.supervisor.stop(victim, timeout=10.0)
            self._resize_window(dep)
        log.info(
            "%s %s/%s: instance %d (%s threads) replaced by %d (%d threads)",
            "scaled up" if from_threads is None or threads > from_threads else "scaled down",
            dep.name,
            u.name,
            victim.iid if live else -1,
            from_threads,
            h.iid,
            threads,
        )
        return True

    def switch_configuration(self, dep: Deployment, live: Any) -> Deployment:
        """Deploy ``dep.live``'s other configuration in ``dep``'s place, make-before-break
        (:meth:`deploy` with ``replace``); ``live`` is the plan once it serves.

        Raises:
            ServiceError / ConfigError / InstanceStartError: as :meth:`deploy` (the old
                configuration keeps serving).
        """
        plan = dep.live
        if plan is None or plan.other_pipeline is None:
            raise ServiceError(f"pipeline {dep.name} has no other configuration to switch to")
        cfg = validate_pipeline(plan.other_pipeline, f"pipeline {dep.name} (live check)")
        return self.deploy(cfg, replace=True, live=live)

    def set_queue_limit(self, dep: Deployment, limit: int | None, reason: str = "") -> None:
        """Bound ``dep``'s queue at ``limit`` requests (None: no bound); beyond it the
        front end answers 503 with ``reason`` (load shedding at the resource cap)."""
        dep.route.queue_limit = limit
        dep.route.shed_reason = reason
