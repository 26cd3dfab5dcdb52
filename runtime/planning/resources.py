"""A configuration of a pipeline's units against the offered load and the device's cap,
shared by :func:`~infscaler.runtime.planning.planner.plan` and ``search``: per-unit
arrival rates and load, the capacity the instances and cores serve, what a configuration
uses of the cap (memory, slots, pinned threads, busy cores) and the one-instance edits.
Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence

from infscaler.runtime import queueing
from infscaler.runtime.planning.simulator import UnitConfig, UnitProfile, config_memory_mb
from infscaler.runtime.queueing import busy_cpu_ms

__all__ = [
    "MAX_RPS",
    "add_instances",
    "arrival_rates",
    "busy_cores",
    "cap_usage",
    "capacity_rps",
    "demand_cores",
    "per_item_ms",
    "pinned_threads",
    "unit_loads",
    "with_unit",
]

#: :func:`capacity_rps` when nothing bounds it (no time per item anywhere), requests/s.
MAX_RPS = 1e12


def per_item_ms(u: UnitProfile, c: UnitConfig) -> float:
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


def unit_loads(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float
) -> list[float]:
    """Offered load rho_k of each unit (items/s x s per item over all its instances)."""
    return [
        r * per_item_ms(u, c) / 1e3
        for r, u, c in zip(arrival_rates(units, rate), units, config, strict=True)
    ]


def capacity_rps(units: Sequence[UnitProfile], config: Sequence[UnitConfig], cores: int) -> float:
    """Analytic upper bound on requests/s (at most :data:`MAX_RPS`): the queueing model's
    :func:`~infscaler.runtime.queueing.capacity_rps` of the units (:func:`per_item_ms` x
    items per request) and of the cpu ``cores`` (0: not bounded by them)."""
    items = arrival_rates(units, 1.0)
    cpu = [(r, u.engines["cpu"]) for r, u in zip(items, units, strict=True) if "cpu" in u.engines]
    cpu_ms = busy_cpu_ms(
        [p.mean_ms for _, p in cpu], [r for r, _ in cpu], [max(1, p.cores) for _, p in cpu]
    )
    cap = queueing.capacity_rps(
        [per_item_ms(u, c) for u, c in zip(units, config, strict=True)],
        [1] * len(units),
        items,
        cores=cores if cores >= 1 else None,
        cpu_ms=cpu_ms,
    )
    return min(cap, MAX_RPS)


def busy_cores(units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float) -> float:
    """CPU cores the offered load keeps busy: over units, items/s x cpu ms per item (the fleet
    planner's cpu demand per node)."""
    busy = 0.0
    for r, u, c in zip(arrival_rates(units, rate), units, config, strict=True):
        if not u.served or "cpu" not in c.instances or "cpu" not in u.engines:
            continue
        cpu_share = c.instances["cpu"] / max(1, c.total)
        busy += r * cpu_share * u.engines["cpu"].mean_ms / 1e3
    return busy


def demand_cores(
    units: Sequence[UnitProfile], config: Sequence[UnitConfig], rate: float
) -> list[float]:
    """Per unit, the cores its cpu instances are expected to keep busy at ``rate`` requests/s
    (as ``Monitor.demand`` measures them): simulated utilisation (at most 1 per instance) x
    threads; 0 for a unit not served or not on the cpu."""
    out = []
    for r, u, c in zip(arrival_rates(units, rate), units, config, strict=True):
        n = c.instances.get("cpu", 0)
        if not u.served or n <= 0 or "cpu" not in u.engines:
            out.append(0.0)
            continue
        p = u.engines["cpu"]
        busy = r * (n / max(1, c.total)) * p.mean_ms * p.batch_factor(c.batch) / c.batch / 1e3
        out.append(min(float(n), busy) * max(1, p.cores))
    return out


def cap_usage(
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


def pinned_threads(units: Sequence[UnitProfile], cfg: Sequence[UnitConfig]) -> int:
    """Threads pinned by ``cfg``'s cpu instances of model units (intra-op threads x
    instances), counted as the runtime's scaler counts them
    (:meth:`infscaler.runtime.scaling.monitor.Monitor.pinned_threads`): a function unit pins no
    thread slot (it is grown only while one is free, like the scaler grows it)."""
    return sum(
        max(1, u.engines["cpu"].cores) * c.instances.get("cpu", 0)
        for u, c in zip(units, cfg, strict=True)
        if u.served and u.kind == "model" and "cpu" in u.engines
    )


def with_unit(config: Sequence[UnitConfig], k: int, new: UnitConfig) -> list[UnitConfig]:
    out = list(config)
    out[k] = new
    return out


def add_instances(c: UnitConfig, engine: str, n: int = 1) -> UnitConfig:
    inst = dict(c.instances)
    inst[engine] = inst.get(engine, 0) + n
    return UnitConfig({e: v for e, v in inst.items() if v > 0}, c.batch, c.batch_wait_ms)
