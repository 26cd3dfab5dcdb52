"""Slot-bound stand-in pipelines for ``bench/arbitration.py`` (``--high slot:MS``,
``--low slot:MS``): one function stage that holds its instance for MS milliseconds per
request while leaving the CPU idle (``time.sleep``), as an instance waiting on an
accelerator does, so that the host's cores do not bind: on a shared 2-core host the
models' own arms are CPU-bound. The device's engine slots count model instances only
(``Monitor.cap``), so ``--slots`` does not cap these stages (a run of 4 on 3 slots:
bench/HISTORY.md, "Arbitration: auto against the best static split"): each instance
holds 64 MB of ballast from its start and the bench caps memory instead (room for the ``--slots``
instances of its capacity service and half of one more). What they measure is the
control loop, never a model's speed.

Input ``x`` FP32 [-1, 4], output ``y`` (= x). The stage's module is written to a
directory that must be on the service's ``PYTHONPATH`` (:func:`write_module`). More:
bench/HISTORY.md, "The scripts' methods", ``slotbound.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

MODULE = "isc_slotbound_stage"
SOURCE = '''"""bench/slotbound.py's stand-in stage (written by the bench)."""
import os
import time

import numpy as np

_BALLAST = []


def _write_ballast():
    """64 MB of private memory, held for the process's life, so that a memory cap can
    tell the instances apart: written when the module is imported and again in each
    child forked after that (an instance forked from a process that imported it would
    otherwise share the pages, and count a part of them). Written at an instance's
    first call instead, an instance that had served nothing counted 17 MB and the cap
    let a fourth start (bench/HISTORY.md)."""
    _BALLAST[:] = [np.ones(64 * 2**20 // 8)]


_write_ballast()
os.register_at_fork(after_in_child=_write_ballast)


def wait(tensors, ms=100.0):
    """y = x after ``ms`` milliseconds of sleep: the instance is held, the CPU idle."""
    time.sleep(ms / 1e3)
    return {"y": np.array(tensors["x"])}
'''
HOLD_MODULE = "isc_slotbound_hold"
HOLD_SOURCE = '''"""bench/slotbound.py's hold stage (written by the bench), no ballast."""
import time

import numpy as np


def hold(tensors, ms=100.0):
    """held = the first input, after ``ms`` milliseconds of sleep."""
    time.sleep(ms / 1e3)
    return {"held": np.array(next(iter(tensors.values())))}
'''


def parse(model: str) -> float | None:
    """``slot:MS`` -> MS (ms per request, > 0); None for any other model name.

    Raises:
        ValueError: ``slot:`` with no positive number after it.
    """
    if not model.startswith("slot:"):
        return None
    try:
        ms = float(model.split(":", 1)[1])
    except ValueError:
        ms = 0.0
    if not ms > 0:
        raise ValueError(f"{model!r}: write slot:MS with MS > 0 ms per request, e.g. slot:100")
    return ms


def split(model: str) -> tuple[str, float | None]:
    """``MODEL+slot:MS`` -> (MODEL, MS); any other name -> (name, None).

    Raises:
        ValueError: a ``+`` part that is not ``slot:MS`` with MS > 0.
    """
    base, plus, tail = model.partition("+")
    if not plus:
        return model, None
    ms = parse(tail)
    if ms is None or not base:
        raise ValueError(f"{model!r}: write MODEL+slot:MS, e.g. squeezenet+slot:80")
    return base, ms


def with_hold(raw: dict[str, Any], ms: float | None, model: str) -> dict[str, Any]:
    """``raw`` (``model``'s one-stage pipeline config) with a ``hold`` stage of ``ms`` ms
    after the model, reading its outputs and giving ``held`` (fused into the model's
    unit), the pipeline's inputs declared from the model's graph (FP32 only); ``raw``
    itself when ``ms`` is None. Raises ValueError (a non-FP32 input) or ConfigError."""
    if ms is None:
        return raw
    import onnx

    from infscaler.base.config import load_pipeline
    from infscaler.base.models import resolve_model

    g = onnx.load(str(resolve_model(model)), load_external_data=False).graph
    known = {i.name for i in g.initializer}
    inputs = []
    for i in (x for x in g.input if x.name not in known):
        if i.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise ValueError(f"{model}: input {i.name} is not FP32 (the hold stage's bench)")
        dims = [d.dim_value or -1 for d in i.type.tensor_type.shape.dim]
        inputs.append({"name": i.name, "datatype": "FP32", "shape": dims})
    outs = [o.name for o in g.output]
    (model_stage,) = raw["stages"]
    model_stage = {**model_stage, "inputs": {i["name"]: i["name"] for i in inputs}}
    model_stage["outputs"] = {o: o for o in outs}
    stage = {
        "name": "hold",
        "function": f"{HOLD_MODULE}:hold",
        "inputs": outs,
        "outputs": ["held"],
        "params": {"ms": ms},
    }
    raw = {**raw, "stages": [model_stage, stage], "inputs": inputs, "outputs": ["held"]}
    load_pipeline(raw)
    return raw


def held_l0(cal: dict[str, Any], ms: float | None) -> dict[str, Any]:
    """A model's calibration (``l0_ms``: its own) with the ``hold`` stage's ``ms`` added
    to ``l0_ms`` (``hold_ms``: that ms); ``cal`` itself when ``ms`` is None."""
    return cal if ms is None else {**cal, "l0_ms": round(cal["l0_ms"] + ms, 2), "hold_ms": ms}


def write_module(directory: Path) -> Path:
    """Write the stand-in stage's and the hold stage's modules into ``directory`` (put
    it on PYTHONPATH); the stand-in's path."""
    (directory / f"{HOLD_MODULE}.py").write_text(HOLD_SOURCE)
    path = directory / f"{MODULE}.py"
    path.write_text(SOURCE)
    return path


def pipeline(
    name: str,
    ms: float,
    slo_ms: float | None,
    priority: int,
    instances: int,
    autoscale: dict | None = None,
    max_instances: int | None = None,
) -> dict[str, Any]:
    """The raw pipeline config: one ``wait`` stage of ``ms`` ms at ``instances``
    instances (``max_instances``: the stage's bound), SLO (None: none), priority,
    ``autoscale`` (None: fixed). Checked by the config loader (ConfigError)."""
    from infscaler.base.config import load_pipeline

    stage: dict[str, Any] = {
        "name": "wait",
        "function": f"{MODULE}:wait",
        "inputs": ["x"],
        "outputs": ["y"],
        "params": {"ms": ms},
        "instances": instances,
    }
    if max_instances is not None:
        stage["max_instances"] = max_instances
    raw: dict[str, Any] = {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["y"],
        "stages": [stage],
        "priority": priority,
        "request_timeout_s": 60.0,
    }
    if slo_ms is not None:
        raw["slo"] = f"{slo_ms:.1f}ms"
    if autoscale is not None:
        raw["autoscale"] = autoscale
    load_pipeline(raw)
    return raw


def feeds() -> dict[str, np.ndarray]:
    """One request's inputs."""
    return {"x": np.ones((1, 4), np.float32)}
