"""The Tuner: scale out when the arrival envelope exceeds what the configuration sustains
(InferLine, SoCC '20, §5 Algorithm 3): the observed envelope over :data:`WINDOWS_S`
against the planned ``Q(rho mu w) + mu (SLO - T) / 1000`` (:func:`planned_envelope`).
:func:`scale_out_now` returns a :class:`TunerVerdict`. Pure: no clock, no I/O. In full:
docs/scaling.md, "The Tuner's envelope in full"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from infscaler.runtime.queueing import EPS, drain_backlog, max_rate_within
from infscaler.runtime.scaling.cores import SATURATED_FREE_PER_THREAD, refusals
from infscaler.runtime.scaling.scaler import scale_out_choice
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

#: Window lengths of the envelope, s (ascending).
WINDOWS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0)
#: InferLine's max-provisioning ratio: the configuration is planned for ``rho x mu``.
TUNER_RHO = 0.75
#: Probability that a window of the planned Poisson trace exceeds its planned count.
TUNER_TAIL = 1e-4
#: The shortest window that counts as a sustained rate (the scale-in guard, below), s.
SUSTAINED_MIN_S = 1.0
_TIE_S = 1e-9


@dataclass(frozen=True)
class TunerVerdict:
    """What :func:`scale_out_now` decided.

    Attributes:
        decision: a ``scale_out`` (None: no action).
        reason: the decision's reason, or why nothing is done ("" within the envelope).
        blocked: the envelope was exceeded and the cap refused every unit.
        exceeded: the window that triggered (the largest rate), if any.
        count: instances asked for at once (0 without a decision).
        needed: instances the unit needs for ``required_rps`` (0 without a decision).
        required_rps: the capacity the observed envelope asks for, requests/s (None: not
            exceeded)."""

    decision: Decision | None
    reason: str = ""
    blocked: bool = False
    exceeded: Exceedance | None = None
    count: int = 0
    needed: int = 0
    required_rps: float | None = None


@dataclass(frozen=True)
class Exceedance:
    """One window where the observed envelope exceeds the planned one: its length ``window_s``
    (s), the ``observed`` arrivals and the planned ``sustainable`` count."""

    window_s: float
    observed: int
    sustainable: float

    @property
    def rate_rps(self) -> float:
        """The observed rate in this window, requests/s (InferLine's ``r_obs``)."""
        return self.observed / self.window_s


def envelope(
    times: Sequence[float] | np.ndarray, windows: Sequence[float] = WINDOWS_S
) -> tuple[int, ...]:
    """The arrival envelope (InferLine §5, Fig. 4): per window length ``w``, the most arrivals
    in any ``[t, t + w)`` starting at an arrival (1 ns tolerance at the end).

    Args:
        times: arrival times, s (any origin). windows: lengths, s (> 0).

    Returns:
        One count per window, in the order given.

    Raises:
        ValueError: a window <= 0 s."""
    t = np.sort(np.asarray(times, dtype=float))
    out = []
    for w in windows:
        if not w > 0:
            raise ValueError(f"a window must be > 0 s, got {w}")
        if t.size == 0:
            out.append(0)
            continue
        ends = np.searchsorted(t, t + w - _TIE_S, side="left")
        out.append(int((ends - np.arange(t.size)).max()))
    return tuple(out)


def service_time_ms(snapshot: Snapshot) -> float:
    """The pipeline's service time ``T``, ms: the sum of its units' service times (a
    unit's P50, else its fastest option's latency; 0 for a unit with neither)."""
    return sum(unit_service_ms(u) or 0.0 for u in snapshot.units)


def slo_rate_rps(snapshot: Snapshot) -> float | None:
    """The largest pipeline rate, requests/s, at which every unit's approximate P99 (M/D/c at
    its running instances) stays within its SLO share, the least over the units
    (InferLine §4.2); None when no unit bounds it."""
    best: float | None = None
    for u in snapshot.units:
        f = fan_out(u, snapshot)
        svc = instance_ms(u)
        if unit_service_ms(u) is None or svc is None or f <= 0:
            continue
        budget = budget_ms(snapshot, u)
        if budget < svc:
            continue
        rate = max_rate_within(u.total_instances, svc, budget) / f
        best = rate if best is None else min(best, rate)
    return best


def poisson_quantile(mean: float, tail: float) -> int:
    """The least ``k`` with ``P(N > k) <= tail`` for ``N ~ Poisson(mean)`` (exact: the
    pmf summed from the far tail down, in log space; ``O(sqrt(mean))`` terms).

    Raises:
        ValueError: a negative ``mean`` or ``tail`` outside (0, 1).
    """
    if not mean >= 0:
        raise ValueError(f"mean must be >= 0, got {mean}")
    if not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail}")
    if mean == 0:
        return 0
    log_m = math.log(mean)
    above = 0.0  # P(N >= j)
    j = int(math.ceil(mean + 12.0 * math.sqrt(mean) + 20.0))
    while j > 0:
        above += math.exp(j * log_m - mean - math.lgamma(j + 1.0))
        if above > tail:  # P(N >= j) > tail >= P(N >= j + 1)
            return j
        j -= 1
    return 0


def _planned(mu: float, w: float, burst_ms: float, rho: float, tail: float | None) -> float:
    """``Q(rho mu w)`` plus the backlog ``mu`` drains within ``burst_ms`` (SLO - T)."""
    m = rho * mu * w
    return (m if tail is None else float(poisson_quantile(m, tail))) + drain_backlog(mu, burst_ms)


def planned_envelope(
    capacity_rps: float,
    slo_ms: float,
    service_ms: float,
    windows: Sequence[float] = WINDOWS_S,
    rho: float = TUNER_RHO,
    tail: float | None = TUNER_TAIL,
) -> tuple[float, ...]:
    """What the configuration was planned for per window:
    ``Q(rho mu w) + mu max(0, SLO - T) / 1000`` requests (``mu``: ``capacity_rps``; ``T``:
    ``service_ms``; ``tail`` None: the deterministic ``rho mu w``).

    Raises:
        ValueError: ``rho`` outside (0, 1], ``tail`` outside (0, 1) or a negative capacity."""
    _check(rho, tail)
    if not capacity_rps >= 0:
        raise ValueError(f"capacity_rps must be >= 0, got {capacity_rps}")
    return tuple(_planned(capacity_rps, w, slo_ms - service_ms, rho, tail) for w in windows)


def _check(rho: float, tail: float | None) -> None:
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    if tail is not None and not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail}")


def exceedances(
    observed: Sequence[int], planned: Sequence[float], windows: Sequence[float] = WINDOWS_S
) -> list[Exceedance]:
    """The windows where ``observed`` > ``planned`` (InferLine Algorithm 3, lines 3-6)."""
    return [
        Exceedance(w, int(q), float(p))
        for w, q, p in zip(windows, observed, planned, strict=True)
        if q > p + 1e-9
    ]


def required_capacity_rps(
    observed: Sequence[int],
    slo_ms: float,
    service_ms: float,
    windows: Sequence[float] = WINDOWS_S,
    rho: float = TUNER_RHO,
    tail: float | None = TUNER_TAIL,
) -> float:
    """The least capacity ``mu`` (requests/s) whose :func:`planned_envelope` covers
    ``observed`` at every window (closed form, or bisection to 1e-3 with ``tail``).

    Raises:
        ValueError: ``rho`` or ``tail`` out of range."""
    _check(rho, tail)
    burst_s = max(0.0, slo_ms - service_ms) / 1000.0
    need = 0.0
    for w, q in zip(windows, observed, strict=True):
        hi = q / (rho * w + burst_s)  # the deterministic answer: Q(m) >= m at most this
        if tail is None or q <= 0:
            need = max(need, hi)
            continue
        lo = 0.0
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2.0
            if _planned(mid, w, slo_ms - service_ms, rho, tail) >= q:
                hi = mid
            else:
                lo = mid
        need = max(need, hi)
    return need


def _new_instance_items(u: UnitState, o: EngineOption) -> float:
    """Items/s one more instance of ``u`` on ``o`` serves (as the scaler's ``_pick`` gains)."""
    lat = o.latency_ms
    if o.engine == "cpu":
        lat = service_ms_at(u, o.cores or u.min_threads) or lat
    return 1000.0 / lat if lat > 0 else math.inf


def _with_one_more(s: Snapshot, u: UnitState, o: EngineOption) -> tuple[Snapshot, UnitState]:
    """``s`` and ``u`` once one more instance of ``u`` runs on ``o``: memory, slot and pinned
    threads in use, its threads counted busy at the saturation rule's share."""
    instances = {**u.instances, o.engine: u.instances.get(o.engine, 0) + 1}
    threads = dict(u.threads)
    if o.engine == "cpu" and threads:
        t = o.cores or u.min_threads
        threads[t] = threads.get(t, 0) + 1
    u2 = replace(u, instances=instances, threads=threads)
    cap = replace(s.cap, memory_used_mb=s.cap.memory_used_mb + o.memory_mb)
    used = {**s.instances_used, o.engine: s.instances_used.get(o.engine, 0) + 1}
    busy = s.cores_busy
    if busy is not None and o.engine == "cpu":
        busy += SATURATED_FREE_PER_THREAD * o.cores
    s2 = replace(
        s,
        cap=cap,
        instances_used=used,
        cores_used=s.cores_used + (o.cores if o.engine == "cpu" else 0),
        cores_busy=busy,
        units=tuple(u2 if v.index == u.index else v for v in s.units),
    )
    return s2, u2


def instances_for(
    s: Snapshot,
    u: UnitState,
    o: EngineOption,
    required_rps: float,
    config: ScalerConfig = ScalerConfig(),  # noqa: B008 (frozen: an immutable default)
    p99_rps: float | None = None,
) -> tuple[int, int, str]:
    """How many instances of ``u`` on ``o`` to start at once for ``required_rps``
    (InferLine §5, Algorithm 3 lines 9-13), with ``p99_rps`` also for the unit's P99; as many
    as ``max_instances`` and the cap admit (the first assumed admitted).

    Returns:
        ``(count, needed, why)``: instances to start (>= 1), the count ``u`` would have with
        all it needs, and why fewer are started ("" when none is held back)."""
    f = fan_out(u, s)
    f = f if f > 0 else 1.0
    have = capacity_items(u) / f
    gain = _new_instance_items(u, o) / f
    short = required_rps - have
    more = 1 if not math.isfinite(have) or short <= 0 else max(1, math.ceil(short / gain - EPS))
    svc = instance_ms(u)
    if p99_rps is not None and svc is not None:
        more = max(more, p99_needed(s, u, p99_rps * f, svc) - u.total_instances)
    needed = u.total_instances + more
    count, why = 1, ""
    s2, u2 = _with_one_more(s, u, o)
    while count < more:
        if u.max_instances is not None and u2.total_instances >= u.max_instances:
            why = f"{u.name} is at its max_instances {u.max_instances}"
            break
        refused = refusals(s2, u2, o, config)
        if refused:
            why = f"{o.engine} refuses instance {u2.total_instances + 1}: {' and '.join(refused)}"
            break
        count += 1
        s2, u2 = _with_one_more(s2, u2, o)
    return count, needed, why


def scale_out_now(
    snapshot: Snapshot,
    times: Sequence[float] | np.ndarray,
    state: ScalerState,
    config: ScalerConfig = ScalerConfig(),  # noqa: B008 (frozen: an immutable default)
    windows: Sequence[float] = WINDOWS_S,
    rho: float = TUNER_RHO,
    tail: float | None = TUNER_TAIL,
    p99: bool = True,
) -> TunerVerdict:
    """Whether to scale out now, before the P99 shows it (InferLine's Tuner).

    ``times``: offered arrival times since the last change (the snapshot's clock). Nothing
    within ``cooldown_s`` of the last scale-out or ``settle_s`` of the last change, nor with
    no capacity known. Where the observed envelope exceeds the planned one (rate
    ``rho x mu``, or with ``p99`` the lower :func:`slo_rate_rps`), Algorithm 1's unit and
    engine get every instance the envelope needs at once, within ``max_instances`` and the
    cap.

    Returns:
        A :class:`TunerVerdict`."""
    now = snapshot.now
    if state.last_scale_out is not None and now - state.last_scale_out < config.cooldown_s:
        return TunerVerdict(None, "within the cooldown of the last scale-out")
    if state.last_change is not None and now - state.last_change < config.settle_s:
        return TunerVerdict(None, "within the settle window of the last change")
    mu = pipeline_capacity_rps(snapshot)
    if mu is None or mu <= 0:
        return TunerVerdict(None, "no capacity known")
    svc = service_time_ms(snapshot)
    observed = envelope(times, windows)
    plan_mu = mu
    slo_rps = slo_rate_rps(snapshot) if p99 else None
    if slo_rps is not None and slo_rps < rho * mu:
        plan_mu = slo_rps / rho
    planned = planned_envelope(plan_mu, snapshot.slo_ms, svc, windows, rho, tail)
    over = exceedances(observed, planned, windows)
    if not over:
        return TunerVerdict(None)
    worst = max(over, key=lambda e: e.rate_rps)
    sustained = max(
        (q / w for w, q in zip(windows, observed, strict=True) if w >= SUSTAINED_MIN_S),
        default=worst.rate_rps,
    )
    at = (
        f"rho {rho:g} x capacity {mu:.3g} requests/s"
        if plan_mu == mu
        else f"{rho * plan_mu:.3g} requests/s, where the P99 reaches the SLO (< rho {rho:g} x "
        f"capacity {mu:.3g} requests/s)"
    )
    seen = (
        f"arrival envelope {worst.observed} requests in {worst.window_s:g} s > "
        f"{worst.sustainable:.2f} planned ({'Poisson' if tail else 'rate'} at {at} over "
        f"{worst.window_s:g} s, + burst {plan_mu:.3g} x (SLO {snapshot.slo_ms:g} - service "
        f"{svc:.3g} ms)); rate {worst.rate_rps:.3g} requests/s, sustained "
        f"{sustained:.3g} requests/s"
    )
    out, passed = scale_out_choice(snapshot, state, config, sustained)
    if out is None:
        why = f"{seen}; no unit to scale: {'; '.join(passed) or 'none'}"
        # blocked by the cap only where a unit short of capacity was refused
        capped = any("is not short of capacity" not in p for p in passed)
        return TunerVerdict(None, why, blocked=capped, exceeded=worst)
    if out.action != "scale_out":
        return TunerVerdict(None, f"{seen}; the scaler's pick is a thread step", exceeded=worst)
    u = next(x for x in snapshot.units if x.index == out.unit)
    o = min((x for x in u.options if x.engine == out.engine), key=lambda x: (x.latency_ms, x.cores))
    need_rps = required_capacity_rps(observed, snapshot.slo_ms, svc, windows, rho, tail)
    count, needed, held = instances_for(
        snapshot,
        u,
        o,
        need_rps,
        config,
        p99_rps=max(rho * need_rps, worst.rate_rps) if p99 else None,
    )
    plan = (
        f"{u.name} needs {needed} instance(s) for {need_rps:.3g} requests/s (the capacity "
        f"whose planned envelope covers the observed one); +{count} on {out.engine}"
        + (f" ({held})" if held else "")
    )
    reason = f"{seen}; {plan} (Algorithm 1's pick)"
    d = Decision("scale_out", unit=out.unit, engine=out.engine, reason=reason)
    return TunerVerdict(
        d, reason, exceeded=worst, count=count, needed=needed, required_rps=need_rps
    )
