"""The planner: a pipeline's starting configuration for an arrival rate and an SLO
(InferLine §4.3, with InfScaler's Algorithm 1 as the step that adds capacity).

:func:`plan` searches, with the discrete-event simulator (:mod:`infscaler.runtime.simulator`)
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

Pure: no I/O; profiles come from :mod:`infscaler.runtime.unitprofile` or by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infscaler.runtime import arrivals as _arrivals
from infscaler.runtime.scaler import ResourceCap, ScalerConfig
from infscaler.runtime.simulator import (
    MAX_PER_UNIT,
    Autoscale,
    SimResult,
    UnitConfig,
    UnitProfile,
    cap_from_profile,
    config_memory_mb,
    simulate,
)

__all__ = ["PlanResult", "arrivals_for", "autoscale_run", "plan", "predict", "resource_cap"]

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
    """R^m from a :class:`~infscaler.device.DeviceProfile`, a :class:`ResourceCap`, or None
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
    :func:`infscaler.runtime.arrivals.from_spec`), a callable ``f(rate, duration_s, seed)``,
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


def _loads(units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float) -> list[float]:
    """Offered load rho_k of each unit (items/s x s per item over all its instances)."""
    fo = next((i for i, x in enumerate(units) if x.fan_out), None)
    fi = next((i for i, x in enumerate(units) if x.fan_in), None)
    items = units[fo].items_mean if fo is not None else 1.0
    out = []
    for i, (u, c) in enumerate(zip(units, config, strict=True)):
        per_item = fo is not None and fi is not None and fo < i < fi
        out.append(rate * (items if per_item else 1.0) * _per_item_ms(u, c) / 1e3)
    return out


def _busy_cores(units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float) -> float:
    """CPU cores the offered load keeps busy: sum over units of items/s x ms per item
    on the cpu instances' share (pinned instances may outnumber cores, busy cores may
    not; the fleet planner's cpu demand per node, :mod:`infscaler.runtime.fleet`)."""
    fo = next((i for i, x in enumerate(units) if x.fan_out), None)
    fi = next((i for i, x in enumerate(units) if x.fan_in), None)
    items = units[fo].items_mean if fo is not None else 1.0
    busy = 0.0
    for i, (u, c) in enumerate(zip(units, config, strict=True)):
        if not u.served or "cpu" not in c.instances or "cpu" not in u.engines:
            continue
        per_item = fo is not None and fi is not None and fo < i < fi
        cpu_share = c.instances["cpu"] / max(1, c.total)
        busy += rate * (items if per_item else 1.0) * cpu_share * u.engines["cpu"].mean_ms / 1e3
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
            :func:`~infscaler.runtime.simulator.simulate` (``"auto"``: the runtime's
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
    :func:`~infscaler.runtime.simulator.simulate`; None: none modelled).

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
    """Run the scaler (:func:`infscaler.runtime.scaler.decide`) in the simulator: the
    pipeline starts at ``config`` and the scaler acts every ``interval_s`` under the
    cap of ``device`` (a DeviceProfile or ResourceCap); the result's ``timeline`` holds
    the rate, P99 and instances per interval."""
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
