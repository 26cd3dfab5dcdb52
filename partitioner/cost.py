"""Operator complexity c_n (InfScaler §IV-A, Eq. 1): :func:`model_costs` gives every
top-level node of a canonical model an :class:`OperatorCost`: FLOPs (the paper's measure,
§III), weight bytes, activation bytes read and bytes written.

More (details, why it is so, history, figures): docs/architecture.md, "`partitioner/cost.py`".
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import AttributeProto, helper

from infscaler.partitioner.loader import LoadedModel, TensorInfo
from infscaler.partitioner.subgraphs import free_names, subgraphs

__all__ = ["OperatorCost", "constant_tensors", "node_cost", "model_costs"]


@dataclass(frozen=True)
class OperatorCost:
    """Complexity of one operator (``c_n`` of Eq. 1); costs add with ``+``.

    Attributes:
        flops: operations, a multiply-add counting 2.
        param_bytes / input_bytes / output_bytes: constant and activation bytes read, bytes written.
    """

    flops: int = 0
    param_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0

    def __add__(self, other: OperatorCost) -> OperatorCost:
        if not isinstance(other, OperatorCost):
            return NotImplemented
        return OperatorCost(
            self.flops + other.flops,
            self.param_bytes + other.param_bytes,
            self.input_bytes + other.input_bytes,
            self.output_bytes + other.output_bytes,
        )

    def __radd__(self, other: object) -> OperatorCost:
        if isinstance(other, int) and other == 0:  # lets builtin sum() start at 0
            return self
        return NotImplemented

    def to_dict(self) -> dict[str, int]:
        """``{"flops", "param_bytes", "input_bytes", "output_bytes"}`` as ints."""
        return {k: int(v) for k, v in asdict(self).items()}


# --------------------------------------------------------------------------- constants

_DEFAULT_DOMAINS = ("", "ai.onnx")

_RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _graph_constants(graph: onnx.GraphProto, outer: Iterable[str] = ()) -> set[str]:
    """Constant tensors of ``graph``; ``outer``: constants of the enclosing scopes."""
    consts = set(outer)
    consts.update(init.name for init in graph.initializer)
    consts.update(s.values.name for s in graph.sparse_initializer)
    # A subgraph's formal inputs shadow outer names and are runtime values.
    inputs = {v.name for v in graph.input} - {i.name for i in graph.initializer}
    consts -= inputs
    for node in graph.node:  # ONNX requires topological order (checked by the loader)
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        if node.op_type in _RANDOM_OPS or _has_subgraph(node):
            continue
        if node.op_type == "Constant" or all(i in consts for i in node.input if i):
            consts.update(o for o in node.output if o)
    return consts


def constant_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of the top-level tensors computable without any runtime input (of a model
    in topological order): initializers, ``Constant`` outputs, and outputs of
    default-domain nodes whose non-empty inputs are all constant; never those of random
    ops, of If / Loop / Scan, of custom domains, nor ``Shape`` of a runtime tensor.
    """
    return _graph_constants(model.graph)


# ------------------------------------------------------------------------------ tables

# fmt: off
_ELEMENTWISE = frozenset(
    {
        # binary arithmetic / logic / comparison
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift",
        "And", "Or", "Xor", "Not",
        "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
        "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
        "Where",
        # activations
        "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu",
        "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign",
        "Gelu", "Mish", "Swish", "Clip", "Shrink",
        # unary math
        "Erf", "Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal",
        "Floor", "Ceil", "Round", "Sign",
        "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
        "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
        "IsNaN", "IsInf",
        # (de)quantisation: one scale/shift per element
        "QuantizeLinear", "DequantizeLinear",
    }
)
# fmt: on

_NARY = frozenset({"Sum", "Max", "Min", "Mean"})

# fmt: off
_REDUCE = frozenset(
    {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
        "ArgMax", "ArgMin", "CumSum",
    }
)
# fmt: on

# fmt: off
_DATA_MOVEMENT = frozenset(
    {
        "Reshape", "Transpose", "Concat", "Slice", "Gather", "GatherElements",
        "GatherND", "Scatter", "ScatterElements", "ScatterND", "Split", "Squeeze",
        "Unsqueeze", "Flatten", "Identity", "Cast", "CastLike", "Shape", "Size", "Pad",
        "Expand", "Tile", "Dropout", "DepthToSpace", "SpaceToDepth", "Constant",
        "ConstantOfShape", "Range", "EyeLike", "OneHot", "NonZero", "Compress",
        "ReverseSequence", "Trilu", "CenterCropPad", "Col2Im",
    }
)
# fmt: on

_POOL = frozenset({"MaxPool", "AveragePool", "LpPool"})
_GLOBAL_POOL = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})

# FLOPs per element (the table in docs/architecture.md).
_BN_FLOPS_PER_ELEM = 2
_NORM_FLOPS_PER_ELEM = 8
_MVN_FLOPS_PER_ELEM = 6
_RMS_FLOPS_PER_ELEM = 4
_SOFTMAX_FLOPS_PER_ELEM = 5
_LRN_EXTRA_FLOPS_PER_ELEM = 3

# (conv-like op) -> (index of X, index of W, index of bias or None)
_CONV_INPUTS = {
    "Conv": (0, 1, 2),
    "ConvInteger": (0, 1, None),
    "QLinearConv": (0, 3, 8),
}
# (matmul-like op) -> (index of A, index of B)
_MATMUL_INPUTS = {"MatMul": (0, 1), "MatMulInteger": (0, 1), "QLinearMatMul": (0, 3)}

# recurrent op -> (gates G, element-wise FLOPs per hidden unit and step E)
_RNN = {"RNN": (1, 2), "GRU": (3, 11), "LSTM": (4, 13)}
_LSTM_PEEPHOLE_FLOPS = 6  # 3 peephole multiply-adds per hidden unit and step


# ----------------------------------------------------------------------------- helpers


def _numel(shape: tuple[int, ...] | None) -> int:
    return 0 if shape is None else math.prod(shape)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


class _Shapes:
    """Shape look-ups of one node's inputs/outputs, None when unknown."""

    def __init__(self, node: onnx.NodeProto, tensors: Mapping[str, TensorInfo]) -> None:
        self.node = node
        self.tensors = tensors

    def _get(self, names, i: int) -> tuple[int, ...] | None:
        if i >= len(names) or not names[i]:
            return None
        info = self.tensors.get(names[i])
        return None if info is None else tuple(int(d) for d in info.shape)

    def inp(self, i: int) -> tuple[int, ...] | None:
        return self._get(self.node.input, i)

    def out(self, i: int = 0) -> tuple[int, ...] | None:
        return self._get(self.node.output, i)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])


def _conv_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    xi, wi, bi = _CONV_INPUTS[node.op_type]
    y, w, x = s.out(), s.inp(wi), s.inp(xi)
    if y is None:
        return 0
    if w is not None and len(w) >= 2:
        macs_per_out = math.prod(w[1:])  # (Cin/group) * prod(kernel)
    else:
        kernel, group = _attr(node, "kernel_shape"), int(_attr(node, "group", 1))
        if kernel is None or x is None or len(x) < 2:
            return 0
        macs_per_out = (x[1] // group) * math.prod(kernel)
    flops = 2 * _numel(y) * macs_per_out
    if bi is not None and s.has_input(bi):
        flops += _numel(y)
    return flops


def _conv_transpose_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    x, w, y = s.inp(0), s.inp(1), s.out()
    if x is None:
        return 0
    if w is not None and len(w) >= 2:
        macs_per_in = math.prod(w[1:])  # (Cout/group) * prod(kernel)
    else:
        kernel, group = _attr(node, "kernel_shape"), int(_attr(node, "group", 1))
        if kernel is None or y is None or len(y) < 2:
            return 0
        macs_per_in = (y[1] // group) * math.prod(kernel)
    flops = 2 * _numel(x) * macs_per_in
    if s.has_input(2):
        flops += _numel(y)
    return flops


def _gemm_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    a, b = s.inp(0), s.inp(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return 0
    m, k = (a[1], a[0]) if _attr(node, "transA", 0) else a
    n = b[0] if _attr(node, "transB", 0) else b[1]
    flops = 2 * m * n * k
    if s.has_input(2):
        flops += m * n
    return flops


def _matmul_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    ai, bi = _MATMUL_INPUTS[node.op_type]
    a, b = s.inp(ai), s.inp(bi)
    if a is None or b is None or not a or not b:
        return 0
    k = a[-1]
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        return 0
    return 2 * math.prod(batch) * m * n * k


def _einsum_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    equation = _attr(node, "equation")
    shapes = [s.inp(i) for i in range(len(node.input))]
    if not equation or not shapes or any(sh is None for sh in shapes):
        return 0
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return 0
    sizes: dict[str, int] = {}
    ellipsis: tuple[int, ...] = ()
    for term, shape in zip(terms, shapes, strict=True):
        letters = term.replace("...", "")
        if letters and not letters.isalpha():
            return 0
        n_ell = len(shape) - len(letters)
        if n_ell < 0 or (n_ell > 0 and "..." not in term):
            return 0
        if "..." in term:
            before = term.index("...")
            ell_dims = shape[before : before + n_ell]
            try:
                ellipsis = tuple(np.broadcast_shapes(ellipsis, ell_dims))
            except ValueError:
                return 0
            dims = shape[:before] + shape[before + n_ell :]
        else:
            dims = shape
        for letter, dim in zip(letters, dims, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), dim)
    if arrow:
        out_letters = set(rhs.replace("...", ""))
    else:  # implicit mode: letters appearing exactly once
        counts = {c: lhs.count(c) for c in sizes}
        out_letters = {c for c, n in counts.items() if n == 1}
    summed = any(c not in out_letters for c in sizes)
    total = math.prod(sizes.values()) * math.prod(ellipsis)
    return total * ((len(terms) - 1) + (1 if summed else 0))


def _pool_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    kernel = _attr(node, "kernel_shape")
    if kernel is None:
        return 0
    return _numel(s.out()) * math.prod(kernel)


def _interp_factor(mode: str, d: int) -> int:
    mode = mode.lower()
    if mode in ("linear", "bilinear", "trilinear"):
        return 2**d
    if mode in ("cubic", "bicubic"):
        return 4**d
    return 1  # nearest


def _resize_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    x, y = s.inp(0), s.out()
    if y is None:
        return 0
    if x is not None and len(x) == len(y):
        d = sum(1 for i, o in zip(x, y, strict=True) if i != o)
    else:
        d = max(len(y) - 2, 0)
    return _numel(y) * _interp_factor(str(_attr(node, "mode", "nearest")), d)


def _grid_sample_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    y = s.out()
    if y is None:
        return 0
    mode = str(_attr(node, "mode", "linear"))
    return _numel(y) * _interp_factor(mode, max(len(y) - 2, 0))


def _rnn_flops(node: onnx.NodeProto, s: _Shapes) -> int:
    x, w = s.inp(0), s.inp(1)
    if x is None or w is None or len(x) != 3 or len(w) != 3:
        return 0
    gates, elementwise = _RNN[node.op_type]
    dirs, gh, i = w
    h = gh // gates
    seq, batch = (x[1], x[0]) if _attr(node, "layout", 0) else (x[0], x[1])
    per_step = 2 * gh * i + 2 * gh * h + elementwise * h
    if s.has_input(3):  # B: Wb and Rb, one add each
        per_step += 2 * gh
    if node.op_type == "LSTM" and s.has_input(7):  # peepholes P
        per_step += _LSTM_PEEPHOLE_FLOPS * h
    return seq * dirs * batch * per_step


def _subgraph_tensors(
    graph: onnx.GraphProto, outer: Mapping[str, TensorInfo]
) -> dict[str, TensorInfo]:
    tensors = dict(outer)
    for init in graph.initializer:
        tensors[init.name] = TensorInfo(
            tuple(int(d) for d in init.dims),
            np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)),
        )
    for value in [*graph.input, *graph.value_info, *graph.output]:
        t = value.type
        if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            tensors.pop(value.name, None)  # shadows an outer name, shape unknown
            continue
        dims = t.tensor_type.shape.dim
        if t.tensor_type.elem_type and all(d.HasField("dim_value") for d in dims):
            tensors[value.name] = TensorInfo(
                tuple(int(d.dim_value) for d in dims),
                np.dtype(helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type)),
            )
        else:
            tensors.pop(value.name, None)
    return tensors


def _subgraph_cost(
    graph: onnx.GraphProto, outer: Mapping[str, TensorInfo], outer_consts: Container[str]
) -> OperatorCost:
    """Sum of the costs of ``graph``'s nodes (unknown shapes count 0)."""
    tensors = _subgraph_tensors(graph, outer)
    consts = _graph_constants(graph, (n for n in outer if n in outer_consts))
    return sum((node_cost(n, tensors, consts) for n in graph.node), OperatorCost())


def _tensor_bytes(name: str, tensors: Mapping[str, TensorInfo]) -> int:
    info = tensors.get(name)
    if info is None:
        return 0
    try:
        return int(info.nbytes)
    except (TypeError, ValueError, AttributeError):
        return 0


# --------------------------------------------------------------------------------- API


def _flops(
    node: onnx.NodeProto, tensors: Mapping[str, TensorInfo], constants: Container[str]
) -> tuple[int, int]:
    """(FLOPs, extra param bytes from subgraph initializers)."""
    op = node.op_type
    s = _Shapes(node, tensors)
    if node.domain not in _DEFAULT_DOMAINS:
        return 0, 0
    if op in _DATA_MOVEMENT:
        return 0, 0
    if op in _CONV_INPUTS:
        return _conv_flops(node, s), 0
    if op == "ConvTranspose":
        return _conv_transpose_flops(node, s), 0
    if op == "Gemm":
        return _gemm_flops(node, s), 0
    if op in _MATMUL_INPUTS:
        return _matmul_flops(node, s), 0
    if op == "Einsum":
        return _einsum_flops(node, s), 0
    if op in _POOL:
        return _pool_flops(node, s), 0
    if op in _GLOBAL_POOL:
        return _numel(s.inp(0)), 0
    if op == "BatchNormalization":
        return _BN_FLOPS_PER_ELEM * _numel(s.inp(0)), 0
    if op in ("InstanceNormalization", "LayerNormalization", "GroupNormalization"):
        return _NORM_FLOPS_PER_ELEM * _numel(s.inp(0)), 0
    if op == "MeanVarianceNormalization":
        return _MVN_FLOPS_PER_ELEM * _numel(s.inp(0)), 0
    if op == "RMSNormalization":
        return _RMS_FLOPS_PER_ELEM * _numel(s.inp(0)), 0
    if op == "LRN":
        size = int(_attr(node, "size", 1))
        return (size + _LRN_EXTRA_FLOPS_PER_ELEM) * _numel(s.inp(0)), 0
    if op in ("Softmax", "LogSoftmax"):
        return _SOFTMAX_FLOPS_PER_ELEM * _numel(s.inp(0)), 0
    if op == "Hardmax":
        return _numel(s.inp(0)), 0
    if op in _ELEMENTWISE:
        return _numel(s.out()), 0
    if op in _NARY:
        n = sum(1 for i in node.input if i)
        return max(n - 1, 0) * _numel(s.out()), 0
    if op in _REDUCE:
        return _numel(s.inp(0)), 0
    if op in ("Resize", "Upsample"):
        return _resize_flops(node, s), 0
    if op == "GridSample":
        return _grid_sample_flops(node, s), 0
    if op in _RNN:
        return _rnn_flops(node, s), 0
    if op in ("If", "Loop", "Scan"):
        subs = subgraphs(node)
        costs = [_subgraph_cost(g, tensors, constants) for g in subs]
        weights = sum(
            math.prod(i.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(i.data_type)).itemsize
            for g in subs
            for i in g.initializer
        )
        if not costs:
            return 0, weights
        flops = [c.flops for c in costs]
        return (max(flops) if op == "If" else sum(flops)), weights
    return 0, 0


def node_cost(
    node: onnx.NodeProto,
    tensors: Mapping[str, TensorInfo],
    constants: Container[str],
) -> OperatorCost:
    """Cost of one node (FLOPs per the ONNX operator spec, docs/architecture.md's table; bytes
    = prod(shape) * itemsize); never raises: unknown operators and shapes give 0.

    Args:
        node: an ONNX node (other domains than the default get 0 FLOPs).
        tensors: name -> :class:`~infscaler.partitioner.loader.TensorInfo`; a missing one
            counts 0 bytes.
        constants: :func:`constant_tensors`; their bytes count as ``param_bytes``.

    If / Loop / Scan also count their subgraphs' initializers and outer-scope reads.
    """
    flops, extra_params = _flops(node, tensors, constants)
    reads = list(dict.fromkeys(i for i in node.input if i))
    if _has_subgraph(node):
        implicit: set[str] = set()
        for g in subgraphs(node):
            implicit |= set(free_names(g))
        reads += sorted(implicit - set(reads))
    param_bytes = extra_params
    input_bytes = 0
    for name in reads:
        if name in constants:
            param_bytes += _tensor_bytes(name, tensors)
        else:
            input_bytes += _tensor_bytes(name, tensors)
    output_bytes = sum(_tensor_bytes(o, tensors) for o in dict.fromkeys(node.output) if o)
    return OperatorCost(int(flops), int(param_bytes), int(input_bytes), int(output_bytes))


def model_costs(loaded: LoadedModel) -> dict[str, OperatorCost]:
    """:class:`OperatorCost` of every top-level node of a canonical model, by node name
    in graph order (constant-foldable nodes included, at their normal cost)."""
    constants = constant_tensors(loaded.model)
    return {
        node.name: node_cost(node, loaded.tensors, constants) for node in loaded.model.graph.node
    }
