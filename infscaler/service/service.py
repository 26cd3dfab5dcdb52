"""The service: tensor pool, control channel, sharing manager, supervisor, front end and the
deployed pipelines (what ``infscaler serve`` runs under :mod:`infscaler.api.server`).
Deploying: :mod:`.deploy`; scaling decisions applied: :mod:`.scale`; status: :mod:`.status`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.device import Accelerator, load_profile
from infscaler.base.errors import InfScalerError, ServiceError
from infscaler.base.quotas import PeerQuotas
from infscaler.ebpf import open_channel
from infscaler.engines import engine_availability
from infscaler.runtime.processes.supervisor import Supervisor
from infscaler.runtime.scaling.autoscaler import Autoscaler
from infscaler.runtime.scaling.placement import core_load, pick_cores, pinnable_cores
from infscaler.runtime.scaling.pmqos import CpuLatencyRequest, CpuLatencyUnavailable, can_request
from infscaler.runtime.scaling.wakesetting import (
    WakeSetting,
    checked_wake_latency,
    in_force_us,
    planned_us,
    policy_change,
    wake_setting,
)
from infscaler.runtime.serving.admission import ByteBudget
from infscaler.runtime.serving.frontend import FrontEnd, RequestError
from infscaler.runtime.serving.pipeline import default_state_dir
from infscaler.service.deploy import Deployment, DeployMixin
from infscaler.service.scale import ScaleMixin
from infscaler.service.status import degraded_reasons, pipeline_status, service_status
from infscaler.shm.cleanup import record_pool, remove_stale_pools, unrecord_pool
from infscaler.shm.manager import TensorSharingManager
from infscaler.shm.pool import TensorPool

__all__ = [
    "Deployment",
    "Service",
    "ServiceError",
]

log = logging.getLogger("infscaler.service")

_FIRST_STAGE = 1
_LAST_STAGE = 62  # 63 is the manager's barrier stage


class Service(DeployMixin, ScaleMixin):
    """One InfScaler-Edge service.

    Args:
        state_dir: plans and engine caches (default
            :func:`~infscaler.runtime.serving.pipeline.default_state_dir`).
        device: a :class:`~infscaler.base.device.DeviceProfile` (None: this host as is).
        control_path: ``auto``, ``ebpf`` or ``userspace`` (:func:`~infscaler.ebpf.open_channel`).
        routing: ``least-loaded`` or ``round-robin`` among a unit's instances.
        pool_mb: memory cap of the tensor pool, MB.
        max_pending: requests admitted at once (beyond: 503).
        pending_per_uid / operator_pending: of them, what one client uid may have (None: no
            cap) / what only the service's user and root may use (:class:`PeerQuotas`).
        start_timeout_s: how long a deploy waits for its instances to be ready, s.
        max_inflight_mb / max_inflight_mb_per_uid: budget of request bytes in flight, all /
            per client uid, MB (None: unbounded; :meth:`reserve_bytes`).
        objective: ``auto``: a pipeline left to the planner deploys with the planner's
            choice; ``eq1``: as written.
        cpu_wake_latency_us: a PM QoS CPU wake-up latency limit held while serving, µs
            (:class:`~infscaler.runtime.scaling.pmqos.CpuLatencyRequest`); ``"auto"``: the
            autoscaler's wake policy decides; None: no request.
    """

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        device: Any = None,
        control_path: str = "auto",
        routing: str = "least-loaded",
        pool_mb: int = 512,
        max_pending: int = 1024,
        pending_per_uid: int | None = PeerQuotas.pending_per_uid,
        operator_pending: int = PeerQuotas.operator_pending,
        start_timeout_s: float = 120.0,
        max_inflight_mb: float | None = 256,
        max_inflight_mb_per_uid: float | None = 128,
        objective: str = "auto",
        cpu_wake_latency_us: int | str | None = "auto",
    ) -> None:

        if objective not in ("auto", "eq1"):
            raise InfScalerError(f"unknown objective {objective!r}", hint="auto or eq1")
        self.objective = objective
        #: the wake-up setting and what it asks for now (runtime.scaling.wakesetting)
        self._wake: WakeSetting = wake_setting(checked_wake_latency(cpu_wake_latency_us))
        #: the PM QoS request made (a CpuLatencyRequest; None: none)
        self._wake_request: Any = None
        self.state_dir = Path(state_dir or default_state_dir())
        self.device = device
        self.control_path = control_path
        self.routing = routing
        self.pool_mb = pool_mb
        self.max_pending = max_pending
        self.pending_per_uid = pending_per_uid
        self.operator_pending = operator_pending
        self.start_timeout_s = start_timeout_s
        self._lock = threading.RLock()
        self._deploy_lock = threading.Lock()
        #: serialises :meth:`_on_instances_changed` (called from the supervisor's threads)
        self._availability_lock = threading.Lock()
        self._deployments: dict[str, Deployment] = {}
        self._free_stages = list(range(_FIRST_STAGE, _LAST_STAGE + 1))
        self._core_cursor = 0
        self._started = False
        self._stopping = False
        #: while true, :meth:`ready` says no (``serve`` deploys its initial pipelines)
        self.starting = False
        self.pool = self.channel = self.manager = self.supervisor = self.frontend = None
        self.autoscaler: Any = None
        self.started_at: float | None = None
        self._profile: Any = None
        self.inflight = ByteBudget(
            None if max_inflight_mb is None else int(max_inflight_mb * 1e6),
            None if max_inflight_mb_per_uid is None else int(max_inflight_mb_per_uid * 1e6),
        )
        #: called with the reason when the front end dies (``serve`` exits on it)
        self.on_frontend_death: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Service:
        """Open the pool, the control channel, the manager, the supervisor and the front end.

        Raises:
            ChannelError / EbpfUnavailableError: ``control_path='ebpf'`` where it cannot run.
        """

        if self._started:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_slabs()
        cap = int(self.pool_mb) << 20
        # small slabs: a partly used slab of each size class stays mapped, so big slabs
        # would fragment the cap (16 classes x 16 MB filled a 256 MB pool in tests)
        self.pool = TensorPool(cap, slab_bytes=max(1 << 20, min(4 << 20, cap // 16)))
        try:
            record_pool(self.state_dir, self.pool.service_id)
            self.channel = open_channel(self.control_path, self.routing)
            self.manager = TensorSharingManager(
                self.pool, self.channel, on_failure=self._on_request_failed
            ).start()
            self.frontend = FrontEnd(
                self.manager,
                self.pool.service_id,
                max_pending=self.max_pending,
                pending_per_uid=self.pending_per_uid,
                operator_pending=self.operator_pending,
                pool=self.pool,
                on_death=self._on_frontend_death,
            )
            self.supervisor = Supervisor(
                self.manager, self.pool.service_id, on_change=self._on_instances_changed
            )

            self.autoscaler = Autoscaler(self).start()
            self._hold_wake_latency()
        except BaseException:
            self._teardown()
            raise
        self._started = True
        self.started_at = time.time()
        log.info(
            "service started: pool %d MB (%s), control path %s",
            self.pool_mb,
            self.pool.service_id,
            self.channel.kind if hasattr(self.channel, "kind") else type(self.channel).__name__,
        )
        return self

    def set_cpu_wake_latency(self, max_us: int | str | None) -> bool:
        """Change ``cpu_wake_latency_us`` while serving: ``max_us`` µs, ``"auto"`` or None.

        Returns:
            whether a request is in force afterwards (the reason it is not: ``status()``).

        Raises:
            InfScalerError: ``max_us`` is not None, ``"auto"`` or an int in [0, 2**31 - 1].
        """
        max_us = checked_wake_latency(max_us)
        with self._lock:
            self._drop_wake_request()
            self._wake = wake_setting(max_us)
            if self.autoscaler is not None:
                self.autoscaler.reset_wake()
            if self._started:
                self._hold_wake_latency()
            return self.cpu_wake_latency_held

    def hold_cpus_awake(self, hold: bool, reason: str, epoch: int | None = None) -> bool:
        """Apply the autoscaler's wake decision under ``auto`` (hold 0 µs, or drop it); a
        decision from before the last :meth:`set_cpu_wake_latency` (its ``epoch``) is ignored.
        Returns whether it was applied (:func:`~infscaler.runtime.scaling.wakesetting.policy_change`)."""
        with self._lock:
            auto = self.autoscaler
            change = policy_change(
                self._wake,
                hold,
                reason,
                holding=self._wake_request is not None,
                epoch=epoch,
                current_epoch=None if auto is None else auto.wake_epoch,
            )
            if change is None:
                return False
            if change.drop:
                self._drop_wake_request()
            self._wake = change.setting
            if change.take and self._started:
                self._hold_wake_latency()
            return True

    def _drop_wake_request(self) -> None:
        if self._wake_request is not None:
            self._wake_request.close()
            self._wake_request = None

    def _hold_wake_latency(self) -> None:
        """Make the PM QoS request asked for, if any; where it cannot be made, log why and serve."""
        max_us = self._wake.requested_us
        if max_us is None:
            return
        try:
            self._wake_request = CpuLatencyRequest(max_us)
        except CpuLatencyUnavailable as exc:
            self._wake = dataclasses.replace(self._wake, unavailable_reason=str(exc))
            log.warning("serving without a CPU wake-up latency limit: %s", exc)
            return
        log.info(
            "holding a CPU wake-up latency limit of %d us while serving (idle CPUs use "
            "no deeper cpuidle state)",
            max_us,
        )

    def _remove_stale_slabs(self) -> None:
        """Unlink the slabs a killed earlier run on this state dir left
        (:func:`infscaler.shm.cleanup.remove_stale_pools`)."""

        try:
            found = remove_stale_pools(self.state_dir)
        except OSError as exc:
            log.warning("cannot look for stale slabs in %s: %s", self.state_dir, exc)
            return
        for sid, names in found.items():
            log.warning(
                "removed %d shared-memory slabs of an earlier run (pool %s) that did not "
                "close cleanly",
                len(names),
                sid,
            )

    def _on_instances_changed(self) -> None:
        """Mark each pipeline with a unit that has no live instance degraded (503 +
        Retry-After), or clear it. Serialised; never holds the service's own lock (why:
        docs/serving.md, "`infscaler/service/service.py`")."""
        deps = self.deployments()
        with self._availability_lock:
            for dep in deps:
                why = degraded_reasons(self.supervisor, dep)
                route = dep.route
                if why:
                    etas = [
                        self.supervisor.restart_eta((dep.name, u.index), route.stage_ids[u.index])
                        for u in dep.pipeline.served_units()
                    ]
                    known = [e for e in etas if e is not None]
                    route.retry_after_s = max(known) if known else 10.0
                    route.unavailable_reason = f"pipeline {dep.name} is degraded: " + "; ".join(why)
                else:
                    route.unavailable_reason = None

    def degraded(self, name: str) -> list[str]:
        """Why pipeline ``name`` is degraded, one line per unit without a ready instance ([]: not).

        Raises:
            ServiceError: (404) unknown pipeline.
        """
        return degraded_reasons(self.supervisor, self.deployment(name))

    def _on_frontend_death(self, reason: str) -> None:
        log.critical("the front end failed (%s): the service is not ready", reason)
        if self.on_frontend_death is not None:
            self.on_frontend_death(reason)

    def reserve_bytes(self, nbytes: int, peer_uid: int | None = None) -> None:
        """Reserve ``nbytes`` of the in-flight budget for client ``peer_uid`` (None: no
        per-client budget); give back with :meth:`release_bytes`.

        Raises:
            RequestError: (503, with ``retry_after_s``) over the budget or the client's share.
        """
        verdict = self.inflight.reserve(nbytes, peer_uid)
        if not verdict.admit:
            raise RequestError(
                f"the service is at its in-flight memory budget: {verdict.reason}",
                hint="retry after Retry-After seconds, send fewer concurrent requests, "
                "or raise --max-inflight-mb",
                retry_after_s=verdict.retry_after_s,
                code="bytes_in_flight",
            )

    def release_bytes(self, nbytes: int, peer_uid: int | None = None) -> None:
        """Give back what :meth:`reserve_bytes` reserved."""
        self.inflight.release(nbytes, peer_uid)

    def _on_request_failed(self, request: int, reason: str) -> None:
        if self.frontend is not None:
            self.frontend.fail_request(request, reason)

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, drain in-flight requests (up to ``drain_timeout_s``), stop every
        instance, close everything. Idempotent."""
        if not self._started:
            return
        self._stopping = True
        with self._lock:
            deps = list(self._deployments.values())
        for d in deps:
            d.route.accepting = False
        if self.frontend is not None:
            self.frontend.drain(drain_timeout_s)
        self._teardown()
        self._started = False

    def _teardown(self) -> None:
        self._drop_wake_request()
        if self.autoscaler is not None:
            with contextlib.suppress(Exception):
                self.autoscaler.close()
        if self.supervisor is not None:
            with contextlib.suppress(Exception):
                self.supervisor.close(timeout=5.0)
        if self.frontend is not None:
            with contextlib.suppress(Exception):
                self.frontend.close()
        if self.manager is not None:
            with contextlib.suppress(Exception):
                self.manager.stop()
        if self.channel is not None:
            with contextlib.suppress(Exception):
                self.channel.close()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                self.pool.close()
            with contextlib.suppress(Exception):
                unrecord_pool(self.state_dir, self.pool.service_id)
        with self._lock:
            self._deployments.clear()

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def cpu_wake_auto(self) -> bool:
        """``cpu_wake_latency_us`` is ``auto``."""
        return self._wake.auto

    @property
    def cpu_wake_latency_us(self) -> int | None:
        """The limit requested now, µs (None: none; under ``auto`` 0 while held)."""
        return self._wake.requested_us

    @property
    def cpu_wake_auto_reason(self) -> str:
        """Why the wake policy last held the CPUs awake or let them sleep ("": never)."""
        return self._wake.auto_reason

    @property
    def cpu_wake_latency_reason(self) -> str:
        """Why the request asked for could not be made ("": it could, or none asked)."""
        return self._wake.unavailable_reason

    @property
    def cpu_wake_latency_held(self) -> bool:
        """Whether the ``cpu_wake_latency_us`` request is in force."""
        return self._wake_request is not None and self._wake_request.held

    @property
    def cpu_wake_latency_in_force_us(self) -> int | None:
        """The PM QoS limit in force, µs (None: none held)."""
        return in_force_us(self._wake, self.cpu_wake_latency_held)

    @property
    def cpu_wake_latency_planned_us(self) -> int | None:
        """The PM QoS limit the deploy-time planner plans for, µs
        (:func:`~infscaler.runtime.scaling.wakesetting.planned_us`)."""
        wake = self._wake
        return planned_us(wake, self.cpu_wake_latency_held, wake.auto and can_request())

    @property
    def stopping(self) -> bool:
        return self._stopping

    def device_profile(self) -> Any:
        """The device profile whose cap the scaler keeps: the one given, else ``cpu-host`` plus
        the gpu / dla engines this host has."""
        if self.device is not None:
            return self.device
        if self._profile is None:
            profile = load_profile("cpu-host")
            have = engine_availability()
            extra = [
                Accelerator(
                    engine=kind,
                    precisions=["fp32", "fp16"] if kind == "gpu" else ["fp16", "int8"],
                    description=f"found on this host: {reason}",
                )
                for kind in ("gpu", "dla")
                for ok, reason in [have.get(kind, (False, ""))]
                if ok
            ]
            if extra:
                profile = profile.model_copy(
                    update={"accelerators": [*profile.accelerators, *extra]}
                )
            self._profile = profile
        return self._profile

    # -- core placement (:mod:`infscaler.runtime.scaling.placement`) ---------------------------
    def _cores(self, n: int, key: tuple[str, int] | None = None) -> list[int]:
        """The ``n`` cores a new cpu instance of unit ``key`` is pinned to
        (:func:`~infscaler.runtime.scaling.placement.pick_cores`), within the core set of
        its pipeline's level while a higher one is at risk
        (:mod:`~infscaler.runtime.scaling.coreact`)."""
        cores = pinnable_cores(sorted(os.sched_getaffinity(0)), self.device)
        keeper = getattr(self.autoscaler, "core_sets", None)
        if keeper is not None and key is not None:  # kept off a higher pipeline's cores
            cores = keeper.cores_for(key[0], cores)
        with self._lock:
            start = self._core_cursor
            self._core_cursor += n
        load = core_load(self.supervisor.handles(), key) if n < len(cores) else {}
        return pick_cores(n, cores, load, start)

    # -- requests ----------------------------------------------------------------------------
    def deployment(self, name: str) -> Deployment:
        """Raises: ServiceError (404) for an unknown name."""
        with self._lock:
            dep = self._deployments.get(name)
        if dep is None:
            known = ", ".join(sorted(self._deployments)) or "none"
            raise ServiceError(f"unknown model {name!r} (deployed: {known})", 404)
        return dep

    def deployments(self) -> list[Deployment]:
        with self._lock:
            return list(self._deployments.values())

    def submit(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        timeout_s: float | None = None,
        arrived_s: float | None = None,
        *,
        priority: int | None = None,
        queue_timeout_us: int | None = None,
        uid: int | None = None,
        slot: Any = None,
    ) -> concurrent.futures.Future:
        """Start a request; a future of :class:`~infscaler.runtime.serving.route.Result`.
        Arguments as :meth:`FrontEnd.submit` (``slot``: the first slot ``inputs`` were read
        into; the caller releases it when this raises); ``uid``: the client's uid (None: the
        service's own user, root or in-process).

        Raises:
            ServiceError: (404) unknown pipeline; RequestError (400) a bad timeout or
            priority, (413) inputs over :attr:`max_input_bytes`, (503) overloaded / refused /
            stopping.
        """
        dep = self.deployment(name)
        if self._stopping:
            raise RequestError("the service is stopping", code="stopping")
        return self.frontend.submit(
            dep.route,
            inputs,
            timeout_s,
            arrived_s,
            priority=priority,
            queue_timeout_us=queue_timeout_us,
            uid=uid,
            slot=slot,
        )

    def precheck(self, name: str, uid: int | None = None) -> RequestError | None:
        """The refusal pipeline ``name`` would give a request now, before its body is read
        (:meth:`FrontEnd.precheck`), or None (also for an unknown name, no SLO, before start)."""
        with self._lock:
            dep = self._deployments.get(name)
        if dep is None or self.frontend is None or dep.route.pipeline.config.slo_ms is None:
            return None
        if dep.route.admitted <= 0:  # read without the front end's lock: a hint only
            return None
        d = self.frontend.precheck(dep.route, uid)
        if d.admit or self._stopping:
            return None
        return RequestError(
            d.reason,
            d.status,
            d.hint,
            retry_after_s=d.retry_after_s,
            code=None if d.refusal is None else d.refusal.value,
            hold_s=d.hold_s,
        )

    @property
    def max_input_bytes(self) -> int | None:
        """:attr:`FrontEnd.max_input_bytes` (None before start)."""
        return None if self.frontend is None else self.frontend.max_input_bytes

    def infer(self, name: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None):
        """Blocking :meth:`submit` (for tests and scripts)."""
        fut = self.submit(name, inputs, timeout_s)
        return fut.result()

    # -- introspection -----------------------------------------------------------------------
    def ready(self, name: str | None = None) -> bool:
        """Every unit of pipeline ``name`` has a ready instance, its route takes requests and
        the front end runs; ``name`` None: the service is started, not stopping, its initial
        pipelines deployed and its front end alive (a degraded pipeline leaves it ready)."""
        if not self._started or self._stopping or (name is None and self.starting):
            return False
        if self.frontend is None or not self.frontend.alive():
            return False
        deps = [self.deployment(name)] if name else []
        handles = self.supervisor.handles()
        for d in deps:
            if d.route.unavailable_reason is not None:
                return False
            for u in d.pipeline.served_units():
                if not any(h.key == (d.name, u.index) and h.state == "ready" for h in handles):
                    return False
        return True

    def pipeline_status(self, dep: Deployment) -> dict[str, Any]:
        """One pipeline's status: :func:`infscaler.service.status.pipeline_status`."""
        return pipeline_status(self, dep)

    def status(self) -> dict[str, Any]:
        """The service's status: :func:`infscaler.service.status.service_status`."""
        return service_status(self)
