"""Threads per instance at low concurrency: while about one request is in flight, each cpu
model unit runs one instance with more intra-op threads, as a trial, split back when the
concurrency rises.

With the mean in flight over ``window_s`` at most ``1 + merge_margin`` and half a core
idle, a unit of ``n`` instances at ``t`` threads moves to one at
``T = min(physical cores, max(2, n) x t)`` (merged, or widened). The trial is judged
``trial_s`` after: kept when the rate rose or P99 fell by ``gain``, else split back and
backed off (``backoff_s``, doubled per revert). A kept move splits when the mean in flight
over ``split_s`` exceeds ``1 + split_margin``. Pure: no I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from infscaler.runtime.scaling.types import Decision, Snapshot, UnitState

__all__ = [
    "ENV",
    "Moved",
    "ThreadsConfig",
    "ThreadsState",
    "config_for",
    "enabled",
    "in_flight",
    "step",
]

#: ``INFSCALER_THREADS=off`` turns the move off (benchmarks' baseline).
ENV = "INFSCALER_THREADS"


@dataclass(frozen=True)
class ThreadsConfig:
    """Tuning of :func:`step` (seconds unless said).

    Attributes:
        window_s: the span of the in-flight mean a move rests on; no change within it.
        merge_margin: move while the mean in flight <= 1 + this.
        split_s / split_margin: split back while the mean in flight over ``split_s`` > 1 +
            ``split_margin``.
        trial_s: a move's verdict comes this long after its last ``scale_up``.
        gain: kept when the served rate rose, or the P99 fell, by this fraction.
        backoff_s: no move of a unit this long after a reverted one, doubled per revert.
        idle_cores: a move needs busy cores <= physical cores - this (None: not checked)."""

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
class Moved:
    """One unit of a move: its ``unit`` index, ``threads`` and ``instances`` before, ``to``
    threads after, ``expect`` live instances once the last ``scale_in`` lands (0: none sent)
    and whether its ``scale_up`` / ``scale_out`` was ``sent``."""

    unit: int
    threads: int
    instances: int
    to: int
    expect: int = 0
    sent: bool = False


@dataclass(frozen=True)
class ThreadsState:
    """What :func:`step` carries between looks of one pipeline.

    Attributes:
        looks: ``(now, pending, served rps, p99 ms or nan)`` within the last
            ``max(window_s, 2 x trial_s)``.
        phase: None, ``merging``, ``trial`` (judged at ``started + trial_s``), ``kept`` or
            ``splitting``.
        moved: the units of the move under way. started: ``now`` of the last step sent, s.
        before_rps / before_p99: served rate and P99 (means of the looks) before the move.
        blocked: ``(unit, until, reverts)`` per unit whose move was reverted or split.
        verdict: the last trial's verdict (None: none yet).
        held: ``(code, one line)``: why no move was made at the last look (None: one was)."""

    looks: tuple[tuple[float, float, float, float], ...] = ()
    phase: str | None = None
    moved: tuple[Moved, ...] = ()
    started: float | None = None
    before_rps: float = 0.0
    before_p99: float = math.nan
    blocked: tuple[tuple[int, float, int], ...] = ()
    verdict: str | None = None
    held: tuple[str, str] | None = None


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


def _swapping(u: UnitState, m: Moved) -> bool:
    """A make-before-break swap between ``t`` and ``T`` under way on ``u``'s last instance."""
    live = {k: v for k, v in u.threads.items() if v > 0}
    return live == {m.threads: 1, m.to: 1} and u.instances.get("cpu", 0) == 2


def step(
    s: Snapshot,
    state: ThreadsState,
    c: ThreadsConfig,
    last_change: float | None = None,
    models: frozenset[int] | None = None,
    hold: tuple[str, str] | None = None,
) -> tuple[list[Decision], ThreadsState]:
    """One look: the decisions (at most one per unit) and the new state.

    Args:
        s: the pipeline's snapshot. state: what the last call returned. c: tuning.
        last_change: ``now`` of the scaler's last change (None: none).
        models: the units that run a model (None: every unit).
        hold: ``(code, one line)`` when another policy owns the instance counts (``loan``,
            ``trial``): no move starts (None: none)."""
    served = s.served_rate if s.served_rate is not None else s.arrival_rate
    keep = max(c.window_s, 2 * c.trial_s)
    p99 = s.p99_ms if s.p99_ms is not None else math.nan
    looks = tuple(lk for lk in state.looks if lk[0] > s.now - keep)
    state = replace(state, looks=(*looks, (s.now, float(s.pending), served, p99)), held=None)
    if state.phase is not None:
        units = {u.index: u for u in s.units}
        if any(m.unit not in units for m in state.moved):
            return [], replace(state, phase=None, moved=())
        return _under_way(s, state, c, units)
    if hold is not None:
        return [], replace(state, held=hold)
    return _maybe_move(s, state, c, last_change, models)


def _maybe_move(
    s: Snapshot,
    state: ThreadsState,
    c: ThreadsConfig,
    last_change: float | None,
    models: frozenset[int] | None,
) -> tuple[list[Decision], ThreadsState]:
    since = s.now - c.window_s
    cores = s.cap.physical_cores
    conc = in_flight(state.looks, since)
    held: tuple[str, str] | None = None
    if last_change is not None and last_change > since:
        held = ("changed", f"a change {s.now - last_change:.0f} s ago (< {c.window_s:g} s)")
    elif not state.looks or state.looks[0][0] > since + 1e-9:
        held = ("watching", f"not watched for {c.window_s:g} s yet")
    elif cores < 2:
        held = ("cores", f"{cores} physical core(s)")
    elif conc is None or conc <= 0:
        held = ("idle", "nothing in flight")
    elif conc > 1 + c.merge_margin:
        held = ("in-flight", f"{_f(conc)} requests in flight on average > {1 + c.merge_margin:g}")
    elif s.cores_busy is not None and s.cores_busy > cores - c.idle_cores:
        held = ("busy", f"{_f(s.cores_busy)} of {cores} cores busy (< {c.idle_cores:g} idle)")
    if held is not None:
        return [], replace(state, held=held)
    assert conc is not None
    moved: list[Moved] = []
    for u in s.units:
        if models is not None and u.index not in models:
            continue
        n, t = _cpu_live(u)
        if t is None or n < 1 or any(b[0] == u.index and b[1] > s.now for b in state.blocked):
            continue
        to = min(cores, max(2, n) * t)
        if to > t:
            moved.append(Moved(u.index, t, n, to))
    if not moved:
        return [], replace(state, held=("none", "no model unit to move (at the cores, or blocked)"))
    lk = [x for x in state.looks if x[0] >= since]
    st = replace(
        state,
        phase="merging",
        moved=tuple(moved),
        started=s.now,
        before_rps=_mean([x[2] for x in lk]),
        before_p99=_mean([x[3] for x in lk]),
    )
    units = {u.index: u for u in s.units}
    why = f"{_f(conc)} requests in flight on average over {c.window_s:g} s"
    return _merging(s, st, c, units, why)


def _merging(
    s: Snapshot, state: ThreadsState, c: ThreadsConfig, units: dict[int, UnitState], why: str = ""
) -> tuple[list[Decision], ThreadsState]:
    """The scale_in (one per look and unit) and scale_up of each unit being moved."""
    out: list[Decision] = []
    moved: list[Moved] = []
    for m in state.moved:
        u = units[m.unit]
        n, t = _cpu_live(u)
        if m.sent or _swapping(u, m) or (n, t) == (1, m.to):
            moved.append(m)  # its scale_up sent (or landed)
        elif t == m.threads and n > 1:
            if m.expect and n > m.expect:
                moved.append(m)  # the last scale-in still draining
                continue
            reason = (
                f"{u.name}: {why or 'moving'}: {n} instances x {t} thread(s) -> one at "
                f"{m.to}: one instance stops"
            )
            out.append(Decision("scale_in", unit=u.index, engine="cpu", reason=reason))
            moved.append(replace(m, expect=n - 1))
        elif (n, t) == (1, m.threads):
            kind = "merged" if m.instances > 1 else "widened"
            head = f"{u.name}: {why}: " if why else f"{u.name}: "
            reason = f"{head}{kind}: its one instance {t} -> {m.to} threads"
            out.append(
                Decision(
                    "scale_up",
                    unit=u.index,
                    engine="cpu",
                    threads=m.to,
                    from_threads=t,
                    reason=reason,
                )
            )
            moved.append(replace(m, sent=True))
        else:
            return [], replace(state, phase=None, moved=())  # something else moved it
    st = replace(state, moved=tuple(moved))
    if out:
        st = replace(st, started=s.now)
    if all(m.sent for m in moved):
        st = replace(st, phase="trial")
    return out, st


def _under_way(
    s: Snapshot, state: ThreadsState, c: ThreadsConfig, units: dict[int, UnitState]
) -> tuple[list[Decision], ThreadsState]:
    stale = state.started is not None and s.now > state.started + 4 * c.trial_s
    if stale and state.phase in ("merging", "splitting"):
        return [], replace(state, phase=None, moved=())  # a step that never landed
    if state.phase == "merging":
        return _merging(s, state, c, units)
    if state.phase == "splitting":
        return _splitting(state, units)
    early = state.started is not None and s.now < state.started + c.trial_s / 3
    for m in state.moved:  # trial / kept
        u = units[m.unit]
        if _swapping(u, m) or (early and _cpu_live(u) == (1, m.threads)):
            continue  # the scale_up's swap under way (or not seen yet)
        if _cpu_live(u) != (1, m.to):  # the scaler changed the unit since
            return [], replace(state, phase=None, moved=())
    conc = in_flight(state.looks, s.now - c.split_s)
    if conc is not None and conc > 1 + c.split_margin:
        names = ", ".join(units[m.unit].name for m in state.moved)
        why = (
            f"{names}: {_f(conc)} requests in flight on average over {c.split_s:g} s > "
            f"{1 + c.split_margin:g}: split back"
        )
        # no move again for backoff_s (a load swinging around the threshold)
        blocked = _block(state, s.now, c.backoff_s, revert=False)
        return _split(s, replace(state, blocked=blocked), units, why)
    if state.phase == "trial" and state.started is not None and s.now >= state.started + c.trial_s:
        return _judge(s, state, c, units)
    return [], state


def _judge(
    s: Snapshot, state: ThreadsState, c: ThreadsConfig, units: dict[int, UnitState]
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
    names = ", ".join(units[m.unit].name for m in state.moved)
    if rate_up or p99_down:
        return [], replace(state, phase="kept", verdict=f"{names}: threads kept: {figures}")
    blocked = _block(state, s.now, c.backoff_s, revert=True)
    wait = max(b[1] for b in blocked if any(b[0] == m.unit for m in state.moved)) - s.now
    why = f"{names}: threads reverted: {figures} (no move for {wait:g} s)"
    return _split(s, replace(state, blocked=blocked, verdict=why), units, why)


def _block(
    state: ThreadsState, now: float, backoff_s: float, revert: bool
) -> tuple[tuple[int, float, int], ...]:
    """``state.blocked`` with the moved units blocked: ``backoff_s``, doubled per revert
    in a row when ``revert``."""
    out = list(state.blocked)
    for m in state.moved:
        reverts = next((b[2] for b in out if b[0] == m.unit), 0) + (1 if revert else 0)
        until = now + backoff_s * 2 ** max(0, reverts - 1) if revert else now + backoff_s
        out = [b for b in out if b[0] != m.unit] + [(m.unit, until, reverts)]
    return tuple(out)


def _split(
    s: Snapshot, state: ThreadsState, units: dict[int, UnitState], why: str
) -> tuple[list[Decision], ThreadsState]:
    """``scale_down`` ``T -> t`` of every moved unit; ``scale_out`` follows (:func:`_splitting`)."""
    out = [
        Decision(
            "scale_down",
            unit=m.unit,
            engine="cpu",
            threads=m.threads,
            from_threads=m.to,
            reason=f"{units[m.unit].name}: {why}" if len(state.moved) > 1 else why,
        )
        for m in state.moved
    ]
    moved = tuple(replace(m, sent=False) for m in state.moved)
    return out, replace(state, phase="splitting", moved=moved, started=s.now)


def _splitting(
    state: ThreadsState, units: dict[int, UnitState]
) -> tuple[list[Decision], ThreadsState]:
    """Once a unit's instance is back at ``t`` threads, ``scale_out`` it to ``n``."""
    out: list[Decision] = []
    moved: list[Moved] = []
    for m in state.moved:
        u = units[m.unit]
        n, t = _cpu_live(u)
        if m.sent or (n, t) == (m.instances, m.threads):
            moved.append(replace(m, sent=True))
        elif (n, t) == (1, m.to) or _swapping(u, m):
            moved.append(m)  # waiting for the scale-down
        elif (n, t) == (1, m.threads):
            why = f"{u.name}: split back: {m.instances - 1} more instance(s) at {t} thread(s)"
            out += [
                Decision("scale_out", unit=u.index, engine="cpu", reason=why)
                for _ in range(m.instances - 1)
            ]
            moved.append(replace(m, sent=True))
        else:
            moved.append(replace(m, sent=True))  # moved by the scaler: let go
    if all(m.sent for m in moved):
        return out, replace(state, phase=None, moved=())
    return out, replace(state, moved=tuple(moved))


def _f(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.3g}"
