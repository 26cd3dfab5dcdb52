"""Tests of the balanced partition objectives (infscaler.partitioner.search.search_minmax,
evaluate_cuts; issue 15): hand-computed cases and a brute-force check."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infscaler.base.errors import PartitionError
from infscaler.partitioner.search import evaluate_cuts, search_minmax

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_minmax_balances_hand_case():
    # [4, 1 | 1, 4]: both halves cost 5, any other cut leaves 9 on one side
    r = search_minmax([4, 1, 1, 4], [0, 1, 2], 2)
    assert r.cuts == (1,)
    assert r.objective == 5.0
    assert r.partition_costs == (5.0, 5.0)
    assert r.objective_name == "minmax"


def test_minmax_one_partition_is_the_whole_model():
    r = search_minmax([3, 1, 2], [0, 1], 1)
    assert r.cuts == ()
    assert r.objective == 6.0


def test_weights_objective_moves_the_weights_out_of_the_bottleneck():
    # costs [1, 1, 8, 2], all weights (100 bytes) on operator 0.
    # minmax, K=2: cut 0 -> 1|11, cut 1 -> 2|10, cut 2 -> 10|2: S* = 10 at cuts 1 and 2;
    # sum S^2 ties (104 each), so the latest cut wins: (2,), the weights sit in the
    # bottleneck partition (cost 10).
    plain = search_minmax([1, 1, 8, 2], [0, 1, 2], 2)
    assert plain.cuts == (2,)
    assert plain.partition_weights == (0.0, 0.0)
    # weights, slack 0.1: every S_k <= 11 allows cuts 0, 1, 2; sum W_k S_k is
    # 100x1 = 100 (cut 0), 100x2 = 200 (cut 1), 100x10 = 1000 (cut 2): cut 0, the
    # weights alone in a partition of cost 1.
    w = search_minmax([1, 1, 8, 2], [0, 1, 2], 2, weights=[100, 0, 0, 0])
    assert w.cuts == (0,)
    assert w.partition_costs == (1.0, 11.0)
    assert w.partition_weights == (100.0, 0.0)
    assert w.objective == 11.0
    assert w.objective_name == "weights"
    # without slack the largest partition may not grow: cut 1 (200 < 1000)
    assert search_minmax([1, 1, 8, 2], [0, 1, 2], 2, weights=[100, 0, 0, 0], slack=0).cuts == (1,)


def test_minmax_prefers_fewer_crossing_bytes_among_ties():
    # [1, 2, 1]: cut 0 -> 1|3, cut 1 -> 3|1, both max 3 and sum S^2 10: bytes decide
    assert search_minmax([1, 2, 1], [0, 1], 2, cut_bytes={0: 10, 1: 99}).cuts == (0,)
    assert search_minmax([1, 2, 1], [0, 1], 2, cut_bytes={0: 99, 1: 10}).cuts == (1,)


def test_errors_are_clear():
    with pytest.raises(PartitionError, match="at most 2 partitions"):
        search_minmax([1, 2], [0], 3)
    with pytest.raises(PartitionError, match=">= 1"):
        search_minmax([1, 2], [0], 0)
    with pytest.raises(PartitionError, match="weight sizes"):
        search_minmax([1, 2], [0], 2, weights=[1])
    with pytest.raises(PartitionError, match="slack"):
        search_minmax([1, 2], [0], 2, weights=[1, 1], slack=-1)
    with pytest.raises(PartitionError, match="not valid cut"):
        evaluate_cuts([1, 2, 3], [1], [0])


def test_evaluate_cuts_reports_the_plan():
    r = evaluate_cuts([1, 1, 8, 2], [0, 1, 2], [2, 0], weights=[5, 0, 0, 1])
    assert r.cuts == (0, 2)
    assert r.partition_costs == (1.0, 9.0, 2.0)
    assert r.partition_weights == (5.0, 0.0, 1.0)
    assert r.objective == 9.0
    assert r.objective_name == "given"


@st.composite
def problems(draw):
    n = draw(st.integers(1, 8))
    costs = draw(st.lists(st.integers(0, 9).map(float), min_size=n, max_size=n))
    cuts = sorted(draw(st.sets(st.integers(0, max(0, n - 2)), max_size=n - 1))) if n > 1 else []
    k = draw(st.integers(1, len(cuts) + 1))
    weights = draw(st.lists(st.integers(0, 5).map(float), min_size=n, max_size=n))
    return costs, cuts, k, weights


@SETTINGS
@given(problems())
def test_minmax_matches_brute_force(prob):
    costs, cuts, k, weights = prob
    n = len(costs)

    def parts(combo):
        starts = [0, *(c + 1 for c in combo)]
        ends = [*combo, n - 1]
        return [
            (math.fsum(costs[s : e + 1]), math.fsum(weights[s : e + 1]))
            for s, e in zip(starts, ends, strict=True)
        ]

    plans = [parts(c) for c in itertools.combinations(cuts, k - 1)]
    s_star = min(max(s for s, _ in p) for p in plans)
    r = search_minmax(costs, cuts, k)
    assert r.objective == s_star
    assert math.fsum(s * s for s in r.partition_costs) == min(
        math.fsum(s * s for s, _ in p) for p in plans if max(s for s, _ in p) == s_star
    )
    rw = search_minmax(costs, cuts, k, weights=weights)
    limit = 1.1 * s_star + 1e-9
    ok = [p for p in plans if max(s for s, _ in p) <= limit]
    assert rw.objective <= limit
    got = math.fsum(s * w for s, w in zip(rw.partition_costs, rw.partition_weights, strict=True))
    assert got == min(math.fsum(s * w for s, w in p) for p in ok)
