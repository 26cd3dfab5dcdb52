"""When to hold the CPUs awake: the policy behind ``cpu_wake_latency_us: auto`` (pure).

:func:`decide_wake` holds (a 0 µs PM QoS request, :mod:`.pmqos`) once a pipeline with an
SLO violates it (:func:`~.scaler.is_violated`) and releases ``release_after_s`` after the
last such pipeline left. In full: docs/scaling.md, "The CPU-wake policy in full"."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["IdleCost", "WakeConfig", "WakeEvidence", "WakeState", "decide_wake", "idle_cost"]

#: An item counts as woken when its instance sat idle at least this long before it, s.
MIN_IDLE_S = 0.05


@dataclass(frozen=True)
class IdleCost:
    """What idle gaps cost one unit, served: the woken items' ``share`` of binned items, the
    woken compute p50 over the warm one (``factor``; None: none woken), and ``items`` binned."""

    share: float
    factor: float | None
    items: int


@dataclass(frozen=True)
class WakeEvidence:
    """One pipeline with an SLO at one autoscaler look: its name, whether its SLO is
    ``violated``, and per served unit its :func:`idle_cost` (None: too few items)."""

    pipeline: str
    violated: bool
    costs: tuple[IdleCost | None, ...] = ()


@dataclass(frozen=True)
class WakeConfig:
    """Settings of :func:`decide_wake`.

    Attributes:
        release_after_s: drop the request this long after the last pipeline with an SLO
            left, s.
    """

    release_after_s: float = 60.0


@dataclass(frozen=True)
class WakeState:
    """What :func:`decide_wake` carries: ``hold``, its ``reason``, ``since`` when held (s) and
    ``slo_seen``, the last time a pipeline with an SLO was deployed (s)."""

    hold: bool = False
    reason: str = ""
    since: float | None = None
    slo_seen: float | None = None


def idle_cost(summary: Mapping[str, Any], min_idle_s: float = MIN_IDLE_S) -> IdleCost | None:
    """One unit's :class:`IdleCost` from its served idle summary
    (:meth:`~infscaler.runtime.serving.stats.IdleSlowdown.summary`); bins from ``min_idle_s``
    count as woken. None when nothing was binned or no warm time is known."""
    warm = summary.get("warm_compute_p50_ms")
    bins = summary.get("bins") or []
    items = sum(int(b.get("count") or 0) for b in bins)
    if not items or not warm or warm <= 0:
        return None
    woken = [
        b
        for b in bins
        if b["idle_s"][0] >= min_idle_s and b.get("count") and b.get("compute_p50_ms") is not None
    ]
    n = sum(int(b["count"]) for b in woken)
    if not n:
        return IdleCost(share=0.0, factor=None, items=items)
    mean = math.fsum(int(b["count"]) * float(b["compute_p50_ms"]) for b in woken) / n
    return IdleCost(share=n / items, factor=mean / float(warm), items=items)


def decide_wake(
    now: float,
    slo_pipelines: int,
    evidence: Sequence[WakeEvidence],
    state: WakeState,
    config: WakeConfig = WakeConfig(),
) -> WakeState:
    """Whether to hold the CPUs awake from now on (see the module docstring).

    Args:
        now: the caller's monotonic clock, s. slo_pipelines: deployed pipelines with an SLO.
        evidence: what the autoscaler measured since the last call.
        state: the previous return value. config: its settings.

    Returns:
        The new state; ``hold`` says what to apply, ``reason`` why."""
    if slo_pipelines > 0:
        state = replace(state, slo_seen=now)
    if state.hold:
        if slo_pipelines == 0 and (
            state.slo_seen is None or now - state.slo_seen >= config.release_after_s
        ):
            return replace(
                state,
                hold=False,
                since=None,
                reason=f"dropped: no pipeline with an SLO deployed for "
                f"{config.release_after_s:g} s",
            )
        return state
    for ev in evidence:
        if not ev.violated:
            continue
        costs = [(i, c) for i, c in enumerate(ev.costs) if c is not None and c.factor is not None]
        worst = max(costs, key=lambda ic: ic[1].share * (ic[1].factor - 1.0), default=None)
        idle = (
            f"; {worst[1].share:.0%} of unit {worst[0]}'s items ran after idle, "
            f"{worst[1].factor:.2f} x its warm compute"
            if worst is not None
            else ""
        )
        return replace(
            state,
            hold=True,
            since=now,
            reason=f"{ev.pipeline} missed its SLO{idle}",
        )
    return state
