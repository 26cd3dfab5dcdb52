"""The live check of a planned configuration (infscaler.runtime.planning.livecheck.check) on
hand-computed observations: wait, keep what serves its prediction, try the runner-up when
the choice falls short, keep the better after the trial, and never more switches than
allowed."""

from __future__ import annotations

import math

import pytest

from infscaler.runtime.planning.livecheck import (
    Expected,
    LiveConfig,
    LiveState,
    Observed,
    check,
)
from infscaler.runtime.queueing import capacity_rps

#: K = 2, one instance each: 30 ms and 20 ms per request -> 33.3/s
K2 = Expected("K=2 inst=1+1", (30.0, 20.0), (1, 1), (1.0, 1.0), goodput_rps=30.0)
#: K = 1, two 1-thread replicas of 45 ms -> 44.4/s
REP = Expected("K=1 t=1 inst=2", (45.0,), (2,), (1.0,), goodput_rps=40.0)


def obs(capacity: float | None, **kw) -> Observed:
    base = dict(
        since_change_s=30.0, answered=500, capacity_rps=capacity, p99_ms=80.0,
        offered_rps=12.0, slo_ms=150.0,
    )  # fmt: skip
    base.update(kw)
    return Observed(**base)


def test_capacity_is_the_slowest_unit_over_its_instances() -> None:
    assert capacity_rps([30.0, 20.0], [1, 1]) == pytest.approx(1000 / 30)
    assert capacity_rps([30.0, 20.0], [2, 1]) == pytest.approx(1000 / 20)
    # a per-item unit after a fan-out of 3 items a request
    assert capacity_rps([10.0, 10.0], [1, 1], [1.0, 3.0]) == pytest.approx(1000 / 30)
    assert math.isinf(capacity_rps([0.0], [1]))
    assert K2.capacity_at((2, 1)) == pytest.approx(50.0)
    assert K2.capacity_at((1,)) == pytest.approx(K2.capacity_rps)  # not its units: planned
    assert Expected.from_dict(K2.to_dict()) == K2


def test_nothing_is_judged_while_it_settles_or_on_few_requests() -> None:
    v, st = check(obs(5.0, since_change_s=3.0), LiveState(), K2, REP)
    assert v.action == "wait" and "settling" in v.reason and st == LiveState()
    v, st = check(obs(5.0, answered=20), LiveState(), K2, REP)
    assert v.action == "wait" and "20 of 50" in v.reason and st == LiveState()
    v, _ = check(obs(None), LiveState(), K2, REP)
    assert v.action == "wait"


def test_a_choice_that_serves_its_prediction_is_kept_for_good() -> None:
    v, st = check(obs(31.0), LiveState(), K2, REP)  # 31 of 33.3: within 15 %
    assert v.action == "keep" and st.phase == "settled" and st.switches == 0
    assert "measured 31.0/s of a predicted 33.3/s" in v.reason
    # settled: later observations, however bad, change nothing
    v2, st2 = check(obs(1.0), st, K2, REP)
    assert v2.action == "keep" and st2 == st


def test_a_choice_short_of_its_prediction_tries_the_runner_up_then_keeps_the_better() -> None:
    v, st = check(obs(22.0), LiveState(), K2, REP)  # 22 < 0.85 x 33.3 = 28.3
    assert v.action == "switch" and st.phase == "trial" and st.switches == 1
    assert "falls short" in v.reason and "trying K=1 t=1 inst=2" in v.reason
    assert dict(st.measured) == {"K=2 inst=1+1": 22.0}
    # the runner-up serves now: judged once settled, against what the first measured
    v, st2 = check(obs(40.0, since_change_s=2.0), st, REP, K2)
    assert v.action == "wait"
    v, st2 = check(obs(40.0), st, REP, K2)
    assert v.action == "keep" and st2.phase == "settled" and st2.switches == 1
    assert "kept K=1 t=1 inst=2: measured 40.0/s against 22.0/s" in v.reason


def test_a_trial_that_measures_less_goes_back() -> None:
    _, st = check(obs(22.0), LiveState(), K2, REP)
    v, st2 = check(obs(15.0), st, REP, K2)  # 22 > 1.1 x 15
    assert v.action == "switch" and "back to K=2 inst=1+1" in v.reason
    assert st2.phase == "settled" and st2.switches == 2
    # a tie keeps the one serving: no switch back for 21 against 22
    v, st3 = check(obs(21.0), st, REP, K2)
    assert v.action == "keep" and st3.switches == 1


def test_short_without_a_better_runner_up_is_kept_and_says_why() -> None:
    v, st = check(obs(22.0), LiveState(), K2, None)
    assert v.action == "keep" and "no runner-up" in v.reason and st.phase == "settled"
    slow = Expected("K=3", (45.0,), (1,), (1.0,), goodput_rps=20.0)  # 22.2/s < 1.1 x 22
    v, _ = check(obs(22.0), LiveState(), K2, slow)
    assert v.action == "keep" and "not more than 10%" in v.reason


def test_missing_the_slo_below_the_predicted_goodput_is_short_too() -> None:
    # capacity as predicted, but P99 300 ms > 150 at 12/s, far below 30/s predicted
    v, st = check(obs(33.0, p99_ms=300.0), LiveState(), K2, REP)
    assert v.action == "switch" and "P99 300 ms > SLO 150 ms at 12.0/s" in v.reason
    # at a load near the predicted goodput the P99 is the scaler's business
    v, _ = check(obs(33.0, p99_ms=300.0, offered_rps=29.0), LiveState(), K2, REP)
    assert v.action == "keep"


def test_the_prediction_follows_the_instances_the_scaler_added() -> None:
    # scaled to 2 + 1 instances: predicted 50/s, measured 41 is short of it
    v, _ = check(obs(41.0, instances=(2, 1)), LiveState(), K2, REP)
    assert v.action == "keep" and "falls short" in v.reason  # REP 44.4 < 1.1 x 41
    v, _ = check(obs(40.0), LiveState(), K2, REP)  # at the planned 1 + 1: not short
    assert "of a predicted 33.3/s" in v.reason


def test_the_uncertainty_widens_what_counts_as_serving_the_prediction() -> None:
    noisy = Expected(K2.label, K2.unit_ms, K2.instances, K2.items, 30.0, err=0.2)
    v, _ = check(obs(22.0), LiveState(), noisy, REP)  # floor 33.3 x 0.65 = 21.7
    assert v.action == "keep"


def test_no_more_switches_than_allowed() -> None:
    cfg = LiveConfig(max_switches=0)
    v, st = check(obs(22.0), LiveState(), K2, REP, cfg)
    assert v.action == "keep" and st.switches == 0
