"""The pipeline's ``priority`` and ``queue_policy`` (infscaler.base.config): defaults,
and each validation error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infscaler.base.config import PipelineConfig, load_pipeline
from infscaler.base.errors import ConfigError

BASE = {
    "name": "p",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": ["y"],
    "stages": [{"name": "s", "function": "m:f", "inputs": ["x"], "outputs": ["y"]}],
}


def test_defaults_are_tritons() -> None:
    c = PipelineConfig(**BASE)
    assert c.priority == 1
    q = c.queue_policy
    assert (q.max_queue_size, q.timeout_action, q.default_timeout_ms) == (0, "REJECT", None)
    assert q.allow_timeout_override is False
    c = PipelineConfig(
        **BASE,
        priority=4,
        queue_policy={"max_queue_size": 8, "timeout_action": "DELAY", "default_timeout_ms": 2.5},
    )
    assert c.priority == 4 and c.queue_policy.max_queue_size == 8
    assert c.queue_policy.default_timeout_ms == 2.5


@pytest.mark.parametrize(
    ("over", "where"),
    [
        ({"priority": 0}, "priority"),
        ({"priority": "2"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": 1_000_001}, "priority"),
        ({"queue_policy": {"max_queue_size": -1}}, "queue_policy.max_queue_size"),
        ({"queue_policy": {"timeout_action": "DROP"}}, "queue_policy.timeout_action"),
        ({"queue_policy": {"default_timeout_ms": 0}}, "queue_policy.default_timeout_ms"),
        ({"queue_policy": {"default_timeout_ms": float("inf")}}, "queue_policy.default_timeout_ms"),
        ({"queue_policy": {"default_timeout_us": 5}}, "queue_policy.default_timeout_us"),
    ],
)
def test_bad_values_are_refused_naming_the_field(tmp_path: Path, over: dict, where: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**BASE, **over}))
    with pytest.raises(ConfigError) as exc:
        load_pipeline(path)
    assert where in str(exc.value), str(exc.value)
