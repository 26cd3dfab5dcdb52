"""The admission policy (pure functions) and the deadline table."""

from __future__ import annotations

import math

import pytest

from infscaler.runtime.serving.admission import (
    ByteBudget,
    admit_bytes,
    admit_latency,
    default_estimates,
    estimate_ms,
)
from infscaler.shm.deadlines import ENTRIES, DeadlineTable


def test_bytes_under_the_budget_are_admitted_above_refused_with_a_retry() -> None:
    assert admit_bytes(10, 0, None).admit
    assert admit_bytes(40, 60, 100).admit
    d = admit_bytes(41, 60, 100)
    assert not d.admit and d.retry_after_s and d.retry_after_s > 0
    assert "--max-inflight-mb" in d.reason
    # a request larger than the whole budget runs alone, never starves
    assert admit_bytes(500, 0, 100).admit
    assert not admit_bytes(500, 1, 100).admit
    with pytest.raises(ValueError):
        admit_bytes(-1, 0, 100)


def test_byte_budget_reserves_and_releases() -> None:
    b = ByteBudget(100)
    assert b.reserve(60).admit and b.reserve(40).admit
    assert not b.reserve(1).admit
    b.release(40)
    assert b.reserve(30).admit
    st = b.stats()
    assert st["inflight_bytes"] == 90 and st["peak_bytes"] == 100 and st["refused"] == 1
    with pytest.raises(ValueError):
        ByteBudget(0)


def test_latency_bound_from_measured_service_time() -> None:
    # no SLO: always admitted
    assert admit_latency(10_000, 50.0, 50.0, None).admit
    # 20 ms per request, 10 ms interval (two instances): 20 + 8 * 10 = 100 <= 100
    assert admit_latency(8, 20.0, 10.0, 100.0).admit
    d = admit_latency(9, 20.0, 10.0, 100.0)
    assert not d.admit and d.estimate_ms == pytest.approx(110.0)
    assert d.retry_after_s == pytest.approx(0.05)  # (110 - 100) ms, at the minimum back-off
    assert "SLO" in d.reason
    # a request slower than the SLO on its own still runs when nothing is ahead (an
    # idle pipeline never refuses: it could not measure its service time again)
    assert admit_latency(0, 150.0, 150.0, 100.0).admit
    assert not admit_latency(1, 150.0, 150.0, 100.0).admit
    # the retry grows with the queue, bounded
    assert admit_latency(10_000, 20.0, 10.0, 100.0).retry_after_s == 30.0
    assert estimate_ms(3, 5.0, 2.0) == 11.0


def test_units_estimate_follows_the_requests_ahead_through_the_pipeline() -> None:
    # ddddocr-like: det 67 ms then rec 47 ms, one instance each, S = 114 ms
    units = [(67.0, 1), (47.0, 1)]
    # a burst, nothing done yet: as the drain time (the worst case is unchanged)
    assert estimate_ms(1, 114, 67, [114.0], units) == pytest.approx(181)
    assert estimate_ms(3, 114, 67, [248.0, 181.0, 114.0], units) == pytest.approx(315)
    assert estimate_ms(3, 114, 67) == pytest.approx(315)
    # the requests ahead have progressed: the last one is due in 60 ms, so this one
    # leaves det no earlier than 60 + 67 (the drain-time estimate said 315)
    assert estimate_ms(3, 114, 67, [60.0, 10.0, -5.0], units) == pytest.approx(127)
    # an overdue request ahead counts as finishing now, never as negative time
    assert estimate_ms(1, 114, 67, [-50.0], units) == pytest.approx(114)
    # one unit of 2 instances: one request ahead leaves the second instance free
    assert estimate_ms(1, 100, 50, [80.0], [(100.0, 2)]) == pytest.approx(100)
    assert estimate_ms(2, 100, 50, [90.0, 30.0], [(100.0, 2)]) == pytest.approx(130)
    # fewer remaining times than requests ahead: only the known ones count
    assert estimate_ms(5, 100, 50, [20.0], [(100.0, 2)]) == pytest.approx(100)


def test_progress_admits_what_the_drain_time_refused() -> None:
    units = [(67.0, 1), (47.0, 1)]
    old = admit_latency(3, 114, 67, 200)
    assert not old.admit and old.estimate_ms == pytest.approx(315)
    new = admit_latency(3, 114, 67, 200, "SLO", [60.0, 10.0, -5.0], units)
    assert new.admit and new.estimate_ms == pytest.approx(127)
    late = admit_latency(3, 114, 67, 200, "SLO", [150.0, 90.0, 20.0], units)
    assert not late.admit and late.estimate_ms == pytest.approx(217)
    assert "busy with them" in late.reason and late.retry_after_s == pytest.approx(0.05)
    # before a measurement the progress is not used (the defaults are per request)
    first = admit_latency(3, None, None, 200, "SLO", [1.0, 1.0, 1.0], units)
    assert not first.admit and first.estimate_ms == pytest.approx(100 + 3 * 100)


def test_before_any_measurement_the_first_burst_is_bounded() -> None:
    service, interval = default_estimates(100.0)
    assert service == interval == 50.0
    assert admit_latency(0, None, None, 100.0).admit
    assert admit_latency(1, None, None, 100.0).admit
    # the third request of an idle burst is refused before the scaler ever ticked
    assert not admit_latency(2, None, None, 100.0).admit


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_latency_bound_refuses_a_bad_slo(bad: float) -> None:
    with pytest.raises(ValueError):
        admit_latency(0, 1.0, 1.0, bad)


def test_deadline_table_expiry_cancel_and_reuse() -> None:
    w = DeadlineTable("dltest_x", create=True)
    r = DeadlineTable("dltest_x")  # a reader, as in an instance
    try:
        seq = 7
        req = seq << 16 | 3  # item 3 of request 7
        now_ns = 1_000_000_000
        w.set(seq, 2.0)  # deadline at 2 s (monotonic)
        assert not r.dead(req, now_ns=now_ns)
        assert r.dead(req, now_ns=2_000_000_001)
        w.cancel(seq)
        assert r.dead(req, now_ns=now_ns)
        # the entry reused by a request ENTRIES later: the old one reads as unknown (live)
        w.set(seq + ENTRIES, None)
        assert not r.dead(req, now_ns=now_ns)
        assert not r.dead((seq + ENTRIES) << 16, now_ns=now_ns)
        assert r.remaining_s((seq + ENTRIES) << 16) is None
        # unknown requests are live (the safe side)
        assert not r.dead(12345 << 16)
        # a table that does not exist is no error: nothing is dead
        assert not DeadlineTable("dltest_missing").dead(req)
    finally:
        r.close()
        w.close()
