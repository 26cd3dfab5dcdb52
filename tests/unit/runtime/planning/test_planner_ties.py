"""Tests of the planner's ties (infscaler.runtime.planning.planner.search): every measured figure
carries an uncertainty (ModelStage.whole_ms_err, unit_ms_err), each finalist a goodput
interval scored at the figures' pessimistic and optimistic ends, and candidates whose
intervals overlap tie, the tie going to the simpler configuration. Pure functions on
hand-built stages, as tests/unit/runtime/planning/test_planner_search.py."""

from __future__ import annotations

import pytest

from infscaler.partitioner.profiler import median_err
from infscaler.runtime.planning.planner import ModelStage, search
from infscaler.runtime.scaling.types import ResourceCap

CAP = ResourceCap(
    memory_cap_mb=float("inf"), memory_used_mb=0.0, max_instances={"cpu": 16}, cores=2
)


def stage(whole: float, parts: tuple[float, float], err: float) -> ModelStage:
    """Two equal operators of 50 MB weights each, one valid cut, 1 thread only: the
    search weighs K=1 (two 1-thread replicas, 2 cores) against K=2 (one instance per
    partition), each partition's time measured (``unit_ms``); ``err`` is every
    figure's relative uncertainty."""
    return ModelStage(
        "m",
        costs=(1, 1),
        valid_cuts=(0,),
        whole_ms={1: whole},
        whole_ms_err={1: err},
        unit_ms={((0,), 1): parts},
        unit_ms_err={((0,), 1): (err, err)},
        weights_bytes=(50e6, 50e6),
        cv=0.04,
    )


def plan(st: ModelStage):
    # SLO 150 ms (3 x the 50 ms model), no front end, a short long trace to keep it quick
    return search([st], 150.0, CAP, cores=2, frontend_ms=0.0, max_partitions=2,
                  final_requests=3000)  # fmt: skip


def k(c) -> int:
    return len(c.cuts[0]) + 1


def test_the_same_model_measured_twice_within_its_err_plans_the_same():
    # Two measurements of one model, every figure within 10 % of the other's (its err):
    # whole 50 / 47 ms, partitions 20 + 22 / 22 + 24.2 ms. Capacity: K=1 two replicas
    # 2 / whole (40 / 42.6 per s), K=2 one per partition 1 / slowest partition (45.5 /
    # 41.3 per s). Taken as exact, the first makes K=2 better by more than the 5 % tie
    # and the second K=1: the winner flips on the noise
    a0, b0 = plan(stage(50.0, (20.0, 22.0), 0.0)), plan(stage(47.0, (22.0, 24.2), 0.0))
    assert k(a0.best) == 2 and k(b0.best) == 1
    assert all(c.goodput_lo is None and c.goodput_hi is None for c in a0.candidates)
    # with their 10 % err the two goodput intervals overlap in both: a tie, and the tie
    # goes to fewer partitions, run after run
    a, b = plan(stage(50.0, (20.0, 22.0), 0.1)), plan(stage(47.0, (22.0, 24.2), 0.1))
    for out in (a, b):
        assert k(out.best) == 1 and [x.total for x in out.best.config] == [2]
        lo, hi = out.best.interval()
        assert lo < out.best.goodput_rps < hi
        k2 = next(c for c in out.candidates if k(c) == 2)
        assert k2.finalist and k2.goodput_lo is not None
        assert k2.interval()[1] >= out.best.interval()[0]  # the intervals overlap
        # the loser says what it tied with and which simplicity rule decided
        assert out.best.label() in k2.why
        assert "(rule: fewer partitions) with more units (2 > 1" in k2.why
    # in the first, K=2 has the best goodput (by more than 5 %): tied by overlapping
    # intervals, not by the 5 %
    k2a = next(c for c in a.candidates if k(c) == 2)
    assert k2a.goodput_rps > a.best.goodput_rps / 0.95
    assert "tied by overlapping intervals by the winner" in k2a.why
    # same seed and trace: the central figures are the exact plan's
    assert k2a.goodput_rps == next(c for c in a0.candidates if k(c) == 2).goodput_rps


def test_intervals_apart_the_better_goodput_wins_though_more_complex():
    # partitions of 15 + 16 ms at 2 % err: K=2 ~ 1000 / 16 per s, K=1 ~ 2000 / 50; the
    # intervals are far apart, so the better goodput wins with more partitions
    out = plan(stage(50.0, (15.0, 16.0), 0.02))
    assert k(out.best) == 2
    k1 = next(c for c in out.candidates if k(c) == 1 and c.finalist)
    assert k1.interval()[1] < out.best.interval()[0]
    assert k1.why.startswith("lower goodput (")
    assert "its interval does not reach the best's" in k1.why


def test_the_interval_is_shown_in_the_line_and_the_dict():
    out = plan(stage(50.0, (20.0, 22.0), 0.1))
    lo, hi = out.best.interval()
    assert f"goodput {out.best.goodput_rps:.2f}/s [{lo:.2f}, {hi:.2f}]" in out.best.line()
    d = out.to_dict()["best"]
    assert d["goodput_lo_rps"] == out.best.goodput_lo
    assert d["goodput_hi_rps"] == out.best.goodput_hi
    assert d["goodput_lo_rps"] < d["goodput_rps"] < d["goodput_hi_rps"]
    # a candidate never scored at its ends (screened out) shows its goodput alone
    bare = plan(stage(50.0, (20.0, 22.0), 0.0)).best
    assert "[" not in bare.line().split("goodput ")[1].split(" max")[0]


def test_unit_errs_share_the_whole_models_err_by_time():
    # 10 ms whole at 4 %, cut in two equal halves with a 1 ms T_p: the first partition
    # 5 ms +- 0.2 (0.04), the second 6 ms +- 0.2 (0.0333); measured partitions carry
    # their own err, or the whole model's where none was given
    st = ModelStage("m", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0},
                    whole_ms_err={1: 0.04}, boundary_fixed_ms=1.0)  # fmt: skip
    assert st.unit_errs((0,), 1) == pytest.approx([0.04, 0.2 / 6])
    assert st.unit_errs((), 1) == pytest.approx([0.04])
    m = ModelStage("m", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0},
                   whole_ms_err={1: 0.04}, unit_ms={((0,), 1): (4.0, 7.0)},
                   unit_ms_err={((0,), 1): (0.1, 0.2)})  # fmt: skip
    assert m.unit_errs((0,), 1) == pytest.approx([0.1, 0.2])
    assert ModelStage("m", costs=(1,), valid_cuts=(), whole_ms={1: 5.0}).unit_errs((), 1) == [0.0]
    for bad in ({1: -0.1}, {1: 1.0}, {1: float("nan")}):
        with pytest.raises(ValueError, match="whole_ms_err"):
            ModelStage("m", costs=(1,), valid_cuts=(), whole_ms={1: 5.0}, whole_ms_err=bad)


def test_median_err_is_the_order_statistic_interval_of_the_median():
    # 30 runs 1..30: the 95 % interval of the median is the 10th to the 21st run
    # (binomial(30, 1/2)), around the median 15.5: 5.5 / 15.5
    assert median_err([float(x) for x in range(1, 31)]) == pytest.approx(5.5 / 15.5)
    # 10 runs: the 2nd to the 9th (97.9 %; the 3rd to the 8th covers 89 %)
    assert median_err([float(x) for x in range(1, 11)]) == pytest.approx(3.5 / 5.5)
    # 5 runs (too few for 95 %): the fastest and the slowest, the farther one
    assert median_err([10.0, 11.0, 9.0, 10.0, 12.0]) == pytest.approx(0.2)
    assert median_err([5.0] * 12) == 0.0
    assert median_err([5.0]) is None
    with pytest.raises(ValueError, match="confidence"):
        median_err([1.0, 2.0], confidence=1.0)


def test_a_measured_median_carries_at_least_the_hosts_drift():
    from infscaler.runtime.planning.stageprofile import DRIFT_ERR, with_drift

    assert with_drift(None) == DRIFT_ERR
    assert with_drift(0.01) == DRIFT_ERR  # 30 quiet runs: the runs alone say 1 %
    assert with_drift(0.25) == 0.25
    assert with_drift(3.0) == 0.99
    # K=2 better by more than the 5 % tie on one measurement: with the runs' own 1 %
    # it wins; with the host's drift counted the intervals overlap and the simpler
    # K=1 wins, as it would on the next measurement
    assert k(plan(stage(50.0, (20.0, 22.0), 0.01)).best) == 2
    assert k(plan(stage(50.0, (20.0, 22.0), with_drift(0.01))).best) == 1
