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
