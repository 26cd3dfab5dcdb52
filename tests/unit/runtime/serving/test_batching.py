"""MArk §4 dynamic batching (infscaler.runtime.serving.batching) on hand-computed profiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infscaler.runtime.serving.batching import BatchChoice, choose_batch

# T_b, ms: 20, 30, (40), 50, (55, 60, 65), 70 -- parentheses: interpolated
PROFILE = {1: 20.0, 2: 30.0, 4: 50.0, 8: 70.0}


def test_interpolation_between_profiled_sizes_never_beyond() -> None:
    # at a rate where W_b ~ 0 and no budget, every size up to max_batch pays: T_b is read
    def t_b(b: int) -> float:
        return choose_batch(PROFILE, arrival_rate=1e12, budget_ms=1e9, max_batch=b).batch_latency_ms

    assert t_b(1) == 20.0
    assert t_b(3) == pytest.approx(40.0)  # 30 + (50 - 30) x 1/2
    assert t_b(6) == pytest.approx(60.0)  # 50 + (70 - 50) x 2/4
    assert t_b(8) == 70.0
    beyond = choose_batch(PROFILE, arrival_rate=1e12, budget_ms=1e9, max_batch=9)
    assert beyond.batch_size == 8 and "largest profiled size" in beyond.reason
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        choose_batch(PROFILE, arrival_rate=1.0, budget_ms=100.0, max_batch=0)


def test_budget_stops_the_batch() -> None:
    # 100 req/s: W_b = (b - 1) x 10 ms. budget 100 ms, b x T_1 = 20 b ms
    # b=2: 10 + 30 = 40 <= 100, <= 40   b=3: 20 + 40 = 60 <= 60   b=4: 30 + 50 = 80 <= 80
    # b=5: 40 + 55 = 95 <= 100, <= 100  b=6: 50 + 60 = 110 > 100 -> 5
    c = choose_batch(PROFILE, arrival_rate=100.0, budget_ms=100.0)
    assert isinstance(c, BatchChoice)
    assert c.batch_size == 5
    assert c.wait_ms == pytest.approx(40.0) and c.batch_latency_ms == pytest.approx(55.0)
    assert c.throughput_rps == pytest.approx(5 * 1000 / 55)  # 90.9 req/s
    assert "b=6 would break the budget" in c.reason and "110 ms > 100 ms" in c.reason


def test_throughput_gain_stops_the_batch() -> None:
    # 50 req/s: W_2 = 20 ms; 20 + 30 = 50 > 2 x T_1 = 40: batching would not pay -> 1
    c = choose_batch(PROFILE, arrival_rate=50.0, budget_ms=1000.0)
    assert (c.batch_size, c.wait_ms, c.batch_latency_ms) == (1, 0.0, 20.0)
    assert c.throughput_rps == pytest.approx(50.0)
    assert "would not beat no batching" in c.reason


def test_largest_profiled_size_and_max_batch_bound_it() -> None:
    # 200 req/s: W_b = 5 (b - 1); b=8: 35 + 70 = 105 <= 1000 and <= 160 -> 8, the largest
    c = choose_batch(PROFILE, arrival_rate=200.0, budget_ms=1000.0)
    assert c.batch_size == 8 and c.wait_ms == pytest.approx(35.0)
    assert "largest profiled size" in c.reason
    # max_batch 6: W 25 + T 60
    c = choose_batch(PROFILE, arrival_rate=200.0, budget_ms=1000.0, max_batch=6)
    assert (c.batch_size, c.batch_latency_ms) == (6, 60.0) and c.wait_ms == pytest.approx(25.0)
    assert "max_batch" in c.reason


def test_batch_one_over_budget_and_no_arrivals() -> None:
    c = choose_batch(PROFILE, arrival_rate=100.0, budget_ms=15.0)  # T_1 20 > 15
    assert c.batch_size == 1 and c.batch_latency_ms == 20.0
    assert "even batch 1 violates the budget" in c.reason
    c = choose_batch(PROFILE, arrival_rate=0.0, budget_ms=100.0)  # nothing to batch with
    assert c.batch_size == 1 and c.wait_ms == 0.0
    assert choose_batch({1: 20.0}, arrival_rate=1000.0, budget_ms=100.0).batch_size == 1


@pytest.mark.parametrize(
    ("profile", "rate", "budget", "max_batch", "match"),
    [
        (PROFILE, 10.0, 0.0, 32, "budget_ms must be"),
        (PROFILE, 10.0, -5.0, 32, "budget_ms must be"),
        (PROFILE, 10.0, float("nan"), 32, "budget_ms must be"),
        ({}, 10.0, 100.0, 32, "empty"),
        ({2: 30.0, 4: 50.0}, 10.0, 100.0, 32, "no entry for batch size 1"),
        ({1: 0.0}, 10.0, 100.0, 32, r"batch_latency_ms\[1\] must be"),
        ({0: 5.0, 1: 10.0}, 10.0, 100.0, 32, "integers >= 1"),
        (PROFILE, -1.0, 100.0, 32, "arrival_rate must be"),
        (PROFILE, 10.0, 100.0, 0, "max_batch must be"),
    ],
)
def test_bad_inputs_say_what_is_wrong(profile, rate, budget, max_batch, match) -> None:
    with pytest.raises(ValueError, match=match):
        choose_batch(profile, rate, budget, max_batch=max_batch)


def _interpolated(prof: dict[int, float], b: int) -> float:
    """T_b by linear interpolation between the profiled sizes around ``b`` (the oracle)."""
    lo = max(k for k in prof if k <= b)
    hi = min(k for k in prof if k >= b)
    return prof[lo] if lo == hi else prof[lo] + (prof[hi] - prof[lo]) * (b - lo) / (hi - lo)


@st.composite
def profiles(draw: st.DrawFn) -> dict[int, float]:
    sizes = draw(st.lists(st.integers(2, 64), max_size=6, unique=True))
    t1 = draw(st.floats(1.0, 100.0))
    prof = {1: t1}
    for b in sorted(sizes):  # latency grows with the batch, sub-linearly or not
        prof[b] = t1 * draw(st.floats(0.5, float(b)))
    return prof


@settings(max_examples=80, deadline=None)
@given(profiles(), st.floats(0.0, 5000.0), st.floats(0.5, 2000.0), st.integers(1, 64))
def test_choice_meets_both_constraints_and_the_next_size_breaks_one(
    prof, rate, budget, max_batch
) -> None:
    c = choose_batch(prof, rate, budget, max_batch=max_batch)
    t1 = prof[1]
    limit = min(max_batch, max(prof))
    assert 1 <= c.batch_size <= limit
    assert c.batch_latency_ms == pytest.approx(_interpolated(prof, c.batch_size))
    b = c.batch_size
    if b > 1:
        total = c.wait_ms + c.batch_latency_ms
        assert total <= budget * (1 + 1e-6) and total <= b * t1 * (1 + 1e-6)
        assert c.wait_ms == pytest.approx((b - 1) * 1000 / rate)
    if b < limit and t1 <= budget:  # the size above breaks a constraint (MArk stops there)
        nb = b + 1
        w = (nb - 1) * 1000 / rate if rate > 0 else float("inf")
        total = w + _interpolated(prof, nb)
        assert total > budget * (1 - 1e-6) or total > nb * t1 * (1 - 1e-6)
