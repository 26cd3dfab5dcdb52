"""bench/tuner.py's outcomes on hand-made rows (no service, no host measured): the times
from the step to the first scale-out and to the new instance ready, the misses between,
attainment and P99, and the tuner / scaler ratios."""

from __future__ import annotations

import pytest

from tests.helpers import bench_module

SLO = 100.0
STEP = 10.0


def rows() -> list[dict]:
    """One request per second before the step (all fast), 4 per second after it: the
    first 3 s late (t 10-12.75: 12 sent, the ones at 10.0 / 10.25 refused), then fast."""
    out = [{"t_s": float(t), "outcome": "ok", "ms": 50.0} for t in range(10)]
    for i in range(40):
        t = STEP + i / 4
        if t < 10.5:
            out.append({"t_s": t, "outcome": "refused", "ms": 1.0})
        elif t < 13.0:
            out.append({"t_s": t, "outcome": "ok", "ms": 300.0})
        else:
            out.append({"t_s": t, "outcome": "ok", "ms": 60.0})
    return out


def test_outcomes_hand_computed() -> None:
    tb = bench_module("tuner")
    decisions = [
        {"t_s": 4.0, "action": "shed"},
        {"t_s": 12.0, "action": "tuner_scale_out", "count": 2},
        {"t_s": 20.0, "action": "scale_out"},
    ]
    polls = [(9.5, 1), (11.5, 1), (12.5, 1), (13.5, 3), (14.5, 3)]
    o = tb.outcomes(rows(), decisions, polls, SLO, STEP)
    assert o["instances_at_step"] == 1
    assert o["first_scale_out"]["action"] == "tuner_scale_out"
    assert (o["to_decision_s"], o["to_ready_s"]) == (2.0, 3.5)
    # sent in [10, 12): 8, all missed (2 refused, 6 late); from 12: 32, 4 late (12-12.75)
    assert o["between"] == {"sent": 8, "missed": 8}
    assert o["after_decision"] == {"sent": 32, "missed": 4}
    assert o["missed_after_step"] == 12
    assert o["attainment_before"] == 1.0
    assert o["attainment_after"] == pytest.approx(28 / 40, abs=1e-4)
    assert o["p99_before_ms"] == 50.0
    assert o["p99_after_ms"] == 300.0
    assert o["scale_outs_before_step"] == []


def test_no_scale_out_after_the_step_counts_every_miss_as_before_it() -> None:
    tb = bench_module("tuner")
    early = [{"t_s": 5.0, "action": "scale_out"}]
    o = tb.outcomes(rows(), early, [(9.0, 2), (15.0, 2)], SLO, STEP)
    assert o["to_decision_s"] is None and o["to_ready_s"] is None
    assert o["between"] == {"sent": 40, "missed": 12}
    assert o["after_decision"] is None
    assert [d["t_s"] for d in o["scale_outs_before_step"]] == [5.0]


def test_ratios_tuner_over_scaler() -> None:
    tb = bench_module("tuner")
    t = tb.outcomes(rows(), [{"t_s": 12.0, "action": "tuner_scale_out"}], [], SLO, STEP)
    s = tb.outcomes(rows(), [{"t_s": 14.0, "action": "scale_out"}], [], SLO, STEP)
    r = tb.ratios({"tuner": {"outcomes": t}, "scaler": {"outcomes": s}})
    assert r["to_decision_s"] == 0.5  # 2 s / 4 s
    assert r["to_ready_s"] is None  # no poll: never ready
    assert r["missed_before_scale_out"] == 0.667  # 8 missed in [10, 12) / 12 in [10, 14)
    assert r["missed_after_step"] == 1.0
