"""Helpers shared by tests/unit and tests/integration: small ONNX graphs built with
onnx.helper, a polling wait, the ``chain`` pipeline of stagefuncs.py and bench/ scripts
loaded as modules.

Imported as ``from tests.helpers import ...`` (tests/ is a package; its fixtures are in
tests/conftest.py, tests/unit/conftest.py and tests/integration/conftest.py).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests import REPO_ROOT

OPSET = 17
#: The repository's bench/ folder (scripts, not a package).
BENCH = REPO_ROOT / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/``name``.py as a module, loaded once under its own name with bench/ on
    ``sys.path`` (its scripts import one another by plain name)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A checked ModelProto from nodes / typed inputs / outputs / numpy initializers."""
    inits = [numpy_helper.from_array(v, name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def f32(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def rand(*shape: int, seed: int = 0, scale: float = 0.1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def residual_model(channels: int = 4, size: int = 8, batch: int | str = 1) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv -> Add(x) -> Relu -> Conv -> y: a ResNet basic block + head.

    The skip edge x -> Add crosses every cut placed inside the block.
    """
    c = channels
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3"),
    ]
    inits = {
        "w1": rand(c, c, 3, 3, seed=1),
        "b1": rand(c, seed=2),
        "w2": rand(c, c, 3, 3, seed=3),
        "b2": rand(c, seed=4),
        "w3": rand(2, c, 1, 1, seed=5),
    }
    return make_model(
        nodes, [f32("x", [batch, c, size, size])], [f32("y", [batch, 2, size, size])], inits
    )


def if_model() -> onnx.ModelProto:
    """x -> Relu -> If(ReduceSum(x) > 0: Mul by w_then; else: Add w_else) -> Sigmoid -> y.

    Both branches read outer-scope initializers, which must travel with the If node.
    """
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["r", "w_then"], ["t_out"], name="then_mul")],
        "then",
        [],
        [f32("t_out", [1, 4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Add", ["r", "w_else"], ["e_out"], name="else_add")],
        "else",
        [],
        [f32("e_out", [1, 4])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("ReduceSum", ["x"], ["sum"], name="sum", keepdims=0),
        helper.make_node("Greater", ["sum", "zero"], ["cond"], name="gt"),
        helper.make_node(
            "If", ["cond"], ["branch"], name="if", then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Sigmoid", ["branch"], ["y"], name="sigmoid"),
    ]
    inits = {
        "w_then": np.full((1, 4), 2.0, np.float32),
        "w_else": np.full((1, 4), -1.0, np.float32),
        "zero": np.zeros((), np.float32),
    }
    return make_model(nodes, [f32("x", [1, 4])], [f32("y", [1, 4])], inits)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something truthy, which is returned; after
    ``timeout`` seconds, AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out ({timeout} s) waiting for {what}")


def wait_served(svc: Any, name: str, timeout: float = 10.0) -> None:
    """Wait until pipeline ``name`` of ``svc`` takes requests again after a restart.

    A replacement's handle reads ready a moment before the route learns of it (the
    supervisor's callback, ``Service._on_instances_changed``, clears the route's
    ``unavailable_reason`` just after); a request sent in between is answered 503
    "replacement is loading". Waiting for the handle alone is a race a loaded host loses.
    """
    # Service.ready(name) checks the route's unavailable_reason as well as the handles
    wait_for(
        lambda: svc.ready(name) and not svc.degraded(name),
        timeout,
        f"pipeline {name} served again",
    )


def chain_pipeline(ms: float = 2, *, x_shape: tuple[int, ...] = (-1, 4), **slow: Any) -> dict:
    """The pipeline ``chain``: x (FP32 ``x_shape``) -> scale (x2) -> slow (sleeps ``ms``
    per request) -> y, from ``stagefuncs`` (needs the ``stagefuncs_on_path`` fixture);
    ``slow``: more keys of the slow stage (``instances``, ``max_instances``, ...)."""
    return {
        "name": "chain",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x_shape)}],
        "outputs": ["y"],
        "stages": [
            {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
            {
                "name": "slow",
                "function": "stagefuncs:slow",
                "inputs": ["y"],
                "outputs": ["y"],
                "params": {"ms": ms},
                **slow,
            },
        ],
    }
