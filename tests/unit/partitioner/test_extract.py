"""Tests of partitioner/extract.py: sub-model extraction, chain running, verification."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from infscaler.base.errors import PartitionError, VerificationError
from infscaler.partitioner import extract
from infscaler.partitioner.extract import (
    Chain,
    PartitionSpec,
    Verification,
    check_verification,
    extract_partition,
    load_sessions,
    save_partition,
    verify_chain,
)
from infscaler.partitioner.graph import OperatorGraph
from infscaler.partitioner.loader import LoadedModel, load_model, random_feeds
from infscaler.partitioner.weights import StubModel

OPSET = 13
IR = 8  # onnxruntime 1.31 reads IR <= 13; onnx.helper's default may be newer


def _w(name: str, shape: tuple[int, ...], seed: int, dtype=np.float32) -> TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(dtype), name)


def _vi(name: str, shape: list[int], elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def _load(tmp_path: Path, graph: onnx.GraphProto, name: str) -> LoadedModel:
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)], ir_version=IR)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def _init_names(part: onnx.ModelProto) -> set[str]:
    return {t.name for t in part.graph.initializer}


def _check_part(part: onnx.ModelProto, loaded: LoadedModel, spec: PartitionSpec) -> None:
    """Common checks of one extracted part."""
    onnx.checker.check_model(part)
    ort.InferenceSession(part.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [n.name for n in part.graph.node] == spec.nodes
    assert [i.name for i in part.graph.input] == spec.inputs
    assert [o.name for o in part.graph.output] == spec.outputs
    for vi in [*part.graph.input, *part.graph.output]:
        info = loaded.tensors[vi.name]
        tt = vi.type.tensor_type
        assert [d.dim_value for d in tt.shape.dim] == list(info.shape)
        assert tt.elem_type == oh.np_dtype_to_tensor_dtype(info.dtype)
    assert part.ir_version == loaded.model.ir_version
    assert list(part.opset_import) == list(loaded.model.opset_import)
    assert part.producer_name == "infscaler"
    assert f"partition {spec.index}" in part.doc_string


# ----------------------------------------------------------------- helper-built models


@pytest.fixture
def residual(tmp_path: Path) -> LoadedModel:
    """x -> Conv -> Relu -> Conv -> Add(with x) -> Relu -> out."""
    nodes = [
        oh.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        oh.make_node("Conv", ["r1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        oh.make_node("Add", ["c2", "x"], ["s"], name="add"),
        oh.make_node("Relu", ["s"], ["out"], name="relu2"),
    ]
    graph = oh.make_graph(
        nodes,
        "residual",
        [_vi("x", [1, 4, 8, 8])],
        [_vi("out", [1, 4, 8, 8])],
        [_w("W1", (4, 4, 3, 3), 1), _w("B1", (4,), 2), _w("W2", (4, 4, 3, 3), 3)],
    )
    return _load(tmp_path, graph, "residual")


def test_residual_two_partitions(residual: LoadedModel) -> None:
    specs = [
        PartitionSpec(0, ["conv1", "relu1"], ["x"], ["r1", "x"]),
        PartitionSpec(1, ["conv2", "add", "relu2"], ["r1", "x"], ["out"]),
    ]
    parts = [extract_partition(residual, s) for s in specs]
    for part, spec in zip(parts, specs, strict=True):
        _check_part(part, residual, spec)
    assert _init_names(parts[0]) == {"W1", "B1"}
    assert _init_names(parts[1]) == {"W2"}
    # value_info holds the internal tensors, typed
    assert {v.name for v in parts[0].graph.value_info} == {"c1"}
    assert {v.name for v in parts[1].graph.value_info} == {"c2", "s"}

    v = verify_chain(residual, parts)
    assert v.passed, v.to_dict()
    assert v.max_rel < 1e-5
    assert v.per_output["out"]["shape"] == [1, 4, 8, 8]
    assert v.per_output["out"]["scale"] > 0
    check_verification(v)  # does not raise


def test_residual_three_partitions_input_passes_through(residual: LoadedModel) -> None:
    specs = [
        PartitionSpec(0, ["conv1"], ["x"], ["c1", "x"]),
        PartitionSpec(1, ["relu1", "conv2"], ["c1", "x"], ["c2", "x"]),  # x passes through
        PartitionSpec(2, ["add", "relu2"], ["c2", "x"], ["out"]),
    ]
    parts = [extract_partition(residual, s) for s in specs]
    for part, spec in zip(parts, specs, strict=True):
        _check_part(part, residual, spec)
    assert [_init_names(p) for p in parts] == [{"W1", "B1"}, {"W2"}, set()]
    # x is both an input and an output of the middle part
    assert "x" in [i.name for i in parts[1].graph.input]
    assert "x" in [o.name for o in parts[1].graph.output]

    feeds = random_feeds({"x": residual.tensors["x"]}, seed=3)
    whole = ort.InferenceSession(
        residual.model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(["out"], feeds)[0]
    got = Chain(parts).run(feeds)
    assert list(got) == ["out"]
    np.testing.assert_allclose(got["out"], whole, rtol=1e-5, atol=1e-6)

    v = verify_chain(residual, parts)
    assert v.passed and v.max_rel < 1e-5


def test_chain_reuses_sessions(residual: LoadedModel) -> None:
    specs = [
        PartitionSpec(0, ["conv1", "relu1"], ["x"], ["r1", "x"]),
        PartitionSpec(1, ["conv2", "add", "relu2"], ["r1", "x"], ["out"]),
    ]
    parts = [extract_partition(residual, s) for s in specs]
    chain = Chain(parts)
    assert chain.inputs == ["x"]
    assert chain.outputs == ["out"]
    assert chain.part_inputs == [["x"], ["r1", "x"]]
    feeds = random_feeds({"x": residual.tensors["x"]}, seed=1)
    first = chain.run(feeds)["out"]
    second = chain.run(feeds)["out"]
    np.testing.assert_array_equal(first, second)
    # sessions can be built once and handed over
    sessions = load_sessions(parts)
    assert all(isinstance(s, ort.InferenceSession) for s in sessions)
    np.testing.assert_array_equal(Chain(sessions).run(feeds)["out"], first)
    # a missing feed is reported by name
    with pytest.raises(PartitionError, match="'x'"):
        chain.run({})


def test_wrong_spec_missing_input_names_tensor(residual: LoadedModel) -> None:
    # the residual x is not passed on: add reads a tensor the partition does not have
    bad = PartitionSpec(1, ["conv2", "add", "relu2"], ["r1"], ["out"])
    with pytest.raises(PartitionError, match=r"'x'") as exc:
        extract_partition(residual, bad)
    assert "'add'" in str(exc.value)
    # nodes out of order: relu1 reads c1 before conv1 produced it
    with pytest.raises(PartitionError, match=r"'c1'"):
        extract_partition(residual, PartitionSpec(0, ["relu1", "conv1"], ["x"], ["r1"]))


def test_wrong_spec_other_errors(residual: LoadedModel) -> None:
    with pytest.raises(PartitionError, match="'nope'"):
        extract_partition(residual, PartitionSpec(0, ["conv1", "nope"], ["x"], ["c1"]))
    with pytest.raises(PartitionError, match="output 'r1'"):
        extract_partition(residual, PartitionSpec(0, ["conv1"], ["x"], ["r1"]))
    with pytest.raises(PartitionError, match="twice"):
        extract_partition(residual, PartitionSpec(0, ["conv1", "conv1"], ["x"], ["c1"]))
    with pytest.raises(PartitionError, match="'W1'"):
        extract_partition(residual, PartitionSpec(0, ["conv1"], ["x", "W1"], ["c1"]))
    with pytest.raises(PartitionError, match="'c1'"):  # produced inside but declared as input
        extract_partition(residual, PartitionSpec(0, ["conv1", "relu1"], ["x", "c1"], ["r1"]))


def test_two_outputs_one_produced_early_passes_through(tmp_path: Path) -> None:
    nodes = [
        oh.make_node("Conv", ["x", "W1"], ["c1"], name="conv1"),
        oh.make_node("Sigmoid", ["c1"], ["aux"], name="sig"),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu"),
        oh.make_node("Conv", ["r1", "W2"], ["out"], name="conv2"),
    ]
    graph = oh.make_graph(
        nodes,
        "two_outputs",
        [_vi("x", [1, 3, 6, 6])],
        [_vi("out", [1, 2, 6, 6]), _vi("aux", [1, 5, 6, 6])],
        [_w("W1", (5, 3, 1, 1), 1), _w("W2", (2, 5, 1, 1), 2)],
    )
    loaded = _load(tmp_path, graph, "two_outputs")
    specs = [
        PartitionSpec(0, ["conv1", "sig"], ["x"], ["c1", "aux"]),
        PartitionSpec(1, ["relu", "conv2"], ["c1", "aux"], ["out", "aux"]),
    ]
    parts = [extract_partition(loaded, s) for s in specs]
    for part, spec in zip(parts, specs, strict=True):
        _check_part(part, loaded, spec)
    assert [_init_names(p) for p in parts] == [{"W1"}, {"W2"}]
    got = Chain(parts).run(random_feeds({"x": loaded.tensors["x"]}))
    assert list(got) == ["out", "aux"]
    v = verify_chain(loaded, parts)
    assert v.passed and v.max_rel < 1e-5
    assert set(v.per_output) == {"out", "aux"}


def test_constant_nodes_duplicated_into_two_partitions(tmp_path: Path) -> None:
    k = numpy_helper.from_array(np.array([0.5, -0.25, 1.0], np.float32).reshape(1, 3, 1), "kv")
    nodes = [
        oh.make_node("Constant", [], ["k"], name="const_k", value=k),
        oh.make_node("Cast", ["S64"], ["s"], name="cast_s", to=TensorProto.FLOAT),
        oh.make_node("Add", ["x", "k"], ["a1"], name="add1"),
        oh.make_node("Mul", ["a1", "s"], ["m1"], name="mul1"),
        oh.make_node("Tanh", ["m1"], ["t1"], name="tanh"),
        oh.make_node("Add", ["t1", "k"], ["a2"], name="add2"),
        oh.make_node("Mul", ["a2", "s"], ["y"], name="mul2"),
    ]
    s64 = numpy_helper.from_array(np.array([[[1.5]], [[2.0]], [[-0.5]]]).reshape(1, 3, 1), "S64")
    graph = oh.make_graph(nodes, "consts", [_vi("x", [1, 3, 4])], [_vi("y", [1, 3, 4])], [s64])
    loaded = _load(tmp_path, graph, "consts")
    specs = [
        PartitionSpec(0, ["const_k", "cast_s", "add1", "mul1", "tanh"], ["x"], ["t1"]),
        PartitionSpec(1, ["const_k", "cast_s", "add2", "mul2"], ["t1"], ["y"]),
    ]
    parts = [extract_partition(loaded, s) for s in specs]
    for part, spec in zip(parts, specs, strict=True):
        _check_part(part, loaded, spec)
        assert _init_names(part) == {"S64"}
        assert [n.op_type for n in part.graph.node][:2] == ["Constant", "Cast"]
    v = verify_chain(loaded, parts)
    assert v.passed and v.max_rel < 1e-5


def _if_model(tmp_path: Path) -> LoadedModel:
    """cond = ReduceSum(x) > 0; out = If(cond, then: (x + W) * W2, else: x - W + local)."""
    then_graph = oh.make_graph(
        [
            oh.make_node("Add", ["x", "W"], ["t_sum"], name="then_add"),
            oh.make_node("Mul", ["t_sum", "W2"], ["t_out"], name="then_mul"),
        ],
        "then",
        [],
        [_vi("t_out", [2, 3])],
    )
    else_graph = oh.make_graph(
        [
            oh.make_node("Sub", ["x", "W"], ["e_diff"], name="else_sub"),
            oh.make_node("Add", ["e_diff", "local_b"], ["e_out"], name="else_add"),
        ],
        "else",
        [],
        [_vi("e_out", [2, 3])],
        [_w("local_b", (2, 3), 9)],  # an initializer local to the branch
    )
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        oh.make_node("Greater", ["total", "zero"], ["cond"], name="gt"),
        oh.make_node(
            "If", ["cond"], ["branch"], name="if", then_branch=then_graph, else_branch=else_graph
        ),
        oh.make_node("Relu", ["branch"], ["out"], name="relu"),
    ]
    graph = oh.make_graph(
        nodes,
        "with_if",
        [_vi("x", [2, 3])],
        [_vi("out", [2, 3])],
        [
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            _w("W", (2, 3), 1),
            _w("W2", (2, 3), 2),
            _w("unused", (2, 3), 3),
        ],
    )
    return _load(tmp_path, graph, "with_if")


def test_if_branches_pull_outer_initializers(tmp_path: Path) -> None:
    loaded = _if_model(tmp_path)
    specs = [
        PartitionSpec(0, ["sum", "gt"], ["x"], ["cond", "x"]),
        PartitionSpec(1, ["if", "relu"], ["cond", "x"], ["out"]),
    ]
    parts = [extract_partition(loaded, s) for s in specs]
    for part, spec in zip(parts, specs, strict=True):
        _check_part(part, loaded, spec)
    assert _init_names(parts[0]) == {"zero"}
    # W / W2 are only referenced from inside the branches; local_b stays in its branch
    assert _init_names(parts[1]) == {"W", "W2"}
    v = verify_chain(loaded, parts)  # random feeds in [0, 1): the then-branch
    assert v.passed and v.max_rel < 1e-5
    neg = {"x": -np.abs(random_feeds({"x": loaded.tensors["x"]}, seed=5)["x"])}
    v_else = verify_chain(loaded, parts, feeds=neg)  # the else-branch
    assert v_else.passed and v_else.max_rel < 1e-5
    assert v_else.feeds_seed is None


def test_if_outer_reference_missing_is_refused(tmp_path: Path) -> None:
    loaded = _if_model(tmp_path)
    # the branches read x, which the partition does not receive
    bad = PartitionSpec(1, ["if", "relu"], ["cond"], ["out"])
    with pytest.raises(PartitionError, match=r"subgraph of node 'if'.*'x'"):
        extract_partition(loaded, bad)


# ----------------------------------------------------------------- verification failures


def test_altered_part_is_detected(residual: LoadedModel) -> None:
    specs = [
        PartitionSpec(0, ["conv1", "relu1"], ["x"], ["r1", "x"]),
        PartitionSpec(1, ["conv2", "add", "relu2"], ["r1", "x"], ["out"]),
    ]
    parts = [extract_partition(residual, s) for s in specs]
    altered = onnx.ModelProto()
    altered.CopyFrom(parts[1])
    (w2,) = [t for t in altered.graph.initializer if t.name == "W2"]
    w2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w2) * 1.01, "W2"))

    v = verify_chain(residual, [parts[0], altered])
    assert not v.passed
    assert v.max_rel > 1e-4
    assert v.max_abs > 0
    assert v.worst_output == "out"
    with pytest.raises(VerificationError, match="'out'") as exc:
        check_verification(v)
    assert "1e-04" in str(exc.value) or "0.0001" in str(exc.value)
    assert exc.value.hint and "tolerance" in exc.value.hint
    d = v.to_dict()
    assert d["passed"] is False and d["per_output"]["out"]["max_rel"] == v.max_rel

    # a looser tolerance accepts the same chain
    assert verify_chain(residual, [parts[0], altered], rtol=0.5).passed


def test_nan_and_shape_mismatch_fail(residual: LoadedModel) -> None:
    specs = [
        PartitionSpec(0, ["conv1", "relu1"], ["x"], ["r1", "x"]),
        PartitionSpec(1, ["conv2", "add", "relu2"], ["r1", "x"], ["out"]),
    ]
    parts = [extract_partition(residual, s) for s in specs]
    nan_part = onnx.ModelProto()
    nan_part.CopyFrom(parts[1])
    (w2,) = [t for t in nan_part.graph.initializer if t.name == "W2"]
    arr = numpy_helper.to_array(w2).copy()
    arr[0, 0, 1, 1] = np.nan
    w2.CopyFrom(numpy_helper.from_array(arr, "W2"))
    v = verify_chain(residual, [parts[0], nan_part])
    assert not v.passed and v.max_rel == float("inf")
    assert "NaN" in v.per_output["out"]["reason"]
    with pytest.raises(VerificationError, match="NaN"):
        check_verification(v)

    # a chain whose last output has another shape: 'out' flattened to [1, 256]
    short = onnx.ModelProto()
    short.CopyFrom(parts[1])
    short.graph.node[-1].output[0] = "pre"
    short.graph.node.append(oh.make_node("Flatten", ["pre"], ["out"], name="flat"))
    short.graph.output[0].CopyFrom(_vi("out", [1, 256]))
    onnx.checker.check_model(short)
    v = verify_chain(residual, [parts[0], short])
    assert not v.passed and v.max_rel == float("inf")
    assert "shape" in v.per_output["out"]["reason"]

    # a chain that cannot run (missing tensor) does not raise either
    v = verify_chain(residual, [parts[1]])
    assert not v.passed and v.error and "'r1'" in v.error
    with pytest.raises(VerificationError):
        check_verification(v)


# ----------------------------------------------------------------- weights by reference


def _residual16(tmp_path: Path) -> tuple[LoadedModel, Path]:
    """x -> Conv -> Relu -> Conv -> Add(x) -> Relu, 16 channels: 9 KiB weights (referenced)."""
    nodes = [
        oh.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        oh.make_node("Conv", ["r1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        oh.make_node("Add", ["c2", "x"], ["s"], name="add"),
        oh.make_node("Relu", ["s"], ["out"], name="relu2"),
    ]
    graph = oh.make_graph(
        nodes,
        "residual16",
        [_vi("x", [1, 16, 8, 8])],
        [_vi("out", [1, 16, 8, 8])],
        [_w("W1", (16, 16, 3, 3), 1), _w("B1", (16,), 2), _w("W2", (16, 16, 3, 3), 3)],
    )
    loaded = _load(tmp_path, graph, "residual16")
    return loaded, tmp_path / "residual16.onnx"


def test_stub_sessions_match_the_embedded_model_bitwise(tmp_path: Path) -> None:
    loaded, path = _residual16(tmp_path)
    assert set(loaded.weight_refs) == {"W1", "W2"}  # B1 (64 bytes) stays embedded
    stub = loaded.stub()
    assert isinstance(stub, StubModel) and len(stub.data) < path.stat().st_size // 4
    feeds = random_feeds({"x": loaded.tensors["x"]}, seed=3)
    for optimized in (False, True):
        got = stub.session(extract._session_options(optimized))
        ref = ort.InferenceSession(
            loaded.model.SerializeToString(),
            extract._session_options(optimized),
            providers=["CPUExecutionProvider"],
        )
        np.testing.assert_array_equal(got.run(None, feeds)[0], ref.run(None, feeds)[0])

    # stubs of the parts: the chain verifies exactly (bitwise) against the whole model,
    # with or without a reference given by the caller; nothing is written beside the model
    specs = OperatorGraph.from_loaded(loaded).specs([1])
    parts = [extract_partition(loaded, s) for s in specs]
    stubs = [loaded.stub(p) for p in parts]
    assert all(isinstance(s, StubModel) for s in stubs)
    v = verify_chain(loaded, stubs, threads=1)
    assert v.passed and v.max_abs == 0.0, v.to_dict()
    again = verify_chain(loaded, stubs, reference=v.reference, threads=1)
    assert again.passed and again.max_abs == 0.0 and again.optimized is not None
    wrong = {"out": v.reference["out"] * 1.5}
    assert not verify_chain(loaded, stubs, reference=wrong).passed
    assert not verify_chain(loaded, stubs, reference={}).passed  # lacks the output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["residual16.onnx"]


def test_partition_model_builds_each_session_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infscaler.partitioner.api import partition_model
    from infscaler.partitioner.plan import read_plan

    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    loaded, path = _residual16(tmp_path)
    built: list[int] = []  # size of the serialised model of each session
    real = ort.InferenceSession

    class Counting(real):
        def __init__(self, source, *args, **kwargs):
            size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
            built.append(size)
            super().__init__(source, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    plan = partition_model(
        path, num_partitions=2, warmup=0, repeats=1, use_cache=False, out_dir=tmp_path / "plan"
    )
    k = plan.num_partitions
    # whole model: per-node profile + T_o; each part: verification + latency; the two
    # Identity models of the boundary overhead T_p
    assert len(built) == 2 + 2 * k + 2
    assert max(built) < path.stat().st_size // 4  # every model session from a stub
    v = plan.summary["verification"]
    assert v["passed"] and v["max_abs"] == 0.0 and v["optimized"] is not None
    back = read_plan(tmp_path / "plan")
    assert [p.SerializeToString() for p in back.parts] == [
        p.SerializeToString() for p in plan.parts
    ]
    for part in back.parts:
        onnx.checker.check_model(part, full_check=True)
    # nothing else written: no cache (use_cache=False), no staging directory left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan", "residual16.onnx"]


def test_partition_structure_is_still_checked(tmp_path: Path) -> None:
    loaded, _ = _residual16(tmp_path)
    (spec,) = OperatorGraph.from_loaded(loaded).specs([])
    part = extract_partition(loaded, spec)
    onnx.checker.check_model(part, full_check=True)  # the embedded part is valid as a whole
    # a node the Conv schema does not allow (an attribute it lacks), put in after loading
    loaded.model.graph.node[0].attribute.append(oh.make_attribute("bogus", 1))
    with pytest.raises(PartitionError, match="not a valid ONNX model"):
        extract_partition(loaded, spec)


# ----------------------------------------------------------------- saving


def test_save_partition_plain_and_external(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            oh.make_node("Add", ["h", "b"], ["y"], name="add"),
        ],
        "mlp",
        [_vi("x", [2, 64])],
        [_vi("y", [2, 64])],
        [_w("W", (64, 64), 1), _w("b", (64,), 2)],  # W: 16 KiB (external), b: 256 B (inline)
    )
    loaded = _load(tmp_path, graph, "mlp")
    part = extract_partition(loaded, PartitionSpec(0, ["mm", "add"], ["x"], ["y"]))
    plain = tmp_path / "plans" / "part_0.onnx"
    save_partition(part, plain)
    assert plain.exists() and not (plain.parent / "part_0.onnx.data").exists()
    assert onnx.load(str(plain)) == part

    monkeypatch.setattr(extract, "EXTERNAL_DATA_THRESHOLD", 100)
    big = tmp_path / "ext" / "part_0.onnx"
    before = part.SerializeToString()
    save_partition(part, big)
    save_partition(part, big)  # saved twice: the data file is replaced, not appended to
    data = big.parent / "part_0.onnx.data"
    assert data.exists()
    assert data.stat().st_size == 64 * 64 * 4
    assert big.stat().st_size < 64 * 64 * 4
    assert part.SerializeToString() == before  # the caller's model is untouched
    onnx.checker.check_model(str(big))
    feeds = random_feeds({"x": loaded.tensors["x"]}, seed=2)
    np.testing.assert_array_equal(Chain([big]).run(feeds)["y"], Chain([plain]).run(feeds)["y"])


def test_verification_to_dict_roundtrip_fields() -> None:
    v = Verification(1.0, 0.5, {"y": {"max_abs": 1.0, "max_rel": 0.5}}, 1e-4, False)
    d = v.to_dict()
    assert d["max_abs"] == 1.0 and d["max_rel"] == 0.5 and d["rtol"] == 1e-4
    assert d["worst_output"] == "y"


# ----------------------------------------------------------------- real model


def _crossing(loaded: LoadedModel, first: list[str], second: list[str]) -> list[str]:
    """Tensors produced by ``first`` (or model inputs) consumed by ``second`` or outputs."""
    by_name = {n.name: n for n in loaded.model.graph.node}
    available = list(loaded.graph_inputs)
    for name in first:
        available.extend(o for o in by_name[name].output if o)
    consumed = {i for name in second for i in by_name[name].input if i}
    consumed.update(loaded.graph_outputs)
    return [t for t in dict.fromkeys(available) if t in consumed]


def _split_in_two(loaded: LoadedModel) -> list[PartitionSpec]:
    """Cut the node list in the middle; constant-only nodes go with their consumers."""
    nodes = list(loaded.model.graph.node)
    inits = loaded.initializer_names
    const_nodes: set[str] = set()
    const_tensors: set[str] = set()
    for n in nodes:
        if all((not i) or i in inits or i in const_tensors for i in n.input):
            const_nodes.add(n.name)
            const_tensors.update(n.output)
    compute = [n.name for n in nodes if n.name not in const_nodes]
    mid = len(compute) // 2
    groups = [compute[:mid], compute[mid:]]
    by_name = {n.name: n for n in nodes}
    node_lists = []
    for group in groups:
        chosen = set(group)
        needed = {i for name in group for i in by_name[name].input}
        for n in reversed(nodes):
            if n.name in const_nodes and needed & set(n.output):
                chosen.add(n.name)
                needed.update(n.input)
        node_lists.append([n.name for n in nodes if n.name in chosen])
    cross = _crossing(loaded, groups[0], groups[1])
    return [
        PartitionSpec(0, node_lists[0], list(loaded.graph_inputs), cross),
        PartitionSpec(1, node_lists[1], cross, list(loaded.graph_outputs)),
    ]


@pytest.mark.slow
def test_resnet50_two_partitions() -> None:
    from infscaler.base.models import resolve_model

    loaded = load_model(resolve_model("resnet50"))
    specs = _split_in_two(loaded)
    assert len(specs[0].outputs) >= 1
    parts = [extract_partition(loaded, s) for s in specs]
    inits = loaded.initializer_names
    total = {i for n in loaded.model.graph.node for i in n.input if i in inits}  # used ones
    names = [_init_names(p) for p in parts]
    assert names[0] and names[1]
    assert names[0] | names[1] == total
    assert not names[0] & names[1]  # resnet50 has no shared weights
    for part, spec in zip(parts, specs, strict=True):
        onnx.checker.check_model(part)
        assert [i.name for i in part.graph.input][: len(spec.inputs)] == spec.inputs
        assert [o.name for o in part.graph.output] == spec.outputs
    v = verify_chain(loaded, parts)
    assert v.passed, v.to_dict()
    assert v.max_rel <= 1e-4
