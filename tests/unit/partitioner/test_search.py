"""Tests of the Eq. 1 partition search (infscaler.partitioner.search, InfScaler §IV-A)."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infscaler.base.errors import PartitionError
from infscaler.partitioner.search import (
    SearchResult,
    brute_force,
    max_partitions_for_slo,
    representative_mask,
    search_partitions,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@st.composite
def problems(draw):
    """(costs, valid_cuts): N in 1..12, floats in [0, 1e3] or small integers (for ties)."""
    n = draw(st.integers(1, 12))
    elem = draw(
        st.sampled_from(
            [
                st.floats(0, 1e3, allow_nan=False, allow_infinity=False),
                st.integers(0, 3).map(float),
                st.sampled_from([0.1, 0.7, 333.3, 999.9]),
            ]
        )
    )
    costs = draw(st.lists(elem, min_size=n, max_size=n))
    cuts = draw(st.sets(st.integers(0, n - 2))) if n > 1 else set()
    return costs, sorted(cuts)


def check_plan(res: SearchResult, costs, cuts) -> None:
    """Structural invariants every plan must satisfy."""
    n = len(costs)
    rep = representative_mask(costs)
    assert list(res.cuts) == sorted(res.cuts)
    assert len(set(res.cuts)) == len(res.cuts)
    assert set(res.cuts) <= set(cuts)
    assert res.num_partitions == len(res.cuts) + 1
    assert len(res.sigmas) == len(res.bottleneck) == len(res.bounds) == res.num_partitions
    assert res.representative == tuple(bool(x) for x in rep)
    # Bounds tile 0..N-1 in order and match the cuts.
    assert res.bounds[0][0] == 0 and res.bounds[-1][1] == n - 1
    for (_, e), (s2, _) in zip(res.bounds, res.bounds[1:], strict=False):
        assert s2 == e + 1
    assert tuple(e for _, e in res.bounds[:-1]) == res.cuts
    # Every partition holds a representative operator; sigma / B_k match the definition.
    for (s, e), sig, b in zip(res.bounds, res.sigmas, res.bottleneck, strict=True):
        vals = np.asarray(costs[s : e + 1])[rep[s : e + 1]]
        assert vals.size >= 1
        assert close(sig, float(np.std(vals)))
        assert close(b, float(vals.sum()))
    assert close(sum(res.bottleneck), float(np.asarray(costs)[rep].sum()))
    assert close(res.objective, sum(res.sigmas))


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(problems(), st.integers(1, 4))
def test_dp_matches_brute_force_fixed_k(problem, k):
    costs, cuts = problem
    try:
        expected = brute_force(costs, cuts, k)
    except PartitionError:
        expected = None
    try:
        got = search_partitions(costs, cuts, num_partitions=k)
    except PartitionError:
        got = None
    assert (got is None) == (expected is None)
    if got is None:
        return
    assert got.num_partitions == k
    assert close(got.objective, expected.objective)
    check_plan(got, costs, cuts)
    check_plan(expected, costs, cuts)
    # without cut bytes the tie-break is the latest cuts, the same in both
    assert got.cuts == expected.cuts
    assert got.crossing_bytes == expected.crossing_bytes == 0.0


@st.composite
def problems_with_bytes(draw):
    """(costs, valid_cuts, cut_bytes): bytes per cut, often equal (ties on bytes too)."""
    costs, cuts = draw(problems())
    n = len(costs)
    elem = draw(
        st.sampled_from([st.integers(0, 3), st.integers(0, 10**7), st.sampled_from([0, 2**20])])
    )
    nbytes = draw(st.lists(elem, min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
    return costs, cuts, nbytes


@SETTINGS
@given(problems_with_bytes(), st.integers(1, 4))
def test_dp_matches_brute_force_with_byte_tie_break(problem, k):
    """The DP's lexicographic key (Eq. 1 objective, crossing bytes, latest cuts) equals
    brute force's, which ranks all plans globally."""
    costs, cuts, nbytes = problem
    try:
        expected = brute_force(costs, cuts, k, cut_bytes=nbytes)
    except PartitionError:
        expected = None
    try:
        got = search_partitions(costs, cuts, num_partitions=k, cut_bytes=nbytes)
    except PartitionError:
        got = None
    assert (got is None) == (expected is None)
    if got is None:
        return
    check_plan(got, costs, cuts)
    assert close(got.objective, expected.objective)
    assert got.crossing_bytes == expected.crossing_bytes == sum(nbytes[c] for c in got.cuts)
    assert got.cuts == expected.cuts
    # the tie-break never costs objective: same optimum as without bytes
    assert close(got.objective, search_partitions(costs, cuts, num_partitions=k).objective)


@SETTINGS
@given(problems(), st.integers(1, 4))
def test_search_k_is_min_over_k_with_ties_to_fewer(problem, m):
    costs, cuts = problem
    per_k = {}
    for k in range(1, m + 1):
        with contextlib.suppress(PartitionError):
            per_k[k] = brute_force(costs, cuts, k).objective
    assert 1 in per_k  # a one-partition plan always exists
    best = min(per_k.values())
    expected_k = min(k for k, v in per_k.items() if close(v, best))
    got = search_partitions(costs, cuts, max_partitions=m)
    check_plan(got, costs, cuts)
    assert close(got.objective, best)
    assert got.num_partitions == expected_k
    assert got.cuts == brute_force(costs, cuts, expected_k).cuts


@SETTINGS
@given(problems())
def test_representative_mask_definition(problem):
    costs, _ = problem
    mask = representative_mask(costs)
    assert mask.dtype == bool and mask.shape == (len(costs),)
    if len(set(costs)) == 1:
        assert mask.all()
    else:
        mean = sum(costs) / len(costs)
        for c, m in zip(costs, mask, strict=True):
            if not math.isclose(c, mean, rel_tol=1e-12, abs_tol=1e-12):
                assert m == (c > mean)


@SETTINGS
@given(
    st.floats(0, 1e3),
    st.floats(0, 1e2),
    st.floats(0, 2e3),
    st.integers(1, 16),
)
def test_slo_bound_property(t_o, t_p, slo, cap):
    if t_o > slo:
        with pytest.raises(PartitionError):
            max_partitions_for_slo(t_o, t_p, slo, cap)
        return
    k = max_partitions_for_slo(t_o, t_p, slo, cap)
    assert 1 <= k <= cap
    assert t_o + (k - 1) * t_p <= slo
    if k < cap:
        assert t_o + k * t_p > slo


# --------------------------------------------------------------------------- SLO


def test_slo_bound_examples():
    assert max_partitions_for_slo(50.0, 10.0, 80.0, 8) == 4  # 50 + 3*10 = 80 <= 80
    assert max_partitions_for_slo(50.0, 10.0, 79.9, 8) == 3
    assert max_partitions_for_slo(50.0, 10.0, 80.0, 2) == 2
    assert max_partitions_for_slo(50.0, 10.0, None, 6) == 6
    assert max_partitions_for_slo(50.0, 0.0, 50.0, 5) == 5


def test_slo_below_whole_model_time_raises_with_numbers():
    with pytest.raises(PartitionError) as info:
        max_partitions_for_slo(123.5, 10.0, 80.0, 4)
    assert "123.5" in info.value.message and "80" in info.value.message
    assert info.value.hint and "--slo" in info.value.hint
    with pytest.raises(PartitionError):
        search_partitions([1.0, 2.0, 3.0], [0, 1], t_o_ms=123.5, slo_ms=80.0)


def test_fixed_k_beyond_slo_bound_raises():
    costs = [10.0, 1.0, 10.0, 1.0, 30.0, 1.0, 32.0]
    with pytest.raises(PartitionError) as info:
        search_partitions(costs, range(6), num_partitions=5, t_o_ms=50.0, t_p_ms=10.0, slo_ms=80.0)
    msg = info.value.message
    assert "K=5" in msg and "90" in msg and "80" in msg and "at most 4" in msg


def test_search_respects_slo_bound():
    # Many distinct bottlenecks favour many partitions, but the SLO allows only 2.
    costs = [10.0, 0.0, 20.0, 0.0, 40.0, 0.0, 80.0, 0.0, 160.0]
    free = search_partitions(costs, range(8), max_partitions=8)
    assert free.num_partitions > 2
    bounded = search_partitions(
        costs, range(8), max_partitions=8, t_o_ms=50.0, t_p_ms=10.0, slo_ms=60.0
    )
    assert bounded.num_partitions <= 2
    assert bounded.objective == pytest.approx(brute_force(costs, range(8), 2).objective)


# --------------------------------------------------------------------------- examples


def test_hand_worked_example_k2():
    costs = [10.0, 1.0, 10.0, 1.0, 1.0, 30.0, 1.0, 32.0]
    # sum = 86, mean = 10.75: representative operators are 5 (30) and 7 (32) only;
    # the 10s are below the mean. With K=2 every partition needs one of them, so the
    # single cut must lie in 5..6: {30} | {32}, both sigmas 0, objective 0. Without
    # crossing bytes, ties go to the latest cut -> cut 6.
    res = search_partitions(costs, range(7), num_partitions=2)
    assert res.cuts == (6,)
    assert res.bounds == ((0, 6), (7, 7))
    assert res.objective == 0.0
    assert res.bottleneck == (30.0, 32.0)
    assert res.representative == (False,) * 5 + (True, False, True)
    # K=1: sigma({30, 32}) = 1.
    one = search_partitions(costs, range(7), num_partitions=1)
    assert one.cuts == () and one.objective == pytest.approx(1.0)
    # Search: K=2 (objective 0) beats K=1 (1); K=3 is infeasible (2 representatives).
    assert search_partitions(costs, range(7), max_partitions=4).cuts == (6,)
    # With crossing bytes, the tie goes to the cut that hands over fewer bytes.
    nbytes = [0, 0, 0, 0, 0, 100, 400]
    assert search_partitions(costs, range(7), num_partitions=2, cut_bytes=nbytes).cuts == (5,)
    assert search_partitions(costs, range(7), max_partitions=4, cut_bytes=nbytes).cuts == (5,)
    with pytest.raises(PartitionError) as info:
        search_partitions(costs, range(7), num_partitions=3)
    assert "at most 2" in info.value.message
    # Only cut 3 allowed: {30, 32} cannot be separated -> K=2 infeasible.
    with pytest.raises(PartitionError):
        search_partitions(costs, [3], num_partitions=2)


def test_hand_worked_example_balancing():
    costs = [20.0, 0.0, 22.0, 0.0, 60.0, 0.0, 64.0, 0.0, 100.0]
    # sum = 266, mean = 29.56: representatives are 60, 64, 100 (ops 4, 6, 8).
    # K=2 options: {60} | {64, 100}: 0 + 18 = 18; {60, 64} | {100}: 2 + 0 = 2 -> best,
    # cut anywhere in 6..7; without bytes the latest, 7.
    res = search_partitions(costs, range(8), num_partitions=2)
    assert res.cuts == (7,)
    assert res.objective == pytest.approx(2.0)
    assert res.sigmas == pytest.approx((2.0, 0.0))
    assert res.bottleneck == (124.0, 100.0)


def test_tie_break_avoids_cutting_a_conv_bn_relu_run():
    """Equal Eq. 1 objectives: fewest crossing bytes, then the latest cut.

    A ShuffleNet-like stem: Conv, BN, ReLU, MaxPool, then Conv, BN, ReLU, Conv. Only the
    three Convs are representative, so every cut between two of them scores the same.
    """
    mb = 2**20
    costs = [100.0, 1.0, 1.0, 2.0, 90.0, 1.0, 1.0, 110.0]
    # bytes crossing cut c (after operator c): Conv / BN / ReLU outputs 4 MB, MaxPool 1 MB
    nbytes = [4 * mb, 4 * mb, 4 * mb, 1 * mb, 1 * mb, 1 * mb, 1 * mb]
    no_bytes = search_partitions(costs, range(7), num_partitions=3)
    tied = search_partitions(costs, range(7), num_partitions=3, cut_bytes=nbytes)
    assert tied.objective == no_bytes.objective == 0.0
    # cut 1 after the pooling (1 MB, not 4 MB inside Conv -> BN -> ReLU); cut 2 after the
    # second ReLU (1 MB everywhere in 4..6: the latest, outside the fusible run)
    assert tied.cuts == (3, 6)
    assert tied.crossing_bytes == 2 * mb
    assert tied == brute_force(costs, range(7), 3, cut_bytes=nbytes)
    # a mapping works too, and a missing / negative count is refused
    assert (
        search_partitions(costs, range(7), num_partitions=3, cut_bytes=dict(enumerate(nbytes)))
        == tied
    )
    with pytest.raises(PartitionError):
        search_partitions(costs, range(7), num_partitions=3, cut_bytes={0: 1})
    with pytest.raises(PartitionError):
        search_partitions(costs, range(7), num_partitions=3, cut_bytes=[-1] * 7)
    # the tie-break never trades objective for bytes: representatives 50, 60, 64; cuts
    # 0..1 give 0 + 2 = 2 with 1000 bytes, cuts 2..3 give 5 + 0 = 5 with 1 byte
    res = search_partitions(
        [50.0, 1.0, 60.0, 1.0, 64.0], range(4), num_partitions=2, cut_bytes=[1000, 1000, 1, 1]
    )
    assert res.cuts == (1,) and res.objective == pytest.approx(2.0)


def test_all_equal_costs_every_operator_is_representative():
    costs = [0.1] * 5
    assert representative_mask(costs).all()
    res = search_partitions(costs, range(4), max_partitions=4)
    assert res.num_partitions == 1  # all objectives are 0: ties go to fewer partitions
    assert res.objective == 0.0
    assert res.bottleneck == pytest.approx((0.5,))
    fixed = search_partitions(costs, [1, 3], num_partitions=3)
    assert fixed.cuts == (1, 3) and fixed.objective == 0.0


def test_operator_equal_to_mean_is_not_representative():
    # mean = 2 exactly: strictly greater is required.
    assert representative_mask([1.0, 2.0, 3.0]).tolist() == [False, False, True]
    # mean = 3: only the 6.
    assert representative_mask([2, 2, 2, 6]).tolist() == [False, False, False, True]
    # Large integer FLOP counts are compared exactly (mean = 1e15 + 1).
    flops = [1e15, 1e15 + 1, 1e15 + 2]
    assert representative_mask(flops).tolist() == [False, False, True]


def test_all_zero_costs():
    res = search_partitions([0.0, 0.0, 0.0], [0, 1], max_partitions=3)
    assert res.num_partitions == 1 and res.objective == 0.0


def test_single_operator():
    res = search_partitions([5.0], [])
    assert res.cuts == () and res.bounds == ((0, 0),) and res.objective == 0.0
    assert res.representative == (True,)
    with pytest.raises(PartitionError):
        search_partitions([5.0], [], num_partitions=2)


def test_invalid_inputs():
    with pytest.raises(PartitionError):
        search_partitions([], [])
    with pytest.raises(PartitionError):
        search_partitions([1.0, 2.0], [0], num_partitions=0)
    with pytest.raises(PartitionError):
        search_partitions([1.0, 2.0], [0], max_partitions=0)
    with pytest.raises(PartitionError):
        search_partitions([1.0, -2.0], [0])
    with pytest.raises(PartitionError):
        search_partitions([1.0, float("nan")], [0])
    with pytest.raises(PartitionError):
        brute_force([1.0, 2.0], [0], 0)
    with pytest.raises(ValueError):
        search_partitions([1.0, 2.0, 3.0], [2])  # cut must be in 0..N-2


def test_near_equal_costs_do_not_create_spurious_sigma():
    # Prefix sums of c and c^2 would give sigma ~1e-5 for these equal triples.
    costs = [333.3] * 3 + [0.7, 0.7] + [999.9] * 3
    res = search_partitions(costs, range(7), num_partitions=2)
    assert res.objective == 0.0


def test_large_case():
    rng = np.random.default_rng(0)
    costs = rng.exponential(1.0, size=1000).tolist()
    res = search_partitions(costs, range(999), num_partitions=8)
    assert res.num_partitions == 8
    assert len(res.cuts) == 7 and list(res.cuts) == sorted(res.cuts)
    check_plan(res, costs, range(999))
    searched = search_partitions(costs, range(999), max_partitions=8)
    assert searched.objective <= res.objective + 1e-9
