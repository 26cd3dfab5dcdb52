"""The service: tensor pool + control channel + sharing manager + supervisor + front end,
and the deployed pipelines (what ``infscaler serve`` runs; the HTTP API sits on top,
:mod:`infscaler.api.server`).

Deploying a pipeline (:meth:`Service.deploy`) compiles it (partitioning model stages at
deploy when asked, InfScaler §IV-A), gives every unit a channel stage, starts its
instances (each pinned to its cores), waits until all are ready, then makes the
pipeline visible. Nothing is visible or half-started when a deploy fails: the instances
already started are stopped and the error says why. Undeploying stops new requests,
drains those in flight, then stops the instances. What the service reports about itself
(status, per-pipeline status, why a pipeline is degraded) is built in
:mod:`infscaler.service.status`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.config import PipelineConfig, validate_pipeline
from infscaler.base.device import Accelerator, check_pipeline, load_profile
from infscaler.base.errors import ConfigError, InfScalerError, ServiceError
from infscaler.ebpf import open_channel
from infscaler.engines import engine_availability
from infscaler.runtime.planning.autoplan import live_plan, needs_planning, plan_pipeline
from infscaler.runtime.processes.supervisor import Supervisor
from infscaler.runtime.scaling.autoscaler import Autoscaler
from infscaler.runtime.scaling.monitor import Monitor
from infscaler.runtime.scaling.pmqos import (
    CpuLatencyRequest,
    CpuLatencyUnavailable,
    can_request,
    check_max_us,
)
from infscaler.runtime.serving.admission import ByteBudget
from infscaler.runtime.serving.frontend import FrontEnd, RequestError
from infscaler.runtime.serving.pipeline import CompiledPipeline, compile_pipeline, default_state_dir
from infscaler.runtime.serving.route import Route
from infscaler.runtime.serving.stats import PipelineStats
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


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc ``malloc_trim(0)``, see
    malloc_trim(3)); best effort, a no-op elsewhere.

    A deploy loads and partitions ONNX models in this process (protobufs of tens of MB,
    graph copies); Python frees them, but glibc keeps the freed pages in its arenas, so
    the front end's resident memory stayed ~100 MB above its working set for the
    service's whole life (measured: the ``ocr`` deploy left 207 MB RSS, 108 MB after a
    trim). Called after each deploy and undeploy: rare events, the call takes ms.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _checked_wake_latency(max_us: Any) -> int | str | None:
    """``max_us`` if it is None, ``"auto"`` or a PM QoS limit the kernel takes
    (:func:`~infscaler.runtime.scaling.pmqos.check_max_us`), else an error saying what to give."""
    if max_us is None or max_us == "auto":
        return max_us
    try:
        return check_max_us(max_us)
    except ValueError:
        raise InfScalerError(
            f"cpu_wake_latency_us must be an int >= 0 (microseconds), 'auto' or None, got "
            f"{max_us!r}",
            hint="0 keeps idle CPUs polling; auto holds them awake once an SLO is missed; "
            "None lets them sleep",
        ) from None


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


class Service:
    """One InfScaler-Edge service (see the module docstring).

    Args:
        state_dir: plans partitioned at deploy and engine caches (default
            :func:`~infscaler.runtime.serving.pipeline.default_state_dir`).
        device: a :class:`~infscaler.base.device.DeviceProfile` (None: this host as is).
        control_path: ``auto``, ``ebpf`` or ``userspace`` (:func:`~infscaler.ebpf.open_channel`).
        routing: ``least-loaded`` or ``round-robin`` among a unit's instances.
        pool_mb: memory cap of the tensor pool, MB.
        max_pending: requests admitted at once (beyond: 503).
        start_timeout_s: how long a deploy waits for its instances to be ready.
        max_inflight_mb: budget of request bytes in flight, MB (None: unbounded); the
            server reserves each request's bytes before reading its body
            (:meth:`reserve_bytes`), beyond it 503 with ``retry_after_s``
            (:mod:`infscaler.runtime.serving.admission`).
        max_inflight_mb_per_uid: of that budget, what one client uid may hold, MB
            (None: no per-client bound); the service's own user and root are held to
            the service-wide budget only.
        objective: ``auto``: a pipeline left to the planner (an ``slo`` and
            ``autoscale``, model stages naming no K, threads or instances:
            :func:`~infscaler.runtime.planning.autoplan.needs_planning`) is deployed with the
            planner's choice of K, cuts, threads and instances, whichever way it arrives
            (``serve``, the API, the watcher); ``eq1``: deployed as written (Eq. 1 where a
            stage names K or an SLO).
        cpu_wake_latency_us: while the service runs, hold a Linux PM QoS request that
            keeps idle CPUs in cpuidle states with at most this exit latency, µs (0: the
            polling state only; :class:`~infscaler.runtime.scaling.pmqos.CpuLatencyRequest`):
            requests arriving at an idle device stop paying the cores' wake-up, at the
            cost of power. ``"auto"``: none until an autoscaled pipeline violates its
            SLO, then 0 µs while pipelines with an SLO stay deployed
            (:mod:`infscaler.runtime.scaling.wakepolicy`; the default). None: no request.
            Where it cannot be made (not root) the service logs why and runs without
            (``status()["cpu_wake_latency"]``).
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
        start_timeout_s: float = 120.0,
        max_inflight_mb: float | None = 256,
        max_inflight_mb_per_uid: float | None = 128,
        objective: str = "auto",
        cpu_wake_latency_us: int | str | None = "auto",
    ) -> None:

        if objective not in ("auto", "eq1"):
            raise InfScalerError(f"unknown objective {objective!r}", hint="auto or eq1")
        self.objective = objective
        #: ``cpu_wake_latency_us: auto``: the autoscaler decides (runtime.wakepolicy)
        self.cpu_wake_auto = False
        #: the limit requested now, µs (None: none; in auto mode 0 while held)
        self.cpu_wake_latency_us: int | None = None
        self.cpu_wake_auto_reason = ""
        self.cpu_wake_latency_reason = ""
        self._wake_request: Any = None
        self._set_wake_setting(_checked_wake_latency(cpu_wake_latency_us))
        self.state_dir = Path(state_dir or default_state_dir())
        self.device = device
        self.control_path = control_path
        self.routing = routing
        self.pool_mb = pool_mb
        self.max_pending = max_pending
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
        """Change the PM QoS CPU wake-up latency limit while serving (the constructor's
        ``cpu_wake_latency_us``): the old request is dropped, the new one (if any) made
        at once on a started service, else at :meth:`start`. The idle slowdown the service
        learns from then on is kept under the new setting
        (:mod:`infscaler.runtime.scaling.idlecurve`); the next deploy plans with that setting's
        curve. Not reachable from the socket (a client may only infer).

        Args:
            max_us: the longest cpuidle exit latency allowed, µs (0: polling only),
                ``"auto"`` to leave it to the autoscaler's wake policy (from no request), or
                None to let idle CPUs sleep again.

        Returns:
            whether a request is in force afterwards (False with ``max_us`` None, or where
            the request cannot be made: the reason is in ``status()["cpu_wake_latency"]``).

        Raises:
            InfScalerError: ``max_us`` is not None, ``"auto"`` or an int in [0, 2**31 - 1].
        """
        max_us = _checked_wake_latency(max_us)
        with self._lock:
            self._drop_wake_request()
            self._set_wake_setting(max_us)
            if self.autoscaler is not None:
                self.autoscaler.reset_wake()
            if self._started:
                self._hold_wake_latency()
            return self.cpu_wake_latency_held

    def _set_wake_setting(self, wake: int | str | None) -> None:
        """Take a checked ``cpu_wake_latency_us`` (:func:`_checked_wake_latency`) as the
        setting, from no request and no reasons (the constructor, :meth:`set_cpu_wake_latency`)."""
        self.cpu_wake_auto = wake == "auto"
        self.cpu_wake_auto_reason = ""
        self.cpu_wake_latency_us = None if self.cpu_wake_auto else wake  # type: ignore[assignment]
        self.cpu_wake_latency_reason = ""

    def hold_cpus_awake(self, hold: bool, reason: str, epoch: int | None = None) -> bool:
        """Apply the autoscaler's wake decision (:mod:`infscaler.runtime.scaling.wakepolicy`) where
        ``cpu_wake_latency_us`` is ``auto``: hold a PM QoS request of 0 µs, or drop it;
        anywhere else nothing changes. ``reason`` is shown in ``status()``.

        ``epoch``: the autoscaler's ``wake_epoch`` when it decided; a decision from before
        the last :meth:`set_cpu_wake_latency` (which resets the policy under this lock) is
        ignored. Returns whether the decision was applied."""
        with self._lock:
            if not self.cpu_wake_auto:
                return False
            auto = self.autoscaler
            if epoch is not None and auto is not None and auto.wake_epoch != epoch:
                return False
            self.cpu_wake_auto_reason = reason
            if hold and self._wake_request is None:
                self.cpu_wake_latency_us = 0
                self.cpu_wake_latency_reason = ""
                if self._started:
                    self._hold_wake_latency()
            elif not hold:
                self._drop_wake_request()
                self.cpu_wake_latency_us = None
            return True

    def _drop_wake_request(self) -> None:
        """Drop the PM QoS request in force, if any (the kernel forgets it with the file)."""
        if self._wake_request is not None:
            self._wake_request.close()
            self._wake_request = None

    def _hold_wake_latency(self) -> None:
        """Make the PM QoS CPU latency request ``cpu_wake_latency_us`` asks for (if any);
        where it cannot be made, log why once and serve without it."""
        if self.cpu_wake_latency_us is None:
            return
        try:
            self._wake_request = CpuLatencyRequest(self.cpu_wake_latency_us)
        except CpuLatencyUnavailable as exc:
            self.cpu_wake_latency_reason = str(exc)
            log.warning("serving without a CPU wake-up latency limit: %s", exc)
            return
        log.info(
            "holding a CPU wake-up latency limit of %d us while serving (idle CPUs use "
            "no deeper cpuidle state)",
            self.cpu_wake_latency_us,
        )

    def _remove_stale_slabs(self) -> None:
        """Unlink the ``/dev/shm`` slabs a killed earlier run on this state dir left
        (:func:`infscaler.shm.cleanup.remove_stale_pools`: only slabs named by our prefix and
        a recorded service id whose process is gone)."""

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
        """An instance became ready, exited or was restarted: a unit with no live
        instance makes its pipeline degraded (new requests: fast 503 + Retry-After).

        One call at a time: the supervisor calls this from its status thread (an
        instance reads ready) and from its restart thread (a replacement started), and
        two calls interleaved lost an update: the restart thread read the replacement
        still starting (degraded), the status thread then read it ready and cleared the
        reason, and the restart thread's stale "degraded" was written last, so the
        pipeline stayed unavailable with every instance ready (a loaded CI run of
        tests/integration/runtime/processes/test_faults.py). Serialised, the later call reads the later
        state, and its verdict is the one that stays. (The deployments are listed before
        the lock: it is never held while taking the service's own lock.)"""
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
        """Why pipeline ``name`` is degraded: one line per served unit with no ready
        instance (and when it is expected back); [] when every unit has one.

        Raises:
            ServiceError: (404) unknown pipeline.
        """
        return degraded_reasons(self.supervisor, self.deployment(name))

    def _on_frontend_death(self, reason: str) -> None:
        log.critical("the front end failed (%s): the service is not ready", reason)
        if self.on_frontend_death is not None:
            self.on_frontend_death(reason)

    def reserve_bytes(self, nbytes: int, peer_uid: int | None = None) -> None:
        """Reserve ``nbytes`` of the in-flight budget for a request of client
        ``peer_uid`` (None: not held to a per-client budget), release with
        :meth:`release_bytes` once it is answered.

        Raises:
            RequestError: (503, with ``retry_after_s``) over the budget, or over the
                client's share of it.
        """
        verdict = self.inflight.reserve(nbytes, peer_uid)
        if not verdict.admit:
            raise RequestError(
                f"the service is at its in-flight memory budget: {verdict.reason}",
                hint="retry after Retry-After seconds, send fewer concurrent requests, "
                "or raise --max-inflight-mb",
                retry_after_s=verdict.retry_after_s,
            )

    def release_bytes(self, nbytes: int, peer_uid: int | None = None) -> None:
        """Give back what :meth:`reserve_bytes` reserved."""
        self.inflight.release(nbytes, peer_uid)

    def _on_request_failed(self, request: int, reason: str) -> None:
        if self.frontend is not None:
            self.frontend.fail_request(request, reason)

    def close(self, drain_timeout_s: float = 30.0) -> None:
        """Stop accepting, drain in-flight requests (up to ``drain_timeout_s``), stop
        every instance, close everything. Idempotent."""
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
    def cpu_wake_latency_held(self) -> bool:
        """Whether the ``cpu_wake_latency_us`` request is in force."""
        return self._wake_request is not None and self._wake_request.held

    @property
    def cpu_wake_latency_in_force_us(self) -> int | None:
        """The PM QoS limit in force, µs (None: none held): what the idle slowdowns this
        service serves and plans with are keyed by (:mod:`infscaler.runtime.scaling.idlecurve`)."""
        return self.cpu_wake_latency_us if self.cpu_wake_latency_held else None

    @property
    def cpu_wake_latency_planned_us(self) -> int | None:
        """The PM QoS limit the deploy-time planner plans for, µs (None: sleeping idle
        CPUs), and whose served idle slowdown it plans with: under ``auto``, 0 where
        this process may make the request (:func:`~infscaler.runtime.scaling.pmqos.can_request`),
        since the policy holds the CPUs awake as soon as an autoscaled pipeline misses its
        SLO and the plan must be right in that state; else the one in
        force. Planning for the state at the deploy made the choice path-dependent:
        held or not depended on whether another pipeline had missed within the last
        minute: PP-OCRv4 det under the cap at 2 x L0, deploys made while not held chose
        2 x 1 thread, one made while held 1 x 2, all served held (bench/HISTORY.md,
        2026-11-27 20:15)."""
        if self.cpu_wake_auto:
            return 0 if can_request() else None
        return self.cpu_wake_latency_in_force_us

    @property
    def stopping(self) -> bool:
        return self._stopping

    def device_profile(self) -> Any:
        """The device profile whose cap the scaler keeps: the one given, else
        ``cpu-host`` (this machine, :func:`infscaler.base.device.load_profile`) plus the gpu /
        dla engines this host has (:func:`~infscaler.engines.engine_availability`)."""
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

    # -- deploy ------------------------------------------------------------------------------
    def _core_load(self, key: tuple[str, int] | None = None) -> dict[int, tuple[int, int]]:
        """Per cpu core: ``(threads pinned there by live instances of unit key, by all
        live instances)`` (starting or ready)."""
        load: dict[int, list[int]] = {}
        for h in self.supervisor.handles():
            if h.state not in ("starting", "ready"):
                continue
            for c in h.cores or ():
                mine, every = load.setdefault(c, [0, 0])
                load[c] = [mine + (h.key == key), every + 1]
        return {c: (v[0], v[1]) for c, v in load.items()}

    def _cores(self, n: int, key: tuple[str, int] | None = None) -> list[int]:
        """The ``n`` cores a new cpu instance (of unit ``key``) is pinned to: the least
        loaded by that unit's live instances, then by every live instance, ties in turn
        from a cursor. A cursor alone put a unit's second instance on its first one's
        core whenever another unit's instance had started between them (two instances
        of the bottleneck on one core, the other idle)."""
        host = sorted(os.sched_getaffinity(0))
        wanted = None
        if self.device is not None:
            for acc in self.device.accelerators:
                if acc.engine == "cpu" and acc.cores:
                    wanted = [c for c in acc.cores if c in host]
        cores = wanted or host
        with self._lock:
            start = self._core_cursor
            self._core_cursor += n
        if n >= len(cores):
            return sorted(cores)
        load = self._core_load(key)
        order = sorted(
            range(len(cores)),
            key=lambda i: (*load.get(cores[i], (0, 0)), (i - start) % len(cores)),
        )
        return sorted(cores[i] for i in order[:n])

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
            allowed_functions: modules function stages may come from (None: any; the
                API passes its :class:`~infscaler.base.security.SecurityPolicy`'s).
            live: ``cfg`` is a configuration the live check switches to (its
                :class:`~infscaler.runtime.planning.autoplan.LivePlan`): deployed as it is, not
                planned; None: planned when it is left to the planner.

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
                with self._lock:
                    self._free_stages.extend(ids)
                    self._free_stages.sort()
                raise
            window = cfg.max_inflight or sum(u.instances * u.max_batch for u in served) + 1
            route = Route(
                compiled, stage_ids, PipelineStats([u.name for u in compiled.units]), window
            )
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
        """``(cfg with the planner's choice, its LivePlan)`` when it is left to the
        planner and the objective is ``auto`` (:mod:`infscaler.runtime.planning.autoplan`), else
        ``(cfg, None)``. Its function stages (from ``allowed_functions``, as at deploy)
        run in this process on a sample request to be measured.

        Raises:
            InfScalerError: no configuration meets the SLO (the search's reason).
        """

        if self.objective != "auto" or not needs_planning(cfg):
            return cfg, None

        progress(f"planning {cfg.name}: K, cuts, threads and instances for its SLO")
        device = self.device or load_profile("cpu-host")
        planned, outcome = plan_pipeline(
            cfg,
            device=device,
            state_dir=self.state_dir,
            allowed_functions=allowed_functions,
            progress=progress,
            wake_latency_us=self.cpu_wake_latency_planned_us,
        )
        if outcome is not None and outcome.best is not None:
            progress(f"{cfg.name}: chosen {outcome.best.line()}")
        live = live_plan(
            cfg,
            device=device,
            state_dir=self.state_dir,
            allowed_functions=allowed_functions,
            wake_latency_us=self.cpu_wake_latency_planned_us,
        )
        return planned, live

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

    # -- scaling (applied by the autoscaler, :mod:`infscaler.runtime.scaling.autoscaler`) -----------
    def _live(self, dep: Deployment, unit: int | None = None) -> list[Any]:
        return [
            h
            for h in self.supervisor.handles()
            if h.key[0] == dep.name
            and h.stage_id in dep.route.stage_ids
            and (unit is None or h.key[1] == unit)
            and h.state in ("starting", "ready")
        ]

    def _resize_window(self, dep: Deployment) -> None:
        """The in-flight window: enough to keep every instance busy with full batches."""
        live = self._live(dep)
        if dep.pipeline.config.max_inflight is None:
            dep.route.max_inflight = sum(h.unit.max_batch for h in live) + 1
        dep.route.instances = [
            max(1, sum(1 for h in live if h.key[1] == u.index)) for u in dep.pipeline.units
        ]

    def _served_unit(self, dep: Deployment, unit: int) -> tuple[Any, int, int]:
        """``(unit, its stage id, the stage it hands over to)`` for starting an instance
        of unit ``unit`` of ``dep`` (0: the front end).

        Raises:
            ServiceError: (404) the pipeline was undeployed; (409) the unit runs in the
                front end.
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
        load = self._core_load((dep.name, unit))
        victim = max(
            mine,
            key=lambda h: (sum(load.get(c, (0, 0))[0] for c in h.cores or ()), h.started),
        )
        self.supervisor.stop(victim, timeout=10.0)
        self._resize_window(dep)
        log.info("scaled in %s unit %d on %s: instance %d", dep.name, unit, engine, victim.iid)
        return True

    def scale_threads(
        self, dep: Deployment, unit: int, threads: int, from_threads: int | None = None
    ) -> bool:
        """Replace one cpu instance of unit ``unit`` (one running ``from_threads``
        intra-op threads; None: any) by one running ``threads``, make-before-break: the
        new instance (pinned to ``threads`` cores) is started and waited for until ready
        (it is routed to only then), then the old one stops gracefully (SIGUSR1: it
        finishes its current request; tokens queued at it are re-routed by the sharing
        manager), so no request is lost and the unit never has fewer instances. Blocks
        until the old one exited. The scaler's ``scale_up`` / ``scale_down``.

        Returns:
            False when no such instance runs (nothing was started).

        Raises:
            ServiceError: (404) the pipeline was undeployed; (409) no such served unit,
                or ``threads`` < 1.
            InstanceStartError: the new instance failed to load; it is stopped and the
                old one keeps serving.
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
        live = [x for x in mine if x.state in ("starting", "ready")]
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
        """Deploy ``dep.live``'s other configuration (the runner-up, or the planner's
        choice after a trial) in ``dep``'s place, make-before-break: the new instances
        start and serve before the old ones drain (:meth:`deploy` with ``replace``), so
        no request is lost; ``live`` is the plan once it serves
        (:meth:`~infscaler.runtime.planning.autoplan.LivePlan.swapped`).

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
    ) -> concurrent.futures.Future:
        """Start a request; a future of :class:`~infscaler.runtime.serving.route.Result`.
        ``timeout_s`` / ``arrived_s``: as :meth:`FrontEnd.submit` (the deadline, seconds,
        counted from ``arrived_s``, a ``time.monotonic()`` time; default now).

        Raises:
            ServiceError: (404) unknown pipeline; RequestError (400) a bad timeout,
            (503) overloaded / refused at arrival / stopping.
        """
        dep = self.deployment(name)
        if self._stopping:
            raise RequestError("the service is stopping")
        return self.frontend.submit(dep.route, inputs, timeout_s, arrived_s)

    def infer(self, name: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None):
        """Blocking :meth:`submit` (for tests and scripts)."""
        fut = self.submit(name, inputs, timeout_s)
        return fut.result()

    # -- introspection -----------------------------------------------------------------------
    def ready(self, name: str | None = None) -> bool:
        """Every unit of the pipeline has a ready instance and the front end runs; for
        the service as a whole (``name`` None): started, not stopping, the initial
        pipelines deployed, the front end running (False for good once it failed:
        :attr:`FrontEnd.failure`). A degraded pipeline (a unit restarting) is not ready;
        the service stays ready meanwhile (it serves its other pipelines and restarts the
        unit itself), so ``/v2/health/ready`` means "the process can take requests" for
        Kubernetes and systemd alike; :meth:`degraded` and ``status`` say what is down.
        A pipeline is ready only once its route takes requests again too: the route's
        ``unavailable_reason`` is cleared by :meth:`_on_instances_changed` just after a
        replacement reads ready, and in between health said ready while a request got
        503 "replacement is loading" (a CI failure of tests/integration/runtime/processes/test_faults.py)."""
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
