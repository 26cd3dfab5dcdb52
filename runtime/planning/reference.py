"""Run a pipeline in-process, unpartitioned: the reference the served pipeline is checked
against (tests, ``run_ocr_reference``). Each model stage runs its whole model in one
onnxruntime CPU session; function stages are called directly with read-only views and
checked against the contract of :mod:`infscaler.base.config`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.models import resolve_model
from infscaler.engines.onnxrt.loader import load_session
from infscaler.runtime.serving.pipeline import load_function as _load_function

__all__ = ["run_pipeline_reference"]

# dtype kinds a function stage may return: bool, ints, floats, unicode / bytes text
_PLAIN_KINDS = "biufUS"


@functools.cache
def _session(path: str) -> Any:

    # onnxruntime's own defaults (threads, spinning): the reference is not a served instance
    return load_session(path, threads=None, spinning=None)


def _model_runner(model: Any) -> Any:
    """An object with onnxruntime's ``run`` / ``get_inputs``: ``model`` itself when it
    has them, else a (cached) CPU session of the resolved alias or path."""
    if hasattr(model, "run") and hasattr(model, "get_inputs"):
        return model

    return _session(str(Path(resolve_model(model)).resolve()))


def readonly_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (what a function stage is given)."""
    v = np.asarray(a).view()
    v.setflags(write=False)
    return v


def _checked(stage: Mapping[str, Any], out: Any) -> dict[str, np.ndarray]:
    """A function stage's result, checked against the contract: a dict with exactly the
    declared outputs, each a numpy array of a plain dtype."""
    name, declared = stage["name"], list(stage["outputs"])
    if not isinstance(out, Mapping):
        raise TypeError(f"stage {name}: returned {type(out).__name__}, not a dict of arrays")
    if set(out) != set(declared):
        raise TypeError(f"stage {name}: returned {sorted(out)}, declares {sorted(declared)}")
    for k, v in out.items():
        if not isinstance(v, np.ndarray) or v.dtype.kind not in _PLAIN_KINDS:
            raise TypeError(
                f"stage {name}: output {k!r} is {type(v).__name__} "
                f"{getattr(v, 'dtype', '')}, not a plain-dtype numpy array"
            )
    return dict(out)


def _run_stage(
    stage: Mapping[str, Any], env: Mapping[str, np.ndarray], models: Mapping[str, Any]
) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
    """One function or model stage on the tensors in ``env``."""
    if "function" in stage:
        views = {n: readonly_view(env[n]) for n in stage["inputs"]}
        out = _load_function(stage["function"])(views, **(stage.get("params") or {}))
        if stage.get("fan_out"):
            if not isinstance(out, list):
                raise TypeError(f"stage {stage['name']}: fan_out returned {type(out).__name__}")
            return [_checked(stage, item) for item in out]
        return _checked(stage, out)
    runner = _model_runner(models.get(stage["name"]) or stage.get("model"))
    in_map = stage.get("inputs") or {i.name: i.name for i in runner.get_inputs()}
    out_map = stage.get("outputs") or {o.name: o.name for o in runner.get_outputs()}
    feeds = {model_name: env[tensor] for model_name, tensor in in_map.items()}
    values = runner.run(list(out_map), feeds)
    return {out_map[k]: np.asarray(v) for k, v in zip(out_map, values, strict=True)}


def run_pipeline_reference(
    spec: Mapping[str, Any],
    inputs: Mapping[str, np.ndarray],
    *,
    models: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Run a pipeline mapping (the YAML format of :mod:`infscaler.base.config`) in-process;
    ``partitions``, ``engine`` and ``instances`` are ignored. Between ``fan_out`` and
    ``fan_in`` each item runs on its own tensors plus the request's; ``fan_in`` gets the
    items' inputs in item order.

    Args:
        spec: the pipeline mapping. inputs: the request tensors by name.
        models: model stage name -> a session (``run`` / ``get_inputs`` / ``get_outputs``)
            or an alias / path replacing its ``model``.

    Returns:
        The pipeline's ``outputs`` by name.

    Raises:
        TypeError: a function broke the contract (names, dtypes, fan_out not a list).
        KeyError: a stage reads a tensor nothing produced."""
    models = models or {}
    env: dict[str, np.ndarray] = dict(inputs)
    items: list[dict[str, np.ndarray]] | None = None  # between fan_out and fan_in
    for stage in spec["stages"]:
        if stage.get("fan_in"):
            gathered = [{n: readonly_view(it[n]) for n in stage["inputs"]} for it in items or []]
            fn = _load_function(stage["function"])
            env.update(_checked(stage, fn(gathered, **(stage.get("params") or {}))))
            items = None
        elif items is not None:
            for item in items:
                item.update(_run_stage(stage, item, models))  # type: ignore[arg-type]
        elif stage.get("fan_out"):
            items = [{**env, **it} for it in _run_stage(stage, env, models)]  # type: ignore[union-attr]
        else:
            env.update(_run_stage(stage, env, models))  # type: ignore[arg-type]
    return {name: env[name] for name in spec["outputs"]}
