"""Arbitration between pipelines under one device cap: a pure function from every
pipeline's snapshot to capacity moves.

:func:`arbitrate` takes a :class:`PipelineView` per auto-scaled pipeline (its last
snapshot, priority, whether it violates its SLO and is blocked by the cap), the
:class:`ArbitrationState` the previous call returned and an :class:`ArbitrationConfig`,
and returns at most one :class:`Move` (``lend`` or ``spare``: one ``scale_in`` of the
giver's unit, then one ``scale_out`` of the taker's, in that order, so the cap is never
exceeded; or ``return``: a loan given back) and the new state. Pure: no I/O, no clock.

Rules: a pipeline blocked at the cap takes one instance for its bottleneck unit from a
pipeline of strictly lower priority whatever its state, or from one of equal priority
only out of its slack (load, P99 and the scaler's P99 guard after the give); the loan
goes back after ``release_hold_s`` calm (hysteresis, InferLine §5). Candidates rank by
priority, then goodput gained per unit of the scarce resource. With no lend to make, a
pipeline at the cap that runs no more than the queueing model needs (no spare) takes a
strictly lower pipeline's slack instance as a warm spare (``spare``, no loan).
Capacities and P99s are the queueing model's (:mod:`infscaler.runtime.scaling.unitmodel`). Priorities as
Triton's priority levels (Triton docs, ``model_configuration.md``, "Priority"). The
rules in full and the runs behind them: docs/scaling.md, "Arbitration in full".
"""

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
        priority: its level, 1 the highest (a larger number is lower), the pipeline
            config's ``priority``.
        snapshot: what :func:`~infscaler.runtime.scaling.scaler.decide` got at its last
            look (its ``cap``, ``cores_used`` and ``instances_used`` are the device's).
        violated: its SLO counted as violated at that look
            (:func:`~infscaler.runtime.scaling.scaler.is_violated`).
        blocked: violated, and its own decision could not scale out: the cap refused
            every unit (it shed or would have).
    """

    name: str
    priority: int
    snapshot: Snapshot
    violated: bool = False
    blocked: bool = False


@dataclass(frozen=True)
class ArbitrationConfig:
    """Tuning of :func:`arbitrate`.

    Attributes:
        donor_load: a donor's offered load after the give is at most this fraction of
            its capacity then (0-1; the scaler's ``scale_in_utilisation`` default).
        donor_p99_ratio: a donor's P99 is at most this x its SLO (0-1).
        release_ratio: a taker is calm when its P99 <= this x SLO and its offered load
            <= this x its capacity without the borrowed instance (0-1; the scaler's
            ``LIFT_RATIO``).
        release_hold_s: how long a taker stays calm, without a break, before the
            instance goes back, s (InferLine's 15 s hold).
        spare: rule 4 on (a warm spare for a higher pipeline at the cap); False leaves
            lends and returns only (``INFSCALER_ARBITRATION=lend-only``, benchmarks).
    """

    donor_load: float = 0.6
    donor_p99_ratio: float = 0.8
    release_ratio: float = 0.8
    release_hold_s: float = 15.0
    spare: bool = True


@dataclass(frozen=True)
class Loan:
    """An instance lent: ``donor``'s unit ``donor_unit`` on ``donor_engine`` gave one so
    that ``taker``'s unit ``taker_unit`` could run one more on ``taker_engine``
    (``taker_count``: that unit's instances right after the move). ``calm_since``:
    ``now`` since which the taker has been calm without a break (None: not calm)."""

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
    """One capacity move, applied in this order: stop one instance of ``giver``'s unit
    ``give_unit`` on ``give_engine`` (when ``give`` is True) and wait for it to exit,
    then start one instance of ``taker``'s unit ``take_unit`` on ``take_engine``.

    Attributes:
        kind: ``lend`` (to a pipeline in violation, or ahead of one), ``return`` (a loan
            given back) or ``spare`` (a lower pipeline's slack instance to a higher one
            with none at the cap: no loan, the instance is the taker's).
        give: False for a return whose taker no longer holds the borrowed instance
            (its own scaler already gave it back): only the scale-out is applied.
        resource: the resource that binds: ``memory``, ``cores`` or ``<engine> slots``.
        gain_rps: goodput the move adds, requests/s (taker's gain less giver's loss).
        per_resource: ``gain_rps`` per MB, core or slot of ``resource``.
        reason: one sentence naming giver, taker, the resource and the figures.
    """

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

    Args:
        views: every auto-scaled pipeline deployed, each with its last snapshot.
        state: what the previous call returned (``ArbitrationState()`` the first time).
        config: the tuning.

    Returns:
        ``(moves, new_state)``: zero or one :class:`Move`, and the state to pass on
        (a lend adds a :class:`Loan`, a return removes it; loans whose pipelines are
        gone are dropped).

    Raises:
        ValueError: a ``config`` fraction outside (0, 1] or a negative hold.
    """
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
            # a lender as high as its taker needs its instance back: returned now, calm or
            # not (a lower lender waits: it yields to the higher taker, rule 2)
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
            # None: nothing to give back and the cap refuses the donor's instance:
            # the loan is over (the donor's own scaler grows it when it needs to)
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
    """The move giving ``loan`` back, ``why`` its reason's first words (None: the taker's
    own scaler already gave the instance back and the cap still refuses the donor's
    one)."""
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
    """Requests/s one more instance of ``u`` on ``o`` adds to the pipeline's capacity
    (:func:`pipeline_capacity_rps`; with no service time known anywhere, the new
    instance's own rate at ``o.latency_ms``)."""
    before = pipeline_capacity_rps(s)
    after = pipeline_capacity_rps(_with(s, u.index, o.engine, 1))
    if before is None or after is None:
        return 1000.0 / o.latency_ms if o.latency_ms > 0 else 0.0
    return max(0.0, after - before)


def _need(s: Snapshot) -> tuple[UnitState, EngineOption] | None:
    """The unit a blocked pipeline would grow (largest B_k / S_k below its
    ``max_instances``, with an engine option) and its fastest option."""
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
    """Whether ``u`` of pipeline ``s`` (a donor, or a taker giving a loan back), with one
    instance fewer, would keep its
    approximate P99 at the offered load out of its share of the SLO (the scaler's
    ``p99_needed`` above the instances left; the share depends on the other units'
    service times only). False when the unit has no measured service time, one instance
    or fewer, or an SLO share below its service time: the load rule alone decides then."""
    svc = instance_ms(u)
    if u.service_ms is None or svc is None or u.total_instances <= 1:
        return False
    return p99_needed(s, u, s.offered * fan_out(u, s), svc) > u.total_instances - 1


def _blocked_bottleneck(s: Snapshot) -> tuple[UnitState, float] | None:
    """The bottleneck unit of :func:`_need` and its per-instance service time, ms
    (:func:`~infscaler.runtime.scaling.unitmodel.instance_ms`), when its service time is
    measured, traffic is offered and the cap has no room for one more instance of its
    fastest option (:func:`_short`); else None."""
    need = _need(s)
    if need is None:
        return None
    u, o = need
    svc = instance_ms(u)
    if u.service_ms is None or svc is None or s.offered <= 0 or not _short(s, o):
        return None
    return u, svc


def pressure_ahead(s: Snapshot, calm_ratio: float = 0.8) -> str | None:
    """Why a pipeline at the cap will miss its SLO before its P99 shows it (None: it
    will not, or that cannot be told): its bottleneck unit (:func:`_need`) needs, at the
    offered load, more instances than it runs for its approximate P99 to stay within its
    share of the SLO (the scaler's M/D/c model, ``_p99_needed``, as the donor's guard),
    the cap has no room for one more (:func:`_short`), and its measured P99 (if any) is
    not calm: above ``calm_ratio`` x the SLO (``release_ratio``: a P99 that calm would
    give a loan back, so it does not take one).

    Rule 2 lends on this ahead of the violation, from a strictly lower pipeline only
    (why: docs/scaling.md, "Several pipelines: priorities and arbitration")."""
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
    """Whether :func:`arbitrate` may move anything: two or more pipelines and a loan in
    force, or one blocked at the cap, or under pressure ahead of a violation
    (:func:`pressure_ahead`), or one that :func:`wants_spare` above a strictly lower
    one. A cheap gate for the caller's loop; False never hides a move."""
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
    """Why a pipeline at the cap has no spare instance (None: it has one, has room
    under the cap, or that cannot be told): traffic measured on its bottleneck unit
    (:func:`_need`), which runs no more instances than the M/D/c model needs at the
    offered load for its approximate P99 to stay within its share of the SLO (the
    scaler's ``p99_needed``), and the cap has no room for one more (:func:`_short`).
    Rule 4 moves a lower pipeline's slack instance to it on this."""
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
    """Whether ``d`` has slack to give one instance of ``du`` (the load bound after the
    give is checked by the caller): not violated, P99 <= ``donor_p99_ratio`` x SLO (or
    none yet), the unit above its minimum and its approximate P99 with one instance
    fewer within its share of the SLO (the scaler's scale-in guard, :func:`_tail_short`)."""
    ds = d.snapshot
    if d.violated or du.total_instances <= du.min_instances:
        return False
    if ds.p99_ms is not None and ds.p99_ms > c.donor_p99_ratio * ds.slo_ms + EPS:
        return False
    return not _tail_short(ds, du)


def _best_spare(views: list[PipelineView], takers: set[str], c: ArbitrationConfig) -> Move | None:
    """Rule 4: a warm spare for a higher pipeline. The highest pipeline that is not
    pressed, is not holding a loan and :func:`wants_spare` takes one instance of its
    bottleneck unit from a strictly lower pipeline with slack (the equal-priority
    donor's test: :func:`_has_slack` and the load bound) whose stop frees what the cap lacks; no loan is
    recorded (the instance is the taker's now: its own scaler may scale it in after its
    hold, which frees the slot for any pipeline). None: no such pair."""
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
    """The options of donor unit ``du`` that run an instance whose stop frees at least
    ``short`` for ``take`` (:func:`_frees`), each with the donor's pipeline capacity
    after that stop (req/s, :func:`~.unitmodel.pipeline_capacity_rps`; None: unbounded)."""
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
    """The best lend of rule 2 and the taker unit's instance count after it (None: no
    pipeline is blocked, or no donor can cover what the cap lacks)."""
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
        # the taker misses its SLO: what it answers within the SLO is below what it is
        # offered, so its gain is the capacity the instance adds (0 when another unit
        # bounds the pipeline)
        r_gain = _added(rs, ru, ro)
        for d in views:
            if d.name == r.name or d.priority < r.priority:
                continue
            # a strictly lower pipeline yields what a higher one needs, flooded or not
            # (its own violation, load or loans cannot keep the cap from the higher one);
            # an equal one lends only its slack
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
