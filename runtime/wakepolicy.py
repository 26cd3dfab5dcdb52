"""When to hold the CPUs awake: the policy behind ``cpu_wake_latency_us: auto`` (issue 15).

A core left idle sleeps, and a model whose intra-op threads or instance processes must
wake it runs slower after idle: served on the 2-vCPU development VM, ResNet-50 at 2
threads computed 1.4-1.8 x its warm time after 0.2 s or more idle, and at an SLO of
1.5 x L0 the runtime's own choice served 1.41 requests/s where the same configuration
with the CPUs held awake (a PM QoS request of 0 µs, :mod:`infscaler.runtime.pmqos`)
served 9.17 (bench/README.md, 2026-11-27). Holding them awake costs power (idle cores
poll), so the service holds the request only where it measured the cost: a pipeline
with an SLO violated it (:func:`infscaler.runtime.scaler.is_violated`) while a real
share of its items ran after an idle gap and ran markedly slower than warm
(:func:`idle_cost` on :meth:`infscaler.runtime.stats.IdleSlowdown.summary`).

Once held, it stays held while any pipeline with an SLO stays deployed, and for
``release_after_s`` after the last one left (a redeploy or a variant swap must not
bring the wake-ups back): dropping it when the P99 recovers would flap, since the
request is what made it recover. A loaded device loses nothing either way: its cores do
not idle, so neither rule fires nor does polling cost anything.

Pure functions of what the monitor measured, like :mod:`infscaler.runtime.scaler`; the
autoscaler applies the decision (:meth:`infscaler.service.Service.set_cpu_wake_latency`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["IdleCost", "WakeConfig", "WakeEvidence", "WakeState", "decide_wake", "idle_cost"]

#: An item counts as woken when its instance sat idle at least this long before it, s
#: (the warm bin of IdleSlowdown ends at 0.02 s; served, the slowdown is under 1.05 x up
#: to ~0.05 s: bench/idle_wake.py).
MIN_IDLE_S = 0.05


@dataclass(frozen=True)
class IdleCost:
    """What idle gaps cost one unit, served.

    Attributes:
        share: woken items (after >= :data:`MIN_IDLE_S` idle) over all binned items, in
            [0, 1].
        factor: the woken items' compute p50, weighted by bin count, over the warm
            compute p50 (1.0: no slowdown); None with no woken items.
        items: items binned.
    """

    share: float
    factor: float | None
    items: int


@dataclass(frozen=True)
class WakeEvidence:
    """One pipeline with an SLO, at one look of the autoscaler.

    Attributes:
        pipeline: its name.
        violated: its SLO is violated over the monitor's window
            (:func:`~infscaler.runtime.scaler.is_violated`).
        costs: per served unit, :func:`idle_cost` (None: too few items to say).
    """

    pipeline: str
    violated: bool
    costs: tuple[IdleCost | None, ...] = ()


@dataclass(frozen=True)
class WakeConfig:
    """Thresholds of :func:`decide_wake`.

    Attributes:
        min_factor: a unit's woken items must run at least this much slower than warm.
        min_share: ... and be at least this share of its items.
        min_items: ... out of at least this many binned items.
        release_after_s: drop the request this long after the last pipeline with an SLO
            left, s.
    """

    min_factor: float = 1.15
    min_share: float = 0.10
    min_items: int = 30
    release_after_s: float = 60.0


@dataclass(frozen=True)
class WakeState:
    """What :func:`decide_wake` carries between looks.

    Attributes:
        hold: whether the request should be held.
        reason: why it is held (or was dropped), for status and the log.
        since: when it was taken (the caller's clock, s), None when not held.
        slo_seen: the last time a pipeline with an SLO was deployed (s), None: never.
    """

    hold: bool = False
    reason: str = ""
    since: float | None = None
    slo_seen: float | None = None


def idle_cost(summary: Mapping[str, Any], min_idle_s: float = MIN_IDLE_S) -> IdleCost | None:
    """One unit's :class:`IdleCost` from its served idle summary.

    Args:
        summary: :meth:`infscaler.runtime.stats.IdleSlowdown.summary` (``warm_compute_p50_ms``,
            ``bins`` with ``idle_s`` [lo, hi], ``count``, ``compute_p50_ms``).
        min_idle_s: bins starting at or above this idle gap count as woken, s.

    Returns:
        None when nothing was binned or no warm compute time is known.
    """
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
        now: the caller's clock, s (monotonic).
        slo_pipelines: deployed pipelines with an SLO.
        evidence: what the autoscaler measured of them since the last call.
        state: the previous return value (``WakeState()`` at first).
        config: thresholds.

    Returns:
        the new state; ``hold`` says what to apply, ``reason`` why.
    """
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
        for i, c in enumerate(ev.costs):
            if (
                c is not None
                and c.factor is not None
                and c.items >= config.min_items
                and c.share >= config.min_share
                and c.factor >= config.min_factor
            ):
                return replace(
                    state,
                    hold=True,
                    since=now,
                    reason=f"{ev.pipeline} missed its SLO while {c.share:.0%} of unit {i}'s "
                    f"items ran after idle, {c.factor:.2f} x slower than warm",
                )
    return state
