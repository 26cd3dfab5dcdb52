"""Loading and checking models: clear refusals for bad input, concrete shapes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from infscaler.base.errors import ModelLoadError, ShapeError
from infscaler.partitioner.loader import load_model, parse_shapes
from infscaler.partitioner.weights import MIN_REFERENCED_BYTES, raw_data_offsets
from tests.helpers import f32, make_model, rand, residual_model, save


def test_parse_shapes_trtexec_convention():
    assert parse_shapes("x:1x3x640x640,mask:1x128") == {"x": (1, 3, 640, 640), "mask": (1, 128)}
    assert parse_shapes("ns:input:2x4") == {"ns:input": (2, 4)}
    assert parse_shapes("s:") == {"s": ()}
    assert parse_shapes(None) == {}


def test_parse_shapes_polygraphy_convention():
    assert parse_shapes("x:[1,3,640,640] mask:[1, 128]") == {
        "x": (1, 3, 640, 640),
        "mask": (1, 128),
    }
    assert parse_shapes("x:[1,3,8,8],s:[]") == {"x": (1, 3, 8, 8), "s": ()}
    with pytest.raises(ShapeError, match="positive integers"):
        parse_shapes("x:[1,a]")


@pytest.mark.parametrize("bad", ["x", "x:1x", "x:1,3", "x:0x3", ":1x3", "x:ax3"])
def test_parse_shapes_rejects_malformed(bad):
    with pytest.raises(ShapeError, match="--shapes|dim"):
        parse_shapes(bad)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.onnx")


def test_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        load_model(tmp_path)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model(p)


def test_text_file(tmp_path):
    p = tmp_path / "model.onnx"
    p.write_text("this is a README, not a model\n" * 20)
    with pytest.raises(ModelLoadError, match="not a valid ONNX model|does not hold an ONNX model"):
        load_model(p)


def test_truncated_file(tmp_path):
    full = save(residual_model(channels=16), tmp_path / "full.onnx").read_bytes()
    p = tmp_path / "truncated.onnx"
    p.write_bytes(full[: len(full) // 2])
    with pytest.raises(ModelLoadError) as info:
        load_model(p)
    assert "truncated" in str(info.value)


def test_checker_failure_names_the_problem(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined_tensor"], ["y"], name="r")],
        "g",
        [f32("x", [1, 4])],
        [f32("y", [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / "bad.onnx"
    onnx.save(model, str(p))
    with pytest.raises(ModelLoadError, match="checker"):
        load_model(p)


def test_opset_newer_than_supported(tmp_path):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [f32("x", [1, 4])], [f32("y", [1, 4])]
    )
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    p = tmp_path / "future.onnx"
    onnx.save(model, str(p))
    with pytest.raises(ModelLoadError, match="opset"):
        load_model(p)


def test_operator_onnxruntime_cannot_run(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="n", domain="com.example")],
        "g",
        [f32("x", [1, 4])],
        [f32("y", [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    p = tmp_path / "custom.onnx"
    onnx.save(model, str(p))
    with pytest.raises(ModelLoadError, match="onnxruntime"):
        load_model(p)


def test_a_dynamic_batch_dim_alone_takes_1_with_a_warning(tmp_path, caplog):
    """trtexec's convention: only the leading dim dynamic -> 1, and say so."""
    p = save(residual_model(batch="N"), tmp_path / "dyn.onnx")
    with caplog.at_level("WARNING", logger="infscaler.partitioner.loader"):
        loaded = load_model(p)
    assert loaded.input_shapes == {"x": (1, 4, 8, 8)}
    assert loaded.symbolic_inputs == {"x": ["N", 4, 8, 8]}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "dynamic batch dim 'N': using 1" in line and "--shapes x:4x4x8x8" in line


def test_other_dynamic_dims_still_need_shapes(tmp_path):
    m = residual_model(batch="N")
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "W"
    p = save(m, tmp_path / "dyn.onnx")
    with pytest.raises(ShapeError) as info:
        load_model(p)
    msg = str(info.value)
    assert "'x'" in msg and "dim 0 'N'" in msg and "dim 3 'W'" in msg and "--shapes" in msg


def test_dynamic_batch_with_shapes(tmp_path):
    p = save(residual_model(batch="N"), tmp_path / "dyn.onnx")
    loaded = load_model(p, "x:3x4x8x8")
    assert loaded.input_shapes == {"x": (3, 4, 8, 8)}
    assert loaded.symbolic_inputs == {"x": ["N", 4, 8, 8]}
    assert loaded.tensors["y"].shape == (3, 2, 8, 8)
    assert loaded.tensors["c1"].dtype == np.float32


def test_shapes_for_unknown_input_lists_inputs(tmp_path):
    p = save(residual_model(), tmp_path / "m.onnx")
    with pytest.raises(ShapeError, match="model's inputs are: x"):
        load_model(p, "images:1x3x8x8")


def test_shapes_rank_and_fixed_dim_mismatch(tmp_path):
    p = save(residual_model(batch="N"), tmp_path / "m.onnx")
    with pytest.raises(ShapeError, match="rank"):
        load_model(p, "x:1x4x8")
    with pytest.raises(ShapeError, match="fixes it to 4"):
        load_model(p, "x:1x5x8x8")


def test_shape_inference_failure_is_clear(tmp_path):
    # x: [N, K] + w: [3] only broadcasts when K is 3 or 1; K = 4 cannot be inferred.
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    model = make_model(nodes, [f32("x", ["N", "K"])], [f32("y", ["N", 3])], {"w": rand(3)})
    p = save(model, tmp_path / "m.onnx")
    with pytest.raises(ShapeError, match="shape inference failed.*x"):
        load_model(p, "x:2x4")
    assert load_model(p, "x:2x3").tensors["y"].shape == (2, 3)


def test_nodes_get_unique_names(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"], name="dup"),
        helper.make_node("Relu", ["b"], ["y"], name="dup"),
    ]
    p = save(make_model(nodes, [f32("x", [2])], [f32("y", [2])]), tmp_path / "m.onnx")
    names = [n.name for n in load_model(p).model.graph.node]
    assert len(set(names)) == 3 and all(names)


def test_data_dependent_shape_resolved_by_execution(tmp_path):
    # NonZero's output length depends on the data: ONNX shape inference leaves it symbolic,
    # so the loader takes it from one onnxruntime run on the seeded random input.
    nodes = [
        helper.make_node("Greater", ["x", "half"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nz"),
        helper.make_node("Cast", ["idx"], ["y"], name="cast", to=TensorProto.FLOAT),
    ]
    model = make_model(
        nodes,
        [f32("x", [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", "n"])],
        {"half": np.array(0.5, np.float32)},
    )
    loaded = load_model(save(model, tmp_path / "nz.onnx"))
    x = np.random.default_rng(0).random(16).astype(np.float32)
    assert loaded.tensors["idx"].shape == (1, int((x > 0.5).sum()))
    assert loaded.tensors["y"].dtype == np.float32


def test_external_data(tmp_path):
    model = residual_model(channels=8)
    p = tmp_path / "ext.onnx"
    onnx.save(
        model,
        str(p),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    loaded = load_model(p)
    assert loaded.tensors["w1"].shape == (8, 8, 3, 3)
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(ModelLoadError, match="external"):
        load_model(p)


def test_sha256_changes_with_weights(tmp_path):
    a = load_model(save(residual_model(), tmp_path / "a.onnx"))
    m = residual_model()
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(rand(4, 4, 3, 3, seed=9), "w1"))
    b = load_model(save(m, tmp_path / "b.onnx"))
    assert a.sha256 != b.sha256 and len(a.sha256) == 64


def test_real_model_with_dynamic_dims():
    from infscaler.base.models import resolve_model

    path = resolve_model("ppocrv4-det")
    with pytest.raises(ShapeError, match="p2o.DynamicDimension.0"):
        load_model(path)
    loaded = load_model(path, "x:1x3x320x320")
    assert loaded.tensors[loaded.graph_outputs[0]].shape == (1, 1, 320, 320)
    produced = {o for n in loaded.model.graph.node for o in n.output if o}
    assert produced <= set(loaded.tensors)


# -- weights located in the file (partitioner/weights.py) ---------------------------------


def test_weight_refs_locate_each_large_weight_in_the_file(tmp_path):
    model = residual_model(channels=16)  # 16x16x3x3 float32 weights: 9216 bytes each
    p = save(model, tmp_path / "m.onnx")
    loaded = load_model(p)
    data = p.read_bytes()
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    large = {n for n, a in arrays.items() if a.nbytes > MIN_REFERENCED_BYTES}
    assert large and large != set(arrays)  # the small biases stay embedded
    assert set(loaded.weight_refs) == large
    assert loaded.weights_dir == tmp_path.resolve()
    for name, ref in loaded.weight_refs.items():
        assert ref.location == "m.onnx" and ref.length == arrays[name].nbytes
        assert data[ref.offset : ref.offset + ref.length] == arrays[name].tobytes()
    assert loaded.stub() is not None
    # the file changed after loading: its bytes are no longer referenced
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert loaded.stub() is None


def test_weight_refs_of_external_data_and_of_a_symlinked_file(tmp_path):
    model = residual_model(channels=16)
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    real = save(model, tmp_path / "real.onnx")
    p = tmp_path / "ext.onnx"
    onnx.save(
        model,
        str(p),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    loaded = load_model(p)
    blob = (tmp_path / "ext.onnx.data").read_bytes()
    assert loaded.weight_refs
    for name, ref in loaded.weight_refs.items():
        assert ref.location == "ext.onnx.data"
        assert blob[ref.offset : ref.offset + ref.length] == arrays[name].tobytes()
    # a symlink to the model elsewhere: the references name the file it resolves to
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "link.onnx"
    link.symlink_to(real)
    linked = load_model(link)
    assert linked.weights_dir == tmp_path.resolve()
    assert {r.location for r in linked.weight_refs.values()} == {"real.onnx"}


def test_raw_data_offsets_of_malformed_bytes_is_empty():
    assert raw_data_offsets(b"") == {}
    assert raw_data_offsets(b"\x3a\xff\xff") == {}  # field 7 whose length runs past the end
    model = residual_model(channels=16)
    good = model.SerializeToString()
    assert set(raw_data_offsets(good)) == {t.name for t in model.graph.initializer}
    assert raw_data_offsets(good[: len(good) // 2]) == {}  # truncated
