"""Arbitration between pipelines under one device cap: a pure function from every
pipeline's snapshot to capacity moves (no I/O, no clock).

:func:`arbitrate` returns at most one :class:`Move` per call: ``lend`` (a blocked
pipeline takes an instance from a strictly lower one, or from an equal one's slack),
``return`` (a loan given back after ``release_hold_s`` calm, InferLine §5 hysteresis) or
``spare`` (a lower pipeline's slack instance to a higher one at the cap). The giver's
``scale_in`` precedes the taker's ``scale_out`` so the cap is never exceeded. Capacities
and P99s: :mod:`infscaler.runtime.scaling.unitmodel`; priorities as Triton's priority
levels (``model_configuration.md``, "Priority"). In full: docs/scaling.md,
"Arbitration in full"."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from infscaler.runtime.queueing import EPS
from infscaler.runtime.scaling.scaler import effective_bottleneck
from infscaler.runtime.scaling.types import EngineOption, ResourceCap, Snapshot, UnitState
from infscaler.runtime.scaling.unitmodel import (
    fan_out,
    instance_ms,
    p99_needed,
    pipeline_capacity_rps,
)

__all__ = [
    "ArbitrationConfig",
    "ArbitrationState",
    "Loan",
    "Move",
    "PipelineView",
    "arbitrate",
    "needs_look",
    "pressure_ahead",
    "wants_spare",
]


@dataclass(frozen=True)
class PipelineView:
    """One deployed pipeline as the arbitration sees it.

    Attributes:
        name: the pipeline's name.
        priority: its level, 1 the highest (the pipeline config's ``priority``).
        snapshot: what :func:`~infscaler.runtime.scaling.scaler.decide` got at its last look.
        violated: its SLO counted as violated at that look.
        blocked: violated, and the cap refused every unit's scale-out."""

    name: str
    priority: int
    snapshot: Snapshot
    violated: bool = False
    blocked: bool = False


@dataclass(frozen=True)
class ArbitrationConfig:
    """Tuning of :func:`arbitrate` (fractions in (0, 1]).

    Attributes:
        donor_load: a donor's offered load after the give is at most this x its capacity.
        donor_p99_ratio: a donor's P99 is at most this x its SLO.
        release_ratio: a taker is calm when its P99 and its offered load (against its
            capacity without the borrowed instance) are at most this x SLO / capacity.
        release_hold_s: how long a taker stays calm before the instance goes back, s.
        spare: rule 4 on; False: lends and returns only (``INFSCALER_ARBITRATION=lend-only``)."""

    donor_load: float = 0.6
    donor_p99_ratio: float = 0.8
    release_ratio: float = 0.8
    release_hold_s: float = 15.0
    spare: bool = True


@dataclass(frozen=True)
class Loan:
    """An instance lent by ``donor``'s unit to ``taker``'s unit (``taker_count``: its instances
    right after the move); ``calm_since``: since when the taker has been calm (None: not)."""

    donor: str
    donor_unit: int
    donor_engine: str
    taker: str
    taker_unit: int
    taker_engine: str
    taker_count: int
    since: float
    calm_since: float | None = None


@dataclass(frozen=True)
class ArbitrationState:
    """What :func:`arbitrate` carries from one call to the next: the loans in force."""

    loans: tuple[Loan, ...] = ()


@dataclass(frozen=True)
class Move:
    """One capacity move: stop one instance of ``giver``'s ``give_unit`` on ``give_engine``
    (when ``give``) and wait for it to exit, then start one of ``taker``'s ``take_unit`` on
    ``take_engine``.

    Attributes:
        kind: ``lend``, ``return`` or ``spare`` (no loan: the instance is the taker's).
        give: False for a return whose taker no longer holds the instance.
        resource: the binding resource: ``memory``, ``cores`` or ``<engine> slots``.
        gain_rps: goodput the move adds, requests/s (taker's gain less giver's loss).
        per_resource: ``gain_rps`` per MB, core or slot of ``resource``.
        reason: one sentence naming giver, taker, the resource and the figures."""

    kind: str
    giver: str
    give_unit: int
    give_engine: str
    taker: str
    take_unit: int
    take_engine: str
    resource: str
    gain_rps: float
    per_resource: float
    reason: str
    give: bool = True


def arbitrate(
    views: list[PipelineView],
    state: ArbitrationState,
    config: ArbitrationConfig = ArbitrationConfig(),  # noqa: B008 (frozen)
) -> tuple[list[Move], ArbitrationState]:
    """Decide at most one capacity move between pipelines (see the module docstring).

    Returns:
        ``(moves, new_state)``: zero or one :class:`Move`; a lend adds a :class:`Loan`, a
        return removes it, loans of pipelines gone are dropped.

    Raises:
        ValueError: a ``config`` fraction outside (0, 1] or a negative hold."""
    _check(config)
    by_name = {v.name: v for v in views}
    if not views:
        return [], ArbitrationState()
    now = max(v.snapshot.now for v in views)
    loans: list[Loan] = []
    back: Move | None = None
    for loan in state.loans:
        taker, donor = by_name.get(loan.taker), by_name.get(loan.donor)
        if taker is None or donor is None:
            continue
        if back is None and donor.blocked and donor.violated and donor.priority <= taker.priority:
            # a lender as high as its taker needs its instance back now
            back = _return(
                loan,
                taker,
                donor,
                f"{donor.name} (priority {donor.priority}) misses its SLO at the cap and "
                f"needs its instance back from {taker.name} (priority {taker.priority})",
            )
            if back is not None:
                continue
        calm = _calm(taker, loan, config)
        if calm is None:
            loans.append(replace(loan, calm_since=None))
            continue
        since = loan.calm_since if loan.calm_since is not None else now
        if back is None and now - since >= config.release_hold_s - EPS:
            why = f"pressure over: {taker.name} calm for {_n(now - since)} s ({calm})"
            back = _return(loan, taker, donor, why)
            # None: nothing to give back and the cap refuses the donor: the loan is over
            continue
        loans.append(replace(loan, calm_since=since))
    if back is not None:
        return [back], ArbitrationState(tuple(loans))
    lend = _best_lend(views, {ln.taker for ln in loans}, config)
    if lend is None:
        takers = {ln.taker for ln in loans}
        spare = _best_spare(views, takers, config) if config.spare else None
        return ([] if spare is None else [spare]), ArbitrationState(tuple(loans))
    move, count = lend
    loan = Loan(
        move.giver,
        move.give_unit,
        move.give_engine,
        move.taker,
        move.take_unit,
        move.take_engine,
        count,
        now,
    )
    return [move], ArbitrationState((*loans, loan))


# -- helpers ---------------------------------------------------------------------------------


def _check(c: ArbitrationConfig) -> None:
    for name in ("donor_load", "donor_p99_ratio", "release_ratio"):
        v = getattr(c, name)
        if not 0 < v <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {v}")
    if not c.release_hold_s >= 0:
        raise ValueError(f"release_hold_s must be >= 0 s, got {c.release_hold_s}")


def _n(x: float) -> str:
    return f"{x:.3g}"


def _with(s: Snapshot, index: int, engine: str, delta: int) -> Snapshot:
    """``s`` with unit ``index`` running ``delta`` more instances on ``engine``."""
    units = []
    for u in s.units:
        if u.index == index:
            inst = dict(u.instances)
            inst[engine] = max(0, inst.get(engine, 0) + delta)
            u = replace(u, instances=inst)
        units.append(u)
    return replace(s, units=tuple(units))


def _served(s: Snapshot, capacity: float | None) -> float:
    """Requests/s answered at ``capacity``: ``min(offered, capacity)``."""
    return s.offered if capacity is None else min(s.offered, capacity)


def _unit(s: Snapshot, index: int) -> UnitState | None:
    return next((u for u in s.units if u.index == index), None)


def _calm(taker: PipelineView, loan: Loan, c: ArbitrationConfig) -> str | None:
    """Why ``taker`` is calm enough to give ``loan`` back (None: it is not)."""
    s = taker.snapshot
    if taker.violated:
        return None
    if s.p99_ms is not None and s.p99_ms > c.release_ratio * s.slo_ms + EPS:
        return None
    u = _unit(s, loan.taker_unit)
    has = u is not None and u.instances.get(loan.taker_engine, 0) > 0
    without = _with(s, loan.taker_unit, loan.taker_engine, -1) if has else s
    cap = pipeline_capacity_rps(without)
    if cap is not None and s.offered > c.release_ratio * cap + EPS:
        return None
    if has and u is not None and _tail_short(s, u):
        return None  # one instance fewer: its P99 at this load would miss the SLO
    p99 = "no P99" if s.p99_ms is None else f"P99 {_n(s.p99_ms)} ms"
    load = "" if cap is None else f", offered {_n(s.offered)} req/s on {_n(cap)} without it"
    return f"{p99} <= {c.release_ratio:g} x SLO {_n(s.slo_ms)} ms{load}"


def _return(loan: Loan, taker: PipelineView, donor: PipelineView, why: str) -> Move | None:
    """The move giving ``loan`` back, ``why`` its reason's first words (None: the taker already
    gave it back and the cap still refuses the donor's instance)."""
    ts, ds = taker.snapshot, donor.snapshot
    u = _unit(ts, loan.taker_unit)
    give = u is not None and u.total_instances >= loan.taker_count
    give = give and u is not None and u.total_instances > u.min_instances
    if not give:
        du = _unit(ds, loan.donor_unit)
        opt = (
            None
            if du is None
            else next((o for o in du.options if o.engine == loan.donor_engine), None)
        )
        if opt is None or _short(ds, opt):
            return None
    gain = _served(ds, pipeline_capacity_rps(_with(ds, loan.donor_unit, loan.donor_engine, 1)))
    gain -= _served(ds, pipeline_capacity_rps(ds))
    what = (
        f"{taker.name} gives back the {loan.taker_engine} instance of unit {loan.taker_unit}"
        if give
        else f"{taker.name} already gave the borrowed instance back"
    )
    return Move(
        "return",
        taker.name,
        loan.taker_unit,
        loan.taker_engine,
        donor.name,
        loan.donor_unit,
        loan.donor_engine,
        "lent instance",
        gain,
        gain,
        f"{why}; {what}; "
        f"{donor.name} gets its {loan.donor_engine} instance of unit {loan.donor_unit} "
        f"back (+{_n(gain)} req/s for {donor.name})",
        give,
    )


def _added(s: Snapshot, u: UnitState, o: EngineOption) -> float:
    """Requests/s one more instance of ``u`` on ``o`` adds to the pipeline's capacity (unknown
    capacity: the instance's own rate)."""
    before = pipeline_capacity_rps(s)
    after = pipeline_capacity_rps(_with(s, u.index, o.engine, 1))
    if before is None or after is None:
        return 1000.0 / o.latency_ms if o.latency_ms > 0 else 0.0
    return max(0.0, after - before)


def _need(s: Snapshot) -> tuple[UnitState, EngineOption] | None:
    """The unit a blocked pipeline would grow (largest B_k / S_k below its max, with an
    option) and its fastest option."""
    for u in sorted(s.units, key=lambda u: (-effective_bottleneck(u), u.index)):
        if u.max_instances is not None and u.total_instances >= u.max_instances:
            continue
        if u.options:
            return u, min(u.options, key=lambda o: o.latency_ms)
    return None


def _short(s: Snapshot, o: EngineOption) -> dict[str, float]:
    """What the cap lacks for one more instance of option ``o``: resource -> amount."""
    cap: ResourceCap = s.cap
    short: dict[str, float] = {}
    mem = cap.memory_used_mb + o.memory_mb - cap.memory_cap_mb
    if mem > EPS:
        short["memory"] = mem
    if cap.cores and o.cores and s.cores_used + o.cores > cap.cores:
        short["cores"] = float(s.cores_used + o.cores - cap.cores)
    slots = cap.max_instances.get(o.engine)
    if slots is not None and s.instances_used.get(o.engine, 0) + 1 > slots:
        short[f"{o.engine} slots"] = 1.0
    return short


def _tail_short(s: Snapshot, u: UnitState) -> bool:
    """Whether ``u`` with one instance fewer would have its approximate P99 out of its SLO
    share at the offered load (False with no measured service time or one instance)."""
    svc = instance_ms(u)
    if u.service_ms is None or svc is None or u.total_instances <= 1:
        return False
    return p99_needed(s, u, s.offered * fan_out(u, s), svc) > u.total_instances - 1


def _blocked_bottleneck(s: Snapshot) -> tuple[UnitState, float] | None:
    """The :func:`_need` unit and its per-instance service time, ms, when measured, traffic is
    offered and the cap has no room for one more; else None."""
    need = _need(s)
    if need is None:
        return None
    u, o = need
    svc = instance_ms(u)
    if u.service_ms is None or svc is None or s.offered <= 0 or not _short(s, o):
        return None
    return u, svc


def pressure_ahead(s: Snapshot, calm_ratio: float = 0.8) -> str | None:
    """Why a pipeline at the cap will miss its SLO before its P99 shows it (None: it will not
    or cannot be told): its bottleneck needs more instances than it runs for its P99 share
    (M/D/c), the cap has no room, and its P99 (if any) is above ``calm_ratio`` x SLO.
    Rule 2 lends on this from a strictly lower pipeline only."""
    blocked = _blocked_bottleneck(s)
    if blocked is None:
        return None
    u, svc = blocked
    if s.p99_ms is not None and s.p99_ms <= calm_ratio * s.slo_ms + EPS:
        return None
    needed = p99_needed(s, u, s.offered * fan_out(u, s), svc)
    if needed <= u.total_instances:
        return None  # 0: no count keeps it within the SLO; the violation rule decides
    return (
        f"{_n(s.offered)} req/s needs {needed} instances of {u.name} for its P99 within "
        f"the SLO {_n(s.slo_ms)} ms, it runs {u.total_instances}"
    )


def needs_look(
    views: list[PipelineView],
    state: ArbitrationState,
    config: ArbitrationConfig = ArbitrationConfig(),  # noqa: B008 (frozen)
) -> bool:
    """Whether :func:`arbitrate` may move anything (a cheap gate; False never hides a move):
    two or more pipelines, and a loan in force, or one blocked, under
    :func:`pressure_ahead`, or wanting a spare above a strictly lower one."""
    if len(views) < 2:
        return False
    if state.loans:
        return True
    lowest = max(v.priority for v in views)
    for v in views:
        if v.blocked:
            return True
        if not v.violated and pressure_ahead(v.snapshot, config.release_ratio) is not None:
            return True
        if not (config.spare and v.priority < lowest and not v.violated):
            continue
        if wants_spare(v.snapshot) is not None:
            return True
    return False


def wants_spare(s: Snapshot) -> str | None:
    """Why a pipeline at the cap has no spare instance (None: it has one, room, or cannot be
    told): its bottleneck runs no more than the M/D/c model needs for its P99 share and the
    cap has no room. Rule 4 acts on this."""
    blocked = _blocked_bottleneck(s)
    if blocked is None:
        return None
    u, svc = blocked
    needed = p99_needed(s, u, s.offered * fan_out(u, s), svc)
    if needed == 0 or u.total_instances > needed:
        return None
    return (
        f"{_n(s.offered)} req/s needs {needed} instances of {u.name} for its P99 within "
        f"the SLO {_n(s.slo_ms)} ms, it runs {u.total_instances}: no spare at the cap"
    )


def _has_slack(d: PipelineView, du: UnitState, c: ArbitrationConfig) -> bool:
    """Whether ``d`` may give one instance of ``du``: not violated, P99 within
    ``donor_p99_ratio`` x SLO, above its minimum, and :func:`_tail_short` false."""
    ds = d.snapshot
    if d.violated or du.total_instances <= du.min_instances:
        return False
    if ds.p99_ms is not None and ds.p99_ms > c.donor_p99_ratio * ds.slo_ms + EPS:
        return False
    return not _tail_short(ds, du)


def _best_spare(views: list[PipelineView], takers: set[str], c: ArbitrationConfig) -> Move | None:
    """Rule 4: the highest unpressed pipeline without a loan that :func:`wants_spare` takes one
    bottleneck instance from a strictly lower pipeline with slack whose stop frees what the
    cap lacks; no loan is recorded. None: no such pair."""
    for r in sorted(views, key=lambda v: (v.priority, v.name)):
        why = None if (r.violated or r.blocked or r.name in takers) else wants_spare(r.snapshot)
        if why is None:
            continue
        ru, ro = _need(r.snapshot) or (None, None)
        if ru is None or ro is None:
            continue
        short = _short(r.snapshot, ro)
        best: tuple[tuple, Move] | None = None
        for d in views:
            if d.priority <= r.priority or d.name in takers:
                continue
            ds = d.snapshot
            for du in ds.units:
                if not _has_slack(d, du, c):
                    continue
                for do, after in _freeing(ds, du, ro, short):
                    if after is not None and ds.offered > c.donor_load * after + EPS:
                        continue
                    key = (-d.priority, d.name, du.index, do.engine)
                    if best is not None and key >= best[0]:
                        continue
                    gain = _added(r.snapshot, ru, ro)
                    load = "" if after is None else f" ({_n(ds.offered)} req/s on {_n(after)})"
                    lacks = ", ".join(f"{k} {_n(v)}" for k, v in short.items())
                    reason = (
                        f"{r.name} (priority {r.priority}) {why} (lacks {lacks}); "
                        f"{d.name} (priority "
                        f"{d.priority}) has slack{load} and gives one {do.engine} instance "
                        f"of {du.name} ({du.total_instances} -> {du.total_instances - 1}); "
                        f"{r.name} takes one {ro.engine} instance of {ru.name} as a warm "
                        f"spare (+{_n(gain)} req/s of capacity)"
                    )
                    move = Move(
                        "spare",
                        d.name,
                        du.index,
                        do.engine,
                        r.name,
                        ru.index,
                        ro.engine,
                        next(iter(short)),
                        gain,
                        gain,
                        reason,
                    )
                    best = (key, move)
        if best is not None:
            return best[1]
    return None


def _freeing(
    ds: Snapshot, du: UnitState, take: EngineOption, short: dict[str, float]
) -> Iterator[tuple[EngineOption, float | None]]:
    """Options of donor unit ``du`` whose stop frees ``short`` for ``take``, each with the
    donor's capacity after the stop (req/s; None: unbounded)."""
    for do in du.options:
        if du.instances.get(do.engine, 0) <= 0:
            continue
        freed = _frees(do, take)
        if any(freed.get(k, 0.0) + EPS < v for k, v in short.items()):
            continue
        yield do, pipeline_capacity_rps(_with(ds, du.index, do.engine, -1))


def _frees(o: EngineOption, take: EngineOption) -> dict[str, float]:
    """What stopping one instance of option ``o`` releases, in the terms of ``_short``."""
    freed = {"memory": o.memory_mb, "cores": float(o.cores)}
    freed[f"{take.engine} slots"] = 1.0 if o.engine == take.engine else 0.0
    return freed


def _best_lend(
    views: list[PipelineView], takers: set[str], c: ArbitrationConfig
) -> tuple[Move, int] | None:
    """The best rule-2 lend and the taker unit's count after it (None: none)."""
    best: tuple[tuple, Move, int] | None = None
    for r in views:
        # violated and not blocked: its own scaler acts, or counts its sustain first
        pressed = r.blocked and r.violated
        ahead = None if r.violated else pressure_ahead(r.snapshot, c.release_ratio)
        if not pressed and ahead is None:
            continue
        need = _need(r.snapshot)
        if need is None:
            continue
        ru, ro = need
        short = _short(r.snapshot, ro)
        if not short:
            continue  # refused by something a move does not free (busy cores, own cores)
        resource = (
            next(k for k in ("memory", "cores") if k in short)
            if ("memory" in short or "cores" in short)
            else next(iter(short))
        )
        cost = {"memory": ro.memory_mb, "cores": float(ro.cores)}.get(resource, 1.0)
        rs = r.snapshot
        r_gain = _added(rs, ru, ro)
        for d in views:
            if d.name == r.name or d.priority < r.priority:
                continue
            # a strictly lower pipeline yields whatever its state; an equal one its slack
            yields = d.priority > r.priority
            if ahead is not None and not yields:
                continue  # ahead of a violation, only a strictly lower pipeline gives
            ds = d.snapshot
            if not yields and (
                d.violated
                or d.name in takers
                or (ds.p99_ms is not None and ds.p99_ms > c.donor_p99_ratio * ds.slo_ms + EPS)
            ):
                continue
            for du in ds.units:
                if du.total_instances <= du.min_instances:
                    continue
                for do, after in _freeing(ds, du, ro, short):
                    if not yields and (
                        (after is not None and ds.offered > c.donor_load * after + EPS)
                        or _tail_short(ds, du)
                    ):
                        continue
                    loss = _served(ds, pipeline_capacity_rps(ds)) - _served(ds, after)
                    gain = r_gain - (0.0 if yields else loss)
                    if gain <= EPS:
                        continue
                    per = gain / max(cost, EPS)
                    key = (r.priority, -d.priority, -per, r.name, d.name, du.index)
                    if best is not None and key >= best[0]:
                        continue
                    unit_word = {"memory": "MB", "cores": "core"}.get(resource, "slot")
                    lacks = ", ".join(f"{k} {_n(v)}" for k, v in short.items())
                    load = (
                        f"{_n(ds.offered)} req/s on {_n(after)} req/s after"
                        if after is not None
                        else f"{_n(ds.offered)} req/s"
                    )
                    p99 = "no P99" if ds.p99_ms is None else f"P99 {_n(ds.p99_ms)} ms"
                    viol = (
                        ahead
                        if ahead is not None
                        else f"P99 {_n(rs.p99_ms)} ms > SLO {_n(rs.slo_ms)} ms"
                        if rs.p99_ms is not None and rs.p99_ms > rs.slo_ms
                        else f"SLO {_n(rs.slo_ms)} ms missed"
                    )
                    reason = (
                        f"{r.name} (priority {r.priority}) {viol} at the cap (lacks {lacks}); "
                        f"{d.name} (priority {d.priority}, {p99}, SLO {_n(ds.slo_ms)} ms) "
                        f"gives one {do.engine} instance of {du.name} "
                        f"({du.total_instances} -> {du.total_instances - 1}, min "
                        f"{du.min_instances}; {load}) freeing {_n(do.memory_mb)} MB, "
                        f"{do.cores} cores; {r.name} takes one {ro.engine} instance of "
                        f"{ru.name} ({_n(ro.memory_mb)} MB, {ro.cores} cores): "
                        f"+{_n(gain)} req/s goodput, {_n(per)} req/s per {unit_word} of "
                        f"{resource}"
                    )
                    move = Move(
                        "lend",
                        d.name,
                        du.index,
                        do.engine,
                        r.name,
                        ru.index,
                        ro.engine,
                        resource,
                        gain,
                        per,
                        reason,
                    )
                    best = (key, move, ru.total_instances + 1)
    return None if best is None else (best[1], best[2])
