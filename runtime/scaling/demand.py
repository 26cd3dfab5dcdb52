"""The cpu cap counted in demand: whether one more cpu instance (or thread) fits the cores,
and whether a scale-out that pins past them is kept.

An instance's share of the cores is what it keeps busy (busy fraction x threads,
:meth:`infscaler.runtime.scaling.monitor.Monitor.demand`), not the threads it pins.
:func:`fits_cores` is the one test, for the scaler and the planner. A scale-out past the
pinned cores is a trial (:func:`open_trial`) judged ``trial_s`` later
(:func:`judge_trial`): kept when the SLO is met or the served rate rose by ``trial_gain``,
else reverted and backed off (``trial_backoff_s``, doubled per revert). Why:
docs/scaling.md. Pure: no I/O, no clock."""

from __future__ import annotations

import math
from dataclasses import replace

from infscaler.runtime.scaling.types import (
    Decision,
    ScalerConfig,
    ScalerState,
    Snapshot,
    Trial,
    UnitState,
)

__all__ = [
    "MIN_SHARE",
    "blocked_why",
    "expected_share",
    "fits_cores",
    "is_trial",
    "judge_trial",
    "note_served",
    "open_trial",
    "share_per_thread",
    "trial_note",
    "trial_wait",
]

#: The least share of a core one more thread is expected to take (a stage measured idle
#: still runs every request it gets), cores per thread.
MIN_SHARE = 0.05

_EPS = 1e-9


def fits_cores(demand: float, share: float, cores: float) -> str | None:
    """Whether ``share`` more cores of demand fit ``cores`` beside ``demand``: None when
    ``demand + share <= cores``, else why not (one line).

    Args:
        demand: cores the running instances keep busy (sum of busy fraction x threads).
        share: the expected share of the addition, cores.
        cores: the cpu's physical cores (the device profile's cpu ``cores``).

    Raises:
        ValueError: a figure negative or not finite, or ``cores`` <= 0.
    """
    for name, x in (("demand", demand), ("share", share), ("cores", cores)):
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"{name} must be a finite number >= 0 of cores, got {x}")
    if cores <= 0:
        raise ValueError("cores must be > 0 (a cpu without cores admits nothing)")
    if demand + share <= cores + _EPS:
        return None
    return f"demand {demand:.2f}+{share:.2f} cores busy > {cores:g} cores"


def share_per_thread(busy: float | None, threads: int) -> float:
    """A stage's share of a core per pinned thread: ``busy`` (cores its instances keep
    busy) / ``threads`` (the threads they pin), at most 1 and at least
    :data:`MIN_SHARE`; 1 when not known (``busy`` None or no thread)."""
    if busy is None or threads <= 0:
        return 1.0
    return min(1.0, max(MIN_SHARE, busy / threads))


def expected_share(u: UnitState, threads: int) -> float:
    """Cores ``threads`` more cpu threads of ``u`` are expected to keep busy: its measured
    :func:`share_per_thread` x ``threads``; a whole core per thread when not measured."""
    if threads <= 0:
        return 0.0
    pinned = sum(int(t) * int(n) for t, n in u.threads.items()) or u.total_instances
    return share_per_thread(u.busy, pinned) * threads


def is_trial(s: Snapshot, c: ScalerConfig, d: Decision) -> bool:
    """``d`` is a cpu scale-out the demand cap admitted past the pinned-threads bound:
    every instance's pinned threads plus its own exceed the physical cores."""
    if d.action != "scale_out" or d.engine != "cpu" or c.core_cap != "demand":
        return False
    phys = s.cap.physical_cores
    if not phys or s.cores_demand is None:
        return False
    u = next((x for x in s.units if x.index == d.unit), None)
    if u is None:
        return False
    more = max((o.cores for o in u.options if o.engine == "cpu"), default=1) or 1
    return s.cores_used + more > phys


def note_served(s: Snapshot, state: ScalerState, c: ScalerConfig) -> ScalerState:
    """``state`` with ``(now, served rate)`` added to :attr:`ScalerState.served` and the
    samples older than ``2 x trial_s`` dropped."""
    keep = 2.0 * max(c.trial_s, c.settle_s + 1.0)
    old = tuple((t, r) for t, r in state.served if s.now - t <= keep)
    return replace(state, served=(*old, (s.now, _served(s))))


def open_trial(s: Snapshot, state: ScalerState, c: ScalerConfig, d: Decision) -> Trial:
    """The trial of scale-out ``d``, with the rate served before it: the mean of
    ``state.served`` over the last ``trial_s`` outside the settle window before (none left:
    this look's rate)."""
    assert d.unit is not None and d.engine is not None
    name = next((u.name for u in s.units if u.index == d.unit), str(d.unit))
    warm = -math.inf if state.last_change is None else state.last_change + c.settle_s
    before = [r for t, r in state.served if s.now - t <= c.trial_s and t > warm]
    rate = sum(before) / len(before) if before else _served(s)
    return Trial(d.unit, d.engine, name, s.now, rate)


def trial_note(s: Snapshot, d: Decision) -> str:
    """What a trial scale-out's reason adds: why it is one and how it is judged."""
    return (
        f"a trial: pinned threads {s.cores_used}+ > physical cores {s.cap.physical_cores}, "
        f"demand {s.cores_demand or 0.0:.2f} cores busy; kept only if the served rate "
        f"rises or the SLO is met"
    )


def _due(t: Trial, c: ScalerConfig) -> float:
    return t.started + max(c.trial_s, c.settle_s + 1.0)


def trial_wait(s: Snapshot, state: ScalerState, c: ScalerConfig) -> str | None:
    """Why a violation waits for the trial in force (None: none, or it is due)."""
    t = state.trial
    if t is None or s.now >= _due(t, c) - _EPS:
        return None
    return (
        f"trial of {t.name}'s new {t.engine} instance: {s.now - t.started:.3g} s of "
        f"{_due(t, c) - t.started:.3g} s, measuring whether it raised the served rate "
        f"({t.before_rps:.3g} req/s before)"
    )


def blocked_why(state: ScalerState, unit: int, now: float) -> str | None:
    """Why ``unit`` may not scale out now (None: it may): a reverted trial's backoff."""
    for k, until, reverts in state.blocked:
        if k == unit and now < until:
            return (
                f"its last {reverts} scale-out trial(s) did not raise the served rate: "
                f"no scale-out for another {until - now:.3g} s"
            )
    return None


def judge_trial(
    s: Snapshot, state: ScalerState, c: ScalerConfig, violated: bool
) -> tuple[list[Decision], ScalerState] | None:
    """The verdict on the trial in force once due (None: none is, or not yet).

    Kept when the SLO is no longer ``violated`` or the served rate (mean since the settle
    window after the scale-out) reached ``(1 + trial_gain)`` x the rate before:
    ``([], state)``, the trial closed. Else reverted: one ``scale_in`` of its unit (none at
    ``min_instances``), the unit blocked for ``trial_backoff_s x 2^(reverts - 1)``, counted
    as a change. The verdict is in ``trial_verdict``."""
    t = state.trial
    if t is None or s.now < _due(t, c) - _EPS:
        return None
    # the looks once the settle window after the scale-out was over (instances warm)
    late = [r for when, r in state.served if when > t.started + c.settle_s]
    after = sum(late) / len(late) if late else _served(s)
    need = t.before_rps * (1.0 + c.trial_gain)
    rates = f"served {t.before_rps:.3g} req/s before, {after:.3g} req/s after"
    others = tuple(b for b in state.blocked if b[0] != t.unit)
    if not violated or after >= need - _EPS and after > 0:
        why = "the SLO is met" if not violated else f"+{c.trial_gain:.0%} or more"
        verdict = f"trial of {t.name}'s new {t.engine} instance kept: {rates} ({why})"
        return [], replace(state, trial=None, blocked=others, trial_verdict=verdict)
    reverts = 1 + next((r for k, _, r in state.blocked if k == t.unit), 0)
    hold = c.trial_backoff_s * 2 ** (reverts - 1)
    verdict = (
        f"trial of {t.name}'s new {t.engine} instance reverted: {rates}, the SLO still "
        f"missed and less than +{c.trial_gain:.0%}; no scale-out of {t.name} for "
        f"{hold:.3g} s (revert {reverts} in a row)"
    )
    new = replace(
        state,
        trial=None,
        blocked=(*others, (t.unit, s.now + hold, reverts)),
        trial_verdict=verdict,
        last_change=s.now,
        violating_since=None,
    )
    u = next((x for x in s.units if x.index == t.unit), None)
    if u is None or u.instances.get(t.engine, 0) <= 0 or u.total_instances <= u.min_instances:
        return [], new
    return [Decision("scale_in", unit=t.unit, engine=t.engine, reason=verdict)], new


def _served(s: Snapshot) -> float:
    return s.arrival_rate if s.served_rate is None else s.served_rate
