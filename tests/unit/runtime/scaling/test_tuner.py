"""The Tuner (infscaler.runtime.scaling.tuner) on hand-computed envelopes: InferLine §5's
envelope and Algorithm 3's comparison with the configuration's planned envelope.

The configuration of every test: one cpu unit of one instance, 50 ms per request, so
capacity mu = 20 requests/s; SLO 90 ms, so the burst tolerance is mu x (90 - 50) / 1000 =
0.8 requests, and with rho = 0.75 the deterministic planned envelope (``tail=None``, no
Poisson quantile) is 15 w + 0.8: 0.25 s: 4.55, 0.5 s: 8.3, 1 s: 15.8, 2 s: 30.8, 5 s: 75.8.
The cases on hand-made (periodic) arrivals use it; the Poisson envelope (the default) has
its own tests after them. An SLO of 90 ms leaves one 50-ms instance 40 ms of queueing:
its approximate P99 reaches the SLO at about 1 request/s, so these cases test the
capacity rule alone (``p99=False``); the planned rate's P99 bound (the default) has its
own tests at the end, under an SLO of 300 ms."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from infscaler.runtime.queueing import p99_response_ms
from infscaler.runtime.scaling import tuner
from infscaler.runtime.scaling.scaler import decide
from infscaler.runtime.scaling.tuner import WINDOWS_S, envelope, exceedances
from infscaler.runtime.scaling.types import (
    EngineOption,
    ResourceCap,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)

CPU = EngineOption("cpu", latency_ms=50.0, memory_mb=100.0, cores=1)
CFG = ScalerConfig(settle_s=0.0, sustain_s=0.0)
PLANNED = (4.55, 8.3, 15.8, 30.8, 75.8)
# the deterministic envelope for the hand-made arrivals (module docstring)
planned_envelope = partial(tuner.planned_envelope, tail=None)
required_capacity_rps = partial(tuner.required_capacity_rps, tail=None)
scale_out_now = partial(tuner.scale_out_now, tail=None, p99=False)
poisson_scale_out_now = partial(tuner.scale_out_now, p99=False)


def snap(now: float, rate: float, p99: float | None = 70.0) -> Snapshot:
    u = UnitState(
        index=0,
        name="det",
        bottleneck=1.0,
        instances={"cpu": 1},
        options=(CPU,),
        arrival_rate=rate,
        service_ms=50.0,
    )
    cap = ResourceCap(memory_cap_mb=1000.0, memory_used_mb=100.0, max_instances={"cpu": 4})
    return Snapshot(
        now=now,
        slo_ms=90.0,
        p99_ms=p99,
        arrival_rate=rate,
        units=(u,),
        cap=cap,
        instances_used={"cpu": 1},
        answered=100,
        late=0,
    )


def periodic(start: float, stop: float, rate: float) -> np.ndarray:
    n = int(round((stop - start) * rate))
    return start + np.arange(n) / rate


def test_envelope_hand_computed() -> None:
    # 14 requests/s, evenly: a half-open window of w s holds ceil(14 w) of them
    assert envelope(periodic(0, 10, 14)) == (4, 7, 14, 28, 70)
    # a burst of 5 at 3.0 s in 2 requests/s: the short windows see the burst
    t = np.concatenate([periodic(0, 10, 2), [3.01, 3.02, 3.03, 3.04, 3.05]])
    assert envelope(t) == (6, 6, 7, 9, 15)  # [3, 3.25) holds 3.0 and the 5
    assert envelope([]) == (0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="window must be > 0"):
        envelope([1.0], (0.0,))


def test_planned_envelope_hand_computed() -> None:
    got = planned_envelope(20.0, 90.0, 50.0)
    assert got == pytest.approx(PLANNED)
    # no burst tolerance once the service time reaches the SLO
    assert planned_envelope(20.0, 40.0, 50.0, (1.0,)) == pytest.approx((15.0,))
    with pytest.raises(ValueError, match="rho"):
        planned_envelope(20.0, 90.0, 50.0, rho=0.0)


def test_steady_at_0_7_of_capacity_no_action() -> None:
    times = periodic(0, 10, 14)  # 0.7 x 20
    assert exceedances(envelope(times), PLANNED, WINDOWS_S) == []
    v = scale_out_now(snap(10.0, 14.0), times, ScalerState(), CFG)
    assert v.decision is None and v.reason == ""


def test_step_to_0_8_detected_in_the_1s_window_before_p99() -> None:
    # 6 requests/s (0.3 x 20) for 10 s, then 16/s (0.8 x 20) from 10 s
    before = periodic(0, 10, 6)
    almost = np.concatenate([before, periodic(10, 10.9375, 16)])  # 15 after the step
    assert scale_out_now(snap(10.94, 7.0), almost, ScalerState(), CFG).decision is None
    times = np.concatenate([before, periodic(10, 11, 16)])  # 16 after the step
    v = scale_out_now(snap(11.0, 7.0), times, ScalerState(), CFG)
    assert v.decision is not None
    assert (v.decision.action, v.decision.unit, v.decision.engine) == ("scale_out", 0, "cpu")
    assert v.exceeded is not None and v.exceeded.window_s == 1.0
    assert (v.exceeded.observed, v.exceeded.sustainable) == (16, pytest.approx(15.8))
    assert "16 requests in 1 s > 15.80 planned" in v.decision.reason
    # the P99 window is still within the SLO: the scaler does nothing yet
    decisions, _ = decide(snap(11.0, 7.0), ScalerState(), CFG)
    assert not [d for d in decisions if d.action == "scale_out"]


def test_burst_within_the_tolerance_no_action() -> None:
    # 4 requests/s, plus a burst of 2 at once: at most 3 in 0.25 s (<= 4.55)
    t = np.concatenate([periodic(0, 10, 4), [5.1, 5.1]])
    assert envelope(t)[0] == 3
    assert scale_out_now(snap(10.0, 4.2), t, ScalerState(), CFG).decision is None


def test_burst_beyond_the_tolerance_at_low_mean_rate_is_left_to_the_scaler() -> None:
    # SLO 300 ms: tolerance 20 x 0.25 = 5, planned 0.25 s: 3.75 + 5 = 8.75. A burst of 9
    # at once over 1 request/s: 10 in 0.25 s exceeds it, but the sustained rate (1-s
    # window: 10/s) keeps one instance at utilisation 0.5 <= scale_in_utilisation 0.6
    # with its M/D/1 P99 (~246 ms) within 300 ms: the scale-in would take an instance
    # added back after the hold, so none is added
    t = np.concatenate([periodic(0, 10, 1), [3.01] * 9])
    assert envelope(t) == (10, 10, 10, 11, 14)
    s = replace(snap(10.0, 1.9), slo_ms=300.0)
    v = scale_out_now(s, t, ScalerState(), CFG)
    assert v.decision is None and not v.blocked
    assert v.exceeded is not None and v.exceeded.window_s == 0.25
    assert "is not short of capacity" in v.reason


def test_cooldown_and_unknown_capacity() -> None:
    times = np.concatenate([periodic(0, 10, 6), periodic(10, 11, 16)])
    state = ScalerState(last_scale_out=10.0)
    assert scale_out_now(snap(11.0, 7.0), times, state, CFG).decision is None
    assert scale_out_now(snap(13.5, 7.0), times, state, CFG).decision is not None


def test_cap_full_is_blocked() -> None:
    times = np.concatenate([periodic(0, 10, 6), periodic(10, 11, 16)])
    s = snap(11.0, 7.0)
    full = ResourceCap(memory_cap_mb=150.0, memory_used_mb=100.0, max_instances={"cpu": 4})
    v = scale_out_now(replace(s, cap=full), times, ScalerState(), CFG)
    assert v.decision is None and v.blocked
    assert "memory" in v.reason


# -- how many instances at once (Algorithm 3, lines 8-13) -----------------------------------
# 6 requests/s for 10 s, then 36/s for 1 s: q = (9, 18, 36, 42, 60) (the 2 s window holds
# 6 before the step and 36 after, the 5 s one 24 + 36). Per window the capacity whose
# planned envelope mu x (0.75 w + 0.04) covers it: 9 / 0.2275 = 39.56, 18 / 0.415 = 43.37,
# 36 / 0.79 = 45.57, 42 / 1.54 = 27.27, 60 / 3.79 = 15.83; so 45.57 requests/s, 25.57
# more than one 20 requests/s instance: ceil(25.57 / 20) = 2 more, 3 in all.
STEP36 = np.concatenate([periodic(0, 10, 6), periodic(10, 11, 36)])
NEED36 = 36 / 0.79


def test_required_capacity_hand_computed() -> None:
    assert envelope(STEP36) == (9, 18, 36, 42, 60)
    assert required_capacity_rps((9, 18, 36, 42, 60), 90.0, 50.0) == pytest.approx(NEED36)
    # no burst term (SLO at the service time): InferLine's r_max / rho, 36 / 0.75
    assert required_capacity_rps((9, 18, 36), 50.0, 50.0, (0.25, 0.5, 1.0)) == pytest.approx(48)
    with pytest.raises(ValueError, match="rho"):
        required_capacity_rps((1,), 90.0, 50.0, (1.0,), rho=1.5)


def test_a_step_asks_for_two_instances_in_one_decision() -> None:
    v = scale_out_now(snap(11.0, 9.0), STEP36, ScalerState(), CFG)
    assert v.decision is not None and v.decision.action == "scale_out"
    assert (v.count, v.needed) == (2, 3)
    assert v.required_rps == pytest.approx(NEED36)
    assert "det needs 3 instance(s) for 45.6 requests/s" in v.reason
    assert "+2 on cpu" in v.reason


def test_the_step_of_0_8_asks_for_one() -> None:
    # 16 in 1 s: 16 / 0.79 = 20.25 requests/s, 0.25 more than one instance: +1
    times = np.concatenate([periodic(0, 10, 6), periodic(10, 11, 16)])
    v = scale_out_now(snap(11.0, 7.0), times, ScalerState(), CFG)
    assert (v.count, v.needed) == (1, 2)
    assert v.required_rps == pytest.approx(16 / 0.79)


def test_capped_by_max_instances() -> None:
    s = snap(11.0, 9.0)
    s = replace(s, units=(replace(s.units[0], max_instances=2),))
    v = scale_out_now(s, STEP36, ScalerState(), CFG)
    assert (v.count, v.needed) == (1, 3)
    assert "det is at its max_instances 2" in v.reason


def test_capped_by_the_device_cap() -> None:
    s = snap(11.0, 9.0)
    # memory: 100 used + 100 for the first = 200 <= 250, the second 200 + 100 > 250
    mem = replace(s.cap, memory_cap_mb=250.0)
    v = scale_out_now(replace(s, cap=mem), STEP36, ScalerState(), CFG)
    assert (v.count, v.needed) == (1, 3)
    assert "cpu refuses instance 3: memory 200+100 > 250 MB" in v.reason
    # engine slots: 2 cpu slots, one used: room for one more only
    slots = replace(s.cap, max_instances={"cpu": 2})
    v = scale_out_now(replace(s, cap=slots), STEP36, ScalerState(), CFG)
    assert v.count == 1 and "cpu slots 2+1 > 2" in v.reason
    # cores: 2 physical, the unit's one instance pins 1 thread: the second would make
    # its own instances pin 3 > 2
    cores = replace(s.cap, cores=2, physical_cores=2)
    u = replace(s.units[0], threads={1: 1})
    v = scale_out_now(replace(s, cap=cores, cores_used=1, units=(u,)), STEP36, ScalerState(), CFG)
    assert v.count == 1 and "det's own instances would pin 2+1 > 2 cores" in v.reason


def test_saturation_counts_the_instances_started_together() -> None:
    # 8 physical cores, 5.9 busy: 2.1 idle covers one (0.75) and two (1.5) single-thread
    # instances; with 6.6 busy (1.4 idle) only the first
    s = snap(11.0, 9.0)
    cap = replace(s.cap, cores=8, physical_cores=8)
    base = replace(s, cap=cap, cores_used=1, units=(replace(s.units[0], threads={1: 1}),))
    assert scale_out_now(replace(base, cores_busy=5.9), STEP36, ScalerState(), CFG).count == 2
    v = scale_out_now(replace(base, cores_busy=6.6), STEP36, ScalerState(), CFG)
    assert v.count == 1 and "cores saturated" in v.reason


def test_no_action_under_the_planned_envelope_asks_for_none() -> None:
    v = scale_out_now(snap(10.0, 14.0), periodic(0, 10, 14), ScalerState(), CFG)
    assert v.decision is None and v.count == 0 and v.required_rps is None


# -- the Poisson envelope (the default) ------------------------------------------------------


def _quantile_by_cdf(mean: float, tail: float) -> int:
    """The same quantile by another route: the pmf by recursion from 0, the cdf summed up."""
    k, pmf = 0, math.exp(-mean)
    cdf = pmf
    while 1.0 - cdf > tail:
        k += 1
        pmf *= mean / k
        cdf += pmf
    return k


def test_poisson_quantile_hand_checked() -> None:
    # mean 1: P(N > 5) = 1 - e^-1 (1 + 1 + 1/2 + 1/6 + 1/24 + 1/120) = 5.94e-4 > 1e-4,
    # P(N > 6) = 8.32e-5 <= 1e-4: the quantile is 6
    assert tuner.poisson_quantile(1.0, 1e-4) == 6
    for m in (0.3, 3.75, 15.0, 75.0, 400.0):
        assert tuner.poisson_quantile(m, 1e-4) == _quantile_by_cdf(m, 1e-4)
    assert tuner.poisson_quantile(0.0, 1e-4) == 0
    with pytest.raises(ValueError, match="tail"):
        tuner.poisson_quantile(1.0, 0.0)


def test_planned_envelope_with_the_poisson_quantile() -> None:
    # rho mu w = 15 w: Q(3.75) and Q(15), + the burst 0.8
    got = tuner.planned_envelope(20.0, 90.0, 50.0, (0.25, 1.0))
    assert got == pytest.approx(
        (_quantile_by_cdf(3.75, 1e-4) + 0.8, _quantile_by_cdf(15, 1e-4) + 0.8)
    )
    with pytest.raises(ValueError, match="tail must be"):
        tuner.planned_envelope(20.0, 90.0, 50.0, tail=1.5)


def test_required_capacity_inverts_the_planned_envelope() -> None:
    q = (9, 18, 36, 42, 60)
    mu = tuner.required_capacity_rps(q, 90.0, 50.0)
    assert all(p >= x for p, x in zip(tuner.planned_envelope(mu, 90.0, 50.0), q, strict=True))
    below = tuner.planned_envelope(mu - 0.01, 90.0, 50.0)
    assert any(p < x for p, x in zip(below, q, strict=True))  # the least such capacity
    # the Poisson quantile asks for less capacity than the deterministic envelope
    assert mu < required_capacity_rps(q, 90.0, 50.0)


def test_poisson_noise_at_0_6_of_capacity_is_no_reason_to_scale() -> None:
    # 12 requests/s Poisson (0.6 x 20), seen at every second over 10-s histories: the
    # deterministic envelope is exceeded by the noise, the Poisson one never
    noisy = fired = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        times = np.cumsum(rng.exponential(1 / 12.0, 600))
        for now in np.arange(10.0, 40.0, 1.0):
            seen = times[(times > now - 10.0) & (times <= now)]
            s = snap(now, 12.0)
            noisy += scale_out_now(s, seen, ScalerState(), CFG).exceeded is not None
            fired += poisson_scale_out_now(s, seen, ScalerState(), CFG).decision is not None
    assert noisy > 100 and fired == 0


def test_a_poisson_step_to_1_5_of_capacity_is_seen_within_seconds() -> None:
    # 6 requests/s, then 30/s from 10 s, looked at every 0.1 s: over 20 traces the first
    # scale-out comes 0.6-2.6 s after the step (median about 1 s)
    delays = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        before = np.cumsum(rng.exponential(1 / 6.0, 200))
        after = 10.0 + np.cumsum(rng.exponential(1 / 30.0, 300))
        times = np.concatenate([before[before < 10.0], after[after < 16.0]])
        for now in np.arange(10.0, 16.0, 0.1):
            seen = times[(times <= now) & (times > now - 10.0)]
            if poisson_scale_out_now(snap(now, 7.0), seen, ScalerState(), CFG).decision:
                delays.append(now - 10.0)
                break
    assert len(delays) == 20
    assert max(delays) <= 3.0 and float(np.median(delays)) <= 1.5


def test_nothing_within_the_settle_window_of_the_last_change() -> None:
    times = np.concatenate([periodic(0, 10, 6), periodic(10, 11, 16)])
    settle = ScalerConfig(settle_s=5.0, sustain_s=0.0)
    state = ScalerState(last_change=8.0)
    v = scale_out_now(snap(11.0, 7.0), times, state, settle)
    assert v.decision is None and "settle window" in v.reason
    assert scale_out_now(snap(13.5, 7.0), times, state, settle).decision is not None


# -- the planned rate's P99 bound (the default) ----------------------------------------------
# SLO 300 ms, one 50-ms instance: rho x mu = 15 requests/s, but the approximate P99
# (queueing.p99_response_ms: Erlang C, Kingman's tail) reaches 300 ms at 11.84/s.


def test_slo_rate_is_where_the_p99_reaches_the_slo() -> None:
    s = replace(snap(10.0, 5.0), slo_ms=300.0)
    r = tuner.slo_rate_rps(s)
    assert r is not None and r == pytest.approx(11.84, abs=0.01)
    assert p99_response_ms(r, 1, 50.0) == pytest.approx(300.0, rel=1e-6)
    assert p99_response_ms(r + 0.01, 1, 50.0) > 300.0
    # two instances carry more than twice the rate within the same SLO (pooling)
    two = replace(s, units=(replace(s.units[0], instances={"cpu": 2}),))
    r2 = tuner.slo_rate_rps(two)
    assert r2 is not None and r2 > 2 * r
    # an SLO below the service time: no rate meets it, the utilisation rule alone
    assert tuner.slo_rate_rps(replace(s, slo_ms=40.0)) is None
    # two units: each one's share is the SLO less the other's service time, 250 ms
    u2 = replace(s.units[0], index=1, name="rec")
    both = tuner.slo_rate_rps(replace(s, units=(s.units[0], u2)))
    assert both is not None and p99_response_ms(both, 1, 50.0) == pytest.approx(250.0, rel=1e-6)


def test_a_rate_the_capacity_rule_passes_but_the_p99_does_not() -> None:
    # 13 requests/s for 10 s: under rho x mu = 15 (the deterministic envelope 15 w + 5
    # is not exceeded), above 11.84 where one instance's P99 reaches the SLO: planned
    # 11.84 w + 15.78 x 0.25 s, 5 s: 63.14 < 65 observed
    s = replace(snap(10.0, 13.0), slo_ms=300.0)
    times = periodic(0, 10, 13)
    assert envelope(times) == (4, 7, 13, 26, 65)
    assert scale_out_now(s, times, ScalerState(), CFG).decision is None
    v = tuner.scale_out_now(s, times, ScalerState(), CFG, tail=None)
    assert v.decision is not None and v.decision.action == "scale_out"
    assert v.exceeded is not None and v.exceeded.window_s == 5.0
    r = tuner.slo_rate_rps(s)
    assert r is not None
    assert v.exceeded.sustainable == pytest.approx(r * 5.0 + r / 0.75 * 0.25)  # 63.14
    assert "where the P99 reaches the SLO" in v.reason
    # the instances it asks for keep the P99 within the SLO at rho x the required rate
    # or the triggering window's rate (13/s), the higher
    assert v.required_rps is not None
    rate = max(0.75 * v.required_rps, v.exceeded.rate_rps)
    assert rate == pytest.approx(13.0)
    assert p99_response_ms(rate, v.needed, 50.0) <= 300.0
    assert p99_response_ms(rate, v.needed - 1, 50.0) > 300.0
    # below the P99's rate nothing is done
    slow = periodic(0, 10, 10)
    assert tuner.scale_out_now(s, slow, ScalerState(), CFG, tail=None).decision is None


def test_the_p99_asks_for_more_than_the_capacity_rule() -> None:
    # SLO 100 ms, a step to 20 requests/s: capacity alone asks for 25 requests/s, 2
    # instances; their P99 at the 0.25-s window's 20/s is over 100 ms
    s = replace(snap(11.0, 7.0), slo_ms=100.0)
    times = np.concatenate([periodic(0, 10, 2), periodic(10, 11, 20)])
    cap_only = scale_out_now(s, times, ScalerState(), CFG)
    v = tuner.scale_out_now(s, times, ScalerState(), CFG, tail=None)
    assert cap_only.needed == 2 and v.needed > cap_only.needed
    assert v.required_rps is not None
    assert v.exceeded is not None
    rate = max(0.75 * v.required_rps, v.exceeded.rate_rps)
    assert p99_response_ms(rate, v.needed, 50.0) <= 100.0
    assert p99_response_ms(rate, v.needed - 1, 50.0) > 100.0


def test_poisson_noise_under_the_p99_rate_is_no_reason_to_scale() -> None:
    # 7 requests/s Poisson (0.6 x 11.84) under SLO 300 ms, looked at every second
    fired = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        times = np.cumsum(rng.exponential(1 / 7.0, 400))
        for now in np.arange(10.0, 40.0, 1.0):
            seen = times[(times > now - 10.0) & (times <= now)]
            s = replace(snap(now, 7.0), slo_ms=300.0)
            fired += tuner.scale_out_now(s, seen, ScalerState(), CFG).decision is not None
    assert fired == 0
