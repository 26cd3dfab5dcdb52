"""The one capacity and latency model (infscaler.runtime.queueing), by hand-computed
cases; its P99 approximation against simulated queues is in
tests/unit/runtime/scaling/test_scaler_p99.py."""

from __future__ import annotations

import math

import pytest

from infscaler.runtime.queueing import (
    busy_cpu_ms,
    capacity_rps,
    drain_backlog,
    drain_response_ms,
    fifo_wait_ms,
    max_rate_within,
    p99_response_ms,
)


def test_capacity_is_the_slowest_stage() -> None:
    assert capacity_rps([30.0, 10.0], [1, 1]) == pytest.approx(1000 / 30)
    assert capacity_rps([30.0, 10.0], [2, 1]) == pytest.approx(1000 / 15)
    # a per-item stage behind a fan-out of 3 items a request
    assert capacity_rps([10.0, 10.0], [1, 1], [1.0, 3.0]) == pytest.approx(1000 / 30)


def test_stages_that_do_not_bound_it_and_one_that_bounds_it_at_zero() -> None:
    assert math.isinf(capacity_rps([None, 0.0], [1, 1]))  # no service time known
    assert math.isinf(capacity_rps([20.0], [1], [0.0]))  # no items reach it
    assert capacity_rps([20.0, 5.0], [1, 0]) == 0.0  # no instance: finishes nothing


def test_cores_cap_it_by_busy_time() -> None:
    # two 1-thread stages of 40 and 30 ms on 4 instances each: 100/s by instances,
    # 70 core-ms a request on 2 cores: 28.6/s
    cpu = busy_cpu_ms([40.0, 30.0], [1.0, 1.0], [1, 1])
    assert cpu == pytest.approx(70.0)
    assert capacity_rps([40.0, 30.0], [4, 4], cores=2, cpu_ms=cpu) == pytest.approx(2000 / 70)
    # a stage whose threads are busy half the time takes half the cores
    half = busy_cpu_ms([40.0, 30.0], [1.0, 1.0], [2, 1], [0.5, 1.0])
    assert half == pytest.approx(70.0)
    assert capacity_rps([40.0], [1], cores=2, cpu_ms=0.0) == pytest.approx(25.0)


def test_capacity_refuses_mismatched_stages() -> None:
    with pytest.raises(ValueError, match="one per stage"):
        capacity_rps([10.0, 20.0], [1])
    with pytest.raises(ValueError, match="one per stage"):
        capacity_rps([10.0], [1], [1.0, 2.0])


def test_fifo_wait_and_drain_by_hand() -> None:
    assert fifo_wait_ms(0, 2, 30.0) == 0.0
    assert fifo_wait_ms(1, 2, 30.0) == 0.0  # a free replica: starts at once
    assert fifo_wait_ms(2, 2, 30.0) == 30.0
    assert fifo_wait_ms(5, 2, 30.0) == 60.0
    assert fifo_wait_ms(-3, 0, 30.0) == 0.0
    # S = 50 ms; units (30 ms x 2, 20 ms x 1), 3 ahead: max(30 x 1, 20 x 3) = 60
    assert drain_response_ms(3, 50.0, [(30.0, 2), (20.0, 1)]) == 110.0
    assert drain_response_ms(3, 50.0, []) == 50.0


def test_drain_backlog_is_the_drain_time_inverted() -> None:
    # 20 req/s over a 300 ms budget drains 6 requests; a backlog of 6 waits 300 ms
    assert drain_backlog(20.0, 300.0) == pytest.approx(6.0)
    assert fifo_wait_ms(6, 1, 1000.0 / 20.0) == pytest.approx(300.0)
    assert drain_backlog(20.0, -5.0) == 0.0


def test_max_rate_within_inverts_the_p99() -> None:
    r = max_rate_within(2, 50.0, 150.0)
    assert 0 < r < 40.0
    assert p99_response_ms(r, 2, 50.0) <= 150.0 < p99_response_ms(r * 1.01, 2, 50.0)
    assert max_rate_within(2, 50.0, 40.0) == 0.0
