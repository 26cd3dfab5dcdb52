"""Threads per instance at low concurrency: merge two single-thread-per-core cpu
instances of a unit into one with their threads together while fewer requests are in
flight than instances, as a trial, and split back when the concurrency rises.

The offered concurrency is the mean of the requests in flight (:attr:`Snapshot.pending`,
admitted and not answered) over the looks of the last ``window_s`` (Little's law: rate x
latency). A cpu unit with two live instances (``n = 2``), both at ``t`` intra-op threads, on a
device with at least ``2t`` physical cores and with half a core idle, whose mean in flight
stayed at most ``n - 1 + merge_margin`` for ``window_s`` since the last change, is
**merged**: ``scale_in`` one instance, and once it is gone ``scale_up`` another from ``t``
to ``2t`` threads (make-before-break). Its **trial** is judged ``trial_s`` later on the
served rate and P99 read after it against those before (means of the looks): kept when
the rate rose by ``gain`` or the P99 fell by ``gain``, else **split** back and the unit
not merged again for ``backoff_s`` (doubled per revert in a row, as
:mod:`infscaler.runtime.scaling.demand`'s trials). A kept merge is split back
(``scale_down`` to ``t``, then ``scale_out``) as soon as the mean in flight over the last
``split_s`` exceeds the unit's instances + ``split_margin``, and not merged again for
``backoff_s``. Measurements: bench/HISTORY.md. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from infscaler.runtime.scaling.types import Decision, Snapshot, UnitState

__all__ = ["ENV", "ThreadsConfig", "ThreadsState", "config_for", "enabled", "in_flight", "step"]

#: ``INFSCALER_THREADS=off`` turns the merge off (benchmarks' baseline).
ENV = "INFSCALER_THREADS"


@dataclass(frozen=True)
class ThreadsConfig:
    """Tuning of :func:`step` (seconds unless said).

    Attributes:
        window_s: the in-flight mean a merge rests on covers this long, and no change
            (of this policy or the scaler: ``last_change``) within it.
        merge_margin: merge while the mean in flight <= instances - 1 + this.
        split_s / split_margin: split back while the mean in flight over the last
            ``split_s`` > the instances + ``split_margin``.
        trial_s: a merge's verdict comes this long after its ``scale_up``.
        gain: kept when the served rate rose, or the P99 fell, by this fraction.
        backoff_s: no merge of a unit this long after a reverted one, doubled per revert.
        idle_cores: a merge needs the cores kept busy (:attr:`Snapshot.cores_busy`)
            at most the physical cores - this (None: not measured, not checked).
    """

    window_s: float = 10.0
    merge_margin: float = 0.25
    split_s: float = 3.0
    split_margin: float = 0.5
    trial_s: float = 15.0
    gain: float = 0.1
    backoff_s: float = 60.0
    idle_cores: float = 0.5

    def __post_init__(self) -> None:
        for name in ("window_s", "split_s", "trial_s", "backoff_s"):
            x = getattr(self, name)
            if not math.isfinite(x) or x <= 0:
                raise ValueError(
                    f"ThreadsConfig.{name} must be a finite number of seconds > 0, got {x}"
                )
        for name in ("merge_margin", "split_margin", "gain", "idle_cores"):
            x = getattr(self, name)
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"ThreadsConfig.{name} must be a finite number >= 0, got {x}")


@dataclass(frozen=True)
class ThreadsState:
    """What :func:`step` carries between looks of one pipeline.

    Attributes:
        looks: ``(now, pending, served rps, p99 ms or nan)`` within the last
            ``max(window_s, 2 x trial_s)``.
        phase: None (nothing under way), ``merging`` (scale_in sent, scale_up next),
            ``trial`` (merged, judged at ``started + trial_s``), ``kept`` (merged and
            kept), ``splitting`` (scale_down sent, scale_out next).
        unit / threads: the unit moved and its instances' threads before the merge.
        started: ``now`` of the last step sent, s (None: none).
        before_rps / before_p99: served rate and P99 (means of the looks) before the merge.
        blocked: ``(unit, until, reverts)`` per unit whose merge was reverted.
        verdict: the last trial's verdict, one line (None: none yet).
    """

    looks: tuple[tuple[float, float, float, float], ...] = ()
    phase: str | None = None
    unit: int | None = None
    threads: int = 1
    started: float | None = None
    before_rps: float = 0.0
    before_p99: float = math.nan
    blocked: tuple[tuple[int, float, int], ...] = ()
    verdict: str | None = None


def enabled(environ: Mapping[str, str]) -> bool:
    """False when ``environ[ENV]`` is ``off`` / ``0`` / ``false`` (any case)."""
    return environ.get(ENV, "on").strip().lower() not in ("off", "0", "false")


def config_for(autoscale: Any) -> ThreadsConfig:
    """The tuning for a pipeline's ``autoscale`` settings: ``window_s`` its window (at
    least 2 looks), ``split_s`` 3 looks, ``trial_s`` its settle window + 2 windows."""
    look = float(autoscale.interval_s)
    window = max(float(autoscale.window_s), 2 * look)
    return ThreadsConfig(
        window_s=window,
        split_s=3 * look,
        trial_s=float(autoscale.settle_s) + 2 * window,
    )


def in_flight(looks: tuple[tuple[float, ...], ...], since: float) -> float | None:
    """Mean requests in flight over the looks at or after ``since`` (None: no look)."""
    xs = [lk[1] for lk in looks if lk[0] >= since]
    return sum(xs) / len(xs) if xs else None


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _cpu_live(u: UnitState) -> tuple[int, int | None]:
    """(live cpu instances, their common thread count or None when mixed / unknown)."""
    live = {t: n for t, n in u.threads.items() if n > 0}
    n = u.instances.get("cpu", 0)
    if len(live) != 1 or sum(live.values()) != n:
        return n, None
    return n, next(iter(live))


def step(
    s: Snapshot,
    state: ThreadsState,
    c: ThreadsConfig,
    last_change: float | None = None,
    models: frozenset[int] | None = None,
) -> tuple[list[Decision], ThreadsState]:
    """One look: the decisions (at most one) and the new state.

    Args:
        s: the pipeline's snapshot (``pending``, ``served_rate`` or ``arrival_rate``,
            ``p99_ms``, units' cpu ``instances`` and ``threads``, ``cores_busy``, cap).
        state: what the last call returned (``ThreadsState()`` at first).
        c: tuning.
        last_change: ``now`` of the scaler's last change (None: none); no merge within
            ``window_s`` of it.
        models: the indexes of the units that run a model (intra-op threads only speed
            those up); None: every unit.
    """
    served = s.served_rate if s.served_rate is not None else s.arrival_rate
    keep = max(c.window_s, 2 * c.trial_s)
    p99 = s.p99_ms if s.p99_ms is not None else math.nan
    looks = tuple(lk for lk in state.looks if lk[0] > s.now - keep)
    state = replace(state, looks=(*looks, (s.now, float(s.pending), served, p99)))
    units = {u.index: u for u in s.units}
    if state.phase is not None:
        u = units.get(state.unit) if state.unit is not None else None
        if u is None:
            return [], replace(state, phase=None, unit=None)
        return _under_way(s, state, c, u)
    return _maybe_merge(s, state, c, last_change, models)


def _maybe_merge(
    s: Snapshot,
    state: ThreadsState,
    c: ThreadsConfig,
    last_change: float | None,
    models: frozenset[int] | None,
) -> tuple[list[Decision], ThreadsState]:
    since = s.now - c.window_s
    if last_change is not None and last_change > since:
        return [], state
    if not state.looks or state.looks[0][0] > since + 1e-9:
        return [], state  # not watched for a whole window yet
    conc = in_flight(state.looks, since)
    cores = s.cap.physical_cores
    if conc is None or conc <= 0 or cores < 2:
        return [], state
    if s.cores_busy is not None and s.cores_busy > cores - c.idle_cores:
        return [], state
    best: tuple[float, UnitState, int, int] | None = None
    for u in s.units:
        if models is not None and u.index not in models:
            continue
        n, t = _cpu_live(u)
        if t is None or n != 2 or 2 * t > cores or conc > n - 1 + c.merge_margin:
            continue
        if any(b[0] == u.index and b[1] > s.now for b in state.blocked):
            continue
        key = u.service_ms or 0.0
        if best is None or key > best[0]:
            best = (key, u, n, t)
    if best is None:
        return [], state
    _, u, n, t = best
    lk = [x for x in state.looks if x[0] >= since]
    reason = (
        f"{u.name}: {_f(conc)} requests in flight on average over {c.window_s:g} s < "
        f"{n} instances x {t} thread(s): one instance stops, another runs {2 * t} threads"
    )
    st = replace(
        state,
        phase="merging",
        unit=u.index,
        threads=t,
        started=s.now,
        before_rps=_mean([x[2] for x in lk]),
        before_p99=_mean([x[3] for x in lk]),
    )
    return [Decision("scale_in", unit=u.index, engine="cpu", reason=reason)], st


def _under_way(
    s: Snapshot, state: ThreadsState, c: ThreadsConfig, u: UnitState
) -> tuple[list[Decision], ThreadsState]:
    n, t = _cpu_live(u)
    t0, t2 = state.threads, 2 * state.threads
    stale = state.started is not None and s.now > state.started + 4 * c.trial_s
    if stale and state.phase in ("merging", "splitting"):
        return [], replace(state, phase=None, unit=None)  # a step that never landed
    if {k: v for k, v in u.threads.items() if v > 0} == {t0: 1, t2: 1} and n == 2:
        return [], state  # a make-before-break swap under way (scale_up / scale_down)
    if state.phase == "merging":
        if n >= 2:
            return [], state  # the scale-in is still draining
        if (n, t) != (1, t0):
            return [], replace(state, phase=None, unit=None)  # something else moved it
        why = f"{u.name}: merged: its one instance {t0} -> {t2} threads"
        d = Decision(
            "scale_up", unit=u.index, engine="cpu", threads=t2, from_threads=t0, reason=why
        )
        return [d], replace(state, phase="trial", started=s.now)
    if state.phase == "splitting":
        if n == 1 and t == t2:
            return [], state  # waiting for the scale-down
        if (n, t) != (1, t0):
            return [], replace(state, phase=None, unit=None)  # moved by the scaler
        why = f"{u.name}: split back: one more instance at {t0} thread(s)"
        d = Decision("scale_out", unit=u.index, engine="cpu", reason=why)
        return [d], replace(state, phase=None, unit=None, started=s.now)
    if (n, t) != (1, t2):  # trial / kept, but the scaler changed the unit since
        return [], replace(state, phase=None, unit=None)
    conc = in_flight(state.looks, s.now - c.split_s)
    if conc is not None and conc > n + c.split_margin:
        why = (
            f"{u.name}: {_f(conc)} requests in flight on average over {c.split_s:g} s > "
            f"{n} instance(s): split back to instances of {t0} thread(s)"
        )
        # no merge again for backoff_s: a load that swings around the threshold
        # (clients backing off after refusals) would otherwise merge and split in turn
        reverts = next((b[2] for b in state.blocked if b[0] == u.index), 0)
        blocked = (
            *(b for b in state.blocked if b[0] != u.index),
            (u.index, s.now + c.backoff_s, reverts),
        )
        st = replace(state, phase="splitting", started=s.now, blocked=blocked)
        return [_down(u, t2, t0, why)], st
    if state.phase == "trial" and state.started is not None and s.now >= state.started + c.trial_s:
        return _judge(s, state, c, u)
    return [], state


def _judge(
    s: Snapshot, state: ThreadsState, c: ThreadsConfig, u: UnitState
) -> tuple[list[Decision], ThreadsState]:
    assert state.started is not None
    after = [x for x in state.looks if x[0] >= state.started + c.trial_s / 3]
    rps, p99 = _mean([x[2] for x in after]), _mean([x[3] for x in after])
    b_rps, b_p99 = state.before_rps, state.before_p99
    rate_up = (
        math.isfinite(rps) and math.isfinite(b_rps) and rps >= b_rps * (1 + c.gain) and b_rps > 0
    )
    p99_down = math.isfinite(p99) and math.isfinite(b_p99) and p99 <= b_p99 * (1 - c.gain)
    figures = f"served {_f(b_rps)} -> {_f(rps)}/s, P99 {_f(b_p99)} -> {_f(p99)} ms"
    if rate_up or p99_down:
        return [], replace(state, phase="kept", verdict=f"{u.name}: merge kept: {figures}")
    reverts = next((b[2] for b in state.blocked if b[0] == u.index), 0) + 1
    until = s.now + c.backoff_s * 2 ** (reverts - 1)
    blocked = (*(b for b in state.blocked if b[0] != u.index), (u.index, until, reverts))
    why = (
        f"{u.name}: merge reverted: {figures} (no merge for {c.backoff_s * 2 ** (reverts - 1):g} s)"
    )
    t0 = state.threads
    st = replace(state, phase="splitting", started=s.now, blocked=blocked, verdict=why)
    return [_down(u, 2 * t0, t0, why)], st


def _down(u: UnitState, frm: int, to: int, why: str) -> Decision:
    return Decision(
        "scale_down", unit=u.index, engine="cpu", threads=to, from_threads=frm, reason=why
    )


def _f(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.3g}"
