"""config.pbtxt -> pipeline (infscaler.base.triton): hand-written Triton model
configurations mapped (batch dims, -1 dims, instance groups, dynamic batching, version
policy), the ignored fields warned about one per line, and the refusals naming the file
and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from infscaler.base.errors import ConfigError
from infscaler.base.triton import (
    is_model_dir,
    parse_model_config,
    repository_models,
    triton_pipeline,
)
from tests.helpers import f32, make_model, save

MODEL = """
name: "add"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "a" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "b" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def add_model(batch: bool = True) -> object:
    """y = a + b, float32, shapes [N, 4] (or [4] without a batch dim)."""
    shape = ["N", 4] if batch else [4]
    return make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [f32("a", shape), f32("b", shape)],
        [f32("y", shape)],
    )


def model_dir(tmp_path: Path, config: str | None, versions=(1,), name="add", batch=True) -> Path:
    d = tmp_path / "repo" / name
    for v in versions:
        (d / str(v)).mkdir(parents=True)
        save(add_model(batch), d / str(v) / "model.onnx")
    if config is not None:
        (d / "config.pbtxt").write_text(config)
    return d


def test_inputs_outputs_and_batch_dim(tmp_path) -> None:
    m = triton_pipeline(model_dir(tmp_path, MODEL))
    cfg = m.config
    assert cfg.name == "add" and m.version == 1 and m.warnings == ()
    assert [(i.name, i.datatype, i.shape) for i in cfg.inputs] == [
        ("a", "FP32", [-1, 4]),  # max_batch_size > 0: the batch dim prepended
        ("b", "FP32", [-1, -1]),  # -1: any size
    ]
    assert cfg.outputs == ["y"]
    st = cfg.stages[0]
    assert st.model == str(tmp_path / "repo" / "add" / "1" / "model.onnx")
    assert (st.engine, st.instances, st.batching) == ("cpu", 1, None)
    assert st.inputs == {"a": "a", "b": "b"} and st.outputs == {"y": "y"}


def test_max_batch_size_zero_keeps_dims(tmp_path) -> None:
    text = MODEL.replace("max_batch_size: 8", "max_batch_size: 0").replace("[ -1 ]", "[ 4 ]")
    cfg = triton_pipeline(model_dir(tmp_path, text, batch=False)).config
    assert [i.shape for i in cfg.inputs] == [[4], [4]]


@pytest.mark.parametrize(
    ("groups", "gpu", "engine", "count"),
    [
        ("instance_group [ { count: 3 kind: KIND_CPU } ]", False, "cpu", 3),
        ("instance_group [ { kind: KIND_CPU }, { count: 2 kind: KIND_CPU } ]", False, "cpu", 3),
        ("instance_group [ { count: 2 kind: KIND_GPU } ]", False, "gpu", 2),
        ("instance_group [ { count: 1 kind: KIND_AUTO } ]", True, "gpu", 1),
        ("instance_group [ { count: 1 kind: KIND_AUTO } ]", False, "cpu", 1),
        ("", True, "gpu", 1),
        ("", False, "cpu", 1),
    ],
)
def test_instance_group(tmp_path, groups, gpu, engine, count) -> None:
    st = triton_pipeline(model_dir(tmp_path, MODEL + groups), gpu_available=gpu).config.stages[0]
    assert (st.engine, st.instances) == (engine, count)


def test_instance_group_refusals(tmp_path) -> None:
    mixed = MODEL + "instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]"
    with pytest.raises(ConfigError, match=r"config.pbtxt: instance_group mixes cpu and gpu"):
        triton_pipeline(model_dir(tmp_path, mixed))
    (tmp_path / "repo" / "add" / "config.pbtxt").write_text(
        MODEL + "instance_group [ { kind: KIND_MODEL } ]"
    )
    with pytest.raises(ConfigError, match=r"instance_group\[0\].kind KIND_MODEL"):
        triton_pipeline(tmp_path / "repo" / "add")


def test_dynamic_batching(tmp_path) -> None:
    text = MODEL + (
        "dynamic_batching { max_queue_delay_microseconds: 1500 preferred_batch_size: [ 2, 4 ] }"
    )
    m = triton_pipeline(model_dir(tmp_path, text))
    b = m.config.stages[0].batching
    assert (b.max_batch, b.max_delay_ms, b.policy) == (4, 1.5, "fixed")
    assert any("preferred_batch_size: batches grow up to 4" in w for w in m.warnings)


def test_dynamic_batching_defaults_and_cap(tmp_path) -> None:
    text = MODEL.replace("max_batch_size: 8", "max_batch_size: 128") + "dynamic_batching { }"
    m = triton_pipeline(model_dir(tmp_path, text))
    b = m.config.stages[0].batching
    assert (b.max_batch, b.max_delay_ms) == (64, 0.0)  # Triton's default delay: 0 us
    assert any("capped at 64 (not 128)" in w for w in m.warnings)


def test_dynamic_batching_refusals(tmp_path) -> None:
    d = model_dir(tmp_path, MODEL.replace("max_batch_size: 8", "") + "dynamic_batching { }")
    with pytest.raises(ConfigError, match="dynamic_batching needs max_batch_size > 0"):
        triton_pipeline(d)
    (d / "config.pbtxt").write_text(MODEL + "dynamic_batching { preferred_batch_size: [ 16 ] }")
    with pytest.raises(ConfigError, match=r"preferred_batch_size \[16\] must lie in 1..8"):
        triton_pipeline(d)


def test_version_policy(tmp_path) -> None:
    d = model_dir(tmp_path, MODEL, versions=(1, 3, 2))
    (d / "10").mkdir()  # no model.onnx: not a version
    m = triton_pipeline(d)
    assert m.version == 3 and m.model_path == d / "3" / "model.onnx"
    (d / "config.pbtxt").write_text(MODEL + "version_policy { specific { versions: [ 2 ] } }")
    assert triton_pipeline(d).version == 2
    (d / "config.pbtxt").write_text(MODEL + "version_policy { all { } }")
    m = triton_pipeline(d)
    assert m.version == 3 and any("serves version 3 only" in w for w in m.warnings)
    (d / "config.pbtxt").write_text(MODEL + "version_policy { specific { versions: [ 7 ] } }")
    with pytest.raises(ConfigError, match=r"version_policy.specific.versions \[7\]"):
        triton_pipeline(d)


def test_ignored_fields_warned_one_line_each(tmp_path) -> None:
    text = MODEL.replace(
        '{ name: "a" data_type: TYPE_FP32 dims: [ 4 ] }',
        '{ name: "a" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true }',
    ) + (
        "optimization { graph { level: 1 } }\n"
        "model_warmup [ { name: 'w' batch_size: 1 } ]\n"
        "parameters { key: 'k' value { string_value: 'v' } }\n"
        "dynamic_batching { priority_levels: 2 }\n"
    )
    m = triton_pipeline(model_dir(tmp_path, text))
    where = str(tmp_path / "repo" / "add" / "config.pbtxt")
    assert sorted(m.warnings) == sorted(
        f"{where}: {f} is ignored"
        for f in (
            "optimization",
            "parameters",
            "model_warmup",
            "input[0].allow_ragged_batch",
            "dynamic_batching.priority_levels",
        )
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MODEL.replace("onnxruntime_onnx", "tensorrt_plan"), "platform 'tensorrt_plan' is not"),
        ('backend: "python"\n', "backend 'python' is not supported"),
        (
            MODEL.replace(
                "data_type: TYPE_FP32 dims: [ 4 ] }", "data_type: TYPE_STRING dims: [ 4 ] }", 1
            ),
            r"input\[0\].data_type TYPE_STRING is not supported",
        ),
        (MODEL.replace('name: "add"', 'name: "other"'), "name 'other' differs from the model"),
        (MODEL.replace('"b"', '"c"'), r"input\[1\].name 'c' is not an input of model.onnx"),
        (MODEL.replace("[ -1 ]", "[ 2, 2 ]"), r"input\[1\].dims give rank 3 .* has rank 2"),
        (
            MODEL.replace(
                'output [ { name: "y" data_type: TYPE_FP32',
                'output [ { name: "y" data_type: TYPE_INT64',
            ),
            r"output\[0\].data_type is TYPE_INT64 but the model's 'y' is FP32",
        ),
        (MODEL.replace("[ -1 ]", "[ -2 ]"), r"input\[1\].dims \[-2\]"),
        (MODEL.replace("max_batch_size: 8", "max_batch_size: -1"), "max_batch_size -1 is below 0"),
        (MODEL + "bogus: 1\n", r"config.pbtxt:10:1: .*no field named \"bogus\""),
        ('input [ { name: "a" ', r"config.pbtxt:1:\d+: "),
    ],
)
def test_refusals_name_the_file_and_field(tmp_path, text, message) -> None:
    d = model_dir(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as ei:
        triton_pipeline(d)
    assert str(d / "config.pbtxt") in ei.value.message


def test_every_tensor_problem_at_once(tmp_path) -> None:
    text = MODEL.replace("TYPE_FP32", "TYPE_STRING").replace("TYPE_STRING", "TYPE_BF16", 1)
    with pytest.raises(ConfigError) as ei:
        triton_pipeline(model_dir(tmp_path, text))
    msg = ei.value.message
    assert "input[0].data_type TYPE_BF16" in msg and "input[1].data_type TYPE_STRING" in msg
    assert "output[0].data_type TYPE_STRING" in msg and msg.count("; ") == 2


def test_no_config_pbtxt_is_the_models_own_signature(tmp_path) -> None:
    d = model_dir(tmp_path, None, versions=(1, 2))
    m = triton_pipeline(d, gpu_available=True)
    assert m.version == 2 and m.config.name == "add" and m.config.inputs is None
    assert m.config.stages[0].engine == "gpu"


def test_repository_layout(tmp_path) -> None:
    model_dir(tmp_path, MODEL)
    model_dir(tmp_path, None, name="bare")
    (tmp_path / "repo" / "notes").mkdir()
    (tmp_path / "repo" / ".hidden" / "1").mkdir(parents=True)
    save(add_model(), tmp_path / "repo" / ".hidden" / "1" / "model.onnx")
    assert [p.name for p in repository_models(tmp_path / "repo")] == ["add", "bare"]
    assert is_model_dir(tmp_path / "repo" / "add") and not is_model_dir(tmp_path / "repo")
    assert repository_models(tmp_path / "missing") == []


def test_model_file_missing(tmp_path) -> None:
    d = tmp_path / "repo" / "add"
    d.mkdir(parents=True)
    (d / "config.pbtxt").write_text(MODEL)
    with pytest.raises(ConfigError, match="no version directory holds model.onnx"):
        triton_pipeline(d)
    (d / "config.pbtxt").write_text(MODEL + 'default_model_filename: "../x.onnx"\n')
    with pytest.raises(ConfigError, match="default_model_filename '../x.onnx' must be a file"):
        triton_pipeline(d)


def test_default_model_filename(tmp_path) -> None:
    d = tmp_path / "repo" / "add"
    (d / "1").mkdir(parents=True)
    save(add_model(), d / "1" / "net.onnx")
    (d / "config.pbtxt").write_text(MODEL + 'default_model_filename: "net.onnx"\n')
    assert triton_pipeline(d).model_path == d / "1" / "net.onnx"


def test_private_descriptor_pool(tmp_path) -> None:
    """The ModelConfig class lives in its own pool: a generated inference.ModelConfig
    (the gRPC API's, tritonclient's) registers in the default pool without a clash."""
    from google.protobuf import descriptor_pool

    msg = parse_model_config(model_dir(tmp_path, MODEL) / "config.pbtxt")
    assert msg.DESCRIPTOR.full_name == "inference.ModelConfig"
    assert msg.DESCRIPTOR.file.pool is not descriptor_pool.Default()
    assert msg.max_batch_size == 8 and [t.name for t in msg.input] == ["a", "b"]


def test_int64_input_types_map(tmp_path) -> None:
    d = tmp_path / "repo" / "ids"
    (d / "1").mkdir(parents=True)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [-1])
    out = helper.make_tensor_value_info("out", TensorProto.INT64, [-1])
    save(
        make_model([helper.make_node("Identity", ["ids"], ["out"])], [ids], [out]),
        d / "1" / "model.onnx",
    )
    (d / "config.pbtxt").write_text(
        'input [ { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
        'output [ { name: "out" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
    )
    cfg = triton_pipeline(d).config
    assert cfg.inputs[0].datatype == "INT64" and cfg.inputs[0].shape == [-1]
