"""A discrete-event simulator of a served pipeline: the planner's estimator (InferLine §4.2)
and the place where the auto-scaler (:func:`infscaler.runtime.scaling.scaler.decide`) runs on a
device profile without the device.

What is simulated, following the runtime (:mod:`infscaler.runtime.serving.pipeline`,
``frontend``, ``instance``):

* **units in pipeline order** (a chain; the runtime runs a DAG's branches one after
  another in the configured topological order, so a chain is what it executes). A token
  handed from one unit to the next (and from the front end to the first unit, from the
  last unit or a per-item unit before the fan-in back to the front end) takes
  ``handover_ms``;
* **instances**: each unit has instances on one or more engines; each instance serves one
  batch at a time. Work waits in one FIFO queue per unit; a token that arrives goes to an
  idle instance if there is one, else joins the least-loaded instance that is still
  gathering a batch, else waits in the queue; an instance that becomes free takes the
  head of the queue (the runtime's least-loaded dispatch, with the queue shared);
* **service times** per item on each engine from the unit's :class:`EngineProfile`: a
  mean with a coefficient of variation (0: deterministic, 1: exponential, else gamma), or
  an empirical list of measured times resampled at random;
* **batching** per unit (MArk §4 / the instance's dynamic batching): an instance that
  takes a token takes up to ``batch - 1`` more from the queue and, while the batch is not
  full, waits up to ``batch_wait_ms`` for more; the batch then runs for the profile's
  batch latency T_b (interpolated from measured sizes; b x T_1 when none are known);
* **fan-out / fan-in**: the fan-out unit turns a request into N items (a fixed count or
  one drawn from measured counts); units between it and the fan-in run per item; the
  fan-in (run by the front end: ``served=False``, one server) starts when a request's
  last item is back; N = 0 goes straight to the fan-in;
* **admission**: ``queue_limit`` bounds the requests admitted and not yet answered
  (more are rejected, the front end's 503 when the scaler sheds); ``max_inflight`` bounds
  the requests inside the pipeline's units (more wait at the front end, FIFO); ``"auto"``
  is the runtime's default window: the served units' live instances + 1, growing and
  shrinking with them;
* **auto-scaling** (:class:`Autoscale`): every ``interval_s`` a
  :class:`~infscaler.runtime.scaling.types.Snapshot` is built from the simulated monitor (end-to-end
  P99 and per-unit service P50 over a sliding window, arrival and item rates, queues,
  instances, memory = instance MB + pool MB) and ``decide`` is called; a scaled-out
  instance takes memory and a slot at once and serves after ``startup_s``; a scaled-in
  one stops after its current batch; ``shed`` sets ``queue_limit``.

Time is simulated (no clock, no threads); a run is a pure function of its arguments and
``seed`` (each unit and engine draws from its own random stream, so two configurations
of one pipeline see the same service-time sequence: common random numbers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infscaler.base.levels import MAX_INSTANCES_PER_UNIT as MAX_PER_UNIT
from infscaler.runtime.planning.simloop import _Sim
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


def _result(sim: _Sim) -> SimResult:
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
    sim = _Sim(
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
