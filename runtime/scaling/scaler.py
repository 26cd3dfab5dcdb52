"""The asymmetric auto-scaler: a pure function from a metrics snapshot to decisions.

:func:`decide` maps ``(Snapshot, ScalerState, ScalerConfig)`` to
``(decisions, new_state)`` with no I/O and no clock; the autoscaler loop and the
planner's simulator call it alike (Ray Serve's autoscaling policy shape).

Sources: InfScaler §IV-A Algorithm 1 (scale out the unit with the largest B_k / S_k on
the first engine that admits it); InferLine (Crankshaw et al., SoCC '20) §5 Algorithm 4
(scale in with hysteresis), with the P99 guard of
:mod:`infscaler.runtime.scaling.unitmodel`. The rules added to the papers:
docs/scaling.md, "The scaler's rules in full"."""

from __future__ import annotations

import math
from dataclasses import replace

from infscaler.runtime.queueing import EPS
from infscaler.runtime.scaling.cores import beyond_cores, core_refusal, own_cores, refusals
from infscaler.runtime.scaling.demand import (
    blocked_why,
    is_trial,
    judge_trial,
    note_served,
    open_trial,
    trial_note,
    trial_wait,
)
from infscaler.runtime.scaling.types import (
    Decision,
    EngineOption,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)
from infscaler.runtime.scaling.unitmodel import (
    budget_ms,
    capacity_items,
    fan_out,
    instance_ms,
    p99_needed,
    pipeline_capacity_rps,
    service_ms_at,
    unit_service_ms,
)
from infscaler.runtime.serving.admission import SHED_MIN_LOAD

#: A ``shed`` bound is lifted once P99 is below this fraction of the SLO, or the offered
#: load below this fraction of the pipeline's capacity (hysteresis).
LIFT_RATIO = 0.8


def decide(
    snapshot: Snapshot,
    state: ScalerState,
    config: ScalerConfig = ScalerConfig(),  # noqa: B008 (frozen: an immutable default)
) -> tuple[list[Decision], ScalerState]:
    """Decide what to scale for one pipeline. Pure: no I/O, no clock.

    (1) ``(now, offered)`` joins ``state.rates`` and a due trial past the cores is judged;
    (2) on a violation, the delay logic, then Algorithm 1 (:func:`scale_out_choice`) or, the
    cap refusing every unit, a ``shed`` bound; (3) otherwise, after ``hold_s``, Algorithm 4's
    scale-in or a thread step back per unit, and a bound lifted. A look that waits says why
    in ``new_state.waiting``. In full: docs/scaling.md, "decide, step by step".

    Returns:
        ``(decisions, new_state)``: at most one scale-out or scale-up, or scale-ins /
        scale-downs (at most one per unit), plus at most one ``shed`` (set or lift).

    Raises:
        ValueError: a ``config`` value out of range."""
    _check_config(config)
    new = replace(state, rates=_offered_rates(snapshot, state, config), waiting=None)
    new = note_served(snapshot, new, config)
    violated = is_violated(snapshot, config)
    judged = judge_trial(snapshot, new, config, violated)
    if judged is not None:  # a revert's scale-in is this call's change
        if judged[0]:
            return judged
        state = new = judged[1]
    if violated:
        return _on_violation(snapshot, state, config, new)
    return _on_no_violation(snapshot, state, config, new)


def _offered_rates(
    s: Snapshot, state: ScalerState, c: ScalerConfig
) -> tuple[tuple[float, float], ...]:
    """``state.rates`` within ``rate_horizon_s`` of ``now``, then ``(now, offered)``."""
    now = s.now
    rates = tuple((t, r) for t, r in state.rates if now - t <= c.rate_horizon_s)
    return rates + ((now, s.offered),)


def _on_violation(
    s: Snapshot, state: ScalerState, c: ScalerConfig, new: ScalerState
) -> tuple[list[Decision], ScalerState]:
    """Step 2 of :func:`decide`: delay logic, then a scale-out / scale-up or the shed bound."""
    new = _apply_delay_logic(s, state, c, new)
    if new.waiting is not None:
        return [], new
    out, refused = scale_out_choice(s, state, c, max(r for _, r in new.rates))
    if out is not None:
        trial = open_trial(s, new, c, out) if is_trial(s, c, out) else None
        if trial is not None:
            out = replace(out, reason=f"{out.reason}; {trial_note(s, out)}")
        new = replace(new, last_scale_out=s.now, last_change=s.now, violating_since=None)
        return [out], replace(new, trial=trial)
    if not c.shed:
        return [], new
    return _shed_at_cap(s, state, c, new, refused)


def _apply_delay_logic(
    s: Snapshot, state: ScalerState, c: ScalerConfig, new: ScalerState
) -> ScalerState:
    """``new`` with ``waiting`` saying why a violation is not acted on yet (None: act): the
    settle window, ``sustain_s``, the cooldown or an open trial (Ray Serve's
    ``_apply_delay_logic``)."""
    settling = _settling(s, state, c)
    if settling is not None:
        return replace(new, violating_since=None, waiting=settling)
    since = s.now if state.violating_since is None else state.violating_since
    why = _sustain_or_cooldown(s, state, c, since) or trial_wait(s, state, c)
    return replace(new, violating_since=since, waiting=why)


def _sustain_or_cooldown(
    s: Snapshot, state: ScalerState, c: ScalerConfig, since: float
) -> str | None:
    """Why a counted violation waits (None: act): shorter than ``sustain_s`` since ``since``,
    or the last scale-out within ``cooldown_s``."""
    now = s.now
    if now - since < c.sustain_s - EPS:
        return (
            f"{_violation(s, c)} for {_n(now - since)} s < sustain_s "
            f"{_n(c.sustain_s)} s: waiting for it to persist"
        )
    if state.last_scale_out is not None and now - state.last_scale_out < c.cooldown_s:
        return (
            f"{_violation(s, c)}; {_n(now - state.last_scale_out)} s since "
            f"the last scale-out < cooldown_s {_n(c.cooldown_s)} s"
        )
    return None


def _shed_at_cap(
    s: Snapshot, state: ScalerState, c: ScalerConfig, new: ScalerState, refused: list[str]
) -> tuple[list[Decision], ScalerState]:
    """A ``shed`` at :func:`shed_queue_limit` when the cap refuses every unit (``refused``: why)
    and the bound differs from the one in force; none on refusals alone with no capacity
    known, or below :data:`SHED_MIN_LOAD` of the capacity."""
    limit, how = _shed_limit(s)
    p99 = s.p99_ms
    refusals_only = p99 is None or p99 <= c.violation_ratio * s.slo_ms
    rps = pipeline_capacity_rps(s)
    if refusals_only and rps is None:
        # admission already refuses what would miss the SLO
        return [], new
    if rps is not None and s.offered < SHED_MIN_LOAD * rps - EPS:
        # below capacity the violation is variance, not overload
        return [], new
    if limit == state.queue_limit:
        return [], new
    why = "; ".join(refused) if refused else "no unit to scale"
    shed = Decision(
        "shed",
        queue_limit=limit,
        reason=f"{_violation(s, c)}; cap reached, no unit can be "
        f"admitted: {why}; queue bounded at {limit} requests ({how})",
    )
    return [shed], replace(new, queue_limit=limit)


def _on_no_violation(
    s: Snapshot, state: ScalerState, c: ScalerConfig, new: ScalerState
) -> tuple[list[Decision], ScalerState]:
    """Step 3 of :func:`decide`: after ``hold_s``, :func:`_scale_in` at the horizon's largest
    rate; a bound in force lifted when :func:`_lift_reason` says so."""
    now = s.now
    decisions: list[Decision] = []
    new = replace(new, violating_since=None)
    if state.last_change is None or now - state.last_change > c.hold_s:
        lam = max(r for _, r in new.rates)
        ins = _scale_in(s, c, lam, state.last_change)
        if ins:
            decisions.extend(ins)
            new = replace(new, last_change=now)
    lift = _lift_reason(s) if state.queue_limit is not None else None
    if lift is not None:
        decisions.append(
            Decision(
                "shed",
                queue_limit=None,
                reason=f"{lift}: queue bound {state.queue_limit} lifted",
            )
        )
        new = replace(new, queue_limit=None)
    return decisions, new


def _settling(s: Snapshot, state: ScalerState, c: ScalerConfig) -> str | None:
    """Why a violation does not count yet (None: it counts): within ``settle_s`` of the last
    change."""
    last = state.last_change
    if last is None or not s.now - last < c.settle_s:
        return None
    return (
        f"{_violation(s, c)} within the settle window: {_n(s.now - last)} s since the "
        f"last change < settle_s {_n(c.settle_s)} s (instances may still be warming "
        f"up; not counted)"
    )


def _lift_reason(s: Snapshot) -> str | None:
    """Why a queue bound can go (step 3 of :func:`decide`), or None to keep it."""
    p99 = s.p99_ms
    if p99 is not None and p99 < LIFT_RATIO * s.slo_ms:
        return f"P99 {p99:.0f} ms < {LIFT_RATIO:g} x SLO {_n(s.slo_ms)} ms"
    rps = pipeline_capacity_rps(s)
    if rps is not None and s.offered <= LIFT_RATIO * rps + EPS:
        return f"offered load {_n(s.offered)} req/s <= {LIFT_RATIO:g} x capacity {_n(rps)} req/s"
    return None


#: A P99 over the SLO is a violation when ``P(X >= late)`` < this for
#: ``X ~ Binomial(answered, 0.01)`` (docs/scaling.md, "Auto-scaling and batching").
VIOLATION_SIGNIFICANCE = 0.01


def late_tail_probability(late: int, answered: int, quantile: float = 0.99) -> float:
    """``P(X >= late)`` for ``X ~ Binomial(answered, 1 - quantile)`` (exact).

    Raises:
        ValueError: a negative count, or ``late`` > ``answered``."""
    if answered < 0 or late < 0 or late > answered:
        raise ValueError(f"need 0 <= late <= answered, got {late}, {answered}")
    if late == 0:
        return 1.0
    p = 1.0 - quantile
    term = (1.0 - p) ** answered  # P(X = 0)
    below = 0.0
    for i in range(late):
        below += term
        term *= (answered - i) / (i + 1) * p / (1.0 - p)
    return max(0.0, 1.0 - below)


def is_violated(
    snapshot: Snapshot,
    config: ScalerConfig = ScalerConfig(),  # noqa: B008 (frozen: an immutable default)
) -> bool:
    """True when requests were refused at arrival for the SLO, or the P99 is above
    ``violation_ratio`` x SLO and, where the window's ``answered`` / ``late`` are known and
    ``violation_ratio`` >= 1, the late ones are beyond a 1 % tail
    (:data:`VIOLATION_SIGNIFICANCE`)."""
    if snapshot.slo_refused_rate > 0:
        return True
    p99 = snapshot.p99_ms
    if p99 is None or p99 <= config.violation_ratio * snapshot.slo_ms:
        return False
    n, late = snapshot.answered, snapshot.late
    if n is None or late is None or config.violation_ratio < 1.0 or n <= 0:
        return True
    return late_tail_probability(min(late, n), n) < VIOLATION_SIGNIFICANCE


def effective_bottleneck(unit: UnitState) -> float:
    """B_k / S_k (Algorithm 1, line 5); infinity with no running instance."""
    s = unit.total_instances
    return math.inf if s <= 0 else unit.bottleneck / s


def shed_queue_limit(snapshot: Snapshot) -> int:
    """The queue bound at the cap (Little's law), requests:
    ``max(1, floor(capacity_rps x slo_ms / 1000))``; ``max(1, pending)`` when capacity is
    unknown."""
    return _shed_limit(snapshot)[0]


# -- helpers ---------------------------------------------------------------------------------


def _check_config(c: ScalerConfig) -> None:
    if not c.violation_ratio > 0:
        raise ValueError(f"violation_ratio must be > 0, got {c.violation_ratio}")
    if c.core_cap not in ("demand", "threads"):
        raise ValueError(f"core_cap must be 'demand' or 'threads', got {c.core_cap!r}")
    for name in ("cooldown_s", "hold_s", "rate_horizon_s", "settle_s", "sustain_s", "trial_s"):
        if not getattr(c, name) >= 0:
            raise ValueError(f"{name} must be >= 0 s, got {getattr(c, name)}")
    if not 0 < c.scale_in_utilisation <= 1:
        raise ValueError(f"scale_in_utilisation must be in (0, 1], got {c.scale_in_utilisation}")
    if not c.trial_gain >= 0 or not c.trial_backoff_s >= 0:
        raise ValueError(
            f"trial_gain and trial_backoff_s must be >= 0, got {c.trial_gain}, {c.trial_backoff_s}"
        )


def _n(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}"


def _mb(x: float) -> str:
    return f"{x:.6g}"


def _violation(s: Snapshot, c: ScalerConfig) -> str:
    slo = (
        f"SLO {_n(s.slo_ms)} ms"
        if c.violation_ratio == 1
        else f"{c.violation_ratio:g} x SLO {_n(s.slo_ms)} ms"
    )
    if s.p99_ms is not None and s.p99_ms > c.violation_ratio * s.slo_ms:
        return f"P99 {s.p99_ms:.0f} ms > {slo}"
    return f"{s.slo_refused_rate:.2f} requests/s refused at arrival: they could not meet the {slo}"


#: A unit other than the argmax is scaled only when its B_k/S_k is at least this
#: fraction of the largest (the planner's rule too).
NEXT_BEST_FRACTION = 0.5


def scale_out_choice(
    s: Snapshot, state: ScalerState, c: ScalerConfig, lam: float
) -> tuple[Decision | None, list[str]]:
    """Algorithm 1 with the next-best fallback, each unit's action by :func:`_pick`: the
    decision (None: the cap refuses every unit) and why the units before it were passed."""
    order = sorted(s.units, key=lambda u: (-effective_bottleneck(u), u.index))
    passed: list[str] = []
    top = effective_bottleneck(order[0]) if order else 0.0
    for u in order:
        eff = effective_bottleneck(u)
        who = f"{u.name} (B_k/S_k {_n(eff, 3)})"
        if passed and eff < NEXT_BEST_FRACTION * top:
            passed.append(f"{who} is below {NEXT_BEST_FRACTION:g} x the largest B_k/S_k")
            break
        beyond = beyond_cores(s, u)
        if passed or _refusals_only(s, c) or beyond is not None:
            idle = _not_short(s, c, u, lam)
            if idle is not None:
                passed.append(f"{who} {idle}" + (f" ({beyond})" if beyond else ""))
                continue
        up, up_why = _up_candidate(s, c, u)
        out, tried, bound = _apply_bounds(s, state, c, u)
        if out is None and up is None:
            msg = f"{who} {bound}"
            if up_why is not None:
                msg += f"; no thread scale-up: {up_why}"
            passed.append(msg)
            continue
        rank = "the largest" if not passed else "the next largest"
        before = f"; {'; '.join(passed)}" if passed else ""
        head = (
            f"{_violation(s, c)}{before}; {u.name} has {rank} B_k/S_k {_n(eff, 3)} "
            f"({_n(u.bottleneck, 3)}/{u.total_instances})"
        )
        return _pick(s, u, out, up, tried, up_why, head), passed
    return None, passed


def _apply_bounds(
    s: Snapshot, state: ScalerState, c: ScalerConfig, u: UnitState
) -> tuple[EngineOption | None, list[str], str]:
    """Where one more instance of ``u`` may go (Ray Serve's ``_apply_bounds``): its fastest
    option the cap admits, why the ones before it were refused, and why the unit cannot
    grow ("" when it can)."""
    if u.max_instances is not None and u.total_instances >= u.max_instances:
        at = f"at its max_instances {u.max_instances}"
        return None, [at], f"is {at}"
    if not u.options:
        return None, ["has no engine option"], "has no engine option"
    tried: list[str] = []
    for _, o in sorted(enumerate(u.options), key=lambda io: (io[1].latency_ms, io[0])):
        why = refusals(s, u, o, c, blocked_why(state, u.index, s.now))
        if not why:
            return o, tried, ""
        tried.append(f"{o.engine} refused: {' and '.join(why)}")
    return None, tried, f"fits no engine ({'; '.join(tried)})"


def _refusals_only(s: Snapshot, c: ScalerConfig) -> bool:
    """The violation is requests refused at arrival, with P99 measured within the SLO."""
    return s.p99_ms is not None and s.p99_ms <= c.violation_ratio * s.slo_ms


def _not_short(s: Snapshot, c: ScalerConfig, u: UnitState, lam: float) -> str | None:
    """Why a non-argmax unit need not grow (None: it may): it already serves the max rate at
    utilisation <= ``scale_in_utilisation`` with its P99 in budget."""
    if u.service_ms is None or u.service_ms <= 0 or u.total_instances <= 0:
        return None
    f = fan_out(u, s)
    cap_items = capacity_items(u)
    busy = lam * f / cap_items
    if busy > c.scale_in_utilisation:
        return None
    svc = instance_ms(u)
    if svc is not None and p99_needed(s, u, lam * f, svc) > u.total_instances:
        return None
    return (
        f"is not short of capacity: max rate {_n(lam)} req/s x {_n(f)} items/req on "
        f"{_n(cap_items)} items/s runs at utilisation {busy:.2f} <= "
        f"{c.scale_in_utilisation:g} with its P99 within its share of the SLO (scale-in "
        f"would take one more back after the hold)"
    )


def _vertical(u: UnitState) -> str | None:
    """Why ``u`` cannot change threads at all (None: it may)."""
    if u.max_threads is None or u.max_threads <= u.min_threads:
        return "max_threads is not above threads"
    if set(u.instances) - {"cpu"} and any(n > 0 for e, n in u.instances.items() if e != "cpu"):
        return "it runs on an engine other than the cpu"
    if not any(n > 0 for n in u.threads.values()):
        return "no running cpu instance"
    return None


def _up_candidate(
    s: Snapshot, c: ScalerConfig, u: UnitState
) -> tuple[tuple[int, int, float, float] | None, str | None]:
    """One thread step for the thinnest cpu instance, ``((t, t2, svc_t, svc_t2), None)``, or
    ``(None, why not)`` (why None: the unit has no thread range)."""
    if u.max_threads is None or u.max_threads <= u.min_threads:
        return None, None
    bad = _vertical(u)
    if bad is not None:
        return None, bad
    t = min(k for k, n in u.threads.items() if n > 0)
    higher = sorted(k for k in u.latency_ms_by_threads if t < k <= u.max_threads)
    if not higher:
        return None, f"no measured latency above {t} thread(s) (max_threads {u.max_threads})"
    t2 = higher[0]
    svc_t, svc_t2 = service_ms_at(u, t), service_ms_at(u, t2)
    if svc_t is None or svc_t2 is None:
        return None, f"{t} thread(s) not measured"
    if not svc_t2 < svc_t:
        return None, (
            f"{t2} threads measured no faster than {t} "
            f"({_n(u.latency_ms_by_threads[t2])} vs {_n(u.latency_ms_by_threads[t])} ms)"
        )
    cap = s.cap
    if not cap.cores:
        return None, "the device counts no cpu cores (no budget to give threads from)"
    if not s.cores_used + (t2 - t) <= cap.cores:
        return None, f"cores {s.cores_used}+{t2 - t} > {cap.cores}"
    own = own_cores(s, u, t2 - t) or core_refusal(s, u, c, t2 - t)
    if own is not None:
        return None, own
    return (t, t2, svc_t, svc_t2), None


def _share(s: Snapshot, o: EngineOption) -> tuple[float, str]:
    """The largest share of a free resource one more instance on ``o`` takes, and which."""
    cap = s.cap
    shares = []
    free_mem = cap.memory_cap_mb - cap.memory_used_mb
    if o.memory_mb > 0:
        shares.append((o.memory_mb / free_mem if free_mem > 0 else math.inf, "memory", "MB"))
    free_slots = cap.max_instances[o.engine] - s.instances_used.get(o.engine, 0)
    shares.append((1 / free_slots if free_slots > 0 else math.inf, f"{o.engine} slots", ""))
    if cap.cores and o.cores:
        free_cores = cap.cores - s.cores_used
        shares.append((o.cores / free_cores if free_cores > 0 else math.inf, "cores", ""))
    share, what, _ = max(shares, key=lambda x: x[0])
    return share, what


def _pick(
    s: Snapshot,
    u: UnitState,
    out: EngineOption | None,
    up: tuple[int, int, float, float] | None,
    tried: list[str],
    up_why: str | None,
    head: str,
) -> Decision:
    """The action with the best gain (items/s) per share of the scarcest free resource: a new
    instance or one cpu instance's thread step; ties go to the scale-out."""
    cap = s.cap
    after = f"; {'; '.join(tried)}" if tried else ""
    out_score = up_score = -1.0
    out_txt = up_txt = ""
    if out is not None:
        lat = out.latency_ms
        if out.engine == "cpu":
            lat = service_ms_at(u, out.cores or u.min_threads) or lat
        gain = 1000.0 / lat if lat > 0 else math.inf
        share, what = _share(s, out)
        out_score = gain / share if share > 0 else math.inf
        fits = (
            f"memory {_mb(cap.memory_used_mb)}+{_mb(out.memory_mb)} <= "
            f"{_mb(cap.memory_cap_mb)} MB, {out.engine} slots "
            f"{s.instances_used.get(out.engine, 0)}+1 <= {cap.max_instances[out.engine]}"
        )
        if cap.cores:
            fits += f", cores {s.cores_used}+{out.cores} <= {cap.cores}"
        out_txt = (
            f"{out.engine} ({_n(out.latency_ms)} ms) admits it: {fits}; one more instance "
            f"adds {_n(gain)} items/s for {share:.0%} of the free {what}"
        )
    if up is not None:
        t, t2, svc_t, svc_t2 = up
        gain = 1000.0 / svc_t2 - 1000.0 / svc_t
        share = (t2 - t) / (cap.cores - s.cores_used)
        up_score = gain / share
        lat = u.latency_ms_by_threads
        up_txt = (
            f"one cpu instance {t} -> {t2} threads: {_n(svc_t)} -> {_n(svc_t2)} ms per item "
            f"(measured at load {_n(lat[t])} / {_n(lat[t2])} ms) adds {_n(gain)} items/s "
            f"for {share:.0%} of the free cores (cores {s.cores_used}+{t2 - t} <= "
            f"{cap.cores}; memory and slots unchanged after the swap)"
        )
    if out is not None and out_score >= up_score:
        alt = f"; rather than {up_txt}" if up is not None else ""
        if up is None and up_why is not None:
            alt = f"; no thread scale-up: {up_why}"
        return Decision(
            "scale_out",
            unit=u.index,
            engine=out.engine,
            reason=f"{head}{after}; {out_txt}{alt}",
        )
    assert up is not None
    if out is not None:
        alt = f"; rather than scale-out: {out_txt}"
    else:
        alt = f"; no scale-out: {'; '.join(tried)}" if tried else ""
    return Decision(
        "scale_up",
        unit=u.index,
        engine="cpu",
        threads=up[1],
        from_threads=up[0],
        reason=f"{head}; {up_txt}{alt}",
    )


def _shed_limit(s: Snapshot) -> tuple[int, str]:
    rps = pipeline_capacity_rps(s)
    if rps is None or not math.isfinite(rps * s.slo_ms):
        limit = max(1, s.pending)
        return limit, f"capacity unknown: {s.pending} requests pending"
    limit = max(1, math.floor(rps * s.slo_ms / 1000.0 + EPS))
    return limit, (f"Little's law: capacity {_n(rps)} req/s x SLO {_n(s.slo_ms / 1000.0)} s")


def _scale_in(s: Snapshot, c: ScalerConfig, lam: float, last: float | None) -> list[Decision]:
    """InferLine Algorithm 4: one instance back from each over-provisioned unit."""
    out: list[Decision] = []
    quiet = "no change yet" if last is None else f"no change for {_n(s.now - last)} s"
    for u in s.units:
        svc = unit_service_ms(u)
        running = {e: n for e, n in u.instances.items() if n > 0}
        if svc is None or not running:
            continue
        f = fan_out(u, s)
        items = lam * f
        needed = max(0, math.ceil(items * svc / 1000.0 / c.scale_in_utilisation - EPS))
        tail = p99_needed(s, u, items, svc)
        keep = max(needed, tail, u.min_instances)
        if u.total_instances <= keep:
            down = _scale_down(s, c, u, lam, quiet)
            if down is not None:
                out.append(down)
            continue
        lat = {o.engine: o.latency_ms for o in u.options}
        engine = max(running, key=lambda e: (lat.get(e, math.inf), e))
        slow = f"{_n(lat[engine])} ms" if engine in lat else "no profiled latency"
        reason = (
            f"{quiet} > hold {_n(c.hold_s)} s; {u.name}: max rate {_n(lam)} req/s over "
            f"{_n(c.rate_horizon_s)} s x {_n(f)} items/req = {_n(items)} items/s x "
            f"{_n(svc)} ms needs {needed} instance(s) at utilisation <= "
            f"{c.scale_in_utilisation:g} and {tail} for its P99 within "
            f"{_n(budget_ms(s, u))} ms (min {u.min_instances}); {u.total_instances} > "
            f"{keep}: one {engine} instance stops ({engine} is its slowest engine, {slow})"
        )
        out.append(Decision("scale_in", unit=u.index, engine=engine, reason=reason))
    return out


def _scale_down(
    s: Snapshot, c: ScalerConfig, u: UnitState, lam: float, quiet: str
) -> Decision | None:
    """The thread step back (Algorithm 4 applied to threads): the fattest cpu instance to the
    next measured count below it when the capacity after still serves the max rate at
    ``scale_in_utilisation``."""
    live = {t: n for t, n in u.threads.items() if n > 0}
    if not live or any(e != "cpu" and n > 0 for e, n in u.instances.items()):
        return None
    t = max(live)
    if t <= u.min_threads:
        return None
    lower = sorted(k for k in u.latency_ms_by_threads if u.min_threads <= k < t)
    if not lower:
        return None
    t2 = lower[-1]
    per = {k: service_ms_at(u, k) for k in {*live, t2}}
    if not all(per.values()):
        return None
    now_items = sum(n * 1000.0 / per[k] for k, n in live.items())  # type: ignore[operator]
    after = now_items - 1000.0 / per[t] + 1000.0 / per[t2]  # type: ignore[operator]
    f = fan_out(u, s)
    items = lam * f
    if not items <= c.scale_in_utilisation * after + EPS:
        return None
    n = u.total_instances
    if p99_needed(s, u, items, n * 1000.0 / after) > n:
        return None
    return Decision(
        "scale_down",
        unit=u.index,
        engine="cpu",
        threads=t2,
        from_threads=t,
        reason=(
            f"{quiet} > hold {_n(c.hold_s)} s; {u.name}: max rate {_n(lam)} req/s over "
            f"{_n(c.rate_horizon_s)} s x {_n(f)} items/req = {_n(items)} items/s <= "
            f"{c.scale_in_utilisation:g} x {_n(after)} items/s, its capacity with one cpu "
            f"instance {t} -> {t2} threads ({_n(per[t])} -> {_n(per[t2])} ms per item): "
            f"{t - t2} core(s) back"
        ),
    )
