"""One autoscaler look at one pipeline as one pure policy: observation in, outcome out.

:func:`look` runs the scaler's :func:`~.scaler.decide`, then :func:`_merge` (threads at low
concurrency, only when the scaler decided nothing) and :func:`_tune` (the Tuner's early
scale-out, only when nothing grew), and what the arbitration sees (the shape of Ray
Serve's ``autoscaling_policy``). No I/O, no clock. In full: docs/scaling.md, "The
autoscaler's loop in full"."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from infscaler.runtime.scaling import threads as thread_merge
from infscaler.runtime.scaling.scaler import decide, is_violated
from infscaler.runtime.scaling.tuner import WINDOWS_S, TunerVerdict, scale_out_now
from infscaler.runtime.scaling.types import Decision, ScalerConfig, ScalerState, Snapshot

#: The Tuner looks this far back past its largest window, s (arrivals before are not read).
TUNER_LOOKBACK_S = WINDOWS_S[-1] + 5.0


@dataclass(frozen=True)
class Observation:
    """What the loop read of one pipeline for one look: the snapshot, the states the last look
    left, the scaler's and the merge's tuning (None: off) and model units, the offered
    arrival times since ``now -`` :data:`TUNER_LOOKBACK_S` (None: Tuner off), and whether
    it is a party to a loan in force."""

    snapshot: Snapshot
    state: ScalerState
    config: ScalerConfig
    threads: thread_merge.ThreadsState = field(default_factory=thread_merge.ThreadsState)
    threads_config: thread_merge.ThreadsConfig | None = None
    models: frozenset[int] = frozenset()
    arrivals: np.ndarray | None = None
    on_loan: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one look decided: ``decisions``; ``acts`` in order, ``(service actions, entry to
    keep or None)``; the scaler's ``state`` and the merge's ``threads`` for the next look;
    the arbitration's ``violated`` and ``blocked``; the Tuner's verdict ``tuned``."""

    decisions: list[Decision]
    acts: list[tuple[list[Decision], dict[str, Any] | None]]
    state: ScalerState
    threads: thread_merge.ThreadsState | None
    violated: bool
    blocked: bool
    tuned: TunerVerdict | None


def look(obs: Observation) -> Outcome:
    """One look (module docstring). Raises ``ValueError`` on a bad ``obs.config``."""
    s, before = obs.snapshot, obs.state
    decisions, state = decide(s, before, obs.config)
    acts: list[tuple[list[Decision], dict[str, Any] | None]] = []
    threads = None
    if not decisions and obs.threads_config is not None:
        decisions, state, threads, note = _merge(obs, state)
        if note is not None:
            acts.append(([], note))
    violated = is_violated(s, obs.config)
    grew = any(d.action in ("scale_out", "scale_up") for d in decisions)
    tuned, after = (None, state) if obs.arrivals is None or grew else _tune(obs, state, acts)
    grew = grew or (tuned is not None and tuned.decision is not None)
    violated = violated or (tuned is not None and tuned.blocked)
    blocked = violated and (state.waiting is None or tuned is not None) and not grew
    acts.extend(([d], asdict(d)) for d in decisions)
    if state.trial_verdict not in (before.trial_verdict, *(d.reason for d in decisions)):
        # a trial's verdict (a revert that stops an instance is its scale_in's reason)
        acts.append(([], {"action": "trial_verdict", "reason": state.trial_verdict}))
    return Outcome(decisions, acts, after, threads, violated, blocked, tuned)


def _merge(
    obs: Observation, state: ScalerState
) -> tuple[list[Decision], ScalerState, thread_merge.ThreadsState, dict[str, Any] | None]:
    """The threads merge (:func:`~.threads.step`); a step it takes is a change for the
    scaler (settle, hold). Returns its decisions, the scaler's and the merge's states,
    and its trial verdict to keep when it changed without a step (else None)."""
    assert obs.threads_config is not None
    before = obs.threads
    out, tstate = thread_merge.step(
        obs.snapshot, before, obs.threads_config, state.last_change, obs.models, _owner(obs, state)
    )
    if out:
        state = replace(state, last_change=obs.snapshot.now)
    fresh = tstate.verdict is not None and tstate.verdict != before.verdict and not out
    note = {"action": "trial_verdict", "reason": tstate.verdict} if fresh else None
    return out, state, tstate, note


def _owner(obs: Observation, state: ScalerState) -> tuple[str, str] | None:
    """Which other policy owns the instance counts now (a loan in force, or the scaler's trial),
    for the merge to hold; None: neither."""
    if obs.on_loan:
        return ("loan", "an arbitration loan in force")
    if state.trial is not None:
        return ("trial", "the scaler's scale-out trial is under way")
    return None


def _tune(
    obs: Observation, state: ScalerState, acts: list[tuple[list[Decision], dict[str, Any] | None]]
) -> tuple[TunerVerdict | None, ScalerState]:
    """The Tuner on the arrivals since the last change: its scale-out joins ``acts`` as one
    ``tuner_scale_out`` entry and counts as a scale-out. Returns the verdict and the state."""
    s, times = obs.snapshot, obs.arrivals
    assert times is not None
    since = s.now - TUNER_LOOKBACK_S
    if state.last_change is not None:
        since = max(since, state.last_change)
    verdict = scale_out_now(s, times[times >= since], state, obs.config)
    d, e = verdict.decision, verdict.exceeded
    if e is None:
        return None, state
    if d is None:
        return verdict, state
    entry = {**asdict(d), "action": "tuner_scale_out", "window_s": e.window_s}
    entry.update(observed=e.observed, sustainable=round(e.sustainable, 3))
    entry.update(count=max(1, verdict.count), needed=verdict.needed)
    if verdict.required_rps is not None:
        entry["required_rps"] = round(verdict.required_rps, 3)
    acts.append(([d] * max(1, verdict.count), entry))
    now = s.now
    after = replace(state, last_scale_out=now, last_change=now, violating_since=None, waiting=None)
    return verdict, after


def window_s(window: float, settle_s: float, last_change: float | None, now: float) -> float:
    """The monitor window for a look, s: only since the last change, and after its settle window
    only since its end; at least 1 s, at most ``window``."""
    if last_change is None:
        return window
    since = now - last_change
    if since >= settle_s:
        since -= settle_s
    return max(1.0, min(window, since))
