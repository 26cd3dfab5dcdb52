"""Operator order, constant grouping, crossing tensors and valid cuts on DAGs (§IV-A)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from infscaler.base.errors import PartitionError
from infscaler.partitioner.extract import extract_partition, verify_chain
from infscaler.partitioner.graph import OperatorGraph
from infscaler.partitioner.loader import load_model
from tests.helpers import f32, if_model, make_model, rand, residual_model, save


def _graph(model: onnx.ModelProto, tmp_path, shapes=None) -> OperatorGraph:
    return OperatorGraph.from_loaded(load_model(save(model, tmp_path / "m.onnx"), shapes))


def _verify(g: OperatorGraph, cuts: list[int]) -> float:
    parts = [extract_partition(g.loaded, s) for s in g.specs(cuts)]
    v = verify_chain(g.loaded, parts, rtol=1e-5)
    assert v.passed, v.to_dict()
    return v.max_rel


def test_residual_edge_crosses_cuts_inside_the_block(tmp_path):
    g = _graph(residual_model(), tmp_path)
    assert [op.node for op in g.operators] == ["conv1", "relu1", "conv2", "add", "relu2", "conv3"]
    # x is read by conv1 (op 0) and by add (op 3): it crosses cuts 0, 1, 2.
    assert g.crossing(0) == ["x", "c1"]
    assert g.crossing(1) == ["x", "r1"]
    assert g.crossing(2) == ["x", "c2"]
    assert g.crossing(3) == ["s"]
    assert g.crossing(4) == ["r2"]
    assert g.crossing_bytes(1) == 2 * 1 * 4 * 8 * 8 * 4
    assert g.valid_cuts() == [0, 1, 2, 3, 4]
    specs = g.specs([1, 3])
    assert [s.inputs for s in specs] == [["x"], ["x", "r1"], ["s"]]
    assert [s.outputs for s in specs] == [["x", "r1"], ["s"], ["y"]]
    assert specs[1].nodes == ["conv2", "add"]
    for cuts in ([0], [2], [1, 3], [0, 1, 2, 3, 4]):
        assert _verify(g, cuts) < 1e-5


def test_constant_nodes_go_with_their_consumers_and_never_cross(tmp_path):
    # w (initializer, float64) -> Cast -> wc, used by two MatMuls in different partitions;
    # a Constant scale used by the last Mul.
    nodes = [
        helper.make_node("Cast", ["w64"], ["wc"], name="cast_w", to=TensorProto.FLOAT),
        helper.make_node(
            "Constant",
            [],
            ["k"],
            name="const_k",
            value=onnx.numpy_helper.from_array(np.float32(0.5)),
        ),
        helper.make_node("MatMul", ["x", "wc"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "wc"], ["c"], name="mm2"),
        helper.make_node("Mul", ["c", "k"], ["y"], name="scale"),
    ]
    model = make_model(
        nodes,
        [f32("x", [2, 8])],
        [f32("y", [2, 8])],
        {"w64": rand(8, 8).astype(np.float64)},
    )
    g = _graph(model, tmp_path)
    assert [op.node for op in g.operators] == ["mm1", "relu", "mm2", "scale"]
    assert g.constant_nodes == {"cast_w", "const_k"}
    for c in range(g.num_operators - 1):
        assert not set(g.crossing(c)) & {"wc", "k", "w64"}
    specs = g.specs([1])
    assert specs[0].nodes == ["cast_w", "mm1", "relu"]
    assert specs[1].nodes == ["cast_w", "const_k", "mm2", "scale"]
    assert _verify(g, [1]) < 1e-5
    # weights as held after constant folding: the Cast's float32 output, not the float64 source
    assert g.weight_bytes(0, 1) == 8 * 8 * 4
    assert g.weight_bytes(2, 3) == 8 * 8 * 4 + 4  # wc again, plus the scalar Constant k


def test_if_node_is_one_operator_and_never_cut_inside(tmp_path):
    g = _graph(if_model(), tmp_path)
    ops = [op.node for op in g.operators]
    assert ops == ["relu", "sum", "gt", "if", "sigmoid"]
    # the branches' nodes are not operators, and the outer tensor r (read only inside the
    # branches) crosses every cut between relu and the If.
    assert "then_mul" not in ops and "else_add" not in ops
    assert "r" in g.crossing(1) and "r" in g.crossing(2)
    assert "r" not in g.crossing(3)
    for cuts in ([0], [2], [3], [0, 1, 2, 3]):
        _verify(g, cuts)
    part = extract_partition(g.loaded, g.specs([2])[1])
    assert {i.name for i in part.graph.initializer} == {"w_then", "w_else"}


def test_early_model_output_passes_through_to_the_end(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["early"], name="relu"),
        helper.make_node("Sigmoid", ["early"], ["s"], name="sig"),
        helper.make_node("Tanh", ["s"], ["late"], name="tanh"),
    ]
    model = make_model(nodes, [f32("x", [3])], [f32("early", [3]), f32("late", [3])])
    g = _graph(model, tmp_path)
    assert g.crossing(0) == ["early"]
    assert g.crossing(1) == ["early", "s"]
    specs = g.specs([0, 1])
    assert specs[-1].outputs == ["early", "late"]
    assert "early" in specs[1].inputs and "early" in specs[1].outputs
    _verify(g, [0, 1])


def test_dynamic_batch_partitioned_with_shapes(tmp_path):
    model = residual_model(batch="N")
    assert _graph(model, tmp_path).crossing_bytes(3) == 4 * 8 * 8 * 4  # batch 1 by default
    g = _graph(model, tmp_path, "x:4x4x8x8")
    assert g.crossing_bytes(3) == 4 * 4 * 8 * 8 * 4
    _verify(g, [1, 3])


def test_peak_activation_bytes_by_hand(tmp_path):
    g = _graph(residual_model(), tmp_path)
    t = 1 * 4 * 8 * 8 * 4  # one [1,4,8,8] float32 activation
    # ops 0..2 = conv1, relu1, conv2 with input x live throughout (the Add needs it later):
    # x + c1 (conv1) -> x + c1 + r1 (relu1 then c1 dies) -> x + r1 + c2 (conv2) = 3 t peak
    assert g.peak_activation_bytes(0, 2) == 3 * t
    # last partition: s in, r2, then y ([1,2,8,8]) -> peak s + r2 = 2 t, or r2 + y
    assert g.peak_activation_bytes(4, 5) == max(2 * t, t + t // 2)
    assert g.weight_bytes(0, 5) == sum(
        a.nbytes for a in (rand(4, 4, 3, 3), rand(4), rand(4, 4, 3, 3), rand(4), rand(2, 4, 1, 1))
    )


def test_bad_cuts_are_refused(tmp_path):
    g = _graph(residual_model(), tmp_path)
    for bad in ([3, 1], [1, 1], [5], [-1]):
        with pytest.raises(PartitionError, match="strictly increasing"):
            g.specs(bad)
    with pytest.raises(IndexError):
        g.crossing(5)


def test_max_crossing_bytes_invalidates_cuts(tmp_path):
    g = _graph(residual_model(), tmp_path)
    t = 1 * 4 * 8 * 8 * 4
    assert g.valid_cuts(max_crossing_bytes=t) == [3, 4]
    assert "limit" in g.invalid_reason(0, max_crossing_bytes=t)


def test_producer_of_a_model_output_is_always_an_operator(tmp_path):
    nodes = [helper.make_node("Identity", ["w"], ["y"], name="id")]
    model = make_model(nodes, [], [f32("y", [2])], {"w": rand(2)})
    # y is a model output, so its producer is kept as an operator: the model has one.
    g = _graph(model, tmp_path)
    assert g.num_operators == 1
    nodes = [helper.make_node("Cast", ["w"], ["c"], name="c", to=TensorProto.FLOAT)]
    nodes.append(helper.make_node("Identity", ["c"], ["y"], name="id"))
    g = _graph(make_model(nodes, [f32("x", [2])], [f32("y", [2])], {"w": rand(2)}), tmp_path)
    assert [op.node for op in g.operators] == ["id"]
