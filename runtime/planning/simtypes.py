"""The simulator's inputs: an engine's and a unit's measured profile, a unit's
configuration (engine, instances, threads, batch) and the scaler run inside a simulation
(:class:`Autoscale`). :mod:`infscaler.runtime.planning.simulator` runs them; its event
loop (:mod:`infscaler.runtime.planning.simloop`) reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from infscaler.runtime.scaling.types import (
    Decision,
    ResourceCap,
    ScalerConfig,
    ScalerState,
)

__all__ = ["Autoscale", "EngineProfile", "UnitConfig", "UnitProfile"]

# -- profiles and configuration -------------------------------------------------------------


@dataclass(frozen=True)
class EngineProfile:
    """How long one unit takes on one engine, and what an instance there costs.

    Attributes:
        engine: ``cpu``, ``gpu`` or ``dla``.
        mean_ms: service time of one item (batch 1), ms.
        cv: coefficient of variation (0: constant; 1: exponential; else gamma); ignored
            with ``samples_ms``.
        samples_ms: measured service times, resampled uniformly.
        batch_ms: batch size -> batch latency T_b, ms (others interpolated; empty: b x item).
        memory_mb: memory one instance takes, MB (r_k^m).
        cores: CPU cores one instance is pinned to (cpu model units; 0 otherwise).
        corun: slowdown while every other core is busy, a fraction of ``mean_ms``, scaled by
            the share of other cores busy (``profiler.measure_corun``).
        idle: slowdown after sitting idle, ``(idle s, factor)`` points, increasing,
            interpolated from ``(0, 1)``, the last held (``profiler.measure_idle``)."""

    engine: str
    mean_ms: float
    cv: float = 0.0
    samples_ms: tuple[float, ...] = ()
    batch_ms: Mapping[int, float] = field(default_factory=dict)
    memory_mb: float = 0.0
    cores: int = 0
    corun: float = 0.0
    idle: tuple[tuple[float, float], ...] = ()

    def idle_factor(self, idle_s: float) -> float:
        """The factor on an item's time after its instance sat idle ``idle_s`` seconds
        (see ``idle``): 1.0 with no points."""
        if not self.idle or idle_s <= 0:
            return 1.0
        x0, y0 = 0.0, 1.0
        for x1, y1 in self.idle:
            if idle_s <= x1:
                return y0 + (y1 - y0) * (idle_s - x0) / (x1 - x0)
            x0, y0 = x1, y1
        return y0

    def __post_init__(self) -> None:
        if not math.isfinite(self.mean_ms) or self.mean_ms < 0:
            raise ValueError(f"{self.engine}: mean_ms must be >= 0, got {self.mean_ms}")
        if not math.isfinite(self.cv) or self.cv < 0:
            raise ValueError(f"{self.engine}: cv must be >= 0, got {self.cv}")
        if not math.isfinite(self.corun) or self.corun < 0:
            raise ValueError(f"{self.engine}: corun must be >= 0, got {self.corun}")
        pts = tuple((float(g), float(f)) for g, f in self.idle)
        gaps = [g for g, _ in pts]
        if any(not (math.isfinite(g) and g > 0) for g in gaps) or gaps != sorted(set(gaps)):
            raise ValueError(f"{self.engine}: idle needs increasing idle seconds > 0: {pts}")
        if any(not (math.isfinite(f) and f > 0) for _, f in pts):
            raise ValueError(f"{self.engine}: idle factors must be > 0: {pts}")
        object.__setattr__(self, "idle", pts)
        if any((not math.isfinite(s)) or s < 0 for s in self.samples_ms):
            raise ValueError(f"{self.engine}: samples_ms must be finite and >= 0")
        bad = {b: v for b, v in self.batch_ms.items() if int(b) < 1 or v <= 0}
        if bad:
            raise ValueError(f"{self.engine}: batch_ms needs sizes >= 1 and times > 0: {bad}")
        object.__setattr__(self, "samples_ms", tuple(float(s) for s in self.samples_ms))
        object.__setattr__(
            self, "batch_ms", {int(b): float(v) for b, v in sorted(self.batch_ms.items())}
        )

    def batch_factor(self, b: int) -> float:
        """T_b / T_1: how many item-times a batch of ``b`` takes."""
        if b <= 1:
            return 1.0
        pts = self.batch_ms
        if not pts:
            return float(b)
        t1 = pts.get(1)
        sizes = sorted(pts)
        if t1 is None:  # no batch-1 point: assume T_1 = T_smallest / smallest
            t1 = pts[sizes[0]] / sizes[0]
        if b in pts:
            return pts[b] / t1
        xs = [1, *[s for s in sizes if s > 1]]
        ys = [t1, *[pts[s] for s in sizes if s > 1]]
        if b > xs[-1]:
            return ys[-1] * b / xs[-1] / t1
        return float(np.interp(b, xs, ys)) / t1


@dataclass(frozen=True)
class UnitProfile:
    """One unit of the pipeline for the simulator and the planner.

    Attributes:
        name: ``det/0``, ``rec``, ...
        engines: engine -> :class:`EngineProfile` (its options).
        kind: ``model`` (counts against engine slots and cores) or ``function``.
        fan_out / items: it turns a request into ``items`` items (fixed, or measured counts
            drawn uniformly per request).
        fan_in: it joins a request's items.
        served: runs as instances (False: by the front end, never scaled).
        bottleneck: B_k from the plan (informational).
        min_instances / max_instances: bounds for the planner and the scaler.
        max_batch: the largest batch the unit may run."""

    name: str
    engines: Mapping[str, EngineProfile]
    kind: str = "model"
    fan_out: bool = False
    items: tuple[int, ...] = (1,)
    fan_in: bool = False
    served: bool = True
    bottleneck: float | None = None
    min_instances: int = 1
    max_instances: int | None = None
    max_batch: int = 1

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError(f"unit {self.name}: no engine profile")
        for e, p in self.engines.items():
            if e != p.engine:
                raise ValueError(f"unit {self.name}: engines[{e!r}] profiles {p.engine!r}")
        items = (self.items,) if isinstance(self.items, int) else tuple(self.items)
        if not items or any(int(n) < 0 for n in items):
            raise ValueError(f"unit {self.name}: items must be counts >= 0, got {self.items}")
        object.__setattr__(self, "items", tuple(int(n) for n in items))
        if self.fan_out and self.fan_in:
            raise ValueError(f"unit {self.name}: cannot both fan out and fan in")
        if self.min_instances < 1:
            raise ValueError(f"unit {self.name}: min_instances must be >= 1")
        if self.max_batch < 1:
            raise ValueError(f"unit {self.name}: max_batch must be >= 1")

    @property
    def items_mean(self) -> float:
        return float(np.mean(self.items)) if self.fan_out else 1.0

    def fastest(self, engines: Sequence[str] | None = None) -> EngineProfile:
        """The option with the lowest ``mean_ms`` (among ``engines`` when given)."""
        opts = [p for e, p in self.engines.items() if engines is None or e in engines]
        if not opts:
            raise ValueError(f"unit {self.name}: none of {list(engines or [])} is an option")
        return min(opts, key=lambda p: (p.mean_ms, p.engine))


@dataclass(frozen=True)
class UnitConfig:
    """How one unit is deployed: instances per engine, batch size and batch wait."""

    instances: Mapping[str, int]
    batch: int = 1
    batch_wait_ms: float = 0.0

    def __post_init__(self) -> None:
        if any(n < 0 for n in self.instances.values()) or sum(self.instances.values()) < 1:
            raise ValueError(f"a unit needs at least one instance, got {dict(self.instances)}")
        if self.batch < 1 or self.batch_wait_ms < 0:
            raise ValueError(f"batch must be >= 1 and batch_wait_ms >= 0, got {self}")
        object.__setattr__(
            self, "instances", {e: int(n) for e, n in self.instances.items() if n > 0}
        )

    @property
    def total(self) -> int:
        return sum(self.instances.values())


@dataclass(frozen=True)
class Autoscale:
    """Run the scaler inside the simulation.

    Attributes:
        slo_ms: the pipeline's SLO. cap: the device's limits (``memory_used_mb`` ignored).
        interval_s: how often the scaler looks, s. window_s: the monitor's window, s.
        startup_s: from a scale-out decision until the new instance serves, s.
        config: the scaler's tuning. decide: the policy (default: the scaler's ``decide``)."""

    slo_ms: float
    cap: ResourceCap
    interval_s: float = 1.0
    window_s: float = 10.0
    startup_s: float = 2.0
    config: ScalerConfig = field(default_factory=ScalerConfig)
    decide: Callable[..., tuple[list[Decision], ScalerState]] | None = None

    def __post_init__(self) -> None:
        for name in ("slo_ms", "interval_s", "window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Autoscale.{name} must be > 0, got {getattr(self, name)}")
        if self.startup_s < 0:
            raise ValueError(f"Autoscale.startup_s must be >= 0, got {self.startup_s}")
