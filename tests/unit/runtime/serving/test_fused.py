"""Fused units (issue 14), compiled but not served: function stages next to a model stage
run inside that model unit (:func:`infscaler.runtime.serving.pipeline.fuse_units`), on small
pipelines built here (an onnx.helper model ``y = x @ W + b`` and tests/fusefuncs.py) and
the bundled ``ocr`` pipeline; the unit profile sums its steps. Served fused pipelines are
in tests/integration/runtime/serving/test_fused.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.pipeline import compile_pipeline
from tests.helpers import chain_pipeline, residual_model, save
from tests.integration.runtime.serving.test_fused import fan_pipeline, linear_model, stage

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return linear_model(tmp_path / "linear.onnx")


# -- the rule (compile only) -------------------------------------------------------------------


def names(d: dict, tmp_path: Path) -> list[str]:
    return [u.name for u in compile_pipeline(load_pipeline(d), state_dir=tmp_path).units]


def test_pre_and_post_steps_fuse_and_fan_out_ends_the_unit(model: Path, tmp_path: Path) -> None:
    cp = compile_pipeline(load_pipeline(fan_pipeline(model)), state_dir=tmp_path)
    assert [u.name for u in cp.units] == ["prep>m1>post>rows", "row_prep>m2>row_post", "gather"]
    first, per_item, gather = cp.units
    assert [s.name for s in first.steps] == ["prep", "m1", "post", "rows"]
    assert first.kind == "model" and first.fan_out and not first.per_item
    assert first.inputs == ["x"] and first.outputs == ["row"]
    # z and pid, written by a step before the fan-out, ride along with every item
    assert first.carry == ["pid", "z"]
    assert per_item.per_item and per_item.inputs == ["row"] and per_item.outputs == ["s"]
    assert per_item.carry == ["pid", "z"]
    assert gather.fan_in and not gather.steps and gather.carry == ["pid", "z"]
    assert len(cp.served_units()) == 2  # 7 unfused
    assert [u.index for u in cp.units] == [0, 1, 2]


@pytest.mark.parametrize(
    "change, want",
    [
        (  # a function stage kept apart: it and the fan-out after it stand alone
            lambda d: stage(d, "post").update(fuse=False),
            ["prep>m1", "post", "rows", "row_prep>m2>row_post", "gather"],
        ),
        (  # a model stage kept apart takes no function in
            lambda d: stage(d, "m2").update(fuse=False),
            ["prep>m1>post>rows", "row_prep", "m2", "row_post", "gather"],
        ),
        (  # the pipeline's default, and a stage opting back in
            lambda d: (d.update(fuse=False), stage(d, "row_post").update(fuse=True)),
            ["prep", "m1", "post", "rows", "row_prep", "m2", "row_post", "gather"],
        ),
        (  # only the pipeline off: nothing fuses
            lambda d: d.update(fuse=False),
            ["prep", "m1", "post", "rows", "row_prep", "m2", "row_post", "gather"],
        ),
        (  # a function stage scaled on its own stays apart, unless told to fuse
            lambda d: stage(d, "row_prep").update(instances=2),
            ["prep>m1>post>rows", "row_prep", "m2>row_post", "gather"],
        ),
        (
            lambda d: stage(d, "post").update(threads=2, fuse=False),
            ["prep>m1", "post", "rows", "row_prep>m2>row_post", "gather"],
        ),
        (  # a batching model keeps its functions apart (its batches stack its own inputs)
            lambda d: stage(d, "m2").update(batching={"max_batch": 4, "policy": "fixed"}),
            ["prep>m1>post>rows", "row_prep", "m2", "row_post", "gather"],
        ),
    ],
)
def test_fuse_false_and_batching_keep_stages_apart(
    model: Path, tmp_path: Path, change, want: list[str]
) -> None:
    d = fan_pipeline(model)
    change(d)
    assert names(d, tmp_path) == want


def test_fuse_on_a_fan_in_stage_is_refused(model: Path) -> None:
    from infscaler.base.errors import ConfigError

    d = fan_pipeline(model)
    stage(d, "gather")["fuse"] = True
    with pytest.raises(ConfigError, match=r"stages\[7\] \(gather\).*front end"):
        load_pipeline(d)
    d = fan_pipeline(model)
    stage(d, "post").update(fuse=True, instances=2)
    with pytest.raises(ConfigError, match=r"stages\[2\] \(post\).*instances.*fuse: false"):
        load_pipeline(d)


def test_a_pipeline_of_functions_only_is_unchanged(tmp_path: Path) -> None:
    cp = compile_pipeline(load_pipeline(chain_pipeline()), state_dir=tmp_path)
    assert [u.name for u in cp.units] == ["scale", "slow"]
    assert all(not u.steps and u.kind == "function" for u in cp.units)


def test_partitioned_model_pre_into_first_post_into_last(tmp_path: Path) -> None:
    path = save(residual_model(), tmp_path / "residual.onnx")
    d = {
        "name": "part",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4, 8, 8]}],
        "outputs": ["z"],
        "stages": [
            {"name": "pre", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
            {
                "name": "m",
                "model": str(path),
                "partitions": 2,
                "inputs": {"x": "y"},
                "outputs": {"y": "out"},
            },
            {
                "name": "post",
                "function": "fusefuncs:post",
                "inputs": ["out"],
                "outputs": ["z", "pid"],
            },
        ],
    }
    cp = compile_pipeline(load_pipeline(d), state_dir=tmp_path / "state")
    assert [u.name for u in cp.units] == ["pre>m/0", "m/1>post"]
    assert [u.partition for u in cp.units] == [0, 1]
    assert cp.units[0].inputs == ["x"] and cp.units[1].outputs == ["z", "pid"]


def test_ocr_compiles_to_three_served_units(tmp_path: Path) -> None:
    import infscaler
    from infscaler.base.errors import InfScalerError
    from infscaler.base.models import resolve_model

    for model_name in ("ppocrv4-det", "ppocr-cls", "ppocrv4-rec"):
        try:
            resolve_model(model_name)
        except InfScalerError as exc:
            pytest.skip(f"bundled model {model_name} not installed: {exc}")
    yaml_path = Path(infscaler.__file__).parent / "pipelines" / "ocr.yaml"
    cp = compile_pipeline(load_pipeline(yaml_path), state_dir=tmp_path)
    # unfused: 8 served units (prep, det, crops, cls_prep, cls, rec_prep, rec, decode)
    assert [u.name for u in cp.served_units()] == [
        "prep>det>crops",
        "cls_prep>cls",
        "rec_prep>rec>decode",
    ]
    # the demo's partitioned detector: pre-steps fuse into det/0, post-steps into det/1
    raw = yaml.safe_load(yaml_path.read_text())
    for st in raw["stages"]:
        if st["name"] == "det":
            st["partitions"] = 2
    cp2 = compile_pipeline(load_pipeline(raw), state_dir=tmp_path)
    assert [u.name for u in cp2.served_units()][:2] == ["prep>det/0", "det/1>crops"]
    assert cp.units[-1].name == "merge" and cp.units[-1].fan_in


# -- the planner's view --------------------------------------------------------------------------


def test_unit_profile_sums_the_steps(model: Path, tmp_path: Path) -> None:
    from infscaler.runtime.planning.unitprofile import profile_pipeline

    d = fan_pipeline(model)
    stage(d, "post")["params"] = {"ms": 10.0}
    cp = compile_pipeline(load_pipeline(d), state_dir=tmp_path)
    prof = profile_pipeline(cp, {"x": np.ones((3, 4), np.float32)}, repeats=3, warmup=1)
    assert [u.name for u in prof.units] == [u.name for u in cp.units]
    first = prof.units[0]
    assert first.kind == "model" and first.fan_out and first.items == (3, 3, 3)
    cpu = first.engines["cpu"]
    assert len(cpu.samples_ms) == 3 and min(cpu.samples_ms) >= 10.0  # post's sleep counted
    assert len(prof.units[1].engines["cpu"].samples_ms) == 9  # per item
    assert set(prof.samples_ms) == {u.name for u in cp.units}
