"""Tests of infscaler.partitioner.cost (operator complexity c_n of InfScaler §IV-A, Eq. 1).

Every expected number is computed by hand in the test, with the arithmetic written out.
Graphs are built with onnx.helper, saved, and passed through load_model (so shapes come
from the loader's canonical model, as in production).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from infscaler.partitioner.cost import (
    OperatorCost,
    constant_tensors,
    model_costs,
    node_cost,
)
from infscaler.partitioner.loader import TensorInfo, load_model

F32 = 4  # bytes per float32
F16 = 2
I64 = 8


def vi(name: str, shape, dtype=T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, dtype, shape)


def init(name: str, shape, dtype=np.float32, value=None) -> onnx.TensorProto:
    arr = np.asarray(value, dtype=dtype) if value is not None else np.ones(shape, dtype=dtype)
    return numpy_helper.from_array(arr, name)


def build(tmp_path, nodes, inputs, outputs, initializers=(), opset=17, name="m"):
    """Save a one-graph model and load it through load_model (canonical model)."""
    graph = h.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def single(tmp_path, node, inputs, outputs, initializers=(), opset=17) -> OperatorCost:
    node.name = "n"
    loaded = build(tmp_path, [node], inputs, outputs, initializers, opset)
    costs = model_costs(loaded)
    assert list(costs) == ["n"]
    return costs["n"]


# ------------------------------------------------------------------------ OperatorCost


def test_operator_cost_add_sum_and_dict():
    a = OperatorCost(flops=10, param_bytes=1, input_bytes=2, output_bytes=3)
    b = OperatorCost(flops=5, param_bytes=4, input_bytes=0, output_bytes=7)
    assert a + b == OperatorCost(15, 5, 2, 10)
    assert sum([a, b]) == OperatorCost(15, 5, 2, 10)
    assert sum([a, b], OperatorCost()) == OperatorCost(15, 5, 2, 10)
    assert a.to_dict() == {"flops": 10, "param_bytes": 1, "input_bytes": 2, "output_bytes": 3}
    with pytest.raises(AttributeError):
        a.flops = 3  # type: ignore[misc]  # frozen


# -------------------------------------------------------------------------------- Conv


def test_conv_2d_with_bias_and_padding(tmp_path):
    node = h.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    cost = single(
        tmp_path,
        node,
        [vi("x", [1, 3, 16, 16])],
        [vi("y", [1, 8, 16, 16])],
        [init("w", [8, 3, 3, 3]), init("b", [8])],
    )
    # 2 * N * Cout * H_out * W_out * (Cin/group * kh * kw) + bias N * Cout * H_out * W_out
    assert cost.flops == 2 * 1 * 8 * 16 * 16 * (3 * 3 * 3) + 1 * 8 * 16 * 16
    assert cost.param_bytes == (8 * 3 * 3 * 3 + 8) * F32
    assert cost.input_bytes == 1 * 3 * 16 * 16 * F32
    assert cost.output_bytes == 1 * 8 * 16 * 16 * F32


def test_conv_groups_stride_dilation_no_bias(tmp_path):
    node = h.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        group=4,
        strides=[2, 2],
        dilations=[2, 2],
        pads=[2, 2, 2, 2],
        kernel_shape=[3, 3],
    )
    # H_out = floor((20 + 2 + 2 - 2 * (3 - 1) - 1) / 2) + 1 = floor(19 / 2) + 1 = 10
    cost = single(
        tmp_path,
        node,
        [vi("x", [1, 8, 20, 20])],
        [vi("y", [1, 16, 10, 10])],
        [init("w", [16, 8 // 4, 3, 3])],
    )
    assert cost.flops == 2 * 1 * 16 * 10 * 10 * (8 // 4) * (3 * 3)
    assert cost.param_bytes == 16 * 2 * 3 * 3 * F32


def test_conv_1d_and_3d(tmp_path):
    c1 = single(
        tmp_path,
        h.make_node("Conv", ["x", "w"], ["y"]),
        [vi("x", [2, 4, 10])],
        [vi("y", [2, 6, 8])],  # 10 - 3 + 1
        [init("w", [6, 4, 3])],
    )
    assert c1.flops == 2 * 2 * 6 * 8 * (4 * 3)
    (tmp_path / "3d").mkdir()
    c3 = single(
        tmp_path / "3d",
        h.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1, 1, 1]),
        [vi("x", [1, 2, 4, 6, 6])],
        [vi("y", [1, 3, 4, 6, 6])],
        [init("w", [3, 2, 3, 3, 3]), init("b", [3])],
    )
    assert c3.flops == 2 * 1 * 3 * (4 * 6 * 6) * (2 * 3 * 3 * 3) + 1 * 3 * (4 * 6 * 6)


def test_conv_transpose_with_bias_and_groups(tmp_path):
    # Y spatial = (5 - 1) * stride 2 + kernel 3 = 11
    cost = single(
        tmp_path,
        h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2]),
        [vi("x", [1, 4, 5, 5])],
        [vi("y", [1, 3, 11, 11])],
        [init("w", [4, 3, 3, 3]), init("b", [3])],  # W: [Cin, Cout/group, kh, kw]
    )
    # 2 * N * Cin * H_in * W_in * (Cout/group) * kh * kw + bias N * Cout * H_out * W_out
    assert cost.flops == 2 * 1 * 4 * 5 * 5 * 3 * (3 * 3) + 1 * 3 * 11 * 11
    assert cost.param_bytes == (4 * 3 * 3 * 3 + 3) * F32
    (tmp_path / "g").mkdir()
    grouped = single(
        tmp_path / "g",
        h.make_node("ConvTranspose", ["x", "w"], ["y"], group=2),
        [vi("x", [1, 4, 5, 5])],
        [vi("y", [1, 4, 7, 7])],  # Cout = 2 * 2, spatial 5 - 1 + 3
        [init("w", [4, 2, 3, 3])],
    )
    assert grouped.flops == 2 * 1 * 4 * 5 * 5 * 2 * (3 * 3)


# ------------------------------------------------------------------------ Gemm / MatMul


def test_gemm_trans_a_trans_b_with_c(tmp_path):
    # A: [K=5, M=3] (transA), B: [N=4, K=5] (transB), C: [N=4]
    cost = single(
        tmp_path,
        h.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1),
        [vi("a", [5, 3])],
        [vi("y", [3, 4])],
        [init("b", [4, 5]), init("c", [4])],
    )
    assert cost.flops == 2 * 3 * 4 * 5 + 3 * 4
    assert cost.input_bytes == 5 * 3 * F32
    assert cost.param_bytes == (4 * 5 + 4) * F32


def test_gemm_without_c(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("Gemm", ["a", "b"], ["y"]),
        [vi("a", [7, 5])],
        [vi("y", [7, 2])],
        [init("b", [5, 2])],
    )
    assert cost.flops == 2 * 7 * 2 * 5


def test_matmul_batched_broadcast(tmp_path):
    # [2,1,4,5] @ [3,5,6] -> batch broadcast([2,1], [3]) = [2,3], M=4, K=5, N=6
    cost = single(
        tmp_path,
        h.make_node("MatMul", ["a", "b"], ["y"]),
        [vi("a", [2, 1, 4, 5]), vi("b", [3, 5, 6])],
        [vi("y", [2, 3, 4, 6])],
    )
    assert cost.flops == 2 * (2 * 3) * 4 * 6 * 5
    assert cost.input_bytes == (2 * 1 * 4 * 5 + 3 * 5 * 6) * F32
    assert cost.param_bytes == 0


def test_matmul_one_d_operands(tmp_path):
    # numpy rules: [5] @ [2,5,6] -> [2,6] (M dropped); [3,4,5] @ [5] -> [3,4] (N dropped)
    left = single(
        tmp_path,
        h.make_node("MatMul", ["a", "b"], ["y"]),
        [vi("a", [5]), vi("b", [2, 5, 6])],
        [vi("y", [2, 6])],
    )
    assert left.flops == 2 * 2 * 1 * 6 * 5
    (tmp_path / "r").mkdir()
    right = single(
        tmp_path / "r",
        h.make_node("MatMul", ["a", "b"], ["y"]),
        [vi("a", [3, 4, 5]), vi("b", [5])],
        [vi("y", [3, 4])],
    )
    assert right.flops == 2 * 3 * 4 * 1 * 5


def test_einsum_batched_matmul_and_transpose(tmp_path):
    mm = single(
        tmp_path,
        h.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik"),
        [vi("a", [2, 3, 4]), vi("b", [2, 4, 5])],
        [vi("y", [2, 3, 5])],
    )
    assert mm.flops == 2 * 2 * 3 * 5 * 4  # like MatMul: 2 * B * M * N * K
    (tmp_path / "t").mkdir()
    tr = single(
        tmp_path / "t",
        h.make_node("Einsum", ["a"], ["y"], equation="ij->ji"),
        [vi("a", [3, 4])],
        [vi("y", [4, 3])],
    )
    assert tr.flops == 0  # pure data movement
    assert tr.input_bytes == tr.output_bytes == 3 * 4 * F32


# ---------------------------------------------------------------------- pooling / norm


def test_max_pool_and_average_pool(tmp_path):
    mp = single(
        tmp_path,
        h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
        [vi("x", [1, 4, 8, 8])],
        [vi("y", [1, 4, 4, 4])],
    )
    assert mp.flops == 1 * 4 * 4 * 4 * (2 * 2)  # out elems * prod(kernel)
    (tmp_path / "avg").mkdir()
    ap = single(
        tmp_path / "avg",
        h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        [vi("x", [1, 4, 8, 8])],
        [vi("y", [1, 4, 8, 8])],
    )
    assert ap.flops == 1 * 4 * 8 * 8 * (3 * 3)


def test_global_average_pool(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("GlobalAveragePool", ["x"], ["y"]),
        [vi("x", [2, 4, 7, 7])],
        [vi("y", [2, 4, 1, 1])],
    )
    assert cost.flops == 2 * 4 * 7 * 7  # input elements
    assert cost.output_bytes == 2 * 4 * F32


def test_batch_normalization(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"]),
        [vi("x", [1, 4, 8, 8])],
        [vi("y", [1, 4, 8, 8])],
        [init("s", [4]), init("b", [4]), init("m", [4]), init("v", [4])],
    )
    assert cost.flops == 2 * 1 * 4 * 8 * 8  # y = a * x + b per element
    assert cost.param_bytes == 4 * 4 * F32  # scale, B, mean, var
    assert cost.input_bytes == 1 * 4 * 8 * 8 * F32


def test_lstm_follows_spec_equations(tmp_path):
    seq, batch, inp, hid = 5, 2, 3, 6
    cost = single(
        tmp_path,
        h.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hid),
        [vi("x", [seq, batch, inp])],
        [vi("y", [seq, 1, batch, hid])],
        [
            init("w", [1, 4 * hid, inp]),
            init("r", [1, 4 * hid, hid]),
            init("b", [1, 8 * hid]),
        ],
    )
    # per step and batch row: X*W^T, H*R^T (multiply-adds), Wb + Rb, 13 element-wise
    per_step = 2 * (4 * hid) * inp + 2 * (4 * hid) * hid + 2 * (4 * hid) + 13 * hid
    assert cost.flops == seq * 1 * batch * per_step


# ----------------------------------------------------------------------- element-wise


def test_relu(tmp_path):
    cost = single(
        tmp_path, h.make_node("Relu", ["x"], ["y"]), [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])]
    )
    assert cost.flops == 2 * 3 * 4
    assert cost.input_bytes == cost.output_bytes == 2 * 3 * 4 * F32


def test_add_with_broadcast(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("Add", ["a", "b"], ["y"]),
        [vi("a", [2, 3, 4]), vi("b", [4])],
        [vi("y", [2, 3, 4])],
    )
    assert cost.flops == 2 * 3 * 4  # one per output element
    assert cost.input_bytes == (2 * 3 * 4 + 4) * F32


def test_sum_of_three_inputs(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("Sum", ["a", "b", "c"], ["y"]),
        [vi("a", [2, 3]), vi("b", [2, 3]), vi("c", [3])],
        [vi("y", [2, 3])],
    )
    assert cost.flops == (3 - 1) * 2 * 3


def test_softmax(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("Softmax", ["x"], ["y"], axis=-1),
        [vi("x", [2, 10])],
        [vi("y", [2, 10])],
    )
    # documented: 5 per element (max, subtract, exp, sum, divide)
    assert cost.flops == 5 * 2 * 10


@pytest.mark.parametrize(
    ("mode", "per_output"),
    [("nearest", 1), ("linear", 2**2), ("cubic", 4**2)],  # 2 resized axes (H, W)
)
def test_resize_modes(tmp_path, mode, per_output):
    cost = single(
        tmp_path,
        h.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode),
        [vi("x", [1, 3, 4, 4])],
        [vi("y", [1, 3, 8, 8])],
        [init("scales", [4], value=[1.0, 1.0, 2.0, 2.0])],
    )
    assert cost.flops == 1 * 3 * 8 * 8 * per_output
    assert cost.param_bytes == 4 * F32  # the scales tensor
    assert cost.input_bytes == 1 * 3 * 4 * 4 * F32


# ---------------------------------------------------------------------- data movement


def test_reshape_zero_flops_but_bytes(tmp_path):
    cost = single(
        tmp_path,
        h.make_node("Reshape", ["x", "shape"], ["y"]),
        [vi("x", [2, 3, 4])],
        [vi("y", [6, 4])],
        [init("shape", [2], dtype=np.int64, value=[6, 4])],
    )
    assert cost.flops == 0
    assert cost.input_bytes == 2 * 3 * 4 * F32
    assert cost.param_bytes == 2 * I64
    assert cost.output_bytes == 6 * 4 * F32


def test_unknown_op_and_missing_tensors_do_not_crash():
    info = TensorInfo((2, 3), np.dtype("float32"))
    custom = h.make_node("Foo", ["a", "w"], ["b"], domain="com.example")
    cost = node_cost(custom, {"a": info, "b": info, "w": info}, {"w"})
    assert cost == OperatorCost(0, 2 * 3 * F32, 2 * 3 * F32, 2 * 3 * F32)
    conv = h.make_node("Conv", ["x", "w", ""], ["y"])
    assert node_cost(conv, {}, set()) == OperatorCost(0, 0, 0, 0)


def test_if_costs_the_larger_branch(tmp_path):
    then = h.make_graph(
        [h.make_node("Add", ["x", "x"], ["t1"]), h.make_node("Relu", ["t1"], ["t2"])],
        "then",
        [],
        [vi("t2", [2, 3])],
    )
    other = h.make_graph([h.make_node("Neg", ["x"], ["e1"])], "else", [], [vi("e1", [2, 3])])
    node = h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    cost = single(tmp_path, node, [vi("x", [2, 3]), vi("cond", [], T.BOOL)], [vi("y", [2, 3])])
    assert cost.flops == max(2 * 3 + 2 * 3, 2 * 3)  # then: Add + Relu; else: Neg
    # cond (1 bool byte) + x, read from the enclosing scope by both branches
    assert cost.input_bytes == 1 + 2 * 3 * F32


# -------------------------------------------------------------- param vs input bytes


def test_param_bytes_versus_input_bytes(tmp_path):
    nodes = [
        h.make_node("Cast", ["w2_half"], ["w2"], to=T.FLOAT, name="cast"),
        h.make_node("Conv", ["x", "w1"], ["y1"], name="conv_init"),
        h.make_node("Conv", ["x", "w2"], ["y2"], name="conv_cast"),
        h.make_node("Conv", ["x", "w3"], ["y3"], name="conv_runtime"),
    ]
    loaded = build(
        tmp_path,
        nodes,
        [vi("x", [1, 2, 5, 5]), vi("w3", [4, 2, 1, 1])],
        [vi("y1", [1, 4, 5, 5]), vi("y2", [1, 4, 5, 5]), vi("y3", [1, 4, 5, 5])],
        [init("w1", [4, 2, 1, 1]), init("w2_half", [4, 2, 1, 1], dtype=np.float16)],
    )
    consts = constant_tensors(loaded.model)
    assert {"w1", "w2_half", "w2"} <= consts
    assert "w3" not in consts and "x" not in consts
    costs = model_costs(loaded)
    x_bytes, w_bytes = 1 * 2 * 5 * 5 * F32, 4 * 2 * 1 * 1 * F32
    assert costs["conv_init"].param_bytes == w_bytes
    assert costs["conv_init"].input_bytes == x_bytes
    assert costs["conv_cast"].param_bytes == w_bytes  # Cast of an initializer is constant
    assert costs["conv_cast"].input_bytes == x_bytes
    assert costs["conv_runtime"].param_bytes == 0
    assert costs["conv_runtime"].input_bytes == x_bytes + w_bytes
    # the constant-foldable Cast keeps its normal cost: reads fp16, writes fp32
    assert costs["cast"] == OperatorCost(0, 4 * 2 * F16, 0, 4 * 2 * F32)
    for name in ("conv_init", "conv_cast", "conv_runtime"):
        assert costs[name].flops == 2 * 1 * 4 * 5 * 5 * (2 * 1 * 1)


def test_constant_tensors_mixed_graph(tmp_path):
    c_val = h.make_tensor("c_val", T.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [
        h.make_node("Constant", [], ["c"], value=c_val),
        h.make_node("Cast", ["w_int"], ["w"], to=T.FLOAT),
        h.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        h.make_node("Add", ["c", "w"], ["cw"]),  # constant + constant
        h.make_node("Clip", ["cw", "", "hi"], ["clipped"]),  # empty optional input
        h.make_node("RandomNormal", [], ["rnd"], shape=[3]),
        h.make_node("Add", ["rnd", "c"], ["rnd_c"]),  # depends on a random op
        h.make_node("Mul", ["x", "clipped"], ["xc"]),  # depends on the runtime input
        h.make_node("Shape", ["x"], ["xshape"]),  # runtime input, even if static
        h.make_node("Add", ["xc", "rnd_c"], ["s"]),
        h.make_node("Add", ["s", "zeros"], ["y"]),
    ]
    loaded = build(
        tmp_path,
        nodes,
        [vi("x", [3])],
        [vi("y", [3]), vi("xshape", [1], T.INT64)],
        [
            init("w_int", [3], dtype=np.int32, value=[1, 2, 3]),
            init("shape", [1], dtype=np.int64, value=[3]),
            init("hi", [], value=2.0),
        ],
    )
    consts = constant_tensors(loaded.model)
    assert {"w_int", "shape", "hi", "c", "w", "zeros", "cw", "clipped"} <= consts
    for runtime in ("x", "rnd", "rnd_c", "xc", "xshape", "s", "y"):
        assert runtime not in consts, runtime
    costs = model_costs(loaded)
    assert len(costs) == len(nodes)
    add_node = loaded.model.graph.node[3]
    assert costs[add_node.name].flops == 3  # constant-foldable nodes keep their cost
    assert costs[add_node.name].param_bytes == (3 + 3) * F32


# --------------------------------------------------------------------------- real models


@pytest.mark.slow
def test_resnet50_total_flops_matches_published():
    from infscaler.base.models import resolve_model

    loaded = load_model(resolve_model("resnet50"))
    costs = model_costs(loaded)
    assert set(costs) == {n.name for n in loaded.model.graph.node}
    total = sum(costs.values())
    # Published: ResNet-50 at 224x224 is ~4.1 G multiply-adds (torchvision's model card,
    # "GFLOPS 4.09", counts MACs; He et al. 2016, Table 1, lists 3.8e9 for the original
    # variant), i.e. about 8.2e9 FLOPs with a multiply-add counted as 2.
    assert abs(total.flops - 8.2e9) <= 0.10 * 8.2e9
    convs = [costs[n.name].flops for n in loaded.model.graph.node if n.op_type == "Conv"]
    assert sum(convs) > 0.95 * total.flops  # convolutions dominate
    assert total.param_bytes > 90e6  # ~25.6 M float32 parameters = ~102 MB


@pytest.mark.slow
def test_ppocrv4_det_every_node_costed():
    from infscaler.base.models import resolve_model

    loaded = load_model(resolve_model("ppocrv4-det"), "x:1x3x640x640")
    costs = model_costs(loaded)
    assert set(costs) == {n.name for n in loaded.model.graph.node}
    assert all(isinstance(c, OperatorCost) for c in costs.values())
    total = sum(costs.values())
    assert total.flops > 0
    ops = {n.op_type for n in loaded.model.graph.node}
    assert {"Conv", "ConvTranspose", "Resize"} <= ops
    for node in loaded.model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "Resize"):
            assert costs[node.name].flops > 0, node.name
        # bytes come from the loader's shapes (a Resize's empty roi Constant has 0 bytes)
        expected_out = sum(loaded.tensors[o].nbytes for o in node.output if o)
        assert costs[node.name].output_bytes == expected_out, node.name
    assert total.output_bytes > 0
