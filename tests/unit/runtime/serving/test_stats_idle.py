"""The served idle slowdown (runtime.stats.IdleSlowdown): hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from infscaler.runtime.planning.simulator import EngineProfile
from infscaler.runtime.serving.stats import IDLE_EDGES_S, IdleSlowdown, PipelineStats

MS = 1_000_000  # ns


def feed_warm_then_idle(s: IdleSlowdown, n: int, *, idle_gap_ms: int, tail_ms: int | None):
    """One instance: n warm items (5 ms gaps, 10 ms compute, queued: no wake), then n
    items after ``idle_gap_ms`` idle each (input ready 1 ms after the instance went
    idle, woken 3 ms later, 15 ms compute)."""
    t = 0
    for _ in range(n):
        start = t + 5 * MS
        s.add(0, start, start + 10 * MS, ready_ns=start - 20 * MS, now=0.0)
        t = start + 10 * MS
    for _ in range(n):
        ready = t + (idle_gap_ms - 3) * MS
        start = ready + 3 * MS
        tail = None if tail_ms is None else tail_ms * MS
        s.add(0, start, start + 15 * MS, ready_ns=ready, tail_ns=tail, now=0.0)
        t = start + 15 * MS


def test_points_fold_wake_and_tail_into_the_factor():
    s = IdleSlowdown()
    feed_warm_then_idle(s, 12, idle_gap_ms=300, tail_ms=2)
    # (15 compute + 3 wake + 2 tail - 2 hops x 0.5) / 10 warm = 1.9 at the 0.3 s gap
    assert s.points(handover_ms=0.5, now=0.0) == ((0.3, 1.9),)
    summary = s.summary(now=0.0)
    assert summary["warm_compute_p50_ms"] == 10.0
    busy = summary["bins"][0]
    assert busy["count"] == 11 and busy["wake_count"] == 0  # the first item has no gap
    b = [x for x in summary["bins"] if x["count"] and x is not busy]
    assert len(b) == 1 and b[0]["idle_s"] == [0.2, 0.4]
    assert b[0]["wake_p50_ms"] == 3.0 and b[0]["tail_p50_ms"] == 2.0
    # the simulator takes them as they are
    EngineProfile("cpu", 10.0, idle=s.points(0.5, now=0.0))


def test_without_tail_one_hop_is_taken_off():
    s = IdleSlowdown()
    feed_warm_then_idle(s, 12, idle_gap_ms=60, tail_ms=None)
    assert s.points(handover_ms=0.5, now=0.0) == ((0.06, pytest.approx(1.75)),)


def test_too_few_items_give_no_points():
    s = IdleSlowdown()
    feed_warm_then_idle(s, 5, idle_gap_ms=300, tail_ms=2)
    assert s.points(handover_ms=0.5, now=0.0) == ()
    assert s.points(handover_ms=0.5, min_count=4, now=0.0) == ((0.3, 1.9),)


def test_out_of_order_rows_are_not_binned_and_instances_are_apart():
    s = IdleSlowdown()
    s.add(0, 100 * MS, 110 * MS, ready_ns=0)
    s.add(0, 50 * MS, 60 * MS, ready_ns=0)  # started before the last end seen: skipped
    s.add(1, 55 * MS, 65 * MS, ready_ns=0)  # another instance: its first item, no gap
    s.add(1, 75 * MS, 80 * MS, ready_ns=70 * MS)  # gap 10 ms, woken 5 ms after ready
    counts = [b["count"] for b in s.summary()["bins"]]
    assert sum(counts) == 1 and counts[0] == 1
    assert s.summary()["bins"][0]["wake_p50_ms"] == 5.0


def test_old_items_leave_the_window():
    s = IdleSlowdown(horizon_s=10.0)
    feed_warm_then_idle(s, 12, idle_gap_ms=300, tail_ms=2)
    assert s.points(0.5, now=5.0)
    assert s.points(0.5, now=11.0) == ()


def test_bins_cover_every_gap():
    s = IdleSlowdown()
    gaps_ms = [1, 30, 70, 150, 300, 600, 5000]
    t = 0
    s.add(0, 0, 1, ready_ns=0)
    t = 1
    for g in gaps_ms:
        start = t + g * MS
        s.add(0, start, start + MS, ready_ns=start)
        t = start + MS
    assert [b["count"] for b in s.summary()["bins"]] == [1] * (len(IDLE_EDGES_S) + 1)


def test_pipeline_stats_feed_the_last_unit_its_tail():
    """Two units; the trace rows as the front end gets them; the answer 2 ms after the
    last unit's end: only the last unit's items carry a tail."""
    st = PipelineStats(["a", "b"])
    t = 0
    for i in range(24):
        gap = 5 if i < 12 else 300
        submit = t + gap * MS
        a0, a1 = submit + 1 * MS, submit + 11 * MS
        b0, b1 = a1 + 1 * MS, a1 + 21 * MS
        trace = np.array([[0, 0, a0, a1], [1, 0, b0, b1]], np.int64)
        st.record_success((b1 + 2 * MS - submit) / 1e6, trace, submit)
        t = b1 + 2 * MS
    snap = st.snapshot()
    a_bins = snap["units"][0]["idle"]["bins"]
    b_bins = snap["units"][1]["idle"]["bins"]
    assert all(b["tail_p50_ms"] is None for b in a_bins)
    assert any(b["tail_p50_ms"] == 2.0 for b in b_bins)
    pts = st.idle_points(handover_ms=0.0)
    # unit a's instance idles 30 ms between the first 12 requests (b's 20 ms, the tail,
    # the gap): no warm item, no points; b's idles 19 ms (warm), then 314 ms:
    # (20 compute + 1 wake + 2 tail) / 20 warm
    assert pts[0] == ()
    assert pts[1] == ((0.314, pytest.approx(1.15)),)


def test_instances_gone_past_the_horizon_are_forgotten():
    """Months of restarts and scaling add instance ids: the ones idle past the horizon
    are dropped once more than 64 are known, the live ones kept."""
    s = IdleSlowdown(horizon_s=10.0)
    for i in range(100):
        s.add(i, i * MS, i * MS + 1, ready_ns=0)
    assert len(s._last_end) == 100  # all within the horizon
    late = 60 * 10**9
    s.add(1000, late, late + MS, ready_ns=late)
    assert set(s._last_end) == {1000}
    s.add(1000, late + 5 * MS, late + 6 * MS, ready_ns=late + 5 * MS)
    assert s.summary()["bins"][0]["count"] == 1  # its own gap still counts
