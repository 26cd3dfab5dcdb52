"""Engines (cpu / gpu / dla): one interface, real onnxruntime / TensorRT, nothing faked.

The cpu engine runs everywhere and is checked against a plain onnxruntime session, on
small onnx.helper graphs and on the trained PP-OCR text-direction classifier. The gpu and
dla engines must say why this host lacks them; the tests that need the hardware skip with
that reason here and run on a GPU host / a Jetson.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.errors import ModelNotInstalledError

CLS_OUT = "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def cls_path() -> Path:
    """The trained PP-OCR text-direction classifier (rapidocr_onnxruntime's wheel)."""
    from infscaler.base.models import resolve_model

    try:
        return resolve_model("ppocr-cls")
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))


def _load_in_child(model: str, cores: list[int], queue: mp.Queue) -> None:
    """Runs in a spawned process: load a cpu engine pinned to ``cores``, report back."""
    try:
        from infscaler.engines import create_engine as make

        eng = make("cpu", model, cores=cores).load()
        out = eng.infer({"x": np.zeros((2, 3, 48, 192), np.float32)})
        queue.put(
            {
                "affinity": sorted(os.sched_getaffinity(0)),
                "describe": eng.describe(),
                "memory_mb": eng.memory_mb,
                "shape": list(out[CLS_OUT].shape),
                "heavy_imports": sorted(m for m in ("tensorrt", "pycuda") if m in sys.modules),
            }
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def test_cpu_pins_the_process_and_measures_memory_in_a_child(cls_path):
    """A fresh (spawned) process, as an instance is: pinned to core 0, threads = 1 core,
    USS growth of a model with real weights, and no tensorrt / pycuda imported."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_load_in_child, args=(str(cls_path), [0], queue))
    before = os.sched_getaffinity(0)
    proc.start()
    try:
        got = queue.get(timeout=120)
    finally:
        proc.join(timeout=30)
    assert "error" not in got, got.get("error")
    assert got["affinity"] == [0]
    assert got["describe"]["cores"] == [0] and got["describe"]["pinned"] is True
    assert got["describe"]["threads"] == 1 and got["describe"]["session_intra_op_threads"] == 1
    assert got["memory_mb"] > 0 and got["describe"]["memory_mb"] > 0
    assert got["shape"] == [2, 2]
    assert got["heavy_imports"] == []
    assert os.sched_getaffinity(0) == before  # only the child was pinned
