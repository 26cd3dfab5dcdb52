"""The greedy planner (InferLine §4.3 with InfScaler's Algorithm 1 adding capacity), a
candidate source of the search and, alone, :func:`~infscaler.runtime.planning.planner.plan`.

:meth:`PlanSearch.plan` runs: start (fastest engine, minimum instances; infeasible when
the service time or the minimum memory is out of bounds), add capacity (one instance to
the most loaded unit that fits, else IncreaseBatch) until the simulated P99 meets the
SLO, then trim (InferLine Algorithm 2). Details: docs/planner.md, "The greedy source".
Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infscaler.runtime.planning.resources import (
    add_instances,
    cap_usage,
    demand_cores,
    unit_loads,
    with_unit,
)
from infscaler.runtime.planning.scoring import ArrivalsArg, arrivals_for, fmt_num
from infscaler.runtime.planning.simulator import (
    MAX_PER_UNIT,
    SimResult,
    UnitConfig,
    UnitProfile,
    config_memory_mb,
    simulate,
)
from infscaler.runtime.scaling.demand import fits_cores, share_per_thread
from infscaler.runtime.scaling.types import ResourceCap
from infscaler.runtime.serving.batching import decide_batching

__all__ = ["GreedyOptions", "PlanResult", "PlanSearch", "fits_instance"]


@dataclass(frozen=True)
class PlanResult:
    """What :func:`~infscaler.runtime.planning.planner.plan` found.

    Attributes:
        feasible: a configuration meets the SLO within the cap.
        reason: one line a user can read.
        rate / slo_ms / arrivals / units: the target and the profiles.
        config: per unit, the plan or the last one tried (None: could not start).
        prediction: the simulation of ``config`` (None: not simulated).
        memory_mb / memory_cap_mb: of ``config`` (instances + pool) and the device's cap.
        steps: one line per change. simulations: how many the search ran."""

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


@dataclass(frozen=True)
class GreedyOptions:
    """How the greedy source simulates (defaults: the search's own screen).

    Attributes:
        arrivals: the sample arrival process (None: the search's ``arrivals``).
        duration_s: length of the sample trace, s (None: the search's ``requests`` / rate).
        pool_mb / warmup_s / max_inflight: as :func:`~.simulator.simulate`.
        batch_wait_ms: batch window when a unit's batch is raised, ms.
        max_steps: most changes the greedy search makes. minimize: run the trim step."""

    arrivals: ArrivalsArg | None = None
    duration_s: float | None = None
    pool_mb: float = 0.0
    warmup_s: float = 0.0
    batch_wait_ms: float = 2.0
    max_inflight: int | str | None = "auto"
    max_steps: int = 64
    minimize: bool = True

    def trace(
        self, arrivals: ArrivalsArg, rate: float, requests: int, seed: int
    ) -> tuple[np.ndarray, str]:
        """``(times, label)`` of the sample trace at ``rate``.

        Raises:
            ValueError: bad duration, or a trace that holds no requests."""
        duration = requests / rate if self.duration_s is None else self.duration_s
        if not duration > 0:
            raise ValueError(f"duration_s must be > 0, got {duration!r}")
        spec = arrivals if self.arrivals is None else self.arrivals
        times, label = arrivals_for(spec, rate, duration, seed)
        if times.size == 0:
            raise ValueError(f"the arrival trace ({label}) holds no requests")
        return times, label


def _engines_allowed(u: UnitProfile, cap: ResourceCap) -> list[str]:
    """The unit's options the device has, fastest first (Algorithm 1's affinity order)."""
    opts = sorted(u.engines.values(), key=lambda p: (p.mean_ms, p.engine))
    if not cap.max_instances:
        return [p.engine for p in opts]
    return [p.engine for p in opts if p.engine in cap.max_instances]


def fits_instance(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig],
    k: int,
    engine: str,
    cap: ResourceCap,
    pool_mb: float,
    rate: float | None = None,
) -> str | None:
    """None when unit ``k`` can take one more instance on ``engine``, else why not: its
    ``max_instances``, memory, the engine's slots, the cpu's thread slots, and for a model
    unit (``rate`` and cores known) the cores by demand as the runtime's scaler counts them
    (:func:`~infscaler.runtime.scaling.demand.fits_cores`)."""
    u, c = units[k], config[k]
    limit = min(u.max_instances or MAX_PER_UNIT, MAX_PER_UNIT)
    if c.total + 1 > limit:
        return f"{u.name} is at its max_instances {limit}"
    mem, slots, cores = cap_usage(units, config, pool_mb)
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
    # pinned threads against the thread slots, as the runtime's scaler counts them
    if engine == "cpu" and cap.cores and cores + max(1, p.cores) > cap.cores:
        return f"cpu pinned threads {cores}+{max(1, p.cores)} > {cap.cores} thread slots"
    if u.kind == "model" and engine == "cpu" and cap.physical_cores and rate:
        # model units only: a function step's time may be waiting, not demand
        busy = demand_cores(units, config, rate)
        pinned = c.instances.get("cpu", 0) * max(1, p.cores)
        share = share_per_thread(busy[k] if pinned else None, pinned) * max(1, p.cores)
        used = sum(b for x, b in zip(units, busy, strict=True) if x.kind == "model")
        why = fits_cores(used, share, cap.physical_cores)
        if why is not None:
            return f"cpu {why} ({u.name}'s share at {rate:g} requests/s)"
    return None


def _window(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], max_inflight: int | str | None
) -> int | str | None:
    """The in-flight window to simulate: as given, but ``"auto"`` with batching becomes the
    served instances x their batch + 1."""
    if max_inflight == "auto" and any(c.batch > 1 for c in config):
        return 1 + sum(c.total * c.batch for u, c in zip(units, config, strict=True) if u.served)
    return max_inflight


@dataclass
class PlanSearch:
    """One run of :func:`~infscaler.runtime.planning.planner.plan`'s search: its target, inputs
    and what it records (steps, notes, simulations). Each step returns the
    :class:`PlanResult` that ends the search, else what the next step starts from."""

    units: list[UnitProfile]
    rate: float
    slo_ms: float
    cap: ResourceCap
    times: np.ndarray
    label: str
    seed: int
    handover_ms: float
    pool_mb: float
    warmup_s: float
    batch_wait_ms: float
    max_inflight: int | str | None
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    simulations: int = 0

    def result(
        self,
        feasible: bool,
        reason: str,
        config: Sequence[UnitConfig] | None,
        pred: SimResult | None,
    ) -> PlanResult:
        """The plan's result with ``config`` (None: the search could not start)."""
        units, pool_mb = self.units, self.pool_mb
        mem = config_memory_mb(units, config, pool_mb) if config is not None else 0.0
        return PlanResult(
            feasible=feasible,
            reason=reason,
            rate=float(self.rate),
            slo_ms=float(self.slo_ms),
            arrivals=self.label,
            units=tuple(units),
            config=None if config is None else tuple(config),
            prediction=pred,
            memory_mb=mem,
            memory_cap_mb=self.cap.memory_cap_mb,
            steps=tuple(self.steps),
            simulations=self.simulations,
            pool_mb=pool_mb,
            handover_ms=self.handover_ms,
            notes=tuple(self.notes),
        )

    def plan(self, max_steps: int = 64, minimize: bool = True) -> PlanResult:
        """Steps 1 to 4 in turn (``minimize`` False: no trim); at most ``max_steps``
        changes."""
        config = self.start()  # 1. the service-time bound, 2. the minimum configuration
        if isinstance(config, PlanResult):
            return config
        grown = self.add_capacity(config, max_steps)  # 3. until the P99 meets the SLO
        if isinstance(grown, PlanResult):
            return grown
        config, pred = grown
        if minimize:
            config, pred = self.trim(config, pred)  # 4. remove what is not needed
        return self.finish(config, pred)

    def run(self, cfg: Sequence[UnitConfig]) -> SimResult:
        """Simulate ``cfg`` on the sample trace."""
        self.simulations += 1
        return simulate(
            self.units,
            cfg,
            self.times,
            slo_ms=self.slo_ms,
            handover_ms=self.handover_ms,
            seed=self.seed,
            warmup_s=self.warmup_s,
            pool_mb=self.pool_mb,
            max_inflight=_window(self.units, cfg, self.max_inflight),
        )

    def meets(self, r: SimResult) -> bool:
        return r.p99_ms is not None and r.p99_ms <= self.slo_ms and r.rejected == 0

    def start(self) -> list[UnitConfig] | PlanResult:
        """Steps 1 and 2: each unit's minimum instances on its fastest engine, unless the service
        time alone misses the SLO or the minimum configuration exceeds the memory cap."""
        units, cap, slo_ms, handover_ms = self.units, self.cap, self.slo_ms, self.handover_ms
        # 1. engines and the service-time bound
        config: list[UnitConfig] = []
        for u in units:
            allowed = _engines_allowed(u, cap) if u.served else list(u.engines)
            if not allowed:
                return self.result(
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
            return self.result(
                False,
                f"the service time alone is {bound:.1f} ms (each unit once on its fastest "
                f"engine + {hops} handovers) > SLO {slo_ms:g} ms: no number of instances meets it",
                config,
                None,
            )

        # 2. the minimum configuration must fit
        mem, slots, cores = cap_usage(units, config, self.pool_mb)
        if mem > cap.memory_cap_mb:
            return self.result(
                False,
                f"the minimum configuration needs {mem:.0f} MB > the device's memory cap "
                f"{cap.memory_cap_mb:.0f} MB",
                config,
                None,
            )
        for e, n in slots.items():
            if cap.max_instances and n > cap.max_instances.get(e, 0):
                self.notes.append(
                    f"the minimum configuration already uses {n} {e} slots > {cap.max_instances.get(e, 0)}"
                )
        if cap.cores and cores > cap.cores:
            self.notes.append(
                f"the minimum configuration pins {cores} cpu cores > the device's {cap.cores}: "
                "instances share cores (stages take turns), so measured times may exceed the "
                "prediction when they run at once"
            )
        return config

    def grow(self, cfg: list[UnitConfig], loads: list[float]) -> tuple[list[UnitConfig], str] | str:
        """One more instance for the unit with the largest load that can take one."""
        units, cap = self.units, self.cap
        why: list[str] = []
        served = [k for k in range(len(units)) if units[k].served]
        top = max(loads[k] for k in served)
        # units carrying at least half the top load: more instances elsewhere barely help
        order = sorted((k for k in served if loads[k] >= 0.5 * top), key=lambda k: -loads[k])
        for k in order:
            for e in _engines_allowed(units[k], cap):
                stop = fits_instance(units, cfg, k, e, cap, self.pool_mb, self.rate)
                if stop is None:
                    new = with_unit(cfg, k, add_instances(cfg[k], e))
                    return new, (
                        f"+1 {units[k].name} on {e} (B_k/S_k: load {loads[k]:.2f}) -> "
                        f"{new[k].total} instances"
                    )
                why.append(stop)
            if loads[k] >= 1.0:
                break  # an overloaded unit that cannot grow: others would not help
        # IncreaseBatch on the most loaded unit with a batch profile, where it pays
        for k in order:
            u, c = units[k], cfg[k]
            profiles = [
                u.engines[e].batch_ms for e in c.instances if len(u.engines[e].batch_ms) > 1
            ]
            if c.batch < u.max_batch and profiles:
                b = min(u.max_batch, c.batch * 2)
                pays = [decide_batching(p, max_batch=b) for p in profiles if 1 in p]
                if pays and not any(d.on for d in pays):
                    why.append(f"batching {u.name} would not pay: {pays[0].reason}")
                    continue
                new = with_unit(
                    cfg, k, UnitConfig(c.instances, b, max(c.batch_wait_ms, self.batch_wait_ms))
                )
                said = f"; {pays[0].reason}" if pays else ""
                return new, f"batch of {u.name} {c.batch} -> {b} (no instance fits: {why[0]}){said}"
        return "; ".join(dict.fromkeys(why)) or "no unit can take another instance"

    def add_capacity(
        self, config: list[UnitConfig], max_steps: int
    ) -> tuple[list[UnitConfig], SimResult] | PlanResult:
        """Step 3: add capacity until the simulated P99 meets the SLO, at most
        ``max_steps`` changes; ``(config, its simulation)``, or the infeasible result."""
        units, rate, slo_ms = self.units, self.rate, self.slo_ms
        pred: SimResult | None = None
        history: list[float] = []
        for _ in range(max_steps):
            loads = unit_loads(units, config, rate)
            if max(loads[k] for k in range(len(units)) if units[k].served) < 1.0:
                pred = self.run(config)
                if self.meets(pred):
                    break
                history.append(pred.p99_ms if pred.p99_ms is not None else math.inf)
                if len(history) >= 5 and history[-1] >= 0.98 * history[-5]:
                    return self.result(
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
                    return self.result(
                        False,
                        f"the front end's {unit_over.name} (load {max(loads):.2f}) cannot keep "
                        f"up with {rate:g} requests/s",
                        config,
                        None,
                    )
            step = self.grow(config, unit_loads(units, config, rate))
            if isinstance(step, str):
                return self._stopped(config, pred, step)
            config, line = step
            self.steps.append(line)
        else:
            return self.result(False, f"no configuration within {max_steps} steps", config, pred)
        assert pred is not None
        return config, pred

    def _stopped(self, config: list[UnitConfig], pred: SimResult | None, why: str) -> PlanResult:
        """The infeasible result when no unit can grow (``why``: the limits met)."""
        units, rate = self.units, self.rate
        if pred is None or max(unit_loads(units, config, rate)) >= 1.0:
            pred = self.run(config)
        worst = max(
            (k for k in range(len(units)) if units[k].served),
            key=lambda k: unit_loads(units, config, rate)[k],
        )
        return self.result(
            False,
            f"the device's cap stops the search before the SLO is met (simulated P99 "
            f"{fmt_num(pred.p99_ms)} ms > SLO {self.slo_ms:g} ms; bottleneck {units[worst].name}): "
            f"{why}",
            config,
            pred,
        )

    def trim(self, config: list[UnitConfig], pred: SimResult) -> tuple[list[UnitConfig], SimResult]:
        """Step 4: remove what is not needed, most memory first, while the simulated P99
        still meets the SLO."""
        units, rate = self.units, self.rate
        while True:
            best: tuple[float, float, list[UnitConfig], SimResult, str] | None = None
            for k, (u, c) in enumerate(zip(units, config, strict=True)):
                if not u.served or c.total <= u.min_instances:
                    continue
                for e in sorted(c.instances, key=lambda e: -u.engines[e].memory_mb):
                    cand = with_unit(config, k, add_instances(c, e, -1))
                    if max(unit_loads(units, cand, rate)) >= 1.0:
                        continue
                    r = self.run(cand)
                    if self.meets(r):
                        saved = u.engines[e].memory_mb
                        key = (saved, -(r.p99_ms or 0.0))
                        if best is None or key > (best[0], best[1]):
                            best = (saved, -(r.p99_ms or 0.0), cand, r, f"-1 {u.name} on {e}")
                    break
            if best is None:
                return config, pred
            config, pred = best[2], best[3]
            self.steps.append(best[4] + f" (P99 {fmt_num(pred.p99_ms)} ms still meets the SLO)")

    def finish(self, config: list[UnitConfig], pred: SimResult) -> PlanResult:
        """The feasible result (with a note when batching needs a larger in-flight
        window than the runtime's default)."""
        window = _window(self.units, config, self.max_inflight)
        if window != self.max_inflight:
            self.notes.append(
                f"batching needs a larger in-flight window than the runtime's default (instances "
                f"+ 1): set `max_inflight: {window}` in the pipeline"
            )
        return self.result(
            True,
            f"predicted P99 {fmt_num(pred.p99_ms)} ms <= SLO {self.slo_ms:g} ms at {self.rate:g} "
            f"requests/s ({self.label}) with "
            f"{config_memory_mb(self.units, config, self.pool_mb):.0f} MB",
            config,
            pred,
        )
