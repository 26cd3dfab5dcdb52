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
    """One engine a unit can run on (Algorithm 1's A_k^m).

    Attributes:
        engine: ``cpu``, ``gpu`` or ``dla``.
        latency_ms: service time of one item (batch 1), ms: measured, else the plan's.
        memory_mb: memory one more instance takes (r_k^m), MB: a running instance's PSS,
            else the plan's estimate.
        cores: CPU cores one instance is pinned to (0 for gpu / dla)."""

    engine: str
    latency_ms: float
    memory_mb: float
    cores: int = 0


@dataclass(frozen=True)
class UnitState:
    """One served unit (a partition or a function stage) as the monitor sees it.

    Attributes:
        index / name: the unit's index in the pipeline and its name (``det/0``).
        bottleneck: B_k from the plan (Eq. 1); function stages and whole models: ms.
        instances: running instances per engine (S_k by engine), e.g. ``{"cpu": 2}``.
        options: the engines this unit may run on, any order.
        arrival_rate: items/s reaching this unit over the monitor's window.
        queue_len: tokens waiting at or running in this unit now.
        service_ms: P50 service time of one item, ms (None: no sample yet).
        min_instances / max_instances: bounds from the pipeline (max None: only the cap).
        threads: running cpu instances per intra-op thread count (empty: unknown).
        latency_ms_by_threads: thread count -> measured ms per item on the cpu; a count
            with no entry is never scaled to.
        min_threads / max_threads: the range of a cpu instance's threads (max None: fixed).
        busy: cores its live instances kept busy (busy fraction x threads; None: unknown)."""

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
        memory_used_mb: memory in use now (instance PSS + pool mapped), MB.
        max_instances: per engine, instance slots.
        cores: cpu thread slots: cores x ``threads_per_core`` (0: cores not counted).
        physical_cores: the cpu's cores themselves (0: not known)."""

    memory_cap_mb: float
    memory_used_mb: float
    max_instances: dict[str, int]
    cores: int = 0
    physical_cores: int = 0


@dataclass(frozen=True)
class Snapshot:
    """What the scaler decides on (one pipeline).

    Attributes:
        now: monotonic time, s. slo_ms: the latency SLO, ms.
        p99_ms: end-to-end P99 over the monitor's window, ms (None: no sample).
        arrival_rate: requests/s over the monitor's window.
        units: every served unit, in pipeline order.
        cap: resource limits and use (shared by every pipeline on the device).
        cores_used: cpu threads pinned by running cpu model instances, all pipelines.
        instances_used: per engine, running instances (all pipelines).
        pending: requests admitted and not yet answered.
        offered_rate: requests/s submitted, refused included (None: ``arrival_rate``).
        slo_refused_rate: requests/s refused at arrival as unable to meet the SLO.
        cores_busy: cpu cores kept busy by every instance and the front end (None: unknown).
        answered / late: requests answered in the P99's window, and those over the SLO
            (None: not counted).
        cores_demand: the sum of :attr:`UnitState.busy` (None: not measured).
        served_rate: requests/s answered over the window (None: not counted)."""

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
    """Tuning of :func:`~infscaler.runtime.scaling.scaler.decide` (InferLine §5 defaults where
    it gives one; why: docs/scaling.md, "The scaler's rules in full").

    Attributes:
        violation_ratio: the SLO counts as violated when P99 > this x SLO.
        cooldown_s: minimum time between two scale-outs, s.
        hold_s: no scale-in within this long after any change, s.
        rate_horizon_s: scale-in serves the max arrival rate over this window, s.
        scale_in_utilisation: a unit may drop an instance when the rest run at most this
            busy, 0-1.
        shed: bound the queue when the cap is reached (else only report it).
        settle_s: a violation within this long after the last change is not counted, s.
        sustain_s: a scale-out needs the violation for at least this long, s.
        oversubscribe: allow pinned threads past the physical cores.
        core_cap: ``demand`` (busy cores plus the new share; past the cores a trial) or
            ``threads`` (pinned threads; no trials).
        trial_s: a trial's verdict comes this long after its scale-out, s.
        trial_gain: a trial is kept when the SLO is met or the served rate rose by this.
        trial_backoff_s: no scale-out of a reverted unit this long, doubled per revert, s."""

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
    """A scale-out on trial: the ``unit``, ``engine`` and ``name`` scaled out, ``started``
    (s) and ``before_rps``, the mean served rate over the ``trial_s`` before it."""

    unit: int
    engine: str
    name: str
    started: float
    before_rps: float


@dataclass(frozen=True)
class ScalerState:
    """What :func:`~infscaler.runtime.scaling.scaler.decide` carries between calls.

    Attributes:
        last_change / last_scale_out: ``now`` of the last change / scale-out (None: never).
        rates: ``(now, arrival_rate)`` samples within ``rate_horizon_s``.
        queue_limit: the queue bound in force, requests (None: none).
        violating_since: ``now`` of the first call of the current violated run (None: none).
        waiting: why the last violated call changed nothing (None: it did not wait).
        trial: the scale-out on trial (None: none).
        blocked: ``(unit, until, reverts)`` per unit whose trial was reverted.
        trial_verdict: the last trial's verdict (None: none yet).
        served: ``(now, served rate)`` samples over the last ``2 x trial_s``."""

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
            ``scale_up`` / ``scale_down`` (one cpu instance from ``from_threads`` to
            ``threads``, make-before-break) or ``shed`` (queue bound ``queue_limit``; None
            lifts it).
        unit / engine: the unit's index and engine (None for ``shed``).
        reason: one line a user can read."""

    action: str
    unit: int | None = None
    engine: str | None = None
    queue_limit: int | None = None
    reason: str = ""
    threads: int | None = None
    from_threads: int | None = None


def device_cap(profile: Any, *, host_cores: int, memory_used_mb: float = 0.0) -> ResourceCap:
    """R^m of a DeviceProfile with U^m ``memory_used_mb`` (MB): its ``memory_cap_mb``, each
    accelerator's ``max_instances`` (a DLA's x ``count``), the cpu's thread slots and
    physical cores (its listed ``cores``, else ``host_cores``)."""
    max_inst: dict[str, int] = {}
    cores = physical = 0
    for acc in profile.accelerators:
        if acc.count < 1:
            continue
        max_inst[acc.engine] = acc.max_instances * (acc.count if acc.engine == "dla" else 1)
        if acc.engine == "cpu":
            physical = len(acc.cores) if acc.cores else host_cores
            cores = int(physical * getattr(acc, "threads_per_core", 1.0) + 1e-9)
    return ResourceCap(
        memory_cap_mb=float(profile.memory_cap_mb),
        memory_used_mb=memory_used_mb,
        max_instances=max_inst,
        cores=cores,
        physical_cores=physical,
    )
