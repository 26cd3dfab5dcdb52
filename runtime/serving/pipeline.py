"""Compile a pipeline configuration into *units*: what the runtime schedules.

A unit is one partition of a model stage (the paper's operator group, §IV-A; a model
partitioned into K parts gives K units, each scaled on its own, Algorithm 1) or one
function stage, or a *fused unit*: a model unit with the function stages next to it
(pre- and post-processing) run as steps inside the same instance, so a request crosses
one hop per model partition, not one per function (:func:`fuse_units` states the rule).
Units run in pipeline order; each instance of unit *i* hands its output
token straight to an instance of unit *i+1* (InfScaler §IV-B: zero-copy handover), except
at the ends and around a fan-in, where tokens go to the front end (stage 0).

Tensors travel in pool slots by name (:mod:`infscaler.shm.tensors`). What a slot holds
between units *i* and *i+1* is fixed here, once, by liveness over the unit list:
unit *i* writes its outputs plus the tensors it received that a later unit (or the
response) still needs (``carry``). Branches of a DAG therefore run one after another in
the configured (topological) order, and a tensor that skips stages rides along.

More (details, why it is so, history, figures): docs/serving.md, "`runtime/serving/pipeline.py`".
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infscaler.base.config import DATATYPES, InputSpec, PipelineConfig, StageConfig
from infscaler.base.errors import ConfigError, InfScalerError
from infscaler.base.models import MODELS, file_key, resolve_model
from infscaler.base.security import (
    FunctionNotAllowedError,
    check_function_module,
    check_plain_function,
)
from infscaler.partitioner.loader import parse_shapes
from infscaler.partitioner.plan import Plan, read_plan

log = logging.getLogger("infscaler.runtime")

TRACE = "__trace__"
FANOUT = "__fanout__"
ERROR = "__error__"
#: The front end's instance id (hop 0, in the service process; u16 token field).
FRONTEND_INSTANCE = 0xFFFE
RESERVED = (TRACE, FANOUT, ERROR)

#: ONNX element type -> v2 datatype.
_ONNX_TO_V2 = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.STRING: "BYTES",
}
_PLAN_DTYPE_TO_V2 = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


@dataclass
class Unit:
    """One schedulable unit (a partition instance runs exactly one).

    Attributes:
        index: position in the pipeline's unit list.
        name: ``<stage>`` or ``<stage>/<k>`` for partition k (0-based) of a model; a
            fused unit: its steps' names joined by ``>`` (``prep>det/0``).
        stage: the configured stage's name (a fused unit: its model stage's).
        kind: ``model`` or ``function``.
        partition / num_partitions: which operator group of the model (0 / 1 if whole).
        path: the ONNX file the engine loads (model units).
        function / params: ``module:callable`` and its keyword arguments.
        in_map: slot tensor -> engine input name (model units).
        out_map: engine output name -> slot tensor (model units).
        inputs / outputs: slot tensors read / written.
        carry: received slot tensors this unit passes on unchanged.
        fan_out / fan_in: see :mod:`infscaler.base.config`; per_item: runs once per item.
        engine / precision / threads / instances / shapes: how instances run.
        max_threads: the most intra-op threads the scaler may give one cpu instance
            (``scale_up``; None: ``threads`` is fixed).
        max_instances: the most instances the scaler may run (None: the cap decides).
        max_batch / batch_delay_ms / batch_policy: dynamic batching of a model unit
            (``fixed``: up to ``max_batch`` inputs gathered for ``batch_delay_ms``;
            ``mark``: the autoscaler picks the size, MArk §4); 1: no batching.
        bottleneck: B_k from the plan (sum of representative complexities, Eq. 1).
        plan_latency_ms: the plan's measured latency of this partition per engine.
        memory_mb: the plan's weights + peak activations (MB).
        steps: a fused unit's steps in order (each a :class:`Unit` of its own: the
            function stages before the model unit, the model unit, the function stages
            after it); empty for a unit that is not fused. A fused unit takes its model
            step's fields (kind ``model``, engine, path, in_map / out_map, plan figures);
            its ``inputs`` are what the steps read that no earlier step wrote, its
            ``outputs`` the last step's plus earlier steps' outputs read after the unit
            (a fan-out last step: the items' tensors), its ``carry`` may include
            tensors an earlier step wrote (what a fan-out unit hands every item). A
            ``fuse: whole`` unit (:func:`whole_unit`) holds every stage, the fan-out,
            per-item and fan-in steps included.
    """

    index: int
    name: str
    stage: str
    kind: str
    partition: int = 0
    num_partitions: int = 1
    path: str | None = None
    function: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    in_map: dict[str, str] = field(default_factory=dict)
    out_map: dict[str, str] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    carry: list[str] = field(default_factory=list)
    fan_out: bool = False
    fan_in: bool = False
    per_item: bool = False
    engine: str = "cpu"
    precision: str = "fp32"
    threads: int = 1
    max_threads: int | None = None
    instances: int = 1
    max_instances: int | None = None
    max_batch: int = 1
    batch_delay_ms: float = 0.0
    batch_policy: str = "fixed"
    shapes: dict[str, list[int]] = field(default_factory=dict)
    bottleneck: float | None = None
    plan_latency_ms: dict[str, Any] = field(default_factory=dict)
    memory_mb: float | None = None
    steps: list[Unit] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a unit that crossed a process boundary as a dict (to_dict) gets its steps back
        self.steps = [s if isinstance(s, Unit) else Unit(**s) for s in self.steps]

    @property
    def step_units(self) -> list[Unit]:
        """What an instance of this unit runs, in order: its steps, or itself."""
        return self.steps or [self]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompiledPipeline:
    """A validated pipeline, ready to deploy.

    Attributes:
        config: the configuration it came from.
        units: in execution order.
        inputs: request tensor specs (v2 datatypes; -1 any size).
        outputs: response tensor specs (shape -1 where unknown; datatype "" if unknown).
        front_inputs: request tensors the front end writes into the first slot.
        plans: stage name -> plan directory (partitioned model stages).
    """

    config: PipelineConfig
    units: list[Unit]
    inputs: list[InputSpec]
    outputs: list[dict[str, Any]]
    front_inputs: list[str]
    plans: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def output_names(self) -> list[str]:
        """Names of the response tensors, in order."""
        return [o["name"] for o in self.outputs]

    @property
    def fan_in_index(self) -> int | None:
        """Index of the fan-in unit (run by the front end), or None."""
        return next((u.index for u in self.units if u.fan_in), None)

    def next_unit(self, index: int) -> int | None:
        """The unit after ``index`` that an instance hands over to, or None when the
        token goes to the front end (the end, or a fan-in next)."""
        nxt = index + 1
        if nxt >= len(self.units) or self.units[nxt].fan_in:
            return None
        return nxt

    def served_units(self) -> list[Unit]:
        """Units that run as instances (all but the fan-in, which the front end runs)."""
        return [u for u in self.units if not u.fan_in]


# -- model metadata ------------------------------------------------------------------


def _value_infos(path: Path) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises many kinds; all mean "bad file"
        raise ConfigError(f"cannot read model {path}: {str(exc).splitlines()[0]}") from None
    inits = {i.name for i in m.graph.initializer}
    return [i for i in m.graph.input if i.name not in inits], list(m.graph.output)


def _vi_spec(vi: onnx.ValueInfoProto) -> tuple[str, list[int]]:
    t = vi.type.tensor_type
    dtype = _ONNX_TO_V2.get(t.elem_type, "")
    shape = [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim
    ]
    return dtype, shape


def keyed_plan_dir(
    state_dir: str | os.PathLike[str], model_path: Path, parts: Sequence[object], prefix: str = ""
) -> Path:
    """Where a deploy-time plan of ``model_path`` is kept:
    ``<state_dir>/plans/<prefix><stem>-<12 hex>``, the digest of the model file's
    :func:`~infscaler.base.models.file_key` (resolved path, size, modification time) and
    ``parts`` (what else the plan depends on, as ``str``), so that a model file replaced
    in place is partitioned anew. Used for the plans of partitioned stages (here) and of
    the deploy-time planner's chosen cuts (:func:`infscaler.runtime.planning.autoplan.chosen_plan_dir`).

    Raises:
        OSError: ``model_path`` cannot be stat'ed.
    """
    key = "|".join([file_key(model_path)] + [str(x) for x in parts])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(state_dir) / "plans" / f"{prefix}{model_path.stem}-{digest}"


def _plan_dir_for(
    stage: StageConfig, model_path: Path, state_dir: Path, shapes: str | None
) -> Path:
    parts = (stage.partitions, stage.slo, stage.max_partitions, shapes)
    return keyed_plan_dir(state_dir, model_path, parts)


# -- compiler -------------------------------------------------------------------------


def compile_pipeline(
    cfg: PipelineConfig,
    *,
    state_dir: Path | None = None,
    device: Any = None,
    progress: Callable[[str], None] = lambda _m: None,
    allowed_functions: Sequence[str] | None = None,
) -> CompiledPipeline:
    """Resolve models, partition model stages at deploy (cached in
    ``state_dir/plans``), and lay out the units.

    Args:
        cfg: a validated :class:`~infscaler.base.config.PipelineConfig`.
        state_dir: where deploy-time plans are kept (default ``$INFSCALER_STATE_DIR`` or
            ``~/.local/state/infscaler``).
        device: a :class:`~infscaler.base.device.DeviceProfile` passed to the partitioner.
        progress: called with a line per step (partitioning takes seconds).
        allowed_functions: the modules function stages may come from (None: any; see
            :func:`load_function`). Every function stage must name a plain function
            defined in its module either way.

    Raises:
        ConfigError: a model stage whose tensors do not exist in the model, inputs not
            available when a stage runs, outputs never produced, unknown functions.
        InfScalerError: partitioning failed (the partitioner's message).
    """

    state_dir = Path(state_dir or default_state_dir())
    units: list[Unit] = []
    plans: dict[str, str] = {}
    pipe_inputs = list(cfg.inputs) if cfg.inputs is not None else None
    pipe_outputs = list(cfg.outputs) if cfg.outputs is not None else None
    in_items = False
    fn_specs: dict[int, dict[str, dict[str, Any]]] = {}

    for si, stage in enumerate(cfg.stages):
        where = f"pipeline {cfg.name}: stages[{si}] ({stage.name})"
        if stage.fan_out:
            in_items = True
        if stage.kind == "function":
            fn = _check_function(stage.function or "", where, allowed_functions)
            fn_specs[len(units)] = _declared_outputs(fn, list(stage.outputs or []), where)
            units.append(_function_unit(stage, len(units), in_items))
            if stage.fan_in:
                in_items = False
            continue

        # -- model stage: whole, a given plan, or partitioned now --------------------
        plan_dir, plan = _stage_plan(stage, state_dir, device, progress)
        if plan is not None and plan_dir is not None:
            plans[stage.name] = str(plan_dir)
        io = _model_io(stage, plan_dir, plan, where)
        units.extend(_model_units(stage, io, len(units), in_items))
        if pipe_inputs is None and si == 0:
            pipe_inputs = [
                InputSpec(
                    name=io.in_mapping.get(n, n),
                    datatype=t.get("v2") or _PLAN_DTYPE_TO_V2.get(t.get("dtype", ""), "FP32"),
                    shape=[int(d) if isinstance(d, int) and d > 0 else -1 for d in t["shape"]],
                )
                for n, t in io.model_inputs.items()
            ]
        if pipe_outputs is None and si == len(cfg.stages) - 1:
            pipe_outputs = [io.out_mapping.get(n, n) for n in io.model_outputs]

    assert pipe_inputs is not None and pipe_outputs is not None
    _layout(units, pipe_inputs, pipe_outputs, cfg.name)
    out_specs = _output_specs(units, pipe_outputs, fn_specs)
    if cfg.fuse == "whole":
        fused = [whole_unit(units, pipe_outputs, cfg.name)]
    else:
        flags = {s.name: s.fuses(cfg.fuse) for s in cfg.stages}
        fused = fuse_units(units, flags, pipe_outputs)
    if len(fused) != len(units) or fused[0].steps:
        units = fused
        _layout(units, pipe_inputs, pipe_outputs, cfg.name)
    needed0 = set(pipe_outputs) | {n for u in units for n in u.inputs}
    front = [i.name for i in pipe_inputs if i.name in needed0]
    return CompiledPipeline(cfg, units, pipe_inputs, out_specs, front, plans)


def _function_unit(stage: StageConfig, index: int, in_items: bool) -> Unit:
    """The unit of function stage ``stage`` at position ``index`` (``in_items``: after a
    fan-out and before its fan-in)."""
    return Unit(
        index=index,
        name=stage.name,
        stage=stage.name,
        kind="function",
        function=stage.function,
        params=dict(stage.params),
        inputs=list(stage.inputs or []),
        outputs=list(stage.outputs or []),
        fan_out=stage.fan_out,
        fan_in=stage.fan_in,
        per_item=in_items and not stage.fan_out and not stage.fan_in,
        threads=stage.threads,
        instances=stage.instances_for(0, 1),
        max_instances=stage.max_instances,
    )


def _stage_plan(
    stage: StageConfig, state_dir: Path, device: Any, progress: Callable[[str], None]
) -> tuple[Path | None, Plan | None]:
    """The plan of model stage ``stage`` and its directory: the given one, the one kept
    in ``state_dir/plans`` for these settings, or a new one from the partitioner (§IV-A,
    Eq. 1); ``(None, None)`` for a stage served whole.

    Raises:
        InfScalerError: partitioning failed (the partitioner's message).
    """
    if stage.plan is not None:
        plan_dir = Path(stage.plan)
        return plan_dir, read_plan(plan_dir, load_parts=False)
    if not ((stage.partitions or 1) > 1 or stage.slo is not None):
        return None, None
    model_path = resolve_model(stage.model or "")
    shapes = stage.shapes
    if shapes is None and stage.model in MODELS:
        shapes = MODELS[stage.model].shapes
    plan_dir = _plan_dir_for(stage, model_path, state_dir, shapes)
    if (plan_dir / "plan.yaml").is_file():
        progress(f"{stage.name}: reusing plan {plan_dir}")
        return plan_dir, read_plan(plan_dir, load_parts=False)
    progress(f"{stage.name}: partitioning {model_path.name} (K={stage.partitions or 'search'})")
    # why: the partitioner (~30 modules: search, profiler, extract, ...) only when
    # a stage is partitioned now; instances and the service never load it else
    from infscaler.partitioner.api import partition_model

    partition_model(
        model_path,
        shapes=shapes,
        slo=stage.slo,
        num_partitions=stage.partitions,
        max_partitions=stage.max_partitions,
        device=device,
        out_dir=plan_dir,
        force=True,
        progress=lambda m, s=stage.name: progress(f"{s}: {m}"),
    )
    return plan_dir, read_plan(plan_dir, load_parts=False)


@dataclass
class _ModelIO:
    """A model stage's tensors: the model's inputs and outputs (name -> ``{"name",
    "v2" or "dtype", "shape"}``), its parts ``(file, input names, output names, the
    plan's partition or None)``, the static input shapes, and the stage's mappings of
    model tensor names to pipeline names."""

    model_inputs: dict[str, dict[str, Any]]
    model_outputs: dict[str, dict[str, Any]]
    parts: list[tuple[Path, list[str], list[str], dict[str, Any] | None]]
    shapes_of: dict[str, list[int]]
    in_mapping: dict[str, str]
    out_mapping: dict[str, str]
    stage: str

    def slot_name(self, onnx_name: str) -> str:
        """The slot tensor of model tensor ``onnx_name``: its pipeline name for the
        model's inputs and outputs, ``<stage>/<onnx name>`` for a tensor crossing a cut."""
        if onnx_name in self.model_inputs:
            return self.in_mapping.get(onnx_name, onnx_name)
        if onnx_name in self.model_outputs:
            return self.out_mapping.get(onnx_name, onnx_name)
        return f"{self.stage}/{onnx_name}"


def _model_io(stage: StageConfig, plan_dir: Path | None, plan: Plan | None, where: str) -> _ModelIO:
    """The tensors of model stage ``stage``, from its plan or from the whole model.

    Raises:
        ConfigError: the model cannot be read, or the stage maps a tensor the model
            does not have.
    """
    if plan is not None and plan_dir is not None:
        model_inputs = {t["name"]: t for t in plan.summary["model"]["inputs"]}
        model_outputs = {t["name"]: t for t in plan.summary["model"]["outputs"]}
        parts = [
            (
                plan_dir / p["file"],
                [t["name"] for t in p["inputs"]],
                [t["name"] for t in p["outputs"]],
                p,
            )
            for p in plan.summary["partitions"]
        ]
        shapes_of = {n: list(t["shape"]) for n, t in model_inputs.items()}
    else:
        model_path = resolve_model(stage.model or "")
        ins, outs = _value_infos(model_path)
        model_inputs = {
            vi.name: {"name": vi.name, "v2": _vi_spec(vi)[0], "shape": _vi_spec(vi)[1]}
            for vi in ins
        }
        model_outputs = {
            vi.name: {"name": vi.name, "v2": _vi_spec(vi)[0], "shape": _vi_spec(vi)[1]}
            for vi in outs
        }
        parts = [(model_path, list(model_inputs), list(model_outputs), None)]
        shapes_of = {}
        if stage.shapes:
            shapes_of = {k: list(v) for k, v in parse_shapes(stage.shapes).items()}
    in_mapping = dict(stage.inputs or {})
    out_mapping = dict(stage.outputs or {})
    for label, mapping, known in (
        ("inputs", in_mapping, model_inputs),
        ("outputs", out_mapping, model_outputs),
    ):
        bad = [n for n in mapping if n not in known]
        if bad:
            raise ConfigError(
                f"{where}.{label}: {bad} are not {label} of the model",
                hint=f"the model's {label}: {sorted(known)}",
            )
    return _ModelIO(
        model_inputs, model_outputs, parts, shapes_of, in_mapping, out_mapping, stage.name
    )


def _model_units(stage: StageConfig, io: _ModelIO, first: int, in_items: bool) -> list[Unit]:
    """The units of model stage ``stage``, one per part, from position ``first``."""
    units: list[Unit] = []
    k_total = len(io.parts)
    for k, (path, p_in, p_out, meta) in enumerate(io.parts):
        units.append(
            Unit(
                index=first + k,
                name=stage.name if k_total == 1 else f"{stage.name}/{k}",
                stage=stage.name,
                kind="model",
                partition=k,
                num_partitions=k_total,
                path=str(path),
                in_map={io.slot_name(n): n for n in p_in},
                out_map={n: io.slot_name(n) for n in p_out},
                inputs=[io.slot_name(n) for n in p_in],
                outputs=[io.slot_name(n) for n in p_out],
                per_item=in_items,
                engine=stage.engine,
                precision=stage.precision,
                threads=stage.threads,
                max_threads=stage.max_threads,
                instances=stage.instances_for(k, k_total),
                max_instances=stage.max_instances,
                max_batch=stage.batching.max_batch if stage.batching else 1,
                batch_delay_ms=stage.batching.max_delay_ms if stage.batching else 0.0,
                batch_policy=stage.batching.policy if stage.batching else "fixed",
                shapes={n: s for n, s in io.shapes_of.items() if n in p_in},
                bottleneck=None if meta is None else meta.get("bottleneck"),
                plan_latency_ms={} if meta is None else meta.get("latency_ms", {}),
                memory_mb=None if meta is None else meta.get("memory_mb"),
            )
        )
    return units


def _check_function(
    spec: str, where: str, allowed: Sequence[str] | None = None
) -> Callable[..., Any]:

    try:
        return load_function(spec, allowed, plain=True)
    except FunctionNotAllowedError as exc:
        raise FunctionNotAllowedError(f"{where}.function: {exc.message}", exc.hint) from None
    except InfScalerError as exc:
        raise ConfigError(f"{where}.function: {exc.message}", hint=exc.hint) from None


def load_function(
    spec: str, allowed: Sequence[str] | None = None, *, plain: bool = False
) -> Callable[..., Any]:
    """Import ``module:callable``.

    Args:
        spec: ``module:attr``.
        allowed: modules (and their submodules) the function may come from; checked
            before the module is imported (importing runs code). None: any module (the
            instances, which run what :func:`compile_pipeline` checked).
        plain: require a plain Python function defined in ``module`` (no builtins such
            as ``os:system``, no classes such as ``subprocess:Popen``); implied by
            ``allowed``.

    Raises:
        FunctionNotAllowedError: (403) the module is not allowed, or ``attr`` is not a
            plain function of it (:mod:`infscaler.base.security`).
        InfScalerError: the module cannot be imported or has no such callable.
    """
    import importlib

    if allowed is not None:
        check_function_module(spec, allowed)
    module, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means the same to the user
        raise InfScalerError(
            f"cannot import {module!r} for function {spec!r}: {type(exc).__name__}: {exc}",
            hint="the module must be importable by the service (installed, or on PYTHONPATH)",
        ) from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise InfScalerError(f"{module!r} has no callable {attr!r}")
    if plain or allowed is not None:
        check_plain_function(spec, mod, fn)
    return fn


def fuse_units(units: list[Unit], fuse: Mapping[str, bool], outputs: Sequence[str]) -> list[Unit]:
    """Fuse function units into the model units next to them, so that there is one
    instance and one token hop per model partition, not one per function.

    The rule, on the unfused unit list (pipeline order):

    * a function stage fuses into the model unit that follows it, across other such
      function stages, in the same item domain (pre-processing; a partitioned model:
      into partition 0); else into the model unit before it (post-processing; into
      partition K-1), again across function stages fused there;
    * a ``fan_out`` stage ends its unit: it may be the last step of the model unit
      before it, never a pre-step (the stages after it run per item);
    * a ``fan_in`` stage stays in the front end; stages of another item domain never
      share a unit;
    * a stage with ``fuse: false`` stays its own unit (a model stage then takes no
      function in); so does a function stage that sets its own ``instances``,
      ``max_instances`` or ``threads`` (:meth:`~infscaler.base.config.StageConfig.fuses`), a
      model stage with dynamic ``batching`` (its batches stack the model's own
      inputs), and a function stage with no model next to it (a pipeline of functions
      only is unchanged).

    Args:
        units: the unfused units, laid out (:func:`_layout`).
        fuse: stage name -> its ``fuse`` flag (stage's, else the pipeline's).
        outputs: the pipeline's response tensors.

    Returns:
        The new unit list (indices renumbered; ``carry`` to be laid out again), or
        ``units`` itself when nothing fuses.
    """
    n = len(units)

    def fn_ok(u: Unit) -> bool:
        return u.kind == "function" and not u.fan_in and fuse.get(u.stage, True)

    def model_ok(u: Unit) -> bool:
        return u.kind == "model" and u.max_batch <= 1 and fuse.get(u.stage, True)

    owner: list[int | None] = [None] * n
    for i, u in enumerate(units):
        if not fn_ok(u):
            continue
        if not u.fan_out:  # pre-processing: the next model unit of this domain
            j = i + 1
            while j < n and fn_ok(units[j]) and not units[j].fan_out:
                if units[j].per_item != u.per_item:
                    break
                j += 1
            if j < n and model_ok(units[j]) and units[j].per_item == u.per_item:
                owner[i] = j
                continue
        prev = units[i - 1] if i else None  # post-processing: the model unit before
        if prev is None or prev.per_item != u.per_item:
            continue
        if model_ok(prev):
            owner[i] = i - 1
        elif owner[i - 1] is not None and owner[i - 1] < i - 1 and not prev.fan_out:
            owner[i] = owner[i - 1]
    if not any(o is not None for o in owner):
        return units
    needed_after: list[set[str]] = [set() for _ in range(n)]
    acc = set(outputs)
    for i in range(n - 1, -1, -1):
        needed_after[i] = set(acc)
        acc |= set(units[i].inputs)
    out: list[Unit] = []
    for i, u in enumerate(units):
        if owner[i] is not None:
            continue  # emitted with its model unit
        group = [units[j] for j in range(n) if owner[j] == i or j == i]
        index = len(out)
        if len(group) == 1:
            out.append(replace(u, index=index))
            continue
        last = group[-1]
        inputs: list[str] = []
        written: set[str] = set()
        for s in group:
            inputs += [t for t in s.inputs if t not in written and t not in inputs]
            written |= set(s.outputs)
        if last.fan_out:
            outs = list(last.outputs)
        else:
            later = needed_after[last.index]
            outs = list(last.outputs)
            for s in group[:-1]:
                outs += [t for t in s.outputs if t in later and t not in outs]
        out.append(
            replace(
                u,
                index=index,
                name=">".join(s.name for s in group),
                inputs=inputs,
                outputs=outs,
                carry=[],
                fan_out=last.fan_out,
                steps=[replace(s, index=index, carry=[], steps=[]) for s in group],
            )
        )
    return out


def whole_unit(units: list[Unit], outputs: Sequence[str], name: str = "") -> Unit:
    """The one unit of a ``fuse: whole`` pipeline (the whole pipeline in one
    instance, replicated, is a configuration the staged units cannot express): every unit
    of ``units`` a step of it, in order, the fan-out, the per-item steps and the fan-in
    included (:class:`~infscaler.runtime.serving.runners.FusedRunner` runs the items through the
    per-item steps and calls the fan-in itself; the front end has no fan-in to do).

    It is a ``model`` unit (when the pipeline has a model: its instances pin ``threads``
    cores, the monitor counts them like any model unit's) taking its first model step's
    fields (engine, path, threads, instances, max_instances; ``fuse: whole`` makes the
    model stages agree on them); ``max_threads`` is None (not scaled vertically, like a
    fused unit); ``memory_mb`` is the sum over its model steps of the plan's figure, else
    the ONNX file's size, MB; ``inputs`` are what its steps read that no earlier step
    wrote, ``outputs`` the pipeline's.

    Args:
        units: the unfused units, laid out (:func:`_layout`), every model whole.
        outputs: the pipeline's response tensors.
        name: the pipeline (for messages).

    Raises:
        ConfigError: a model stage in more than one partition (a ``plan`` directory of
            K > 1: ``fuse: whole`` runs every model whole).
    """
    split = next((u for u in units if u.num_partitions > 1), None)
    if split is not None:
        raise ConfigError(
            f"pipeline {name}: stage {split.stage} has {split.num_partitions} partitions; "
            "with fuse: whole every model runs whole (K = 1)",
            hint="name the ONNX model instead of a partitioned plan, or set fuse: true",
        )
    models = [u for u in units if u.kind == "model"]
    first = models[0] if models else units[0]
    inputs: list[str] = []
    written: set[str] = set()
    for s in units:
        inputs += [t for t in s.inputs if t not in written and t not in inputs]
        written |= set(s.outputs)
    memory = [
        u.memory_mb
        if u.memory_mb is not None
        else (Path(u.path).stat().st_size / 2**20 if u.path and Path(u.path).is_file() else None)
        for u in models
    ]
    return replace(
        first,
        index=0,
        name=">".join(u.name for u in units),
        inputs=inputs,
        outputs=list(outputs),
        carry=[],
        fan_out=False,
        fan_in=False,
        per_item=False,
        max_threads=None,
        max_batch=1,
        memory_mb=None if None in memory or not memory else float(sum(memory)),
        bottleneck=None,
        plan_latency_ms={},
        steps=[replace(u, index=0, carry=[], steps=[]) for u in units],
    )


def _layout(units: list[Unit], inputs: list[InputSpec], outputs: list[str], name: str) -> None:
    """Fill each unit's ``carry`` by liveness and check that every input is available."""
    n = len(units)
    needed_after: list[set[str]] = [set() for _ in range(n)]
    acc = set(outputs)
    for i in range(n - 1, -1, -1):
        needed_after[i] = set(acc)
        acc |= set(units[i].inputs)
    per_item: set[str] = set()
    arriving = {i.name for i in inputs} & (acc | set(outputs))
    for u in units:
        missing = [t for t in u.inputs if t not in arriving]
        if missing:
            raise ConfigError(
                f"pipeline {name}: unit {u.name} reads {missing}, which no earlier stage "
                "produces and the request does not bring",
                hint=f"available there: {sorted(arriving)}",
            )
        if u.fan_in:
            arriving = arriving - per_item
        produced = {t for s in u.steps for t in s.outputs}  # a fused unit's steps' outputs
        carry = sorted(((arriving | produced) & needed_after[u.index]) - set(u.outputs))
        u.carry = carry
        if u.fan_out or u.per_item:
            per_item |= set(u.outputs)
        arriving = set(u.outputs) | set(carry)
    missing = [t for t in outputs if t not in arriving]
    if missing:
        raise ConfigError(f"pipeline {name}: outputs {missing} are not produced by any stage")


def _declared_outputs(fn: Any, outputs: list[str], where: str) -> dict[str, dict[str, Any]]:
    """A function stage's declared output tensors: its optional ``outputs_spec``
    attribute, ``{name: {"datatype": v2 datatype, "shape": [int, ...]}}`` (-1: any
    size; numpy ``<U`` / ``S`` outputs are ``BYTES``). Names it does not produce are an
    error; outputs it does not declare stay unknown.

    Raises:
        ConfigError: a malformed ``outputs_spec``.
    """
    raw = getattr(fn, "outputs_spec", None)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: the function's outputs_spec must be a dict")
    out = {}
    for name, spec in raw.items():
        dt = spec.get("datatype") if isinstance(spec, Mapping) else None
        shape = spec.get("shape") if isinstance(spec, Mapping) else None
        if (
            name not in outputs
            or dt not in DATATYPES
            or not isinstance(shape, list | tuple)
            or not all(isinstance(d, int) and d >= -1 for d in shape)
        ):
            raise ConfigError(
                f"{where}: outputs_spec[{name!r}] must be an output of the stage "
                f"({outputs}) with a v2 datatype and a shape of ints (-1: any size), got "
                f"{spec!r:.80}"
            )
        out[name] = {"datatype": dt, "shape": [int(d) for d in shape]}
    return out


def _output_specs(
    units: list[Unit], outputs: list[str], fn_specs: dict[int, dict[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    specs = []
    for name in outputs:
        spec: dict[str, Any] = {"name": name, "datatype": "", "shape": [-1]}
        for u in units:
            if u.kind == "function" and name in fn_specs.get(u.index, {}):
                spec.update(fn_specs[u.index][name])
            if u.kind == "model" and name in u.out_map.values():
                onnx_name = next(k for k, v in u.out_map.items() if v == name)
                try:
                    _, outs = _value_infos(Path(u.path or ""))
                except ConfigError:
                    break
                for vi in outs:
                    if vi.name == onnx_name:
                        spec["datatype"], spec["shape"] = _vi_spec(vi)
        specs.append(spec)
    return specs


def default_state_dir() -> Path:
    """``$INFSCALER_STATE_DIR``, systemd's ``$STATE_DIRECTORY``, or
    ``~/.local/state/infscaler``."""
    env = os.environ.get("INFSCALER_STATE_DIR") or os.environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":")[0])
    return Path.home() / ".local" / "state" / "infscaler"


def encode_error(message: str, status: int = 500) -> np.ndarray:
    """The ``__error__`` slot tensor for ``message`` and the HTTP ``status`` the client
    gets (400: the request's data was unusable, :class:`~infscaler.runtime.serving.instance.
    StageInputError`; 500: the stage failed). uint8: ``"<status> "`` then the message,
    UTF-8, at most 4 KiB in all."""
    return np.frombuffer(f"{status:03d} {message}".encode()[:4096], dtype=np.uint8).copy()


def error_status(arr: np.ndarray) -> tuple[int, str]:
    """``(status, message)`` of an ``__error__`` tensor (500 when it carries none)."""
    text = bytes(np.asarray(arr, dtype=np.uint8)).decode(errors="replace")
    head = text[:4]
    if len(head) == 4 and head[:3].isdigit() and head[3] == " " and 400 <= int(head[:3]) < 600:
        return int(head[:3]), text[4:]
    return 500, text
