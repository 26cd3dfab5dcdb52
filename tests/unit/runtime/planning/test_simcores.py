"""runtime.planning.simcores: the shares of a core under each CPU priority mode (CFS
weights, cgroup weights split over a group's threads, core sets), hand-computed."""

from __future__ import annotations

import pytest

from infscaler.runtime.planning.simcores import (
    SharedPipeline,
    nice_weight,
    simulate_shared,
)


def test_nice_weights_are_the_kernels_table():
    assert [nice_weight(n) for n in (-20, 0, 10, 15, 19)] == [88761, 1024, 110, 36, 15]
    with pytest.raises(ValueError):
        nice_weight(20)


def _flooded(mode: str, lo_instances: int) -> dict:
    hi = SharedPipeline("hi", 1, 10.0, 1)
    lo = SharedPipeline("lo", 2, 10.0, lo_instances)
    return simulate_shared([hi, lo], 1, mode, 60.0, warmup_s=5.0)


@pytest.mark.parametrize(
    ("mode", "lo_n", "hi_share"),
    [
        ("off", 1, 1 / 2),
        ("off", 4, 1 / 5),
        ("nice", 1, 1024 / (1024 + 110)),
        ("nice", 4, 1024 / (1024 + 4 * 110)),  # a share per instance
        ("cgroup", 4, 100 / (100 + 11)),  # the group's weight, however many threads
    ],
)
def test_one_core_is_shared_by_weight(mode, lo_n, hi_share):
    r = _flooded(mode, lo_n)
    full = 1000.0 / 10.0  # requests per second on a whole core
    assert r["hi"]["goodput_rps"] == pytest.approx(hi_share * full, rel=0.02)
    assert r["hi"]["goodput_rps"] + r["lo"]["goodput_rps"] == pytest.approx(full, rel=0.02)


def test_core_sets_keep_the_lower_pipeline_off_a_violating_ones_core():
    # hi's 30 ms never fits its 20 ms SLO: at risk from its first window on
    hi = SharedPipeline("hi", 1, 30.0, 1, rate_rps=5.0, slo_ms=20.0)
    lo = SharedPipeline("lo", 2, 10.0, 2)
    cores = simulate_shared([hi, lo], 2, "cores", 60.0, warmup_s=5.0)
    nice = simulate_shared([hi, lo], 2, "nice", 60.0, warmup_s=5.0)
    assert cores["lo"]["kept_s"] >= 50.0 and nice["lo"]["kept_s"] == 0.0
    # lo on one core only: 100 req/s; with nice it also uses what hi leaves of its core
    assert cores["lo"]["goodput_rps"] == pytest.approx(100.0, rel=0.03)
    assert nice["lo"]["goodput_rps"] > 170.0
    # hi alone on its core: no request shares it with a lower one
    assert cores["hi"]["p99_ms"] < nice["hi"]["p99_ms"]


def test_a_light_open_loop_pipeline_alone_meets_its_slo_and_bad_input_is_refused():
    hi = SharedPipeline("hi", 1, 10.0, 1, rate_rps=20.0, cv=0.1, slo_ms=50.0)
    r = simulate_shared([hi], 2, "off", 60.0)["hi"]
    assert r["attainment"] > 0.97 and 15.0 < r["goodput_rps"] < 25.0
    with pytest.raises(ValueError):
        simulate_shared([hi], 2, "fair", 10.0)
    with pytest.raises(ValueError):
        SharedPipeline("x", 1, 0.0)
