"""The arrival trace the statistics expose (runtime.serving.stats: RateWindow.count_since /
times_since, PipelineStats.offered_times): hand-placed times."""

from __future__ import annotations

import numpy as np

from infscaler.runtime.serving.stats import PipelineStats, RateWindow


def test_rate_window_times_since_and_count_since() -> None:
    w = RateWindow(horizon_s=10.0)
    for t in (1.0, 2.0, 2.5, 9.0, 12.5):
        w.add(now=t)
    # 12.5 trims what is older than 2.5 s: 1.0 and 2.0 are gone
    assert w.times_since(0.0).tolist() == [2.5, 9.0, 12.5]
    assert w.times_since(9.0).tolist() == [9.0, 12.5]  # at or after the cutoff
    assert w.count_since(9.0) == 2
    assert w.times_since(13.0).size == 0 and w.times_since(13.0).dtype == np.float64
    assert w.count_since(13.0) == 0


def test_offered_times_holds_admitted_and_refused_requests_a_copy() -> None:
    s = PipelineStats(["det"])
    s.arrival()
    s.record_rejection(slo=True)
    s.arrival()
    got = s.offered_times(0.0)
    assert got.size == 3 and bool(np.all(np.diff(got) >= 0))
    assert s.offered_times(float(got[-1]) + 1e-6).size == 0
    got[:] = -1.0  # a copy: the statistics are not changed through it
    assert s.offered_times(0.0).min() >= 0.0
