"""A discrete-event simulator of a served pipeline: the planner's estimator (InferLine §4.2)
and the place where the auto-scaler (:func:`infscaler.runtime.scaling.scaler.decide`)
runs on a device profile without the device.

It follows the runtime (:mod:`infscaler.runtime.serving.pipeline`): units in pipeline
order, ``handover_ms`` per hop; instances per engine serving one batch at a time from one
FIFO queue per unit (least-loaded dispatch); service times per item from each
:class:`EngineProfile` (mean and CV, or measured samples resampled); batching with a
``batch_wait_ms`` window; fan-out / fan-in; admission (``queue_limit``,
``max_inflight``, ``"auto"`` = the live instances + 1); CPU contention on ``cpu_cores``;
and with :class:`Autoscale` the scaler called every ``interval_s`` on a simulated
:class:`~infscaler.runtime.scaling.types.Snapshot`. What each rule models, in full:
docs/planner.md, "Simulator".

Time is simulated (no clock, no threads); a run is a pure function of its arguments and
``seed`` (each unit and engine draws from its own random stream: common random numbers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infscaler.base.levels import MAX_INSTANCES_PER_UNIT as MAX_PER_UNIT
from infscaler.runtime.planning.simloop import SimLoop
from infscaler.runtime.planning.simtypes import Autoscale, EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import (
    ResourceCap,
    device_cap,
)

__all__ = [
    "Autoscale",
    "EngineProfile",
    "MAX_PER_UNIT",
    "SimResult",
    "UnitConfig",
    "UnitProfile",
    "UnitResult",
    "cap_from_profile",
    "config_memory_mb",
    "default_config",
    "simulate",
]


def default_config(units: Sequence[UnitProfile]) -> list[UnitConfig]:
    """``min_instances`` of every unit on its fastest engine, batch 1."""
    return [UnitConfig({u.fastest().engine: u.min_instances if u.served else 1}) for u in units]


def config_memory_mb(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], pool_mb: float = 0.0
) -> float:
    """Memory of a configuration: the served units' instances x their MB, plus the pool."""
    total = pool_mb
    for u, c in zip(units, config, strict=True):
        if u.served:
            total += sum(u.engines[e].memory_mb * n for e, n in c.instances.items())
    return float(total)


def cap_from_profile(profile: Any, host_cores: int | None = None) -> ResourceCap:
    """R^m of a :class:`~infscaler.base.device.DeviceProfile` (as the monitor reads it): memory
    cap, instance slots per engine (a DLA's times its core count), CPU thread slots
    (the profile's core set, or this host's / ``host_cores`` when it lists none, times
    ``threads_per_core``, as :meth:`infscaler.base.device.Accelerator.thread_slots`);
    ``physical_cores`` the core count itself (the scaler's busy-cores bound). No memory
    in use: :func:`infscaler.runtime.scaling.types.device_cap`."""
    if host_cores is None:
        host_cores = len(os.sched_getaffinity(0))
    return device_cap(profile, host_cores=host_cores)


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitResult:
    """One unit over the run.

    Attributes:
        name: the unit. instances: per engine at the end.
        utilisation: busy time / time instances were ready (0-1).
        mean_queue: time-average number of items waiting (not in service).
        items: items served. batches: batches run (mean batch = items / batches).
        service_ms: mean batch latency, ms (None: served nothing).
    """

    name: str
    instances: dict[str, int]
    utilisation: float
    mean_queue: float
    items: int
    batches: int
    service_ms: float | None


@dataclass(frozen=True)
class SimResult:
    """What a simulation predicts.

    Attributes:
        requests: arrivals after ``warmup_s``. completed / rejected: of those.
        throughput_rps: completed requests / (last completion - first arrival).
        p50_ms / p95_ms / p99_ms / mean_ms: end-to-end latency of the completed ones.
        slo_ms / slo_attainment: the fraction of requests answered within the SLO
            (rejected ones count as misses); None without an SLO.
        duration_s: simulated time to the last event.
        memory_mb: memory of the final configuration (instances + pool), MB.
        units: per unit. timeline: per interval (``t``, ``rate``, ``p99_ms``,
            ``instances``, ``memory_mb``, ``queue_limit``, ``rejected``, ``decisions``).
        decisions: every scaler decision with its time.
        latencies_ms: per completed request, in arrival order.
    """

    requests: int
    completed: int
    rejected: int
    throughput_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    slo_ms: float | None
    slo_attainment: float | None
    duration_s: float
    memory_mb: float
    units: tuple[UnitResult, ...]
    timeline: tuple[dict[str, Any], ...] = ()
    decisions: tuple[dict[str, Any], ...] = ()
    latencies_ms: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def to_dict(self, latencies: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["units"] = [asdict(u) for u in self.units]
        d.pop("latencies_ms")
        if latencies:
            d["latencies_ms"] = [round(float(x), 3) for x in self.latencies_ms]
        return d


def _result(sim: SimLoop) -> SimResult:
    """What the run ``sim`` predicts (see :class:`SimResult`)."""
    t_end = sim.now
    arr = np.asarray(sim.arrivals, dtype=float)
    keep = arr >= sim.warmup_s
    done = keep & ~np.isnan(sim.finish)
    lat = (sim.finish[done] - arr[done]) * 1e3
    n_req = int(keep.sum())
    rejected = int((sim.rejected & keep).sum())
    if lat.size:
        p50, p95, p99 = (float(x) for x in np.percentile(lat, [50, 95, 99]))
        mean = float(lat.mean())
    else:
        p50 = p95 = p99 = mean = None
    if done.any():
        span = float(np.nanmax(sim.finish[done]) - arr[keep].min())
        thr = float(done.sum() / span) if span > 0 else 0.0
    else:
        thr = 0.0
    att = None
    if sim.slo_ms is not None and n_req:
        att = float((lat <= sim.slo_ms).sum() / n_req)
    units = []
    for u in sim.units:
        u.note_queue(t_end)
        busy = sum(i.busy_time for i in u.instances)
        avail = sum(
            i.avail_time + (t_end - i.ready_at if i.ready_at is not None else 0.0)
            for i in u.instances
        )
        units.append(
            UnitResult(
                name=u.p.name,
                instances=u.counts(),
                utilisation=float(min(1.0, busy / avail)) if avail > 0 else 0.0,
                mean_queue=float(u.q_area / t_end) if t_end > 0 else 0.0,
                items=u.items,
                batches=u.batches,
                service_ms=float(u.batch_time / u.batches * 1e3) if u.batches else None,
            )
        )
    mem = sim.pool_mb + sum(i.memory_mb for u in sim.units for i in u.live())
    return SimResult(
        requests=n_req,
        completed=int(done.sum()),
        rejected=rejected,
        throughput_rps=thr,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=mean,
        slo_ms=sim.slo_ms,
        slo_attainment=att,
        duration_s=float(t_end),
        memory_mb=float(mem),
        units=tuple(units),
        timeline=tuple(sim.timeline),
        decisions=tuple(sim.decisions),
        latencies_ms=lat,
    )


def _check_units(units: Sequence[UnitProfile]) -> None:
    if not units:
        raise ValueError("a pipeline needs at least one unit")
    fo = [i for i, u in enumerate(units) if u.fan_out]
    fi = [i for i, u in enumerate(units) if u.fan_in]
    if len(fo) > 1 or len(fi) > 1:
        raise ValueError("at most one fan-out unit and one fan-in unit")
    if fi and not (fo and fo[0] < fi[0]):
        raise ValueError(f"unit {units[fi[0]].name} fans in but no earlier unit fans out")
    if fo and not fi:
        raise ValueError(f"unit {units[fo[0]].name} fans out but no later unit fans in")


def simulate(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig] | None,
    arrivals: np.ndarray | Sequence[float],
    *,
    slo_ms: float | None = None,
    handover_ms: float = 0.0,
    queue_limit: int | None = None,
    max_inflight: int | str | None = None,
    seed: int = 0,
    warmup_s: float = 0.0,
    autoscale: Autoscale | None = None,
    pool_mb: float = 0.0,
    timeline_s: float | None = None,
    cpu_cores: int | None = None,
) -> SimResult:
    """Simulate ``units`` deployed as ``config`` under ``arrivals`` (see the module
    docstring).

    Args:
        units: the pipeline's units in order (:class:`UnitProfile`).
        config: one :class:`UnitConfig` per unit (None: :func:`default_config`). A
            ``served=False`` unit (the fan-in) always runs on one server.
        arrivals: request arrival times, s (sorted or not; :mod:`~infscaler.runtime.planning.arrivals`).
        slo_ms: for ``slo_attainment`` (and the scaler, from ``autoscale.slo_ms``).
        handover_ms: time of one token handover (every hop between front end and units).
        queue_limit: admitted-and-unanswered requests beyond which arrivals are rejected.
        max_inflight: requests inside the units at once (more wait at the front end);
            ``"auto"``: the runtime's default, live served instances + 1.
        seed: random streams of service times and fan-out counts.
        warmup_s: requests arriving before this are left out of the statistics.
        autoscale: run the scaler every ``autoscale.interval_s`` (:class:`Autoscale`).
        pool_mb: tensor pool memory counted with the instances, MB.
        timeline_s: without ``autoscale``, record the timeline at this interval.
        cpu_cores: the cores cpu instances share (None: no contention, every instance
            runs at its profiled speed). With it, an item that starts while the busy
            cpu threads (``cores`` of each running cpu instance, this one included)
            exceed ``cpu_cores`` takes ``busy / cpu_cores`` times its profiled time
            (processor sharing, its share fixed at the start).

    Raises:
        ValueError: inconsistent units / configuration or bad arguments.
    """
    units = list(units)
    _check_units(units)
    cfg = list(config) if config is not None else default_config(units)
    if len(cfg) != len(units):
        raise ValueError(f"config has {len(cfg)} entries for {len(units)} units")
    if handover_ms < 0 or pool_mb < 0 or warmup_s < 0:
        raise ValueError("handover_ms, pool_mb and warmup_s must be >= 0")
    if queue_limit is not None and queue_limit < 0:
        raise ValueError(f"queue_limit must be >= 0, got {queue_limit}")
    if max_inflight not in (None, "auto") and (
        not isinstance(max_inflight, int) or max_inflight < 1
    ):
        raise ValueError(f"max_inflight must be an integer >= 1 or 'auto', got {max_inflight!r}")
    if timeline_s is not None and not timeline_s > 0:
        raise ValueError(f"timeline_s must be > 0, got {timeline_s}")
    if cpu_cores is not None and (not isinstance(cpu_cores, int) or cpu_cores < 1):
        raise ValueError(f"cpu_cores must be an integer >= 1, got {cpu_cores!r}")
    arr = np.sort(np.asarray(arrivals, dtype=float))
    if arr.size and (not np.isfinite(arr).all() or arr[0] < 0):
        raise ValueError("arrival times must be finite and >= 0")
    sim = SimLoop(
        units,
        cfg,
        arr,
        slo_ms=slo_ms if slo_ms is not None else (autoscale.slo_ms if autoscale else None),
        handover_ms=handover_ms,
        queue_limit=queue_limit,
        max_inflight=max_inflight,
        seed=seed,
        warmup_s=warmup_s,
        autoscale=autoscale,
        pool_mb=pool_mb,
        timeline_s=timeline_s,
        cpu_cores=cpu_cores,
        max_per_unit=MAX_PER_UNIT,
    )
    sim.run()
    return _result(sim)
