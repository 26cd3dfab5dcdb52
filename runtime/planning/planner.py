"""The planner: a pipeline's starting configuration for an arrival rate and an SLO
(InferLine §4.3, with InfScaler's Algorithm 1 as the step that adds capacity).

:func:`plan` searches, with the discrete-event simulator (:mod:`infscaler.runtime.planning.simulator`)
as the estimator of P99 on a sample arrival trace at the given rate:

1. **Bound.** Every unit on its fastest engine the device has, batch 1. If the service
   time alone (the units' per-item times, one item per per-item unit, plus the token
   handovers) exceeds the SLO, no configuration can meet it: infeasible.
2. **Start** at each unit's minimum instances (``instances`` in pipeline.yaml, 1 by
   default); refuse if that alone exceeds the device's memory cap.
3. **Add capacity** (Algorithm 1): while a unit is overloaded (offered load
   rho_k = lambda_k x T_k / S_k >= 1: B_k / S_k in requests' terms) or the simulated P99
   exceeds the SLO, give one more instance to the unit with the largest B_k / S_k, on
   the first engine in its affinity order (fastest first) that fits the device's
   resource cap (memory MB shared by every engine, instance slots per engine and CPU
   cores for model units, the unit's own ``max_instances``); when it cannot take one,
   the next most loaded unit carrying at least half that load. If none can grow, double
   the batch of the most loaded unit that has a measured batch profile (InferLine's
   IncreaseBatch); if that is not possible either, the plan is infeasible and the
   reason names the limits that stopped it. It also stops, infeasible, when four
   additions in a row left the simulated P99 where it was (service time, not capacity,
   is what misses the SLO).
4. **Trim** (InferLine Algorithm 2, RemoveReplica): remove the instance whose removal
   saves the most memory while the simulated P99 still meets the SLO, until none can go.

The in-flight window simulated is the runtime's default (the served instances + 1, or
the pipeline's ``max_inflight``); once a batch is raised it is the instances x their
batch + 1, which the plan then recommends as ``max_inflight`` (the default window would
let no batch grow beyond 2).

The result is the least-memory configuration this greedy search finds, with its
predicted P99 / throughput / utilisation per unit. :func:`predict` simulates a given
configuration; :func:`autoscale_run` runs the scaler (Algorithm 1) in the simulator on a
device profile.

Assumptions (also in the simulator's docstring): instances do not slow each other down
(each has its own cores / engine slot); the CPU cap counts cores like the scaler does,
so a host with fewer cores than model instances gets no more CPU instances.

:func:`search` goes further than :func:`plan`: for model stages described by
:class:`ModelStage` (per-operator costs, valid cuts, the whole model's measured time per
thread count) it searches K, the cuts of several objectives (Eq. 1, minmax, weights),
intra-op threads and instances, and scores every candidate by its simulated goodput with
CPU contention and the front end's CPU; ``explain`` says why each candidate lost.

Pure: no I/O; profiles come from :mod:`infscaler.runtime.planning.unitprofile`,
:mod:`infscaler.runtime.planning.stageprofile` or by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from infscaler.base.errors import PartitionError
from infscaler.partitioner import search as _search
from infscaler.runtime.planning import arrivals as _arrivals
from infscaler.runtime.planning.simulator import (
    MAX_PER_UNIT,
    Autoscale,
    EngineProfile,
    SimResult,
    UnitConfig,
    UnitProfile,
    cap_from_profile,
    config_memory_mb,
    simulate,
)
from infscaler.runtime.scaling.types import ResourceCap, ScalerConfig

__all__ = [
    "FRONTEND_MS",
    "GOODPUT_TIE",
    "MEMORY_AMPLE",
    "HANDOVER_MS",
    "Candidate",
    "ModelStage",
    "PlanResult",
    "SearchOutcome",
    "arrival_rates",
    "arrivals_for",
    "autoscale_run",
    "capacity_rps",
    "cpu_cores",
    "frontend_profile",
    "plan",
    "predict",
    "resource_cap",
    "search",
]

ArrivalsArg = str | np.ndarray | Sequence[float] | Callable[[float, float, int], np.ndarray]


@dataclass(frozen=True)
class PlanResult:
    """What :func:`plan` found.

    Attributes:
        feasible: a configuration meets the SLO within the cap.
        reason: one line a user can read (why infeasible, or what was found).
        rate / slo_ms / arrivals: the target.
        units: the profiles planned for.
        config: per unit (the plan, or for an infeasible plan the last one tried; None
            when the search could not start).
        prediction: the simulation of ``config`` (None when not simulated).
        memory_mb / memory_cap_mb: of ``config`` (instances + pool) and the device's cap.
        steps: the search, one line per change.
        simulations: how many simulations the search ran.
    """

    feasible: bool
    reason: str
    rate: float
    slo_ms: float
    arrivals: str
    units: tuple[UnitProfile, ...]
    config: tuple[UnitConfig, ...] | None
    prediction: SimResult | None
    memory_mb: float
    memory_cap_mb: float
    steps: tuple[str, ...] = ()
    simulations: int = 0
    pool_mb: float = 0.0
    handover_ms: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def rows(self) -> list[dict[str, Any]]:
        """Per unit: ``unit``, ``engine`` (``cpu`` or ``cpu:2+gpu:1``), ``instances``,
        ``batch``, ``service_ms`` (per item, batch 1, on the first configured engine),
        ``items_per_request``, ``utilisation``, ``mean_queue``, ``memory_mb``."""
        if self.config is None:
            return []
        out = []
        for i, (u, c) in enumerate(zip(self.units, self.config, strict=True)):
            ur = self.prediction.units[i] if self.prediction is not None else None
            engines = sorted(c.instances, key=lambda e: u.engines[e].mean_ms)
            out.append(
                {
                    "unit": u.name,
                    "kind": u.kind if u.served else "front end",
                    "engine": engines[0]
                    if len(engines) == 1
                    else "+".join(f"{e}:{c.instances[e]}" for e in engines),
                    "instances": c.total,
                    "batch": c.batch,
                    "service_ms": round(u.engines[engines[0]].mean_ms, 4),
                    "items_per_request": round(u.items_mean, 3) if u.fan_out else None,
                    "utilisation": round(ur.utilisation, 4) if ur else None,
                    "mean_queue": round(ur.mean_queue, 4) if ur else None,
                    "memory_mb": round(
                        sum(u.engines[e].memory_mb * n for e, n in c.instances.items())
                        if u.served
                        else 0.0,
                        2,
                    ),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        pred = self.prediction
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "rate": self.rate,
            "slo_ms": self.slo_ms,
            "arrivals": self.arrivals,
            "units": self.rows(),
            "config": None if self.config is None else [asdict(c) for c in self.config],
            "predicted": None
            if pred is None
            else {
                k: getattr(pred, k)
                for k in (
                    "p50_ms",
                    "p95_ms",
                    "p99_ms",
                    "mean_ms",
                    "throughput_rps",
                    "slo_attainment",
                    "requests",
                    "completed",
                    "rejected",
                )
            },
            "memory_mb": round(self.memory_mb, 2),
            "memory_cap_mb": self.memory_cap_mb if math.isfinite(self.memory_cap_mb) else None,
            "pool_mb": self.pool_mb,
            "handover_ms": self.handover_ms,
            "simulations": self.simulations,
            "steps": list(self.steps),
            "notes": list(self.notes),
        }


# -- helpers -------------------------------------------------------------------------------


def resource_cap(device: Any) -> ResourceCap:
    """R^m from a :class:`~infscaler.base.device.DeviceProfile`, a :class:`ResourceCap`, or None
    (no limit but the control path's :data:`MAX_PER_UNIT` per unit)."""
    if device is None:
        return ResourceCap(memory_cap_mb=math.inf, memory_used_mb=0.0, max_instances={}, cores=0)
    if isinstance(device, ResourceCap):
        return device
    return cap_from_profile(device)


def arrivals_for(
    arrivals: ArrivalsArg, rate: float, duration_s: float, seed: int = 0
) -> tuple[np.ndarray, str]:
    """``(times, label)`` for a spec (``poisson``, ``gamma:4``, ``azure``, ...; see
    :func:`infscaler.runtime.planning.arrivals.from_spec`), a callable ``f(rate, duration_s, seed)``,
    or explicit times."""
    if isinstance(arrivals, str):
        return _arrivals.from_spec(arrivals, rate, duration_s, seed), arrivals
    if callable(arrivals):
        return np.asarray(arrivals(rate, duration_s, seed), dtype=float), getattr(
            arrivals, "__name__", "custom"
        )
    a = np.asarray(arrivals, dtype=float)
    return a, f"trace ({a.size} requests)"


def _engines_allowed(u: UnitProfile, cap: ResourceCap) -> list[str]:
    """The unit's options the device has, fastest first (Algorithm 1's affinity order)."""
    opts = sorted(u.engines.values(), key=lambda p: (p.mean_ms, p.engine))
    if not cap.max_instances:
        return [p.engine for p in opts]
    return [p.engine for p in opts if p.engine in cap.max_instances]


def _per_item_ms(u: UnitProfile, c: UnitConfig) -> float:
    """Mean time per item the unit's instances need on average (capacity inverse)."""
    rate = 0.0  # items per ms
    for e, n in c.instances.items():
        p = u.engines[e]
        per_item = p.mean_ms * p.batch_factor(c.batch) / c.batch
        rate += n / per_item if per_item > 0 else math.inf
    return 1.0 / rate if rate > 0 else 0.0


def arrival_rates(units: Sequence[UnitProfile], rate: float) -> list[float]:
    """Items per second arriving at each unit at ``rate`` requests/s: the rate itself,
    or for a per-item unit (between the fan-out and the fan-in, as the simulator routes
    them) the rate x the fan-out's mean items per request.

    >>> from infscaler.runtime.planning.simulator import EngineProfile as E
    >>> us = [UnitProfile("a", {"cpu": E("cpu", 1)}, fan_out=True, items=3),
    ...       UnitProfile("b", {"cpu": E("cpu", 1)}),
    ...       UnitProfile("c", {"cpu": E("cpu", 1)}, fan_in=True, served=False)]
    >>> arrival_rates(us, 10.0)
    [10.0, 30.0, 10.0]
    """
    fo = next((i for i, x in enumerate(units) if x.fan_out), None)
    fi = next((i for i, x in enumerate(units) if x.fan_in), None)
    items = units[fo].items_mean if fo is not None else 1.0
    return [
        rate * (items if fo is not None and fi is not None and fo < i < fi else 1.0)
        for i in range(len(units))
    ]


def _loads(units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float) -> list[float]:
    """Offered load rho_k of each unit (items/s x s per item over all its instances)."""
    return [
        r * _per_item_ms(u, c) / 1e3
        for r, u, c in zip(arrival_rates(units, rate), units, config, strict=True)
    ]


def capacity_rps(units: Sequence[UnitProfile], config: Sequence[UnitConfig], cores: int) -> float:
    """Analytic upper bound on requests/s: the most loaded unit's instances (its ms per
    item over its instances x its items per request) and the cpu cores (``cores`` x 1000
    over the cpu ms all units spend per request, each item on its instance's pinned
    threads).

    E.g. one unit of 15 ms on 1 instance: 1000 / 15 requests/s; a per-item unit of 10 ms
    with 3 items per request on 2 instances: 1000 / (3 x 10 / 2).
    """
    per_req = [
        r * _per_item_ms(u, c)
        for r, u, c in zip(arrival_rates(units, 1.0), units, config, strict=True)
    ]
    cpu_ms = 0.0
    for r, u in zip(arrival_rates(units, 1.0), units, strict=True):
        p = u.engines.get("cpu")
        if p is not None:
            cpu_ms += r * p.mean_ms * max(1, p.cores)
    return min(1e3 / max(max(per_req), 1e-9), 1e3 * max(1, cores) / max(cpu_ms, 1e-9))


def _busy_cores(units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float) -> float:
    """CPU cores the offered load keeps busy: sum over units of items/s x ms per item
    on the cpu instances' share (pinned instances may outnumber cores, busy cores may
    not; the fleet planner's cpu demand per node, :mod:`infscaler.runtime.planning.fleet`)."""
    busy = 0.0
    for r, u, c in zip(arrival_rates(units, rate), units, config, strict=True):
        if not u.served or "cpu" not in c.instances or "cpu" not in u.engines:
            continue
        cpu_share = c.instances["cpu"] / max(1, c.total)
        busy += r * cpu_share * u.engines["cpu"].mean_ms / 1e3
    return busy


def _usage(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], pool_mb: float
) -> tuple[float, dict[str, int], int]:
    """(memory MB, model instances per engine, cores of cpu model instances)."""
    slots: dict[str, int] = {}
    cores = 0
    for u, c in zip(units, config, strict=True):
        if not u.served or u.kind != "model":
            continue
        for e, n in c.instances.items():
            slots[e] = slots.get(e, 0) + n
            if e == "cpu":
                cores += max(1, u.engines[e].cores) * n
    return config_memory_mb(units, config, pool_mb), slots, cores


def _fits(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig],
    k: int,
    engine: str,
    cap: ResourceCap,
    pool_mb: float,
) -> str | None:
    """None when unit ``k`` can take one more instance on ``engine``, else why not."""
    u, c = units[k], config[k]
    limit = min(u.max_instances or MAX_PER_UNIT, MAX_PER_UNIT)
    if c.total + 1 > limit:
        return f"{u.name} is at its max_instances {limit}"
    mem, slots, cores = _usage(units, config, pool_mb)
    p = u.engines[engine]
    if mem + p.memory_mb > cap.memory_cap_mb:
        return (
            f"memory {mem:.0f}+{p.memory_mb:.0f} > cap {cap.memory_cap_mb:.0f} MB "
            f"({u.name} on {engine})"
        )
    if (
        u.kind == "model"
        and cap.max_instances
        and slots.get(engine, 0) + 1 > cap.max_instances.get(engine, 0)
    ):
        return f"{engine} slots {slots.get(engine, 0)}/{cap.max_instances.get(engine, 0)} used"
    # pinned threads of cpu model instances against the thread slots, as the runtime's
    # scaler counts them (Monitor.pinned_threads); a function stage pins none but needs
    # a free slot to be added
    if engine == "cpu" and cap.cores and cores + max(1, p.cores) > cap.cores:
        return f"cpu pinned threads {cores}+{max(1, p.cores)} > {cap.cores} thread slots"
    return None


def _window(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], max_inflight: int | str | None
) -> int | str | None:
    """The in-flight window to simulate: as given, except that ``"auto"`` with batching
    becomes the served instances x their batch + 1 (the runtime's default window, the
    instances + 1, would let no batch grow beyond 2: the plan then recommends this one)."""
    if max_inflight == "auto" and any(c.batch > 1 for c in config):
        return 1 + sum(c.total * c.batch for u, c in zip(units, config, strict=True) if u.served)
    return max_inflight


def _with(config: Sequence[UnitConfig], k: int, new: UnitConfig) -> list[UnitConfig]:
    out = list(config)
    out[k] = new
    return out


def _add(c: UnitConfig, engine: str, n: int = 1) -> UnitConfig:
    inst = dict(c.instances)
    inst[engine] = inst.get(engine, 0) + n
    return UnitConfig({e: v for e, v in inst.items() if v > 0}, c.batch, c.batch_wait_ms)


# -- the search ----------------------------------------------------------------------------


def plan(
    units: Sequence[UnitProfile],
    rate: float,
    slo_ms: float,
    device: Any = None,
    *,
    arrivals: ArrivalsArg = "poisson",
    duration_s: float = 60.0,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    warmup_s: float = 0.0,
    batch_wait_ms: float = 2.0,
    max_inflight: int | str | None = "auto",
    max_steps: int = 64,
    minimize: bool = True,
) -> PlanResult:
    """The starting configuration (see the module docstring).

    Args:
        units: the pipeline's unit profiles, in order.
        rate: mean arrival rate, requests/s.
        slo_ms: the end-to-end P99 latency SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no cap).
        arrivals: the sample arrival process (a spec, a callable or times).
        duration_s: length of the sample trace, s.
        seed: of the trace and the service times.
        handover_ms / pool_mb / warmup_s / max_inflight: see
            :func:`~infscaler.runtime.planning.simulator.simulate` (``"auto"``: the runtime's
            default window, the served instances + 1).
        batch_wait_ms: batch window when the search raises a unit's batch.
        max_steps: most changes the search makes.
        minimize: run the trimming phase.

    Raises:
        ValueError: bad rate / SLO / duration or an arrival spec that cannot be read.
    """
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    if not (isinstance(slo_ms, int | float) and math.isfinite(slo_ms) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number of ms, got {slo_ms!r}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    units = list(units)
    cap = resource_cap(device)
    times, label = arrivals_for(arrivals, rate, duration_s, seed)
    if times.size == 0:
        raise ValueError(f"the arrival trace ({label}) holds no requests")
    steps: list[str] = []
    notes: list[str] = []
    sims = 0

    def result(
        feasible: bool,
        reason: str,
        config: Sequence[UnitConfig] | None,
        pred: SimResult | None,
    ) -> PlanResult:
        mem = config_memory_mb(units, config, pool_mb) if config is not None else 0.0
        return PlanResult(
            feasible=feasible,
            reason=reason,
            rate=float(rate),
            slo_ms=float(slo_ms),
            arrivals=label,
            units=tuple(units),
            config=None if config is None else tuple(config),
            prediction=pred,
            memory_mb=mem,
            memory_cap_mb=cap.memory_cap_mb,
            steps=tuple(steps),
            simulations=sims,
            pool_mb=pool_mb,
            handover_ms=handover_ms,
            notes=tuple(notes),
        )

    # 1. engines and the service-time bound
    config: list[UnitConfig] = []
    for u in units:
        allowed = _engines_allowed(u, cap) if u.served else list(u.engines)
        if not allowed:
            return result(
                False,
                f"unit {u.name} runs on {sorted(u.engines)}, which the device "
                f"(engines {sorted(cap.max_instances)}) does not have",
                None,
                None,
            )
        config.append(UnitConfig({allowed[0]: u.min_instances if u.served else 1}))
    hops = len(units) + 1  # front end -> each unit in turn -> front end
    bound = sum(
        u.engines[next(iter(c.instances))].mean_ms for u, c in zip(units, config, strict=True)
    )
    bound += hops * handover_ms
    if bound > slo_ms:
        return result(
            False,
            f"the service time alone is {bound:.1f} ms (each unit once on its fastest "
            f"engine + {hops} handovers) > SLO {slo_ms:g} ms: no number of instances meets it",
            config,
            None,
        )

    # 2. the minimum configuration must fit
    mem, slots, cores = _usage(units, config, pool_mb)
    if mem > cap.memory_cap_mb:
        return result(
            False,
            f"the minimum configuration needs {mem:.0f} MB > the device's memory cap "
            f"{cap.memory_cap_mb:.0f} MB",
            config,
            None,
        )
    for e, n in slots.items():
        if cap.max_instances and n > cap.max_instances.get(e, 0):
            notes.append(
                f"the minimum configuration already uses {n} {e} slots > {cap.max_instances.get(e, 0)}"
            )
    if cap.cores and cores > cap.cores:
        notes.append(
            f"the minimum configuration pins {cores} cpu cores > the device's {cap.cores}: "
            "instances share cores (stages take turns), so measured times may exceed the "
            "prediction when they run at once"
        )

    def run(cfg: Sequence[UnitConfig]) -> SimResult:
        nonlocal sims
        sims += 1
        return simulate(
            units,
            cfg,
            times,
            slo_ms=slo_ms,
            handover_ms=handover_ms,
            seed=seed,
            warmup_s=warmup_s,
            pool_mb=pool_mb,
            max_inflight=_window(units, cfg, max_inflight),
        )

    def meets(r: SimResult) -> bool:
        return r.p99_ms is not None and r.p99_ms <= slo_ms and r.rejected == 0

    def grow(cfg: list[UnitConfig], loads: list[float]) -> tuple[list[UnitConfig], str] | str:
        """One more instance for the unit with the largest load that can take one."""
        why: list[str] = []
        served = [k for k in range(len(units)) if units[k].served]
        top = max(loads[k] for k in served)
        # units carrying at least half the top load: more instances elsewhere barely help
        order = sorted((k for k in served if loads[k] >= 0.5 * top), key=lambda k: -loads[k])
        for k in order:
            for e in _engines_allowed(units[k], cap):
                stop = _fits(units, cfg, k, e, cap, pool_mb)
                if stop is None:
                    new = _with(cfg, k, _add(cfg[k], e))
                    return new, (
                        f"+1 {units[k].name} on {e} (B_k/S_k: load {loads[k]:.2f}) -> "
                        f"{new[k].total} instances"
                    )
                why.append(stop)
            if loads[k] >= 1.0:
                break  # an overloaded unit that cannot grow: others would not help
        # IncreaseBatch on the most loaded unit with a batch profile
        for k in order:
            u, c = units[k], cfg[k]
            if c.batch < u.max_batch and any(len(u.engines[e].batch_ms) > 1 for e in c.instances):
                b = min(u.max_batch, c.batch * 2)
                new = _with(cfg, k, UnitConfig(c.instances, b, max(c.batch_wait_ms, batch_wait_ms)))
                return new, f"batch of {u.name} {c.batch} -> {b} (no instance fits: {why[0]})"
        return "; ".join(dict.fromkeys(why)) or "no unit can take another instance"

    # 3. add capacity until the simulated P99 meets the SLO
    pred: SimResult | None = None
    history: list[float] = []
    for _ in range(max_steps):
        loads = _loads(units, config, rate)
        if max(loads[k] for k in range(len(units)) if units[k].served) < 1.0:
            pred = run(config)
            if meets(pred):
                break
            history.append(pred.p99_ms if pred.p99_ms is not None else math.inf)
            if len(history) >= 5 and history[-1] >= 0.98 * history[-5]:
                return result(
                    False,
                    f"adding instances no longer lowers the simulated P99 "
                    f"({history[-1]:.1f} ms > SLO {slo_ms:g} ms): the service time with "
                    "queueing, not capacity, misses the SLO",
                    config,
                    pred,
                )
        else:
            unit_over = units[int(np.argmax(loads))]
            if unit_over.fan_in and not unit_over.served:
                return result(
                    False,
                    f"the front end's {unit_over.name} (load {max(loads):.2f}) cannot keep up "
                    f"with {rate:g} requests/s",
                    config,
                    None,
                )
        step = grow(config, _loads(units, config, rate))
        if isinstance(step, str):
            if pred is None or max(_loads(units, config, rate)) >= 1.0:
                pred = run(config)
            worst = max(
                (k for k in range(len(units)) if units[k].served),
                key=lambda k: _loads(units, config, rate)[k],
            )
            return result(
                False,
                f"the device's cap stops the search before the SLO is met (simulated P99 "
                f"{_fmt(pred.p99_ms)} ms > SLO {slo_ms:g} ms; bottleneck {units[worst].name}): "
                f"{step}",
                config,
                pred,
            )
        config, line = step
        steps.append(line)
    else:
        return result(False, f"no configuration within {max_steps} steps", config, pred)
    assert pred is not None

    # 4. trim: remove what is not needed, most memory first
    while minimize:
        best: tuple[float, float, list[UnitConfig], SimResult, str] | None = None
        for k, (u, c) in enumerate(zip(units, config, strict=True)):
            if not u.served or c.total <= u.min_instances:
                continue
            for e in sorted(c.instances, key=lambda e: -u.engines[e].memory_mb):
                cand = _with(config, k, _add(c, e, -1))
                if max(_loads(units, cand, rate)) >= 1.0:
                    continue
                r = run(cand)
                if meets(r):
                    saved = u.engines[e].memory_mb
                    key = (saved, -(r.p99_ms or 0.0))
                    if best is None or key > (best[0], best[1]):
                        best = (saved, -(r.p99_ms or 0.0), cand, r, f"-1 {u.name} on {e}")
                break
        if best is None:
            break
        config, pred = best[2], best[3]
        steps.append(best[4] + f" (P99 {_fmt(pred.p99_ms)} ms still meets the SLO)")
    window = _window(units, config, max_inflight)
    if window != max_inflight:
        notes.append(
            f"batching needs a larger in-flight window than the runtime's default (instances "
            f"+ 1): set `max_inflight: {window}` in the pipeline"
        )
    return result(
        True,
        f"predicted P99 {_fmt(pred.p99_ms)} ms <= SLO {slo_ms:g} ms at {rate:g} requests/s "
        f"({label}) with {config_memory_mb(units, config, pool_mb):.0f} MB",
        config,
        pred,
    )


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def predict(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig] | None,
    arrivals: ArrivalsArg,
    *,
    rate: float | None = None,
    duration_s: float = 60.0,
    slo_ms: float | None = None,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    warmup_s: float = 0.0,
    max_inflight: int | str | None = "auto",
    cpu_cores: int | None = None,
) -> SimResult:
    """Simulate ``config`` (None: each unit's minimum on its fastest engine) under
    ``arrivals``: explicit times, or a spec / callable at ``rate`` over ``duration_s``;
    ``cpu_cores``: the cores cpu instances share (contention, see
    :func:`~infscaler.runtime.planning.simulator.simulate`; None: none modelled).

    Raises:
        ValueError: a spec without a rate, or bad arguments.
    """
    if isinstance(arrivals, str) or callable(arrivals):
        if rate is None:
            raise ValueError(f"arrivals {arrivals!r} need a rate")
        times, _ = arrivals_for(arrivals, rate, duration_s, seed)
    else:
        times = np.asarray(arrivals, dtype=float)
    return simulate(
        units,
        config,
        times,
        slo_ms=slo_ms,
        handover_ms=handover_ms,
        seed=seed,
        warmup_s=warmup_s,
        pool_mb=pool_mb,
        max_inflight=max_inflight,
        cpu_cores=cpu_cores,
    )


def autoscale_run(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig] | None,
    arrivals: np.ndarray | Sequence[float],
    slo_ms: float,
    device: Any,
    *,
    interval_s: float = 1.0,
    window_s: float = 10.0,
    startup_s: float = 2.0,
    scaler_config: ScalerConfig | None = None,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    max_inflight: int | str | None = "auto",
    decide: Callable[..., Any] | None = None,
) -> SimResult:
    """Run the scaler (:func:`infscaler.runtime.scaling.scaler.decide`) in the simulator: the
    pipeline starts at ``config`` and the scaler acts every ``interval_s`` under the
    cap of ``device`` (a DeviceProfile or ResourceCap); the result's ``timeline`` holds
    the rate, P99 and instances per interval.

    ``scaler_config`` None takes :class:`ScalerConfig`'s defaults, ``settle_s`` (5 s)
    and ``sustain_s`` (2 s) included: the run predicts what the service's scaler does
    with a pipeline's ``autoscale: true``, and that scaler waits out both. The
    simulation models no warm-up, so a run that must react at once passes them as 0.
    The run starts with no change known (no settle window at t = 0)."""
    auto = Autoscale(
        slo_ms=slo_ms,
        cap=resource_cap(device),
        interval_s=interval_s,
        window_s=window_s,
        startup_s=startup_s,
        config=scaler_config or ScalerConfig(),
        decide=decide,
    )
    return simulate(
        units,
        config,
        arrivals,
        slo_ms=slo_ms,
        handover_ms=handover_ms,
        seed=seed,
        pool_mb=pool_mb,
        max_inflight=max_inflight,
        autoscale=auto,
    )


# -- the configuration-space search --------------------------------------------------------

#: Front-end CPU per request, ms: the service process's CPU time (HTTP server, admission,
#: token handover, reply; all its threads) per request of a 1x3x224x224 FP32 input (602 KB,
#: binary tensor data over the Unix socket), measured with ``bench/frontend_cpu.py`` on
#: the 2-core development host (2026-11-25: 1.67 ms over 200 requests, 1.55 ms over 600).
#: It grows with the request's bytes; pass the target's own figure with ``frontend_ms``.
FRONTEND_MS = 1.6

#: Time of one token handover in :func:`search`'s simulations, ms (every hop between the
#: front end and the units; :func:`~infscaler.runtime.planning.simulator.simulate`): the fixed
#: part of a hop between two served instances, compute end -> the next compute start,
#: one request at a time, measured with ``bench/hop_latency.py`` on the 2-core
#: development host (2026-11-27: 0.50 ms + 0.20 ms per MB crossing, fitted over six
#: cuts of ResNet-50 and PP-OCRv4 det; the per-MB part is close to the T_p an estimated
#: partition already carries, 0.14 ms per MB). It was 0.1, a figure never measured.
HANDOVER_MS = 0.5


def frontend_profile(frontend_ms: float = FRONTEND_MS) -> UnitProfile:
    """The front end as :func:`search` simulates it: a single-threaded cpu server of
    ``frontend_ms`` per request ahead of the pipeline's units, competing with them for
    the cores, not itself served by instances (``served=False``). Put it first in the
    units (with a ``UnitConfig({"cpu": 1})``) to score a configuration as the search
    does.

    Raises:
        ValueError: ``frontend_ms`` <= 0 (as :class:`EngineProfile`)."""
    return UnitProfile(
        "frontend",
        {"cpu": EngineProfile("cpu", frontend_ms, cores=1)},
        kind="function",
        served=False,
    )


#: :func:`search` counts candidates within this fraction of the best goodput as tied
#: (and also those whose goodput interval overlaps the best's: the floor of the tie when
#: the measurements carry no uncertainty) and gives the tie to the simpler one: fewer
#: units (partitions and stages), then one within :data:`MEMORY_AMPLE` of the cap, then
#: fewer intra-op threads per instance, then fewer processes, then less memory.
GOODPUT_TIE = 0.05

#: A candidate whose memory is at most this fraction of the device's cap leaves the cap
#: ample: among tied candidates within it, memory does not decide, the threads per
#: instance do (:func:`search`'s ties). Why: within the 5 % tie the simulator ranked one
#: 2-thread instance of ResNet-50 (157 MB) level with two 1-thread ones (314 MB) at
#: 3 x L0 on 2 cores, and the tie went to the memory; served, over the day's runs at
#: that SLO, one 2-thread instance sustained 16.9-20.8 requests/s (mean 18.4, 3
#: bisections) and two 1-thread replicas 19.5-23.0 (mean 20.7, 6); with the CPUs held
#: awake 20.8-22.1 (2) and 23.4 (3); in one run's 900-request step at 19.8/s the replicas
#: passed where the 2-thread instance failed (bench/HISTORY.md, 2026-11-27; in another,
#: two deployments of the replicas split at that rate): an intra-op parallel run waits
#: for its slowest thread, so one interrupted core delays every request, where a replica
#: delays only its own. Above it, the memory saved is what another model runs in on a device with a fixed
#: memory budget.
MEMORY_AMPLE = 0.5

#: :func:`search` scores every candidate on a short trace (``requests``, 600), then
#: scores again, on a trace of this many requests, the finalists: the candidates within
#: :data:`FINALIST_WITHIN` of the best short score, at most :data:`FINALISTS_MAX` of them.
#: The short score is a screen, not a prediction: the largest rate whose P99 over 600
#: simulated requests meets the SLO read 9.8-16.2 requests/s over 8 seeds for
#: ResNet-50 as 2 single-thread replicas on 2 cores at 2 x L0 (seed 0: 16.2), where the
#: same simulator's P99 over 20 000 requests crosses the SLO at about 10.5/s; over
#: 12 000 requests 6 seeds read 10.0-11.0, and the 2026-11-27 bench served 10.4/s
#: over 900 requests and missed at 11.8/s (bench/HISTORY.md, "2026-11-27, 12:45-13:25
#: UTC: the planner's screen, and idle wake-ups"). Picked on the short screen, the
#: deploy-time search gave that cell 2 x 1 thread in one deploy and 1 x 2 threads in the
#: next.
FINAL_REQUESTS = 12_000
#: Finalists are the candidates whose short score is within this fraction of the best.
FINALIST_WITHIN = 0.3
#: At most this many finalists (the best short scores first).
FINALISTS_MAX = 4


def cpu_cores(device: Any) -> int | None:
    """Physical cores of a DeviceProfile's cpu entry (its listed ``cores``; None when it
    lists none or has no cpu entry): the contention count for :func:`search`, where
    ``ResourceCap.cores`` counts thread slots (cores x ``threads_per_core``)."""
    for acc in getattr(device, "accelerators", ()):
        if acc.engine == "cpu" and acc.count >= 1 and acc.cores:
            return len(acc.cores)
    return None


@dataclass(frozen=True)
class ModelStage:
    """One partitionable model stage, as the search needs it (all measured, none invented).

    Attributes:
        name: the stage (units are named ``name/k``; ``name`` when K = 1).
        costs: per operator in topological order, the complexity used to cut and to share
            the measured time among partitions: profiled ms at 1 thread (preferred) or FLOPs.
        valid_cuts: cut positions (cut p lies after operator p; ``OperatorGraph.valid_cuts``).
        whole_ms: intra-op threads -> measured time of the whole model, ms (batch 1). Key 1
            is required; a thread count not measured is not an option (no speedup is
            invented).
        weights_bytes: per operator, the weight bytes it reads (``OperatorCost.param_bytes``);
            empty: 0 (the ``weights`` objective then equals ``minmax``).
        flops: per operator FLOPs, for the bottleneck share reported (empty: ``costs``).
        op_ms: per operator profiled ms, to share the measured time among partitions
            (empty: ``costs``).
        cut_bytes: bytes crossing each valid cut (``OperatorGraph.crossing_bytes``).
        boundary_fixed_ms / boundary_per_mb_ms: the measured partition boundary overhead
            T_p = fixed + per_mb x MB crossing (``profiler.BoundaryOverhead``), added to the
            partition after each cut.
        activations_mb: peak activations of the whole model, MB (each instance counted
            with it: an upper bound for a partition).
        instance_overhead_mb: memory of an idle instance process, MB
            (:data:`infscaler.base.device.INSTANCE_OVERHEAD_MB`).
        cv: coefficient of variation of the measured whole-model time (used per unit at
            a thread count without its own ``cv_by_threads``).
        cv_by_threads: intra-op threads -> the CV of the whole model's timed runs at that
            count (:func:`infscaler.runtime.planning.stageprofile.spread_cv`); each unit's
            simulated service times are gamma with it (its partitions keep the whole
            model's spread: one run's slowness is the host's, not an operator's).
        corun_by_threads: intra-op threads -> how much slower the whole model runs while
            every other core runs a copy of it (:func:`infscaler.partitioner.profiler.
            measure_corun`, a fraction; each unit's :attr:`~infscaler.runtime.planning.simulator.
            EngineProfile.corun`; absent: 0).
        idle_by_threads: intra-op threads -> how much slower the whole model runs after
            the host sat idle, ``((idle s, factor), ...)`` (:func:`infscaler.partitioner.
            profiler.measure_idle`; each unit's :attr:`~infscaler.runtime.planning.simulator.
            EngineProfile.idle`, its partitions at the same factor; absent: none).
        unit_ms: measured per-partition times that replace the estimate: ``(cuts, threads)
            -> (ms per partition, ...)``.
        whole_ms_err: intra-op threads -> the uncertainty of ``whole_ms`` at that count,
            relative (a fraction of it, 0 <= err < 1): the distance from the median of
            its timed runs to the farther end of the median's 95 % confidence interval
            (:func:`infscaler.partitioner.profiler.median_err`); absent: 0 (a figure
            taken as exact). :func:`search` scores its finalists with every service time
            at x (1 + err) and x (1 - err) for a goodput interval (its ties).
        unit_ms_err: ``(cuts, threads) -> (relative err per partition, ...)``: the same
            for ``unit_ms`` (absent: the whole model's ``whole_ms_err`` at ``threads``).
        pre_ms / post_ms: function steps fused into this stage's instances
            (:func:`infscaler.runtime.serving.pipeline.fuse_units`): their measured cpu ms per call
            before partition 0 / after partition K-1, added to those partitions' service
            times (the same at every thread count: a function step runs on one thread).
        items: the stage's last unit fans out (a fused ``fan_out`` step after the model):
            the measured items per request, one drawn per request by the simulator;
            empty: it does not fan out. A stage after a fan-out (and before the fan-in)
            runs per item: its arrival rate is the requests' x the mean items
            (:func:`arrival_rates`).
    """

    name: str
    costs: tuple[float, ...]
    valid_cuts: tuple[int, ...]
    whole_ms: Mapping[int, float]
    weights_bytes: tuple[float, ...] = ()
    flops: tuple[float, ...] = ()
    op_ms: tuple[float, ...] = ()
    cut_bytes: Mapping[int, float] = field(default_factory=dict)
    boundary_fixed_ms: float = 0.0
    boundary_per_mb_ms: float = 0.0
    activations_mb: float = 0.0
    instance_overhead_mb: float = 0.0
    cv: float = 0.0
    cv_by_threads: Mapping[int, float] = field(default_factory=dict)
    corun_by_threads: Mapping[int, float] = field(default_factory=dict)
    idle_by_threads: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    unit_ms: Mapping[tuple[tuple[int, ...], int], tuple[float, ...]] = field(default_factory=dict)
    whole_ms_err: Mapping[int, float] = field(default_factory=dict)
    unit_ms_err: Mapping[tuple[tuple[int, ...], int], tuple[float, ...]] = field(
        default_factory=dict
    )
    pre_ms: float = 0.0
    post_ms: float = 0.0
    items: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "costs", tuple(float(c) for c in self.costs))
        for name in ("pre_ms", "post_ms"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"stage {self.name}: {name} must be a time >= 0 ms, got {v!r}")
        object.__setattr__(self, "items", tuple(int(n) for n in self.items))
        if any(n < 0 for n in self.items):
            raise ValueError(f"stage {self.name}: items must be counts >= 0, got {self.items}")
        object.__setattr__(self, "valid_cuts", tuple(sorted(int(c) for c in self.valid_cuts)))
        if not self.costs or any(not math.isfinite(c) or c < 0 for c in self.costs):
            raise ValueError(f"stage {self.name}: costs must be finite numbers >= 0")
        if 1 not in self.whole_ms:
            raise ValueError(f"stage {self.name}: whole_ms needs the 1-thread time")
        for t, ms in self.whole_ms.items():
            if int(t) < 1 or not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"stage {self.name}: whole_ms[{t}] = {ms!r} is not a time")
        for t, cv in {None: self.cv, **self.cv_by_threads}.items():
            if not (isinstance(cv, int | float) and math.isfinite(cv) and cv >= 0):
                at = "" if t is None else f"_by_threads[{t}]"
                raise ValueError(f"stage {self.name}: cv{at} = {cv!r} is not a CV >= 0")
        errs = [(f"whole_ms_err[{t}]", e) for t, e in self.whole_ms_err.items()]
        errs += [(f"unit_ms_err[{k}]", e) for k, v in self.unit_ms_err.items() for e in v]
        for at, e in errs:
            if not (isinstance(e, int | float) and math.isfinite(e) and 0 <= e < 1):
                raise ValueError(f"stage {self.name}: {at} = {e!r} is not a relative err in [0, 1)")
        for t, f in self.corun_by_threads.items():
            if not (isinstance(f, int | float) and math.isfinite(f) and f >= 0):
                raise ValueError(f"stage {self.name}: corun_by_threads[{t}] = {f!r} is not >= 0")
        for t, pts in self.idle_by_threads.items():
            try:
                EngineProfile("cpu", 1.0, idle=tuple(pts))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"stage {self.name}: idle_by_threads[{t}]: {exc}") from None
        for name in ("weights_bytes", "flops", "op_ms"):
            v = getattr(self, name)
            if v and len(v) != len(self.costs):
                raise ValueError(f"stage {self.name}: {len(v)} {name} for {len(self.costs)} ops")

    def tp_ms(self, cut: int) -> float:
        """T_p of one cut, ms."""
        return self.boundary_fixed_ms + self.boundary_per_mb_ms * self.cut_bytes.get(cut, 0) / 1e6

    def cut_sets(
        self, max_partitions: int, objectives: Sequence[str]
    ) -> dict[tuple[int, ...], list[str]]:
        """Candidate cut sets -> the objectives that chose them (K = 1: ``()``, ``["k1"]``)."""

        out: dict[tuple[int, ...], list[str]] = {(): ["k1"]}
        w = self.weights_bytes or None
        for k in range(2, max_partitions + 1):
            if k > len(self.valid_cuts) + 1:
                break
            for obj in objectives:
                try:
                    if obj == "eq1":
                        r = _search.search_partitions(
                            self.costs,
                            self.valid_cuts,
                            num_partitions=k,
                            cut_bytes=self.cut_bytes or None,
                        )
                    elif obj == "minmax":
                        r = _search.search_minmax(self.costs, self.valid_cuts, k)
                    elif obj == "weights":
                        r = _search.search_minmax(self.costs, self.valid_cuts, k, weights=w)
                    else:
                        raise ValueError(f"unknown objective {obj!r}: use {_search.OBJECTIVES}")
                except PartitionError:
                    continue  # e.g. Eq. 1 has too few representative operators for K
                out.setdefault(r.cuts, []).append(f"{obj}")
        return out

    def eq1_cuts(self, max_partitions: int) -> tuple[int, ...]:
        """The cuts Eq. 1 chooses on its own (K in 1..``max_partitions``, no SLO bound)."""

        return _search.search_partitions(
            self.costs,
            self.valid_cuts,
            max_partitions=max_partitions,
            cut_bytes=self.cut_bytes or None,
        ).cuts

    def bounds(self, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
        ends = [*cuts, len(self.costs) - 1]
        starts = [0, *(c + 1 for c in cuts)]
        return list(zip(starts, ends, strict=True))

    def share(self, cuts: tuple[int, ...]) -> float:
        """The largest partition's share of the FLOPs (of ``costs`` without ``flops``)."""
        v = self.flops or self.costs
        total = math.fsum(v) or 1.0
        return max(math.fsum(v[s : e + 1]) for s, e in self.bounds(cuts)) / total

    def units(self, cuts: tuple[int, ...], threads: int) -> list[UnitProfile]:
        """Unit profiles of this stage cut at ``cuts``, each instance on ``threads`` threads.

        Service time of partition k: ``unit_ms[(cuts, threads)][k]`` when measured, else
        ``whole_ms[threads] x S_k / S`` (its share of ``op_ms``, else of ``costs``) + T_p
        of its input cut; plus ``pre_ms`` on partition 0 and ``post_ms`` on the last (the
        fused function steps). The last unit fans out when ``items`` is given.
        Memory: overhead + its weights + the whole model's activations, MB.
        """
        bounds = self.bounds(cuts)
        share_of = self.op_ms or self.costs
        total = math.fsum(share_of) or 1.0
        measured = self.unit_ms.get((cuts, threads))
        out = []
        for k, (s, e) in enumerate(bounds):
            if measured is not None:
                ms = float(measured[k])
            else:
                ms = self.whole_ms[threads] * math.fsum(share_of[s : e + 1]) / total
                if k > 0:
                    ms += self.tp_ms(cuts[k - 1])
            if k == 0:
                ms += self.pre_ms
            if k == len(bounds) - 1:
                ms += self.post_ms
            mem = self.instance_overhead_mb + self.activations_mb
            if self.weights_bytes:
                mem += math.fsum(self.weights_bytes[s : e + 1]) / 1e6
            cv = self.cv_by_threads.get(threads, self.cv)
            corun = self.corun_by_threads.get(threads, 0.0)
            idle = tuple(self.idle_by_threads.get(threads, ()))
            prof = EngineProfile(
                "cpu", ms, cv=cv, memory_mb=mem, cores=threads, corun=corun, idle=idle
            )
            name = self.name if len(bounds) == 1 else f"{self.name}/{k}"
            fans = bool(self.items) and k == len(bounds) - 1
            out.append(
                UnitProfile(name, {"cpu": prof}, fan_out=fans, items=self.items if fans else (1,))
            )
        return out

    def unit_errs(self, cuts: tuple[int, ...], threads: int) -> list[float]:
        """The relative uncertainty of each unit's service time of :meth:`units` (same
        order): a measured partition's ``unit_ms_err`` (else the whole model's
        ``whole_ms_err`` at ``threads``); an estimated one's share of the whole model's
        time carries ``whole_ms_err``, its T_p and the fused function steps none, so the
        unit's err is that share's absolute err over its whole service time. 0 where
        nothing is known.

        E.g. 10 ms whole with a 4 % err, cut in two equal halves with a 1 ms T_p: the
        first partition 5 ms +- 0.2 (0.04), the second 6 ms +- 0.2 (0.0333).
        """
        base = float(self.whole_ms_err.get(threads, 0.0))
        measured = self.unit_ms.get((cuts, threads))
        errs = self.unit_ms_err.get((cuts, threads))
        units = self.units(cuts, threads)
        bounds = self.bounds(cuts)
        share_of = self.op_ms or self.costs
        total = math.fsum(share_of) or 1.0
        out = []
        for k, ((s, e), u) in enumerate(zip(bounds, units, strict=True)):
            if measured is not None:
                part = float(measured[k])
                err = float(errs[k]) if errs is not None and k < len(errs) else base
            else:
                part = self.whole_ms[threads] * math.fsum(share_of[s : e + 1]) / total
                err = base
            ms = u.engines["cpu"].mean_ms
            out.append(part * err / ms if ms > 0 else 0.0)
        return out


@dataclass(frozen=True)
class Candidate:
    """One point of the configuration space, with its predicted figures.

    Attributes:
        cuts / objectives / threads: per model stage, the cuts, the objectives that chose
            them (``k1`` for K = 1) and the intra-op threads of each instance.
        units / config: the units simulated (the front end first) and their instances.
        goodput_rps: requests answered within the SLO per second at ``rate`` (the
            simulated SLO attainment x the rate); with no rate, the max rate.
        max_rate_rps: the largest rate whose simulated P99 <= SLO (bisection), or None.
        p99_ms / attainment: at ``rate`` (at the max rate without one).
        memory_mb: instances' memory. share: per stage, the bottleneck partition's share
            of the FLOPs. fits: within the cap. why: why it lost (filled by the search).
        whole: the whole pipeline in one unit (``fuse: whole``): ``units`` are the front
            end and that unit; ``cuts`` all ``()``, ``threads`` its threads per stage.
        finalist: scored again on the long trace (:data:`FINAL_REQUESTS`);
            False: its figures are the short screen's (600 requests), which reads high.
        unit_err: per unit of ``units``, the relative uncertainty of its service time
            (:meth:`ModelStage.unit_errs`; 0 for the front end and function units).
        goodput_lo / goodput_hi: the goodput (requests/s, scored as ``goodput_rps``, on
            the same trace and seed) with every unit's service time at x (1 + err) and
            x (1 - err): the interval its measurements allow. None: not scored (only
            the finalists are; :meth:`interval` is then ``goodput_rps`` itself).
    """

    cuts: tuple[tuple[int, ...], ...]
    objectives: tuple[tuple[str, ...], ...]
    threads: tuple[int, ...]
    units: tuple[UnitProfile, ...]
    config: tuple[UnitConfig, ...]
    goodput_rps: float
    max_rate_rps: float | None
    p99_ms: float | None
    attainment: float | None
    memory_mb: float
    share: tuple[float, ...]
    fits: bool = True
    note: str = ""
    why: str = ""
    whole: bool = False
    finalist: bool = False
    unit_err: tuple[float, ...] = ()
    goodput_lo: float | None = None
    goodput_hi: float | None = None

    def interval(self) -> tuple[float, float]:
        """``(goodput_lo, goodput_hi)``, requests/s, widened to hold ``goodput_rps``
        (the simulator's rate bisection is not monotone to the last 2 %); ``goodput_rps``
        at both ends where not scored."""
        g = self.goodput_rps
        lo = g if self.goodput_lo is None else min(self.goodput_lo, g)
        hi = g if self.goodput_hi is None else max(self.goodput_hi, g)
        return lo, hi

    def goodput_text(self) -> str:
        """``12.30/s [11.10, 13.00]`` (the interval only where it was scored)."""
        if self.goodput_lo is None and self.goodput_hi is None:
            return f"{self.goodput_rps:.2f}/s"
        lo, hi = self.interval()
        return f"{self.goodput_rps:.2f}/s [{lo:.2f}, {hi:.2f}]"

    def identity(self) -> list[Any]:
        """The configuration itself, JSON-able: ``[whole, cuts per model stage, threads
        per model stage, instances per served unit]`` (what :func:`search`'s
        ``incumbent`` is compared with; the objectives that found the cuts are not part
        of it)."""
        return [
            bool(self.whole),
            [list(c) for c in self.cuts],
            list(self.threads),
            [c.total for u, c in zip(self.units, self.config, strict=True) if u.served],
        ]

    def label(self) -> str:
        if self.whole:  # one unit: the whole pipeline (fuse: whole), every model K = 1
            inst = "+".join(
                str(c.total) for u, c in zip(self.units, self.config, strict=True) if u.served
            )
            return f"whole pipeline in one unit (fuse: whole) t={self.threads[0]} inst={inst}"
        parts = []
        for i, (c, o, t) in enumerate(zip(self.cuts, self.objectives, self.threads, strict=True)):
            pre = f"s{i}:" if len(self.cuts) > 1 else ""
            parts.append(f"{pre}K={len(c) + 1} cuts={list(c)} [{'/'.join(o)}] t={t}")
        inst = "+".join(
            str(c.total) for u, c in zip(self.units, self.config, strict=True) if u.served
        )
        return f"{' '.join(parts)} inst={inst}"

    def line(self) -> str:
        mr = "" if self.max_rate_rps is None else f" max {self.max_rate_rps:.1f}/s"
        share = "/".join(f"{s:.0%}" for s in self.share)
        return (
            f"{self.label()}: goodput {self.goodput_text()}{mr} P99 {_fmt(self.p99_ms)} ms "
            f"mem {self.memory_mb:.0f} MB bottleneck {share}"
            + (f" -- {self.why}" if self.why else "")
        )


@dataclass(frozen=True)
class SearchOutcome:
    """What :func:`search` found: the winner, every candidate (best first), the reasons."""

    best: Candidate | None
    candidates: tuple[Candidate, ...]
    explain: tuple[str, ...]
    simulations: int
    rate: float | None
    slo_ms: float

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate) -> dict[str, Any]:
            return {
                "label": c.label(),
                "whole": c.whole,
                "cuts": [list(x) for x in c.cuts],
                "objectives": [list(x) for x in c.objectives],
                "threads": list(c.threads),
                "instances": {
                    u.name: c2.total for u, c2 in zip(c.units, c.config, strict=True) if u.served
                },
                "goodput_rps": c.goodput_rps,
                "goodput_lo_rps": c.goodput_lo,
                "goodput_hi_rps": c.goodput_hi,
                "max_rate_rps": c.max_rate_rps,
                "p99_ms": c.p99_ms,
                "attainment": c.attainment,
                "memory_mb": round(c.memory_mb, 2),
                "bottleneck_share": list(c.share),
                "finalist": c.finalist,
                "why": c.why,
            }

        return {
            "rate": self.rate,
            "slo_ms": self.slo_ms,
            "simulations": self.simulations,
            "best": None if self.best is None else cand(self.best),
            "candidates": [cand(c) for c in self.candidates],
            "explain": list(self.explain),
        }


def _scaled(units: Sequence[UnitProfile], errs: Sequence[float], sign: float) -> list[UnitProfile]:
    """``units`` with each one's service times (``mean_ms``, ``samples_ms``,
    ``batch_ms`` of every engine) x (1 + ``sign`` x its relative err): ``sign`` 1 the
    pessimistic end of what was measured, -1 the optimistic one (:func:`search`'s
    goodput interval). A unit with err 0 is returned as it is."""
    out = []
    for u, err in zip(units, errs, strict=True):
        f = 1.0 + sign * float(err)
        if err <= 0 or f <= 0:
            out.append(u)
            continue
        engines = {
            e: replace(
                p,
                mean_ms=p.mean_ms * f,
                samples_ms=tuple(x * f for x in p.samples_ms),
                batch_ms={b: v * f for b, v in p.batch_ms.items()},
            )
            for e, p in u.engines.items()
        }
        out.append(replace(u, engines=engines))
    return out


def _pinned(units: Sequence[UnitProfile], cfg: Sequence[UnitConfig]) -> int:
    """Threads pinned by ``cfg``'s cpu instances of model units (intra-op threads x
    instances), counted as the runtime's scaler counts them
    (:meth:`infscaler.runtime.scaling.monitor.Monitor.pinned_threads`): a function unit pins no
    thread slot (it is grown only while one is free, like the scaler grows it)."""
    return sum(
        max(1, u.engines["cpu"].cores) * c.instances.get("cpu", 0)
        for u, c in zip(units, cfg, strict=True)
        if u.served and u.kind == "model" and "cpu" in u.engines
    )


def search(
    stages: Sequence[ModelStage | UnitProfile],
    slo_ms: float,
    device: Any = None,
    *,
    rate: float | None = None,
    cores: int | None = None,
    arrivals: str = "poisson",
    requests: int = 600,
    seed: int = 0,
    handover_ms: float = HANDOVER_MS,
    frontend_ms: float = FRONTEND_MS,
    max_partitions: int = 3,
    objectives: Sequence[str] = ("eq1", "minmax", "weights"),
    oversubscribe: float = 1.0,
    max_candidates: int = 400,
    goodput_tie: float = GOODPUT_TIE,
    whole: Mapping[int, UnitProfile] | None = None,
    final_requests: int = FINAL_REQUESTS,
    finalist_within: float = FINALIST_WITHIN,
    finalists_max: int = FINALISTS_MAX,
    incumbent: Sequence[Any] | None = None,
) -> SearchOutcome:
    """Search the runtime's configuration space for the most goodput within the SLO.

    Every hand configuration is a point here: K = 1 with n instances is replication, one
    instance with all cores is one multi-threaded session. Per model stage the search
    tries K = 1 .. ``max_partitions`` with the cuts of each objective (Eq. 1 of InfScaler
    §IV-A, ``minmax`` and ``weights`` of :func:`infscaler.partitioner.search.search_minmax`;
    identical cut sets merged), and each measured intra-op thread count ``t <= cores``
    (``ModelStage.whole_ms``'s keys). For each, instances grow greedily (Algorithm 1's
    rule: one more for the unit with the most work per request, per item x its items per
    request) from one per unit while the cap allows: memory, cpu instance slots, and
    pinned threads (instances x threads <=
    ``oversubscribe`` x cores; the starting one-per-unit is allowed above it, as the
    runtime allows); every step is simulated and the best step kept.

    **Score** (the simulator, :func:`~infscaler.runtime.planning.simulator.simulate`, with CPU
    contention on ``cores``): with ``rate``, the goodput = requests answered within the
    SLO per second under ``arrivals`` at ``rate`` (SLO attainment x rate); without, the
    largest rate whose simulated P99 <= SLO (bisection on the rate, at most 10 steps,
    below the analytic capacity), i.e. the goodput at that rate. Every candidate (and
    every instance count grown) is screened on a trace of ``requests``; the finalists
    (within ``finalist_within`` of the best screen, at most ``finalists_max``) are scored
    again on ``final_requests`` and ranked on that score, ahead of the rest (the screen
    of one short trace reads high and scatters: :data:`FINAL_REQUESTS`). The **front end's CPU**
    (``frontend_ms`` per request; default :data:`FRONTEND_MS`) is simulated as a
    single-threaded server ahead of the units that competes for the same cores.

    **Goodput interval** (the finalists only; the rest keep their screen's figure at
    both ends): every measured service time carries a relative uncertainty from its
    repeats (:attr:`ModelStage.whole_ms_err`, ``unit_ms_err``; a function stage and
    the front end none), and each finalist is scored twice more, on the same trace
    length and seed, with every unit's service time at x (1 + err) and at x (1 - err):
    ``goodput_lo`` / ``goodput_hi``. Two more scores per finalist, and none where no
    unit carries an err. Why: planned anew minutes apart on the 2-core development
    host, a ResNet-50-class model at 3 x L0 moved one configuration's prediction by a
    third (K = 1 x 2 instances: 15.8 and 20.9 requests/s) and the winner flipped with
    it between K = 2 and K = 1; five deploys chose three configurations.

    **Ties**: a candidate ties the best goodput when it is within ``goodput_tie``
    (default :data:`GOODPUT_TIE`, 5 %) of it or its goodput interval reaches the best's
    (its high end >= the best's low end: the measurements cannot tell them apart), and
    the tie goes to the simpler configuration: first the configuration planned before
    (``incumbent``), then fewer units (the partitions and stages a request passes
    through as instances: each cut is one more), then a candidate within
    :data:`MEMORY_AMPLE` (half) of the memory cap, then, within it, fewer intra-op
    threads per instance (replicas: an intra-op parallel run waits for its slowest core;
    bench/HISTORY.md, "2026-11-27, 17:30-18:52 UTC", its "The planner's tie at 3x"
    paragraph), then fewer processes (served instances in all), then less memory, then
    fewer threads. The stage boundaries count as partitions because ddddocr's staged
    det + rec (two units) served less than the whole pipeline in one unit where the
    memory alone had decided (bench/HISTORY.md);
    fewer threads per instance comes before fewer processes because two 1-thread
    ResNet-50 replicas served more than the one 2-thread instance the simulator tied
    with them (:data:`MEMORY_AMPLE`). Every loser's ``why`` names the winner it tied
    with and the rule that decided. The simulator does not resolve goodput finer than
    the 5 % (its rate
    bisection stops at 2 %, a P99 of 600 simulated requests moves by more), and it errs
    on the optimistic side for partitioned plans: every hop adds a process competing for
    the cores and a wake-up it does not model (bench/HISTORY.md, "The same cell after the
    saturated-cores fix": ResNet-50 at 3 x L0 on 2 cores, K = 3 predicted 14.3
    requests/s and served 5.0). Among plans with as many units, the memory saved is what
    another model runs in on a device with a fixed memory budget.

    Args:
        stages: the pipeline in order: :class:`ModelStage` (searched) or fixed
            :class:`UnitProfile` (function stages; their instances grow too).
        slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no memory / slot cap).
        rate: expected mean arrival rate, requests/s (None: score by the max rate).
        cores: physical cpu cores the instances and the front end share: the CPU
            contention of the simulator and the largest thread count tried (default: the
            cap's ``cores``; give the physical count when the profile's thread slots
            oversubscribe them, :func:`cpu_cores`).
        arrivals: arrival process spec (:func:`infscaler.runtime.planning.arrivals.from_spec`).
        requests: requests simulated per screening score (trace length = requests / rate).
        final_requests / finalist_within / finalists_max: the finalists' long score (0: no
            second score, the screen decides).
        seed / handover_ms: see :func:`~infscaler.runtime.planning.simulator.simulate`.
        frontend_ms: front-end CPU per request, ms (0: not modelled).
        max_partitions: largest K per model stage.
        objectives: partition objectives tried (``("eq1",)``: the paper's only).
        whole: the whole pipeline as one unit (``fuse: whole``,
            :func:`infscaler.runtime.planning.autoplan.whole_profiles`): intra-op threads -> its
            profile; each (``t <= cores``) is a candidate too, its instances grown by the
            same loop (``cuts`` all ``()``, ``objectives`` ``whole``, ``whole`` True).
        oversubscribe: pinned threads allowed per core (default 1: no more pinned
            threads than ``cores``), and never more than the cap's thread slots. A
            candidate whose one instance per unit already pins more is ruled out while
            any candidate within them meets the SLO: on a 2-core host the simulator rated
            oversubscribed partitioned plans far above what they served (ResNet-50 K=3
            on 2 cores, 14.3/s predicted, 5.0/s served: bench/HISTORY.md, "The same cell
            after the saturated-cores fix"; PP-OCRv4 det K=3, 1.7x replication's memory
            at 0.91x its throughput), while a device profile's ``threads_per_core`` is
            kept for hand configurations.
        max_candidates: most (cuts x threads) combinations over the stages.
        goodput_tie: relative goodput difference counted as a tie, 0-1 (0: only
            overlapping goodput intervals tie; with no uncertainty, exact).
        incumbent: the configuration planned before for this pipeline
            (:meth:`Candidate.identity`; None: none): scored as a finalist, and while it
            ties the best goodput it wins the tie before every other rule. A replan
            measures the host anew, and two configurations within the tie swapped places
            from one deploy to the next (PP-OCRv4 det under the cap at 2 x L0: 2 x 1
            thread and 1 x 2 at 6.65 and 6.84/s, three plans in one hour,
            bench/HISTORY.md); a replan now changes the configuration only for one
            better by more than the tie.

    Returns:
        :class:`SearchOutcome`: ``best`` (None when no candidate answers any request
        within the SLO) and every candidate with why it lost.

    Raises:
        ValueError: bad SLO / rate / cores, no model stage, an unknown objective, or more
            than ``max_candidates`` combinations.
    """
    import itertools

    if not (isinstance(slo_ms, int | float) and math.isfinite(slo_ms) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number of ms, got {slo_ms!r}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    bad = [o for o in objectives if o not in _search.OBJECTIVES]
    if bad:
        raise ValueError(f"unknown objectives {bad}: use {_search.OBJECTIVES}")
    if not 0 <= goodput_tie < 1:
        raise ValueError(f"goodput_tie must be in [0, 1), got {goodput_tie!r}")
    if frontend_ms < 0 or requests < 50 or max_partitions < 1:
        raise ValueError("frontend_ms must be >= 0, requests >= 50, max_partitions >= 1")
    if final_requests and final_requests < requests or finalists_max < 1:
        raise ValueError(
            f"final_requests must be 0 or >= requests ({requests}), finalists_max >= 1; got "
            f"{final_requests}, {finalists_max}"
        )
    if not 0 <= finalist_within < 1:
        raise ValueError(f"finalist_within must be in [0, 1), got {finalist_within!r}")
    cap = resource_cap(device)
    n_cores = int(cores or cap.cores or 0)
    if n_cores < 1:
        raise ValueError("cores unknown: give cores= or a device profile with a cpu entry")
    models = [i for i, s in enumerate(stages) if isinstance(s, ModelStage)]
    if not models:
        raise ValueError("no model stage to search: pass at least one ModelStage")
    slots = cap.max_instances.get("cpu") if cap.max_instances else None
    # pinned threads a candidate may hold: oversubscribe x the cores, and never more
    # than the cap's thread slots (as the scaler counts them). A profile's
    # threads_per_core lets a hand configuration oversubscribe the cores; the planner's
    # own choice does not (see the docstring: the simulator underrates that contention)
    by_cores = max(1, int(oversubscribe * n_cores + 1e-9))
    thread_slots = min(cap.cores, by_cores) if cap.cores else by_cores

    # per model stage: (cuts, objectives, threads) options
    options = []
    for i in models:
        st = stages[i]
        assert isinstance(st, ModelStage)
        sets = st.cut_sets(max_partitions, objectives)
        threads = sorted(t for t in st.whole_ms if t <= n_cores)
        options.append([(c, tuple(o), t) for c, o in sets.items() for t in threads])
    combos = list(itertools.product(*options))
    if len(combos) > max_candidates:
        raise ValueError(
            f"{len(combos)} combinations > max_candidates {max_candidates}: lower "
            "max_partitions or the thread counts measured"
        )
    sims = 0
    cache: dict[tuple[Any, ...], tuple[float, float | None, SimResult | None]] = {}

    def simulate_at(
        units: list[UnitProfile], cfg: list[UnitConfig], r: float, n: int = requests
    ) -> SimResult:
        nonlocal sims
        sims += 1
        times, _ = arrivals_for(arrivals, r, n / r, seed)
        return simulate(
            units,
            cfg,
            times,
            slo_ms=slo_ms,
            handover_ms=handover_ms,
            seed=seed,
            max_inflight="auto",
            cpu_cores=n_cores,
        )

    def score(
        units: Sequence[UnitProfile],
        cfg: Sequence[UnitConfig],
        n: int = requests,
        guess: float | None = None,
    ) -> tuple[float, float | None, SimResult | None]:
        # guess: where the max rate is expected (the goodput interval's ends, from the
        # central score): probed first, then stepped from (3 %, doubling) until bracketed,
        # then bisected to the same 2 %; about half the simulations of a bisection from
        # the analytic capacity
        key = (id(units), tuple((tuple(sorted(c.instances.items())), c.batch) for c in cfg), n)
        if key in cache:
            return cache[key]
        units, cfg = list(units), list(cfg)
        if rate is not None:
            res = simulate_at(units, cfg, rate, n)
            good = rate * (res.slo_attainment or 0.0)
            out: tuple[float, float | None, SimResult | None] = (good, None, res)
        else:
            top = hi = capacity_rps(units, cfg, n_cores)
            lo, best_res = 0.0, None
            step = 0.03
            for i in range(10):
                if guess is None or not 0 < guess < top:
                    mid = hi * 0.95 if i == 0 else (lo + hi) / 2
                elif i == 0:
                    mid = guess
                elif hi >= top:  # none failed yet: step up
                    mid, step = min(lo * (1 + step), (lo + hi) / 2), step * 2
                elif lo <= 0:  # none passed yet: step down
                    mid, step = hi * (1 - min(step, 0.5)), step * 2
                else:
                    mid = (lo + hi) / 2
                res = simulate_at(units, cfg, mid, n)
                if res.p99_ms is not None and res.p99_ms <= slo_ms and res.rejected == 0:
                    lo, best_res = mid, res
                else:
                    hi = mid
                if lo and hi - lo < 0.02 * hi:
                    break
            good = lo * (best_res.slo_attainment or 0.0) if best_res else 0.0
            out = (good, lo, best_res)
        cache[key] = out
        return out

    fe = [frontend_profile(frontend_ms)] if frontend_ms > 0 else []

    jobs: list[tuple[list[UnitProfile], dict[str, Any]]] = []
    for combo in combos:
        units: list[UnitProfile] = list(fe)
        errs: list[float] = [0.0] * len(fe)
        it = iter(combo)
        for s in stages:
            if isinstance(s, ModelStage):
                cuts, _, t = next(it)
                units.extend(s.units(cuts, t))
                errs.extend(s.unit_errs(cuts, t))
            else:
                units.append(s)
                errs.append(0.0)
        share = tuple(
            st.share(c[0]) for st, c in zip((stages[i] for i in models), combo, strict=True)
        )
        base = {
            "cuts": tuple(c[0] for c in combo),
            "objectives": tuple(c[1] for c in combo),
            "threads": tuple(c[2] for c in combo),
            "units": tuple(units),
            "share": share,
            "unit_err": tuple(errs),
        }
        jobs.append((units, base))
    for t, wu in sorted((whole or {}).items()):  # the whole pipeline in one unit
        if t > n_cores:
            continue
        units = [*fe, wu]
        # the whole pipeline's unit: its model stages' whole-model times carry their
        # errs (absolute, summed), its function steps none
        abs_err = math.fsum(
            m.whole_ms.get(t, 0.0) * m.whole_ms_err.get(t, 0.0)
            for m in (stages[i] for i in models)
            if isinstance(m, ModelStage)
        )
        w_ms = wu.fastest().mean_ms
        base = {
            "cuts": tuple(() for _ in models),
            "objectives": tuple(("whole",) for _ in models),
            "threads": tuple(t for _ in models),
            "units": tuple(units),
            "share": tuple(1.0 for _ in models),
            "whole": True,
            "unit_err": (*(0.0 for _ in fe), min(0.99, abs_err / w_ms) if w_ms > 0 else 0.0),
        }
        jobs.append((units, base))

    cands: list[Candidate] = []
    for units, base in jobs:
        cfg = [
            UnitConfig({"cpu": 1} if "cpu" in u.engines else {u.fastest().engine: 1}) for u in units
        ]
        note = ""
        mem = config_memory_mb(units, cfg)
        if mem > cap.memory_cap_mb:
            cands.append(
                Candidate(
                    **base,
                    config=tuple(cfg),
                    goodput_rps=0.0,
                    max_rate_rps=None,
                    p99_ms=None,
                    attainment=None,
                    memory_mb=mem,
                    fits=False,
                    note=f"cap: one instance per unit needs {mem:.0f} MB > "
                    f"{cap.memory_cap_mb:.0f} MB",
                )
            )
            continue
        pinned = _pinned(units, cfg)
        if pinned > thread_slots:
            note = f"one instance per unit pins {pinned} threads > {thread_slots} thread slots"
        best_here: (
            tuple[float, float, list[UnitConfig], tuple[float, float | None, SimResult | None]]
            | None
        ) = None
        stale = 0
        stop = ""
        while True:
            sc = score(units, cfg)
            mem = config_memory_mb(units, cfg)
            key = (sc[0], -mem)
            if best_here is None or key > (best_here[0], best_here[1]):
                if best_here is not None and sc[0] <= best_here[0] * 1.005:
                    stale += 1
                else:
                    stale = 0
                best_here = (sc[0], -mem, list(cfg), sc)
            else:
                stale += 1
            if stale >= 2:
                break
            # one more instance for the served unit with the most work per request (per
            # item x its items per request: a per-item unit after a fan-out)
            per_req = arrival_rates(units, 1.0)
            order = sorted(
                (k for k, u in enumerate(units) if u.served),
                key=lambda k: -per_req[k] * _per_item_ms(units[k], cfg[k]),
            )
            grown = False
            stop = ""
            pinned = _pinned(units, cfg)
            n_inst = sum(
                c.total for u, c in zip(units, cfg, strict=True) if u.served and u.kind == "model"
            )
            for k in order:
                u = units[k]
                p = u.engines["cpu"] if "cpu" in u.engines else u.fastest()
                if cfg[k].total + 1 > min(u.max_instances or MAX_PER_UNIT, MAX_PER_UNIT):
                    stop = f"{u.name} at its max instances"
                    continue
                if mem + p.memory_mb > cap.memory_cap_mb:
                    stop = f"cap: memory {mem:.0f}+{p.memory_mb:.0f} > {cap.memory_cap_mb:.0f} MB"
                    continue
                if p.engine == "cpu" and pinned + max(1, p.cores) > thread_slots:
                    stop = (
                        f"cap: {pinned}+{max(1, p.cores)} pinned threads > {thread_slots} "
                        "thread slots"
                    )
                    continue
                if u.kind == "model" and slots is not None and n_inst + 1 > slots:
                    stop = f"cap: {slots} cpu instance slots"
                    continue
                cfg = _with(cfg, k, _add(cfg[k], p.engine))
                grown = True
                break
            if not grown:
                break
        assert best_here is not None
        good, max_rate, res = best_here[3]
        cands.append(
            Candidate(
                **base,
                config=tuple(best_here[2]),
                goodput_rps=good,
                max_rate_rps=max_rate,
                p99_ms=None if res is None else res.p99_ms,
                attainment=None if res is None else res.slo_attainment,
                memory_mb=-best_here[1],
                note="; ".join(x for x in (note, stop) if x),
            )
        )

    def pinned_of(c: Candidate) -> int:
        return _pinned(c.units, c.config)

    # a candidate that pins more threads than the slots (its one instance per unit
    # already does) is kept only when no candidate within them answers anything
    within = {id(c) for c in cands if c.fits and c.goodput_rps > 0 and pinned_of(c) <= thread_slots}
    if within:
        cands = [
            c
            if id(c) in within or not c.fits or pinned_of(c) <= thread_slots
            else replace(
                c,
                fits=False,
                note=f"pins {pinned_of(c)} threads on {thread_slots} thread slots "
                f"({n_cores} cores): oversubscribed, while candidates within them meet the SLO",
            )
            for c in cands
        ]
    # the hand configurations (each a point of this space), compared with the winner in
    # the explanation
    tmax = [max((c.threads[i] for c in cands), default=1) for i in range(len(models))]
    hands: dict[str, Callable[[Candidate], bool]] = {
        "replication (K=1, 1 thread)": lambda c: (
            not c.whole and all(not x for x in c.cuts) and all(t == 1 for t in c.threads)
        ),
        "one session (K=1, one instance, all cores)": lambda c: (
            not c.whole
            and all(not x for x in c.cuts)
            and list(c.threads) == tmax
            and all(x.total == 1 for u, x in zip(c.units, c.config, strict=True) if u.served)
        ),
        "the whole pipeline in one unit (fuse: whole)": lambda c: c.whole,
    }
    inc = None if incumbent is None else json.dumps(list(incumbent))

    def is_incumbent(c: Candidate) -> bool:
        return inc is not None and json.dumps(c.identity()) == inc

    # the finalists, scored again on the long trace (FINAL_REQUESTS): the screen reads
    # high and scatters, so the rank and the figures reported are the long score's; the
    # best hand configurations are scored the same way, so the comparison is like for like
    # the goodput interval (each unit's service time at x (1 +- its err), the same trace
    # and seed) is scored for the finalists only: two more scores each, where a unit
    # carries an err (none: the interval is the goodput itself and costs nothing)
    screen = max((c.goodput_rps for c in cands if c.fits), default=0.0)
    final = bool(final_requests) and final_requests > requests and screen > 0
    finalists: list[Candidate] = []
    if screen > 0:
        ok = sorted(
            (c for c in cands if c.fits and c.goodput_rps > 0), key=lambda c: -c.goodput_rps
        )
        finalists = [c for c in ok if c.goodput_rps >= (1 - finalist_within) * screen - 1e-9]
        finalists = finalists[:finalists_max]
        for is_hand in hands.values():
            hand = next((c for c in ok if is_hand(c)), None)
            if hand is not None and all(hand is not c for c in finalists):
                finalists.append(hand)
        kept = next((c for c in ok if is_incumbent(c)), None)
        if kept is not None and all(kept is not c for c in finalists):
            finalists.append(kept)
    n_final = final_requests if final else requests
    rescored = {}
    held: list[list[UnitProfile]] = []  # the scaled units, alive while score caches by id
    for c in finalists:
        new = c
        if final:
            good, max_rate, res = score(c.units, c.config, final_requests)
            new = replace(
                c,
                goodput_rps=good,
                max_rate_rps=max_rate,
                p99_ms=None if res is None else res.p99_ms,
                attainment=None if res is None else res.slo_attainment,
                finalist=True,
            )
        if any(e > 0 for e in c.unit_err):
            ends = []
            worst = max(c.unit_err)
            for sign in (1.0, -1.0):  # pessimistic (slower), then optimistic
                held.append(_scaled(c.units, c.unit_err, sign))
                near = new.max_rate_rps
                guess = None if near is None else near / (1 + sign * worst)
                ends.append(score(held[-1], c.config, n_final, guess)[0])
            new = replace(new, goodput_lo=ends[0], goodput_hi=ends[1])
        rescored[id(c)] = new
    cands = [rescored.get(id(c), c) for c in cands]
    gmax = max((c.goodput_rps for c in cands if c.fits and c.finalist == final), default=0.0)
    # the best goodput's interval: its lowest end among the candidates at gmax
    leads = [c for c in cands if c.fits and c.finalist == final and c.goodput_rps >= gmax]
    lead = min(leads, key=lambda c: c.interval()[0]) if gmax > 0 and leads else None
    lead_lo = lead.interval()[0] if lead is not None else math.inf

    def within(c: Candidate) -> bool:
        return c.goodput_rps >= (1 - goodput_tie) * gmax - 1e-9

    def tied(c: Candidate) -> bool:
        # within goodput_tie of the best, or its goodput interval reaches the best's
        return (
            c.fits
            and c.finalist == final
            and gmax > 0
            and (within(c) or c.interval()[1] >= lead_lo - 1e-9)
        )

    def served(c: Candidate) -> int:
        # the units a request passes through as instances (partitions, model and
        # function stages; a fused unit once): each is a process and hops the
        # simulator underrates, so the tie goes to fewer of them. Counting cuts alone
        # left ddddocr's staged det + rec (0 cuts, 177 MB) level with the whole
        # pipeline in one unit (0 cuts, 265 MB) under the cap at 3 x L0; the memory
        # gave it the tie in one of two runs, and it served 10.0 requests/s where the
        # whole pipeline served 12.9 (predicted 13.4 and 12.7; bench/HISTORY.md)
        return sum(1 for u in c.units if u.served)

    def processes(c: Candidate) -> int:
        # the served instances in all (each a process)
        return sum(x.total for u, x in zip(c.units, c.config, strict=True) if u.served)

    ample_mb = MEMORY_AMPLE * (cap.memory_cap_mb - cap.memory_used_mb)

    def scarce(c: Candidate) -> bool:
        return c.memory_mb > ample_mb

    def rank(c: Candidate) -> tuple[float, ...]:
        t = tied(c)
        return (
            0 if c.fits else 1,
            0 if c.finalist == final else 1,
            0 if t else 1,
            (0 if is_incumbent(c) else 1) if t else 0,
            served(c) if t else -round(c.goodput_rps, 6),
            (1 if scarce(c) else 0) if t else 0,
            (max(c.threads, default=1) if not scarce(c) else 0) if t else 0,
            processes(c) if t else 0,
            c.memory_mb if t else 0.0,
            -round(c.goodput_rps, 6),
            sum(c.threads),
        )

    cands.sort(key=rank)
    top = cands[0] if cands and cands[0].fits and cands[0].goodput_rps > 0 else None
    ranked: list[Candidate] = []
    for c in cands:
        if c is top:
            why = "WINNER" + (f" ({c.note})" if c.note else "")
            if is_incumbent(c):
                why += (
                    f" (planned before; kept while within {goodput_tie:.0%} of the best)"
                    if within(c)
                    else " (planned before; kept while its goodput interval reaches the best's)"
                )
        elif not c.fits:
            why = c.note
        elif c.goodput_rps <= 0:
            why = f"SLO: P99 {_fmt(c.p99_ms)} ms > {slo_ms:g} ms at every instance count tried" + (
                f" ({c.note})" if c.note else ""
            )
        elif top is not None and c.finalist != final:
            why = (
                f"screened out: {c.goodput_rps:.2f}/s on the {requests}-request screen, more "
                f"than {finalist_within:.0%} below the best screen ({screen:.2f}/s)"
                if c.goodput_rps < (1 - finalist_within) * screen - 1e-9
                else f"screened out: {c.goodput_rps:.2f}/s on the {requests}-request screen, "
                f"below the {finalists_max} best"
            ) + (f"; {c.note}" if c.note else "")
        elif top is not None and not tied(c):
            assert lead is not None
            why = (
                f"lower goodput ({c.goodput_text()} < the best {lead.goodput_text()}): more "
                f"than {goodput_tie:.0%} below it and its interval does not reach the best's"
            ) + (f"; {c.note}" if c.note else "")
        elif top is not None:
            assert lead is not None
            if c is lead:  # the best goodput itself, tied by a simpler winner
                how = f"within {goodput_tie:.0%}" if within(top) else "by overlapping intervals"
                tie = (
                    f"the best goodput ({c.goodput_text()}), tied {how} by the winner "
                    f"({top.goodput_text()})"
                )
            else:
                how = f"within {goodput_tie:.0%}" if within(c) else "by overlapping intervals"
                tie = f"ties the best goodput {how} ({c.goodput_text()} vs {lead.goodput_text()})"
            to = f"; the tie goes to {top.label()}"
            if is_incumbent(top):
                why = (
                    f"{tie}; the configuration planned before ties it too and is kept "
                    "(a replan changes the configuration only for one better by more than "
                    "the tie)"
                )
            elif served(c) > served(top):
                why = (
                    f"{tie}{to} (rule: fewer partitions) with more units ({served(c)} > "
                    f"{served(top)}: partitions and stages)"
                )
            elif scarce(c) and not scarce(top):
                why = (
                    f"{tie}{to} (rule: memory within {MEMORY_AMPLE:.0%} of the cap) with "
                    f"more than {MEMORY_AMPLE:.0%} of the memory cap ({c.memory_mb:.0f} > "
                    f"{ample_mb:.0f} MB)"
                )
            elif not scarce(c) and max(c.threads, default=1) > max(top.threads, default=1):
                why = (
                    f"{tie}{to} (rule: fewer threads per instance) with more threads per "
                    f"instance ({max(c.threads)} > {max(top.threads)}; the memory cap is "
                    "ample: one stalled core delays every request of an intra-op parallel "
                    "instance)"
                )
            elif processes(c) > processes(top):
                why = (
                    f"{tie}{to} (rule: fewer processes) with more processes ({processes(c)} "
                    f"> {processes(top)} served instances)"
                )
            elif c.memory_mb > top.memory_mb + 1e-6:
                why = (
                    f"{tie}{to} (rule: less memory) with more memory ({c.memory_mb:.0f} > "
                    f"{top.memory_mb:.0f} MB)"
                )
            else:
                why = (
                    f"{tie}{to} (rule: fewer threads in all, then the better goodput) "
                    "with as many units, processes and as much memory"
                )
        else:
            why = f"no candidate answers requests within the SLO ({c.goodput_text()})"
        ranked.append(replace(c, why=why))
    best = ranked[0] if top is not None else None
    head = (
        f"{len(ranked)} candidates, {sims} simulations, SLO {slo_ms:g} ms, "
        + (f"rate {rate:g}/s ({arrivals})" if rate is not None else "score: max rate within SLO")
        + f", {n_cores} cores, front end {frontend_ms:g} ms/request"
        + (
            f"; screened on {requests} requests, {sum(c.finalist for c in ranked)} finalists "
            f"scored on {final_requests}"
            if final
            else f"; scored on {requests} requests"
        )
    )
    explain = [head, *(c.line() for c in ranked)]
    if best is not None:
        # every hand configuration is a point of this space: say how the winner compares
        for name, is_hand in hands.items():
            hand = next((c for c in ranked if c.fits and is_hand(c)), None)
            if hand is None or hand is best:
                continue
            ratio = best.goodput_rps / hand.goodput_rps if hand.goodput_rps > 0 else math.inf
            explain.append(
                f"vs {name}: {hand.goodput_rps:.2f}/s ({hand.label()}); the winner "
                f"{best.goodput_rps:.2f}/s = {ratio:.2f}x"
            )
    if best is None:
        explain.append("no candidate answers requests within the SLO within the cap")
    return SearchOutcome(
        best=best,
        candidates=tuple(ranked),
        explain=tuple(explain),
        simulations=sims,
        rate=rate,
        slo_ms=float(slo_ms),
    )
