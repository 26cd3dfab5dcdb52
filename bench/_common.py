"""Helpers shared by the partitioner benchmarks (``bench/*.py``).

Nothing here measures anything by itself: each script does its own measurements and
writes them to ``bench/results/``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

#: Tolerance used only when a plan fails verification at the API default rtol (1e-4);
#: every such retry is recorded in the results next to the original failure.
FALLBACK_RTOL = 1e-2


def default_cache_dir() -> None:
    """Use ``/tmp/isc-cache`` for materialised models unless INFSCALER_CACHE_DIR is set."""
    os.environ.setdefault("INFSCALER_CACHE_DIR", "/tmp/isc-cache")


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
    """Host + software versions for the results file."""
    import onnx
    import onnxruntime as ort

    from infscaler.partitioner.profiler import host_description, usable_cores

    return {
        "host": host_description(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "argv": sys.argv,
        "date_utc": now_utc(),
        "load_average_at_start": list(os.getloadavg()),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Compact fixed-width table on stdout."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if j == 0:
            print("  ".join("-" * w for w in widths))


def synthetic_chain(path: Path, blocks: int = 250, channels: int = 16, size: int = 16) -> Path:
    """Write a synthetic deep residual chain with ``4 * blocks`` operators.

    Each block is ``y = Relu(BatchNormalization(Conv3x3(x))); x = Add(x, y)`` on a
    ``1 x channels x size x size`` float32 tensor, with seeded random weights (conv weights
    scaled down so 250 residual additions stay finite). Built with ``onnx.helper``;
    opset 17. Used to exercise the >= 800-operator target; it is not a real model.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = channels
    nodes = []
    inits = []
    x = "x"
    for b in range(blocks):
        w = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * np.float32(0.1 / np.sqrt(c * 9))
        inits += [
            numpy_helper.from_array(w, f"b{b}_w"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_cb"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"b{b}_s"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_bb"),
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, c).astype(np.float32), f"b{b}_m"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"b{b}_v"),
        ]
        nodes += [
            helper.make_node(
                "Conv", [x, f"b{b}_w", f"b{b}_cb"], [f"b{b}_conv"], name=f"b{b}_conv", pads=[1] * 4
            ),
            helper.make_node(
                "BatchNormalization",
                [f"b{b}_conv", f"b{b}_s", f"b{b}_bb", f"b{b}_m", f"b{b}_v"],
                [f"b{b}_bn"],
                name=f"b{b}_bn",
            ),
            helper.make_node("Relu", [f"b{b}_bn"], [f"b{b}_relu"], name=f"b{b}_relu"),
            helper.make_node("Add", [x, f"b{b}_relu"], [f"b{b}_out"], name=f"b{b}_add"),
        ]
        x = f"b{b}_out"
    shape = [1, c, size, size]
    graph = helper.make_graph(
        nodes,
        f"synthetic_chain_{blocks}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="infscaler-bench"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
