"""The shared bounds agree with what enforces them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infscaler.base.config import StageConfig
from infscaler.base.levels import MAX_INSTANCES_PER_UNIT


def test_control_path_routes_to_every_instance_a_unit_may_run() -> None:
    from infscaler.ebpf.channel import MAX_PER_HOP

    assert MAX_INSTANCES_PER_UNIT <= MAX_PER_HOP


def test_stage_max_instances_is_bounded_by_the_shared_bound() -> None:
    ok = {"name": "s", "model": "m.onnx", "max_instances": MAX_INSTANCES_PER_UNIT}
    assert StageConfig(**ok).max_instances == MAX_INSTANCES_PER_UNIT
    with pytest.raises(ValidationError, match="less than or equal"):
        StageConfig(**{**ok, "max_instances": MAX_INSTANCES_PER_UNIT + 1})


def test_the_highest_level_deployed_runs_at_nice_0_and_lower_levels_higher() -> None:
    from infscaler.base.levels import NICE_BY_RANK, cpu_nice

    assert cpu_nice({}) == {}
    assert cpu_nice({"alone": 5}) == {"alone": 0}  # a lone pipeline loses nothing
    assert cpu_nice({"hi": 1, "lo": 2}) == {"hi": 0, "lo": NICE_BY_RANK[1]}
    assert cpu_nice({"a": 3, "b": 3, "c": 7}) == {"a": 0, "b": 0, "c": NICE_BY_RANK[1]}
    many = cpu_nice({f"p{i}": i for i in range(1, 9)})
    assert [many[f"p{i}"] for i in range(1, 9)] == sorted(many.values())
    assert many["p8"] == NICE_BY_RANK[-1] == max(NICE_BY_RANK) <= 19
    assert len(set(NICE_BY_RANK)) == len(NICE_BY_RANK)


def test_cpu_nice_refuses_a_level_out_of_range() -> None:
    from infscaler.base.levels import cpu_nice

    with pytest.raises(ValueError, match="'x': priority level 0"):
        cpu_nice({"x": 0})


def test_cpu_weight_ranks_the_levels_as_the_nice_values_do() -> None:
    from infscaler.base.levels import CPU_WEIGHT_BY_RANK, cpu_weight

    assert cpu_weight({}) == {}
    assert cpu_weight({"alone": 5}) == {"alone": 100}
    assert cpu_weight({"a": 1, "b": 2, "c": 2, "d": 7, "e": 8, "f": 9}) == {
        "a": 100, "b": 11, "c": 11, "d": 4, "e": 1, "f": 1,
    }  # fmt: skip
    # the same CFS shares as NICE_BY_RANK's (sched(7): 1024, 110, 36, 15)
    assert [round(100 * w / 1024) for w in (1024, 110, 36, 15)] == list(CPU_WEIGHT_BY_RANK)
    with pytest.raises(ValueError, match="priority level 0 not in"):
        cpu_weight({"x": 0})
