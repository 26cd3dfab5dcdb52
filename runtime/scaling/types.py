"""The scaler's data (InfScaler §IV-A, Algorithm 1): its input (:class:`Snapshot`,
:class:`UnitState`, :class:`EngineOption`, :class:`ResourceCap`: R^m and U^m), tuning
(:class:`ScalerConfig`), state (:class:`ScalerState`) and output (:class:`Decision`), and
:func:`device_cap`, R^m of a device profile for the monitor and the simulator alike.
Pure: no I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineOption:
    """One engine a unit can run on (its hardware affinity entry, Algorithm 1's A_k^m).

    Attributes:
        engine: ``cpu``, ``gpu`` or ``dla``.
        latency_ms: service time of one item (batch 1) on this engine, ms: measured by
            the monitor when instances run there, else the plan's profiled latency.
        memory_mb: memory one more instance takes (r_k^m), MB: the measured PSS of a
            running instance of this unit on this engine, else the plan's estimate.
        cores: CPU cores one instance is pinned to (``threads``; 0 for gpu / dla).
    """

    engine: str
    latency_ms: float
    memory_mb: float
    cores: int = 0


@dataclass(frozen=True)
class UnitState:
    """One served unit (a partition or a function stage) as the monitor sees it.

    Attributes:
        index: the unit's index in the pipeline (decisions name it).
        name: ``det/0``, ``rec``, ... (for reasons and logs).
        bottleneck: B_k from the plan (sum of representative complexities, Eq. 1);
            function stages and unpartitioned models use their service time in ms.
        instances: running instances per engine (S_k split by engine), e.g. ``{"cpu": 2}``.
        options: the engines this unit may run on, any order (the scaler sorts by
            ``latency_ms``).
        arrival_rate: items per second reaching this unit over the monitor's window
            (requests/s times fan-out for per-item units).
        queue_len: tokens waiting at or running in this unit now.
        service_ms: P50 service time of one item on its current instances, ms (None:
            no sample yet; the scaler then uses the fastest option's ``latency_ms``).
        min_instances / max_instances: bounds from the pipeline (max None: only the cap).
        threads: running cpu instances per intra-op thread count, e.g. ``{1: 1, 2: 1}``
            (empty: not known; vertical scaling is then not considered).
        latency_ms_by_threads: thread count -> measured service time of one item on the
            cpu at that many intra-op threads, ms
            (:meth:`infscaler.runtime.serving.runners.ModelRunner.probe_threads`); a count
            with no entry is never scaled to.
        min_threads / max_threads: the range the scaler may move a cpu instance's
            intra-op threads in (max None: no vertical scaling).
        busy: cores the unit's live instances kept busy over the monitor's last seconds
            (busy fraction x threads, summed; None: not measured):
            :mod:`infscaler.runtime.scaling.demand`.
    """

    index: int
    name: str
    bottleneck: float
    instances: dict[str, int]
    options: tuple[EngineOption, ...]
    arrival_rate: float = 0.0
    queue_len: int = 0
    service_ms: float | None = None
    min_instances: int = 1
    max_instances: int | None = None
    threads: dict[int, int] = field(default_factory=dict)
    latency_ms_by_threads: dict[int, float] = field(default_factory=dict)
    min_threads: int = 1
    max_threads: int | None = None
    busy: float | None = None

    @property
    def total_instances(self) -> int:
        return sum(self.instances.values())


@dataclass(frozen=True)
class ResourceCap:
    """The device's resource limits R^m and current use U^m.

    Attributes:
        memory_cap_mb: memory the service may use (instances + tensor pool), MB.
        memory_used_mb: memory in use now (sum of instance PSS + pool mapped), MB.
        max_instances: per engine, instance slots (the profile's ``max_instances``).
        cores: cpu thread slots: its cores x the profile's ``threads_per_core``
            (:meth:`infscaler.base.device.Accelerator.thread_slots`; 0: do not count cores).
        physical_cores: the cpu's cores themselves (no ``threads_per_core``), which
            :attr:`Snapshot.cores_busy` is compared with (0: not known).
    """

    memory_cap_mb: float
    memory_used_mb: float
    max_instances: dict[str, int]
    cores: int = 0
    physical_cores: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What the scaler decides on (one pipeline).

    Attributes:
        now: monotonic time, seconds.
        slo_ms: the pipeline's latency SLO, ms.
        p99_ms: end-to-end P99 over the monitor's window, ms (None: no sample).
        arrival_rate: requests per second over the monitor's short window.
        units: every served unit, in pipeline order.
        cap: resource limits and use (shared by every pipeline on the device).
        cores_used: cpu threads pinned by running cpu instances of model stages, all
            pipelines; compared with ``cap.cores``.
        instances_used: per engine, running instances (all pipelines).
        pending: requests admitted and not yet answered.
        offered_rate: requests per second submitted over the window, refused ones
            included (None: same as ``arrival_rate``).
        slo_refused_rate: requests per second refused at arrival because they could not
            meet the SLO (:mod:`infscaler.runtime.serving.admission`).
        cores_busy: cpu cores kept busy over the monitor's last seconds by every
            instance and the front end (CPU s / wall s; None: not measured).
        answered / late: requests answered in the window ``p99_ms`` is taken over, and
            how many took longer than the SLO (None: not counted):
            :func:`~infscaler.runtime.scaling.scaler.is_violated`.
        cores_demand: the sum of :attr:`UnitState.busy` over the device (an instance not
            measured yet counts its threads); None: not measured (the cap then counts
            pinned threads).
        served_rate: requests per second answered over the window (None: not counted).
    """

    now: float
    slo_ms: float
    p99_ms: float | None
    arrival_rate: float
    units: tuple[UnitState, ...]
    cap: ResourceCap
    cores_used: int = 0
    instances_used: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    offered_rate: float | None = None
    slo_refused_rate: float = 0.0
    cores_busy: float | None = None
    answered: int | None = None
    late: int | None = None
    cores_demand: float | None = None
    served_rate: float | None = None

    @property
    def offered(self) -> float:
        """The offered load, requests/s: ``offered_rate``, at least ``arrival_rate``."""
        if self.offered_rate is None:
            return self.arrival_rate
        return max(self.offered_rate, self.arrival_rate)


@dataclass(frozen=True)
class ScalerConfig:
    """Tuning of :func:`~infscaler.runtime.scaling.scaler.decide` (defaults from InferLine §5 where it gives one).

    Why each default: docs/scaling.md, "The scaler's rules in full".

    Attributes:
        violation_ratio: the SLO counts as violated when P99 > ``violation_ratio`` x SLO.
        cooldown_s: minimum time between two scale-outs of one pipeline, s.
        hold_s: no scale-in within this long after any change (InferLine: 15 s).
        rate_horizon_s: scale-in serves the max arrival rate over this window (30 s).
        scale_in_utilisation: a unit may drop an instance when the rest would run at
            most this busy (rate x service time / instances), 0-1.
        shed: bound the queue when the cap is reached (else only report it).
        settle_s: a violation within this long after the last change
            (:attr:`ScalerState.last_change`: the deploy, a scale-out, a scale-in or a
            thread step) is not counted, s.
        sustain_s: a scale-out (or thread scale-up, or a queue bound) needs the violation
            at every call for at least this long, s (:attr:`ScalerState.violating_since`).
        oversubscribe: allow a cpu scale-out or thread step that takes the pinned cpu
            threads of all instances (:attr:`Snapshot.cores_used` + the new ones) past
            the physical cores (:attr:`ResourceCap.physical_cores`); counted as
            ``core_cap`` says.
        core_cap: how the cpu cap counts a cpu scale-out or thread step against the
            physical cores: ``demand`` (default: busy cores plus the new one's expected
            share, :func:`~infscaler.runtime.scaling.demand.fits_cores`; a scale-out past
            the cores is a trial) or ``threads`` (pinned threads; no trials).
        trial_s: a trial's verdict comes this long after its scale-out, s (at least
            ``settle_s`` + 1 s).
        trial_gain: a trial is kept when the SLO is met at its verdict or the served
            rate rose by at least this fraction; else its instance is stopped.
        trial_backoff_s: after a reverted trial the unit is not scaled out for this long,
            s, doubled after each further revert.
    """

    violation_ratio: float = 1.0
    cooldown_s: float = 3.0
    hold_s: float = 15.0
    rate_horizon_s: float = 30.0
    scale_in_utilisation: float = 0.6
    shed: bool = True
    settle_s: float = 5.0
    sustain_s: float = 2.0
    oversubscribe: bool = False
    core_cap: str = "demand"
    trial_s: float = 10.0
    trial_gain: float = 0.1
    trial_backoff_s: float = 60.0


@dataclass(frozen=True)
class Trial:
    """A scale-out on trial (:mod:`infscaler.runtime.scaling.demand`).

    Attributes:
        unit / engine / name: the unit scaled out and where.
        started: ``now`` of the scale-out, s.
        before_rps: requests/s served before it: the mean of the served rates the
            scaler read over the ``trial_s`` before it (:attr:`ScalerState.served`).
    """

    unit: int
    engine: str
    name: str
    started: float
    before_rps: float


@dataclass(frozen=True)
class ScalerState:
    """What :func:`~infscaler.runtime.scaling.scaler.decide` carries from one call to the next (returned anew each call).

    Attributes:
        last_change: ``now`` of the last scale-out or scale-in (None: never).
        last_scale_out: ``now`` of the last scale-out (None: never).
        rates: ``(now, arrival_rate)`` samples within ``rate_horizon_s``.
        queue_limit: the queue bound the last ``shed`` decision set, requests (None: no
            bound in force); a ``shed`` is emitted only when this changes.
        violating_since: ``now`` of the first call of the current run of violated
            calls (outside the settle window), s; None otherwise.
        waiting: why the last call, on a violation, changed nothing, one line; None when
            it did not wait.
        trial: the scale-out on trial (None: none).
        blocked: ``(unit, until, reverts)`` per unit whose trial was reverted: no
            scale-out of it before ``until`` (s); ``reverts`` in a row.
        trial_verdict: the last trial's verdict, one line (None: none yet).
        served: ``(now, served rate)`` samples, requests/s, over the last ``2 x trial_s``.
    """

    last_change: float | None = None
    last_scale_out: float | None = None
    rates: tuple[tuple[float, float], ...] = ()
    queue_limit: int | None = None
    violating_since: float | None = None
    waiting: str | None = None
    trial: Trial | None = None
    blocked: tuple[tuple[int, float, int], ...] = ()
    trial_verdict: str | None = None
    served: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Decision:
    """One action for the supervisor / front end.

    Attributes:
        action: ``scale_out`` / ``scale_in`` (one instance of ``unit`` on ``engine``),
            ``scale_up`` / ``scale_down`` (replace one cpu instance of ``unit`` running
            ``from_threads`` intra-op threads by one running ``threads``,
            make-before-break), or ``shed`` (bound the pipeline's queue at
            ``queue_limit`` requests; None lifts it).
        unit: the unit's index (None for ``shed``).
        engine: the engine (None for ``shed``; ``cpu`` for ``scale_up`` / ``scale_down``).
        queue_limit: for ``shed``.
        threads / from_threads: for ``scale_up`` / ``scale_down``.
        reason: one line a user can read.
    """

    action: str
    unit: int | None = None
    engine: str | None = None
    queue_limit: int | None = None
    reason: str = ""
    threads: int | None = None
    from_threads: int | None = None


def device_cap(profile: Any, *, host_cores: int, memory_used_mb: float = 0.0) -> ResourceCap:
    """R^m of a :class:`~infscaler.base.device.DeviceProfile`, with U^m for memory.

    Memory cap: the profile's ``memory_cap_mb``; instance slots per engine: each
    accelerator's ``max_instances`` (a DLA's times its ``count``); cpu thread slots:
    :meth:`infscaler.base.device.Accelerator.thread_slots` of the cpu entry's ``cores``
    (else ``host_cores``); ``physical_cores``: that core count.

    Args:
        profile: the device profile.
        host_cores: cores this host runs instances on; used when the cpu entry lists none.
        memory_used_mb: memory in use now, MB (0 for a plan).
    """
    max_inst: dict[str, int] = {}
    cores = physical = 0
    for acc in profile.accelerators:
        if acc.count < 1:
            continue
        max_inst[acc.engine] = acc.max_instances * (acc.count if acc.engine == "dla" else 1)
        if acc.engine == "cpu":
            # pinned threads within the thread slots; busy cores within the cores
            # themselves (the scaler's SATURATED_FREE_PER_THREAD)
            physical = len(acc.cores) if acc.cores else host_cores
            cores = int(physical * getattr(acc, "threads_per_core", 1.0) + 1e-9)
    return ResourceCap(
        memory_cap_mb=float(profile.memory_cap_mb),
        memory_used_mb=memory_used_mb,
        max_instances=max_inst,
        cores=cores,
        physical_cores=physical,
    )
