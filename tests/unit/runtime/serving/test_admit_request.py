"""The front end's admission at arrival (infscaler.runtime.serving.admission.admit_request) as a
pure function on hand-computed snapshots, like the scaler's ``decide``: the order of the
checks, each refusal's status / reason / retry, the latency bound's arithmetic, the
request's timeout capped by its pipeline's and the share of pending requests per uid."""

from __future__ import annotations

import math

import pytest

from infscaler.runtime.serving.admission import (
    ArrivalSnapshot,
    Refusal,
    admit_request,
    refusal_hold_s,
    starts_at_once,
)


def snap(**kw) -> ArrivalSnapshot:
    """An idle pipeline "det" with a 30 s default timeout, no SLO, nothing measured."""
    return ArrivalSnapshot(pipeline="det", **kw)


def test_an_idle_pipeline_without_an_slo_admits_with_its_default_timeout() -> None:
    d = admit_request(snap())
    assert d.admit and d.refusal is None and d.timeout_s == 30.0 and d.estimate_ms is None
    d = admit_request(snap(timeout_s=2))
    assert d.admit and d.timeout_s == 2.0


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "5", [1]])
def test_a_bad_timeout_is_a_400_before_anything_else(bad) -> None:
    # even a dead front end answers 400 first: the request itself is wrong
    d = admit_request(snap(timeout_s=bad, failure="boom", pending=5000))
    assert not d.admit and d.refusal is Refusal.BAD_TIMEOUT and d.status == 400
    assert "positive finite number of seconds" in d.reason and repr(bad) in d.reason


def test_refusals_come_in_order_each_with_its_reason() -> None:
    everything = dict(
        failure="the control channel closed",
        accepting=False,
        unavailable_reason="unit det_1 has no live instance",
        unavailable_retry_s=2.5,
        pending=10,
        max_pending=10,
        ahead=4,
        queue_limit=4,
        shed_reason="at the memory cap",
    )
    d = admit_request(snap(**everything))
    assert (d.refusal, d.status) == (Refusal.FAILED, 503)
    assert d.reason == "the front end failed: the control channel closed"

    d = admit_request(snap(**{**everything, "failure": None}))
    assert d.refusal is Refusal.NOT_ACCEPTING
    assert d.reason == "pipeline det is not accepting requests now"

    d = admit_request(snap(**{**everything, "failure": None, "accepting": True}))
    assert d.refusal is Refusal.UNAVAILABLE and d.retry_after_s == 2.5
    assert d.reason == "unit det_1 has no live instance"

    rest = {**everything, "failure": None, "accepting": True, "unavailable_reason": None}
    d = admit_request(snap(**rest))
    assert d.refusal is Refusal.OVERLOADED and d.status == 503 and d.retry_after_s is None
    assert d.reason.startswith("10 requests are in flight (max_pending = 10)")
    assert "add instances" in (d.hint or "")

    d = admit_request(snap(**{**rest, "pending": 9}))
    assert d.refusal is Refusal.SHED
    assert d.reason == "pipeline det sheds load: 4 requests queued (limit 4); at the memory cap"

    d = admit_request(snap(**{**rest, "pending": 9, "queue_limit": 5}))
    assert d.admit  # 4 ahead under a limit of 5, no latency bound


def test_the_slo_bound_before_any_measurement() -> None:
    # default estimates for a 100 ms SLO: 50 ms per request, one at a time:
    # ahead 1 -> 50 + 50 = 100 <= 100 admitted; ahead 2 -> 150 > 100 refused
    d = admit_request(snap(slo_ms=100.0, ahead=1))
    assert d.admit and d.estimate_ms == pytest.approx(100.0)
    d = admit_request(snap(slo_ms=100.0, ahead=2))
    assert not d.admit and d.refusal is Refusal.SLO and d.status == 503
    assert d.estimate_ms == pytest.approx(150.0)
    assert d.retry_after_s == pytest.approx(0.05)  # (150 - 100) ms
    assert d.reason.startswith("pipeline det refuses the request at arrival: it would take")
    assert "its SLO (100 ms)" in d.reason
    # nothing ahead: admitted however slow (an idle pipeline never refuses)
    assert admit_request(snap(slo_ms=100.0, ahead=0, service_ms=500.0, interval_ms=500.0)).admit


def test_time_spent_reading_the_body_comes_off_the_bound() -> None:
    # measured 20 ms per request, 10 ms interval: ahead 5 -> 20 + 5 * 10 = 70 ms
    base = dict(slo_ms=100.0, ahead=5, service_ms=20.0, interval_ms=10.0)
    assert admit_request(snap(**base, spent_ms=30.0)).admit  # 70 <= 100 - 30
    d = admit_request(snap(**base, spent_ms=31.0))  # 70 > 69
    assert not d.admit and d.refusal is Refusal.SLO
    assert "its SLO (69 ms)" in d.reason and d.retry_after_s == pytest.approx(0.05)


def test_a_tighter_timeout_is_the_bound_once_measured() -> None:
    measured = dict(slo_ms=1000.0, ahead=9, service_ms=20.0, interval_ms=10.0)
    # 20 + 9 * 10 = 110 ms: within the SLO (1000 ms) but past a 100 ms timeout
    d = admit_request(snap(**measured, timeout_s=0.1))
    assert not d.admit and d.refusal is Refusal.DEADLINE and d.timeout_s == 0.1
    assert "request's timeout (100 ms)" in d.reason
    assert admit_request(snap(**measured, timeout_s=0.2)).admit
    # not measured yet: only the SLO bounds it (defaults say nothing about a timeout)
    assert admit_request(snap(slo_ms=1000.0, ahead=1, timeout_s=0.1)).admit
    # no SLO but measured: the timeout is the bound; 20 + 2 * 10 = 40 ms > 30 ms
    d = admit_request(snap(ahead=2, service_ms=20.0, interval_ms=10.0, timeout_s=0.03))
    assert d.refusal is Refusal.DEADLINE and d.estimate_ms == pytest.approx(40.0)


def test_the_retry_grows_with_the_queue_and_is_capped() -> None:
    d = admit_request(snap(slo_ms=100.0, ahead=50, service_ms=20.0, interval_ms=10.0))
    # 20 + 50 * 10 = 520 ms: retry after (520 - 100) ms
    assert d.retry_after_s == pytest.approx(0.42)
    d = admit_request(snap(slo_ms=100.0, ahead=100_000, service_ms=20.0, interval_ms=10.0))
    assert d.retry_after_s == 30.0


def test_route_progress_reads_the_latest_dues_and_the_units() -> None:
    from infscaler.runtime.serving.route import Route

    r = Route(pipeline=None, stage_ids=[1, 2], stats=None)  # type: ignore[arg-type]
    assert r.progress(100.0) == (None, None)  # nothing measured yet
    r.service_ms, r.unit_ms, r.instances, r.correction = 114.0, [67.0, 47.0], [1, 1], 1.5
    r.dues = {7: 100.2, 8: 100.3, 9: 100.06}
    remaining, units = r.progress(100.0)
    assert remaining == pytest.approx((60.0,))  # the most recent only: one instance each
    assert [u[0] for u in units] == pytest.approx([100.5, 70.5])
    assert [u[1] for u in units] == [1, 1]  # scaled by the correction
    r.instances = [2, 1]
    remaining, _ = r.progress(100.0)
    assert remaining == pytest.approx((60.0, 300.0))
    # the front end judges a snapshot carrying them on the units' estimate
    d = admit_request(
        ArrivalSnapshot(
            "p",
            slo_ms=200.0,
            ahead=3,
            service_ms=171.0,
            interval_ms=100.5,
            remaining_ms=(10.0, 5.0),
            units=((100.5, 1), (70.5, 1)),
        )
    )
    assert d.admit and d.estimate_ms == pytest.approx(171.0)


def test_one_slow_request_does_not_move_the_correction() -> None:
    # the median of the recent latency / estimate ratios: one request that waited behind
    # a burst (4x its estimate) leaves the correction where the others put it
    from infscaler.runtime.serving.route import Route

    r = Route(pipeline=None, stage_ids=[1], stats=None)  # type: ignore[arg-type]
    for _ in range(9):
        r.record_estimate(100.0 * r.correction, 110.0)
    assert r.correction == pytest.approx(1.1)
    r.record_estimate(100.0 * r.correction, 440.0)
    assert r.correction == pytest.approx(1.1)
    # a lasting change moves it once it is most of the recent ratios
    for _ in range(11):
        r.record_estimate(100.0 * r.correction, 200.0)
    assert r.correction == pytest.approx(2.0)
    r.record_expiry(100.0 * r.correction, 150.0)  # expired before its estimate: no news
    assert r.correction == pytest.approx(2.0)


def test_below_capacity_only_a_likely_late_request_is_refused() -> None:
    # ResNet-50's one 2-thread instance (bench/HISTORY.md): 4 ahead, estimate 227 ms
    # against 226 ms left. At the median estimate (lenience 1) it is refused; with the
    # ratios' 10 % quantile at 0.9 of their median it is admitted (0.9 x 227 = 204)
    base = dict(slo_ms=226.0, ahead=4, service_ms=41.0, interval_ms=46.5)
    est = 41.0 + 4 * 46.5
    d = admit_request(snap(**base))
    assert not d.admit and d.refusal is Refusal.SLO and d.estimate_ms == pytest.approx(est)
    d = admit_request(snap(**base, lenience=0.9))
    assert d.admit and d.estimate_ms == pytest.approx(est)  # the estimate itself kept
    # a request late even on a fast outcome is still refused: 8 ahead, 0.9 x 413 = 372
    d = admit_request(snap(**dict(base, ahead=8), lenience=0.9))
    assert not d.admit and d.refusal is Refusal.SLO
    with pytest.raises(ValueError, match="lenience"):
        admit_request(snap(**base, lenience=0.0))


def test_route_lenience_is_a_low_quantile_below_capacity_and_1_in_overload() -> None:
    from infscaler.runtime.serving.route import Route
    from infscaler.runtime.serving.stats import PipelineStats

    stats = PipelineStats(["m"])
    r = Route(pipeline=None, stage_ids=[1], stats=stats)  # type: ignore[arg-type]
    r.service_ms, r.unit_ms, r.instances = 40.0, [40.0], [1]  # capacity 25 req/s
    assert r.lenience(100.0) == 1.0  # fewer than 10 ratios: not known yet
    # ratios 0.80, 0.82, ..., 1.20 (21 of them): correction = median 1.0, the 10 %
    # quantile (index 2 of 21) 0.84
    for i in range(21):
        r.record_estimate(100.0 * r.correction, 80.0 + 2.0 * i)
    assert r.correction == pytest.approx(1.0)
    for i in range(100):  # 10 req/s offered over the last 10 s: 0.4 x capacity
        stats.offered.add(90.05 + i * 0.1)
    assert r.lenience(100.0) == pytest.approx(0.84)
    for i in range(130):  # 23 req/s >= 0.9 x 25: overload, refuse at the median
        stats.offered.add(90.05 + i * 0.0769)
    assert r.lenience(100.0) == 1.0


def test_in_overload_admission_judges_on_the_drain_time_estimate() -> None:
    # ResNet-50 K = 3 (bench/HISTORY.md, overload.py): units of 3, 4 and 71 ms, one instance
    # each; 2 admitted ahead, the most recent due in 130 ms; 205 ms left of the timeout.
    # Tracked: max(S, 130 + 71) = 201 ms, admitted. Drain time: 78 + 2 x 71 = 220, refused.
    base = dict(
        slo_ms=205.0,
        ahead=2,
        service_ms=78.0,
        interval_ms=71.0,
        remaining_ms=(130.0,),
        units=((3.0, 1), (4.0, 1), (71.0, 1)),
    )
    d = admit_request(snap(**base))
    assert d.admit and d.estimate_ms == pytest.approx(201.0)
    d = admit_request(snap(**base, overloaded=True))
    assert not d.admit and d.refusal is Refusal.SLO and d.estimate_ms == pytest.approx(220.0)
    assert "71.0 ms each on 1 instance(s)" in d.reason  # the drain-time wording
    # one ahead: 78 + 71 = 149 fits
    d = admit_request(snap(**dict(base, ahead=1), overloaded=True))
    assert d.admit and d.estimate_ms == pytest.approx(149.0)


def test_in_overload_replicas_take_as_many_requests_as_instances() -> None:
    # two single-thread replicas of an 84 ms model, SLO 160 ms, in overload: one ahead
    # leaves an instance idle (84 ms, admitted: the interval S / c charged it 42 ms more),
    # two ahead wait one service time (168 ms, refused), three as long as two
    base = dict(slo_ms=160.0, service_ms=84.0, interval_ms=42.0, units=((84.0, 2),))
    d = admit_request(snap(**base, ahead=1, overloaded=True))
    assert d.admit and d.estimate_ms == pytest.approx(84.0)
    for ahead in (2, 3):
        d = admit_request(snap(**base, ahead=ahead, overloaded=True))
        assert not d.admit and d.estimate_ms == pytest.approx(168.0)
        assert "84.0 ms each on 2 instance(s)" in d.reason
    # without the units (a caller that has none) the interval estimate stands: 84 + 42
    d = admit_request(snap(**dict(base, units=None), ahead=1, overloaded=True))
    assert d.admit and d.estimate_ms == pytest.approx(126.0)


def test_route_overload_follows_the_offered_load_and_floors_the_correction_at_1() -> None:
    from infscaler.runtime.serving.route import Route
    from infscaler.runtime.serving.stats import PipelineStats

    stats = PipelineStats(["m"])
    r = Route(pipeline=None, stage_ids=[1, 2], stats=stats)  # type: ignore[arg-type]
    assert r.capacity_rps() is None and not r.overloaded(100.0)  # nothing measured
    r.service_ms, r.unit_ms, r.instances = 80.0, [20.0, 60.0], [1, 2]
    r.correction = 0.5  # learnt from survivors whose requests ahead expired
    # slowest unit: 2 instances x 1000 / 60 ms = 33.3 req/s (the correction below 1 does
    # not make the units faster)
    assert r.capacity_rps() == pytest.approx(2000.0 / 60.0)
    for i in range(250):  # 25 req/s over the last 10 s: 0.75 x capacity
        stats.offered.add(90.05 + i * 0.04)
    assert not r.overloaded(100.0)
    assert r.factor(False) == 0.5 and r.estimates(False) == (40.0, 15.0)
    for i in range(100):  # 35 req/s >= 0.9 x 33.3
        stats.offered.add(90.05 + i * 0.1)
    assert r.overloaded(100.0)
    # in overload the compute times are never scaled below what was measured
    assert r.factor(True) == 1.0 and r.estimates(True) == (80.0, 30.0)
    r.correction = 1.5
    assert r.factor(True) == 1.5 and r.estimates(True) == (120.0, 45.0)
    assert r.capacity_rps() == pytest.approx(2000.0 / 90.0)  # a correction above 1 counts


def test_a_ratio_is_taken_against_the_correction_the_estimate_was_made_with() -> None:
    from infscaler.runtime.serving.route import Route

    r = Route(pipeline=None, stage_ids=[1], stats=None)  # type: ignore[arg-type]
    r.correction = 0.5
    # an estimate of 100 ms made with the factor 1 (overload) on raw compute of 100 ms,
    # answered in 100 ms: the raw ratio is 1, not 0.5 x 100 / 100
    r.record_estimate(100.0, 100.0, factor=1.0)
    assert r.correction == pytest.approx(1.0)
    r.record_expiry(100.0, 300.0, factor=1.0)  # expired at 300 ms: at least 3
    assert r._ratios[-1] == pytest.approx(3.0)


def test_in_overload_estimates_take_the_ratios_high_quantile_not_the_capacity() -> None:
    from infscaler.runtime.serving.route import OVERLOAD_QUANTILE, Route
    from infscaler.runtime.serving.stats import PipelineStats

    r = Route(pipeline=None, stage_ids=[1], stats=PipelineStats(["m"]))  # type: ignore[arg-type]
    r.service_ms, r.unit_ms, r.instances = 40.0, [40.0], [2]  # capacity 50 req/s
    assert r.ratio_quantile(OVERLOAD_QUANTILE) is None  # fewer than 10 ratios
    # ratios 0.80, 0.82, ..., 1.20 (21): median 1.0; the 0.9 quantile is the 19th, 1.16
    for i in range(21):
        r.record_estimate(100.0 * r.correction, 80.0 + 2.0 * i)
    assert r.correction == pytest.approx(1.0)
    assert r.ratio_quantile(OVERLOAD_QUANTILE) == pytest.approx(1.16)
    assert r.factor(False) == pytest.approx(1.0)
    assert r.factor(True) == pytest.approx(1.16)
    assert r.estimates(True) == (pytest.approx(46.4), pytest.approx(23.2))
    assert r.units(True) == ((pytest.approx(46.4), 2),)
    # the capacity stays the median's: the tail is a latency bound, not a slower unit
    assert r.capacity_rps() == pytest.approx(50.0)


def test_a_burst_counts_as_overload_before_the_10_s_mean_shows_it() -> None:
    from infscaler.runtime.serving.route import BURST_LOAD, Route
    from infscaler.runtime.serving.stats import PipelineStats

    stats = PipelineStats(["m"])
    r = Route(pipeline=None, stage_ids=[1], stats=stats)  # type: ignore[arg-type]
    r.service_ms, r.unit_ms, r.instances = 50.0, [50.0], [1]  # capacity 20 req/s
    for i in range(90):  # 10 req/s for 9 s: half the capacity
        stats.offered.add(90.0 + i * 0.1)
    assert not r.overloaded(100.0)
    for i in range(24):  # 24 in the last second (1.2 x): not yet a burst
        stats.offered.add(99.02 + i * 0.04)
    assert stats.offered_rate(100.0, 1.0) == pytest.approx(24.0)
    assert stats.offered_rate(100.0) < 0.9 * 20
    assert not r.overloaded(100.0)
    stats.offered.add(99.99)  # 25 = BURST_LOAD x capacity
    assert BURST_LOAD * 20 == 25 and r.overloaded(100.0)
    assert not r.overloaded(101.5)  # the burst left the 1 s window
    with pytest.raises(ValueError, match="window_s"):
        stats.offered_rate(100.0, 0.0)


def test_a_requests_timeout_shortens_its_pipelines_never_lengthens_it() -> None:
    assert admit_request(snap(timeout_s=3600)).timeout_s == 30.0  # an hour asked: 30 s
    assert admit_request(snap(timeout_s=30.5)).timeout_s == 30.0
    assert admit_request(snap(timeout_s=0.25)).timeout_s == 0.25
    assert admit_request(snap(timeout_s=None, default_timeout_s=5.0)).timeout_s == 5.0
    # the latency bound is the capped timeout too: 3 ahead at 2 s each, 30 s pipeline
    busy = dict(service_ms=2000.0, interval_ms=2000.0, ahead=3, slo_ms=None)
    d = admit_request(snap(timeout_s=3600, **busy))
    assert d.admit and d.timeout_s == 30.0 and d.estimate_ms == 8000.0
    d = admit_request(snap(timeout_s=3600, default_timeout_s=5.0, **busy))
    assert not d.admit and d.refusal is Refusal.DEADLINE and d.timeout_s == 5.0


def test_a_uid_at_its_share_of_pending_requests_is_refused_another_admitted() -> None:
    base = dict(pending=40, max_pending=100, pending_per_uid=8, operator_pending=10)
    d = admit_request(snap(uid=65534, uid_pending=8, **base))
    assert not d.admit and d.refusal is Refusal.UID_QUOTA and d.status == 503
    assert "too many requests pending from your uid (8 admitted" in d.reason
    assert "at most 8 per user, --max-pending-per-uid" in d.reason
    assert d.retry_after_s is not None and d.retry_after_s > 0
    assert "8 requests queued or running" in (d.hint or "")
    assert admit_request(snap(uid=65534, uid_pending=7, **base)).admit
    assert admit_request(snap(uid=1000, uid_pending=0, **base)).admit
    # the operator (uid None) is not held to the per-uid cap
    assert admit_request(snap(uid=None, uid_pending=50, **base)).admit
    # no per-uid cap configured
    assert admit_request(snap(uid=65534, uid_pending=80, **{**base, "pending_per_uid": None}))


def test_the_last_pending_slots_are_the_operators_and_max_pending_holds_for_all() -> None:
    base = dict(max_pending=100, pending_per_uid=64, operator_pending=10)
    # 90 pending: the shared part is full for every other uid, even one holding nothing
    d = admit_request(snap(uid=65534, uid_pending=0, pending=90, **base))
    assert not d.admit and d.refusal is Refusal.OVERLOADED and d.status == 503
    assert "the last 10 of max_pending = 100 are kept for the operator" in d.reason
    assert d.retry_after_s is not None
    assert admit_request(snap(uid=65534, pending=89, **base)).admit
    for pending in (90, 99):  # the operator gets into its share
        assert admit_request(snap(uid=None, pending=pending, **base)).admit
    d = admit_request(snap(uid=None, pending=100, **base))  # but not past max_pending
    assert not d.admit and d.refusal is Refusal.OVERLOADED
    assert d.reason.startswith("100 requests are in flight (max_pending = 100)")
    # a share as large as max_pending still leaves one slot to the others
    d = admit_request(snap(uid=5, pending=0, **{**base, "operator_pending": 100}))
    assert d.admit
    d = admit_request(snap(uid=5, pending=1, **{**base, "operator_pending": 100}))
    assert d.refusal is Refusal.OVERLOADED


def test_a_latency_refusal_is_held_until_the_queue_drained_at_most_the_bound() -> None:
    # 20 + 12 * 10 = 140 ms against a 100 ms SLO: 40 ms, the shortest back-off is 50 ms
    d = admit_request(snap(slo_ms=100.0, ahead=12, service_ms=20.0, interval_ms=10.0))
    assert not d.admit and d.refusal is Refusal.SLO
    assert d.retry_after_s == pytest.approx(0.05) and d.hold_s == pytest.approx(0.05)
    # 20 + 15 * 10 = 170 ms: held (and retried) after 70 ms
    d = admit_request(snap(slo_ms=100.0, ahead=15, service_ms=20.0, interval_ms=10.0))
    assert d.retry_after_s == pytest.approx(0.07) and d.hold_s == pytest.approx(0.07)
    # a long queue: held until it could be admitted (520 - 100 ms), past what was left
    # of the SLO but short of the 520 ms it would have taken admitted now
    d = admit_request(snap(slo_ms=100.0, ahead=50, service_ms=20.0, interval_ms=10.0))
    assert d.retry_after_s == pytest.approx(0.42) and d.hold_s == pytest.approx(0.42)
    d = admit_request(snap(slo_ms=100.0, ahead=50, service_ms=20.0, interval_ms=10.0, spent_ms=70))
    assert d.hold_s == pytest.approx(0.49)  # 30 ms of the SLO left: 520 - 30 ms
    # and at most what is left of its own timeout
    d = admit_request(
        snap(slo_ms=100.0, ahead=50, service_ms=20.0, interval_ms=10.0, timeout_s=0.3, spent_ms=70)
    )
    assert d.refusal is Refusal.SLO and d.hold_s == pytest.approx(0.23)
    # shedding: held until the requests over the limit left, one interval each (6 x 10 ms)
    d = admit_request(snap(slo_ms=100.0, ahead=9, queue_limit=4, interval_ms=10.0, service_ms=20.0))
    assert d.refusal is Refusal.SHED and d.retry_after_s == pytest.approx(0.06)
    assert d.hold_s == pytest.approx(0.06)
    # at most the SLO (else the request's timeout); nothing measured: answered at once
    d = admit_request(snap(slo_ms=100.0, ahead=40, queue_limit=4, interval_ms=10.0))
    assert d.retry_after_s == pytest.approx(0.37) and d.hold_s == pytest.approx(0.1)
    d = admit_request(snap(timeout_s=0.2, ahead=40, queue_limit=4, interval_ms=10.0))
    assert d.hold_s == pytest.approx(0.2)
    d = admit_request(snap(slo_ms=100.0, ahead=4, queue_limit=4))
    assert d.refusal is Refusal.SHED and d.hold_s == 0.0 and d.retry_after_s is None
    # other refusals are answered at once; an admitted request holds nothing
    d = admit_request(snap(slo_ms=100.0, ahead=4, max_queue_size=4, queued=((1, 4),)))
    assert d.refusal is Refusal.QUEUE_FULL and d.hold_s == 0.0
    assert admit_request(snap(slo_ms=100.0, ahead=0)).hold_s == 0.0


def test_refusal_hold_s_bounds_and_bad_input() -> None:
    assert refusal_hold_s(0.5, 200.0) == 0.2
    assert refusal_hold_s(0.05, 200.0) == 0.05
    assert refusal_hold_s(None, 200.0) == 0.0 and refusal_hold_s(math.inf, 200.0) == 0.0
    assert refusal_hold_s(0.5, 0.0) == 0.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="left_ms"):
            refusal_hold_s(0.1, bad)


def test_a_request_that_waits_for_no_instance_is_not_refused_for_the_slo() -> None:
    # two replicas measured (or scaled) at 500 ms against a 400 ms SLO: one ahead leaves
    # an instance free, so the request takes 500 ms whatever admission does; refused, a
    # closed-loop client sends it again while the free instance idles
    base = dict(slo_ms=400.0, service_ms=500.0, interval_ms=250.0, units=((500.0, 2),))
    d = admit_request(snap(**base, ahead=1, overloaded=True))
    assert d.admit and d.estimate_ms == pytest.approx(500.0)
    d = admit_request(snap(**base, ahead=1, remaining_ms=(300.0,)))  # tracked: the same
    assert d.admit
    # two ahead: it waits for one of them; refused as before
    d = admit_request(snap(**base, ahead=2, overloaded=True))
    assert not d.admit and d.refusal is Refusal.SLO and d.estimate_ms == pytest.approx(1000.0)
    # a pipeline: the unit with the fewest instances decides
    d = admit_request(snap(**dict(base, units=((500.0, 2), (10.0, 1))), ahead=1, overloaded=True))
    assert not d.admit
    # against the request's own timeout it is refused still: it would expire half computed
    d = admit_request(snap(**base, ahead=1, overloaded=True, timeout_s=0.3))
    assert not d.admit and d.refusal is Refusal.DEADLINE


def test_starts_at_once() -> None:
    assert starts_at_once(0, None) and starts_at_once(-1, ())
    assert not starts_at_once(1, None) and not starts_at_once(1, ())
    assert starts_at_once(2, ((5.0, 3), (1.0, 4))) and not starts_at_once(3, ((5.0, 3),))
    assert not starts_at_once(1, ((5.0, 0),))  # no instance counts as one
