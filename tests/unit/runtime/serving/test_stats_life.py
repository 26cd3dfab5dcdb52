"""A pipeline's statistics across a switch of configuration: the counters go on, the
windows start again, and the old configuration's late answers still count."""

from __future__ import annotations

import numpy as np

from infscaler.runtime.serving.route import Route
from infscaler.runtime.serving.stats import PipelineStats


def _trace(*units: int) -> np.ndarray:
    """One row per unit: 1 ms queue, 2 ms compute each, starting at t = 0 ns."""
    rows, t = [], 0
    for u in units:
        rows.append([u, 1, t + 1_000_000, t + 3_000_000])
        t += 3_000_000
    return np.array(rows, dtype=np.int64)


def test_counters_survive_a_switch_and_the_old_configuration_still_counts() -> None:
    old = PipelineStats(["m"])
    for _ in range(3):
        old.record_success(5.0, _trace(0), 0)
    old.record_failure(500)
    old.record_rejection(slo=True)
    old.refused["slo"] += 1

    new = old.successor(["m.0", "m.1"])
    assert new.life is old.life
    # the old configuration answers one more while it drains
    old.record_success(5.0, _trace(0), 0)
    new.record_success(7.0, _trace(0, 1), 0)
    new.refused["queue_full"] += 2

    t = new.totals()
    assert t["success"] == 5 and new.success == 5
    assert t["fail"] == {500: 1}
    assert t["rejected"] == 1
    assert t["refused"] == {"queue_full": 2, "slo": 1}
    assert t["latency_count"] == 5 and abs(t["latency_ms"] - 27.0) < 1e-9
    # 4 single-unit requests + one of two units
    assert t["compute_count"] == 6 and abs(t["compute_ms"] - 12.0) < 1e-6
    assert t["queue_count"] == 6
    assert t["configurations"] == 2
    # per unit: this configuration's units, counted by name
    assert [u["compute_count"] for u in t["units"]] == [1, 1]
    snap = new.snapshot()
    assert snap["success"] == 5 and snap["refused"]["queue_full"] == 2
    # the window is the configuration's own: only the new one's request
    assert snap["latency"]["window_count"] == 1
    assert [u["unit"] for u in snap["units"]] == ["m.0", "m.1"]


def test_a_unit_of_the_same_name_goes_on_counting() -> None:
    old = PipelineStats(["a", "b"])
    old.record_success(5.0, _trace(0, 1), 0)
    new = old.successor(["a", "b"])
    new.record_success(5.0, _trace(0, 1), 0)
    assert [u["compute_count"] for u in new.totals()["units"]] == [2, 2]


def test_a_new_pipeline_starts_from_zero() -> None:
    a = PipelineStats(["m"])
    a.record_success(5.0, _trace(0), 0)
    b = PipelineStats(["m"])
    assert b.totals()["success"] == 0 and b.totals()["configurations"] == 1


def test_a_route_counts_refusals_in_its_statistics() -> None:
    stats = PipelineStats(["m"])
    route = Route(None, [1], stats)  # type: ignore[arg-type]
    route.refusals["slo"] += 1
    nxt = Route(None, [2], stats.successor(["m"]))  # type: ignore[arg-type]
    nxt.refusals["slo"] += 1
    assert nxt.stats.totals()["refused"] == {"slo": 2}
