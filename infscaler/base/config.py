"""Pipeline configuration: ``pipeline.yaml`` (what ``infscaler serve`` / ``deploy`` take).

A pipeline is an ordered list of stages (a topological order of its data-flow DAG); each
stage is an ONNX **model** (run by an engine, partitioned into operator groups by the
InfScaler partitioner, §IV-A) or a Python **function** stage (``module:callable``, for
pre- / post-processing). Stages name the tensors they read and write; a stage reads
any tensor a request brought or an earlier stage wrote (DAG edges are these names).

More (details, why it is so, history, figures): docs/pipelines.md, "`infscaler/base/config.py`".
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infscaler.base.errors import ConfigError, InfScalerError
from infscaler.base.levels import MAX_INSTANCES_PER_UNIT, MAX_PRIORITY_LEVEL
from infscaler.base.slo import slo_ms

__all__ = [
    "AutoscaleConfig",
    "BatchingConfig",
    "DATATYPES",
    "InputSpec",
    "PipelineConfig",
    "QueuePolicyConfig",
    "StageConfig",
    "clean_validation_message",
    "load_pipeline",
    "pipeline_for_model",
]

#: v2 (KServe / Triton) tensor datatypes.
DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
_STAGE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,47}$"
_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class InputSpec(BaseModel):
    """One request tensor: ``name``, v2 ``datatype`` and ``shape`` (-1 = any size)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    datatype: Literal[DATATYPES]  # type: ignore[valid-type]
    shape: list[int]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v.startswith("__"):
            raise ValueError(f"tensor names starting with '__' are reserved, got {v!r}")
        return v

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        if any(d < -1 for d in v):
            raise ValueError(f"dims must be >= 0 or -1 (any size), got {v}")
        return v


class BatchingConfig(BaseModel):
    """Dynamic batching of a model stage (Triton's ``dynamic_batching``; MArk §4): wait up to
    ``max_delay_ms`` for up to the batch size, stack along axis 0, run once.

    Attributes:
        max_batch: the largest batch (1-64).
        max_delay_ms: how long to wait for a batch to fill, ms.
        policy: ``mark`` (the autoscaler picks b from the measured T_b) or ``fixed``.
    """

    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(8, ge=1, le=64)
    max_delay_ms: float = Field(2.0, ge=0, le=1000)
    policy: Literal["mark", "fixed"] = "mark"


#: a function stage that sets one of these is scaled on its own: by default not fused
_OWN_SCALING = ("instances", "max_instances", "threads")


class StageConfig(BaseModel):
    """One stage: exactly one of ``function``, ``model``, ``plan``; the fields as in
    docs/pipelines.md's example, and:

    Attributes:
        slo / max_partitions: partition ``model`` at deploy for this SLO (``80ms``, ``1.5x``),
            searching K up to ``max_partitions`` when ``partitions`` is unset.
        instances: an int, or one per partition; with ``autoscale`` the minimum kept.
        max_instances: with ``autoscale``, the most per partition (None: the device's cap;
            at most 16).
        max_threads: with ``autoscale``, cpu model stages: the most intra-op threads the
            scaler may give one instance (None: ``threads`` is fixed).
        fuse: None: the pipeline's ``fuse``, except for a function stage setting
            ``instances``, ``max_instances`` or ``threads`` (docs/pipelines.md, "Fused units").
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_STAGE_NAME)
    function: str | None = None
    model: str | None = None
    plan: str | None = None
    partitions: int | None = Field(None, ge=1, le=16)
    slo: str | None = None
    max_partitions: int = Field(4, ge=1, le=16)
    shapes: str | None = None
    inputs: list[str] | dict[str, str] | None = None
    outputs: list[str] | dict[str, str] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    fan_out: bool = False
    fan_in: bool = False
    engine: Literal["cpu", "gpu", "dla"] = "cpu"
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    instances: int | list[int] = 1
    max_instances: int | None = Field(None, ge=1, le=MAX_INSTANCES_PER_UNIT)
    batching: BatchingConfig | None = None
    threads: int = Field(1, ge=1, le=64)
    max_threads: int | None = Field(None, ge=1, le=64)
    fuse: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> StageConfig:
        kinds = [k for k in ("function", "model", "plan") if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(
                "a stage needs exactly one of `function`, `model` or `plan`"
                + (f", got {' and '.join(kinds)}" if kinds else "")
            )
        if self.function is not None:
            if not _FUNCTION.match(self.function):
                raise ValueError(
                    f"function must be 'package.module:callable', got {self.function!r}"
                )
            if not isinstance(self.inputs, list) or not isinstance(self.outputs, list):
                raise ValueError("a function stage lists its `inputs` and `outputs` (names)")
            if not self.outputs:
                raise ValueError("a function stage must produce at least one output")
            if self.fan_out and self.fan_in:
                raise ValueError("a stage cannot be both fan_out and fan_in")
            if self.fan_in and self.fuse:
                raise ValueError("a fan_in stage runs in the front end: it fuses into no unit")
            own = sorted(self.model_fields_set & set(_OWN_SCALING))
            if self.fuse and own:
                raise ValueError(
                    f"{', '.join(own)} of a fused function stage would be ignored (it runs "
                    "in the model stage's instances): drop them, or set fuse: false"
                )
            for key in ("partitions", "slo", "shapes"):
                if getattr(self, key) is not None:
                    raise ValueError(f"`{key}` applies to model stages only")
            if self.engine != "cpu":
                raise ValueError("function stages run on the cpu engine")
            if self.batching is not None:
                raise ValueError("`batching` applies to model stages only")
        else:
            if self.fan_out or self.fan_in:
                raise ValueError("fan_out / fan_in apply to function stages only")
            if self.params:
                raise ValueError("`params` applies to function stages only")
            for key in ("inputs", "outputs"):
                if isinstance(getattr(self, key), list):
                    raise ValueError(
                        f"a model stage maps `{key}` as model tensor -> pipeline tensor "
                        "(a mapping), or omits it for the model's own names"
                    )
            if self.plan is not None and (self.partitions or self.slo or self.shapes):
                raise ValueError("`plan` is already partitioned: drop partitions / slo / shapes")
        if self.max_threads is not None:
            if self.function is not None or self.engine != "cpu":
                raise ValueError("max_threads applies to model stages on the cpu engine only")
            if self.max_threads < self.threads:
                raise ValueError(
                    f"max_threads ({self.max_threads}) is below threads ({self.threads})"
                )
        if isinstance(self.instances, list):
            if not self.instances or any(n < 1 for n in self.instances):
                raise ValueError(f"instances must be >= 1 each, got {self.instances}")
        elif self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.max_instances is not None:
            lows = self.instances if isinstance(self.instances, list) else [self.instances]
            if max(lows) > self.max_instances:
                raise ValueError(
                    f"max_instances ({self.max_instances}) is below instances ({self.instances})"
                )
        for key in ("inputs", "outputs"):
            names = getattr(self, key)
            values = names.values() if isinstance(names, dict) else names or []
            bad = [n for n in values if not n or n.startswith("__")]
            if bad:
                raise ValueError(f"{key}: empty or reserved ('__') tensor names {bad}")
        return self

    @property
    def kind(self) -> str:
        """``function`` or ``model`` (a plan is a model stage)."""
        return "function" if self.function else "model"

    def fuses(self, default: bool) -> bool:
        """Whether this stage fuses (see ``fuse``), ``default`` being the pipeline's."""
        if self.fuse is not None:
            return self.fuse
        own = self.kind == "function" and self.model_fields_set & set(_OWN_SCALING)
        return default and not own

    def instances_for(self, k: int, num_partitions: int) -> int:
        """Instances of partition ``k`` (0-based) of ``num_partitions``.

        Raises:
            ConfigError: a list of instances whose length is not ``num_partitions``.
        """
        if isinstance(self.instances, int):
            return self.instances
        if len(self.instances) != num_partitions:
            raise ConfigError(
                f"stage {self.name}: `instances` lists {len(self.instances)} counts but the "
                f"model has {num_partitions} partitions",
                hint="give one count per partition, or a single int",
            )
        return self.instances[k]


class AutoscaleConfig(BaseModel):
    """Asymmetric auto-scaling (InfScaler Algorithm 1 with InferLine's scale-in hysteresis);
    each field, its unit (seconds for ``*_s``) and default: docs/scaling.md, "Auto-scaling and
    batching".

    Raises:
        pydantic.ValidationError: a value out of range (``settle_s`` / ``sustain_s``: 0-600 s).
    """

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(1.0, gt=0, le=60)
    window_s: float = Field(10.0, gt=0, le=300)
    violation_ratio: float = Field(1.0, gt=0, le=10)
    cooldown_s: float = Field(3.0, ge=0, le=600)
    hold_s: float = Field(15.0, ge=0, le=3600)
    rate_horizon_s: float = Field(30.0, gt=0, le=3600)
    scale_in_utilisation: float = Field(0.6, gt=0, le=1)
    shed: bool = True
    settle_s: float = 5.0
    sustain_s: float = 2.0
    oversubscribe: bool = False
    tuner: bool = False

    @field_validator("settle_s", "sustain_s")
    @classmethod
    def _seconds(cls, v: float, info: Any) -> float:
        what = {
            "settle_s": "how long after a deploy or a change a violated SLO is not counted",
            "sustain_s": "how long the SLO must stay violated before a scale-out",
        }[info.field_name]
        if not 0 <= v <= 600:
            raise ValueError(f"{info.field_name} must be 0-600 s ({what}), got {v}")
        return v


class QueuePolicyConfig(BaseModel):
    """A pipeline's queue policy: Triton's ``ModelQueuePolicy`` in ms (fields:
    docs/pipelines.md, "Priority and queue policy").

    Raises:
        ValueError: a negative size or a timeout not a positive number.
    """

    model_config = ConfigDict(extra="forbid")

    max_queue_size: int = Field(0, ge=0, le=1_000_000)
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_ms: float | None = Field(None, gt=0, le=3_600_000, allow_inf_nan=False)
    allow_timeout_override: bool = False


class PipelineConfig(BaseModel):
    """A pipeline: the fields as in docs/pipelines.md's example, and:

    Attributes:
        inputs / outputs: None for single-model pipelines (the model's).
        max_inflight: requests in the stages at once (default: the instances x batch + 1).
        priority: 1 (highest) .. :data:`MAX_PRIORITY_LEVEL`, its requests' default; a request
            may lower its own level, never raise it.
        triton_config: a Triton model's ``ModelConfig`` protobuf text (at most 256 KB).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME)
    description: str = ""
    inputs: list[InputSpec] | None = None
    outputs: list[str] | None = None
    stages: list[StageConfig] = Field(min_length=1, max_length=32)
    request_timeout_s: float = Field(60.0, gt=0, le=3600)
    max_inflight: int | None = Field(None, ge=1, le=4096)
    slo: str | float | None = None
    autoscale: AutoscaleConfig | None = None
    fuse: bool | Literal["whole"] = True
    priority: int = Field(1, ge=1, le=MAX_PRIORITY_LEVEL, strict=True)
    queue_policy: QueuePolicyConfig = Field(default_factory=QueuePolicyConfig)
    triton_config: str | None = Field(None, max_length=1 << 18)

    @field_validator("autoscale", mode="before")
    @classmethod
    def _autoscale_bool(cls, v: Any) -> Any:
        if v is True:
            return {}
        if v is False:
            return None
        return v

    @field_validator("slo")
    @classmethod
    def _slo_ms(cls, v: str | float | None) -> str | float | None:
        if v is not None:
            _slo_to_ms(v)
        return v

    @property
    def slo_ms(self) -> float | None:
        """The SLO in ms (None: none given)."""
        return None if self.slo is None else _slo_to_ms(self.slo)

    @model_validator(mode="after")
    def _check(self) -> PipelineConfig:
        if self.autoscale is not None and self.slo is None:
            raise ValueError("autoscale needs the pipeline's `slo` (e.g. slo: 200ms)")
        names = [s.name for s in self.stages]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"stage names must be unique, repeated: {dup}")
        fan_out = [i for i, s in enumerate(self.stages) if s.fan_out]
        fan_in = [i for i, s in enumerate(self.stages) if s.fan_in]
        if len(fan_out) > 1 or len(fan_in) > 1:
            raise ValueError("at most one fan_out stage and one fan_in stage per pipeline")
        if fan_out and not (fan_in and fan_in[0] > fan_out[0]):
            raise ValueError(
                f"stage {self.stages[fan_out[0]].name} fans out but no later stage fans in",
                # the hint goes into the message: pydantic keeps one string
            )
        if fan_in and not fan_out:
            raise ValueError(f"stage {self.stages[fan_in[0]].name} fans in but nothing fans out")
        single_model = len(self.stages) == 1 and self.stages[0].kind == "model"
        if not single_model and (self.inputs is None or self.outputs is None):
            raise ValueError(
                "a pipeline declares its `inputs` and `outputs` (only a single-model pipeline "
                "may omit them)"
            )
        if self.inputs is not None:
            in_names = [i.name for i in self.inputs]
            if len(set(in_names)) != len(in_names):
                raise ValueError(f"input names must be unique, got {in_names}")
        if self.fuse == "whole":
            _check_whole(self.stages)
        return self

    @property
    def whole(self) -> bool:
        """``fuse: whole``: the pipeline runs as one unit."""
        return self.fuse == "whole"


def _check_whole(stages: list[StageConfig]) -> None:
    """What ``fuse: whole`` needs (docs/pipelines.md). Raises ValueError naming the stage."""
    why = "with fuse: whole every stage runs in one unit"
    for st in stages:
        at = f"stage {st.name}"
        if st.fuse is not None:
            raise ValueError(f"{at}: `fuse` has no effect {why}: drop it")
        if st.kind == "function":  # by value: a re-validated dump sets every field
            fields = StageConfig.model_fields
            own = [k for k in _OWN_SCALING if getattr(st, k) != fields[k].default]
            if own:
                raise ValueError(
                    f"{at}: {', '.join(own)} would be ignored ({why}, scaled as one): drop "
                    "them, or set them on the model stages"
                )
            continue
        if (st.partitions or 1) > 1 or st.slo is not None:
            raise ValueError(
                f"{at}: its model runs whole ({why}, K = 1): drop `partitions` / `slo`, or "
                "set the pipeline's fuse to true to partition it"
            )
        if st.batching is not None:
            raise ValueError(f"{at}: `batching` does not apply {why} (one input at a time)")
        if st.max_threads is not None:
            raise ValueError(
                f"{at}: max_threads does not apply {why} (not scaled vertically): set threads"
            )
        if isinstance(st.instances, list) and len(st.instances) != 1:
            raise ValueError(f"{at}: its model runs whole ({why}): give one count of instances")
    models = [st for st in stages if st.kind == "model"]
    for key in ("engine", "threads", "instances", "max_instances"):
        values = {
            st.name: st.instances_for(0, 1) if key == "instances" else getattr(st, key)
            for st in models
        }
        if len(set(values.values())) > 1:
            raise ValueError(
                f"the model stages run in one unit ({why}): give them the same {key}, got {values}"
            )


def _slo_to_ms(text: str | float) -> float:
    """``200ms`` / ``0.2s`` / ``200`` -> 200.0 (ms)
    (:func:`infscaler.base.slo.slo_ms`). Raises ValueError with the reason."""

    try:
        return slo_ms(text)
    except InfScalerError as exc:
        raise ValueError(f"{exc.message}: {exc.hint}" if exc.hint else exc.message) from None


def _where(loc: tuple, data: Any) -> str:
    """``('stages', 2, 'inputs')`` -> ``stages[2] (det).inputs``."""
    parts: list[str] = []
    node = data
    for p in loc:
        if isinstance(p, int):
            name = ""
            if isinstance(node, list) and 0 <= p < len(node):
                node = node[p]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    name = f" ({node['name']})"
            else:
                node = None
            parts[-1:] = [f"{parts[-1] if parts else ''}[{p}]{name}"]
        else:
            node = node.get(p) if isinstance(node, dict) else None
            parts.append(str(p))
    return ".".join(parts) or "(top level)"


def clean_validation_message(msg: str) -> str:
    """A pydantic error message without its ``Value error, `` / ``Assertion failed, `` prefix."""
    return re.sub(r"^(Value error|Assertion failed), ", "", msg)


def validate_pipeline(data: Any, where: str = "pipeline") -> PipelineConfig:
    """Validate a parsed pipeline mapping; ConfigError naming every offending YAML path."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} must be a YAML mapping with name, inputs, outputs, stages",
            hint="see docs/pipelines.md",
        )
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
            # pydantic adds union-member tags (list[str], dict[str,str]) to the loc
            loc = tuple(p for p in loc if p not in ("list[str]", "dict[str,str]", "int"))
            problems.append(f"{_where(loc, data)}: {clean_validation_message(err['msg'])}")
        uniq = list(dict.fromkeys(problems))
        raise ConfigError(f"{where} is not a valid pipeline: " + "; ".join(uniq)) from None
    _check_dataflow(cfg, where)
    return cfg


def _check_dataflow(cfg: PipelineConfig, where: str) -> None:
    """Every function-stage input is available when the stage runs, per-item tensors do
    not leak past the fan-in, and the outputs are produced."""
    available = {i.name for i in cfg.inputs or []}
    per_item: set[str] = set()
    in_items = False
    for i, st in enumerate(cfg.stages):
        at = f"{where}: stages[{i}] ({st.name})"
        if isinstance(st.inputs, list):
            needs = st.inputs
        elif isinstance(st.inputs, dict):
            needs = list(st.inputs.values())
        else:
            needs = []  # a model's own names: checked once the model is loaded
        missing = [n for n in needs if n not in available]
        if missing and cfg.inputs is not None:
            raise ConfigError(
                f"{at}.inputs: {missing} are not pipeline inputs nor outputs of an earlier stage",
                hint=f"available here: {sorted(available)}",
            )
        if st.fan_in:
            in_items = False
            available -= per_item
        produced = st.outputs if isinstance(st.outputs, list) else list((st.outputs or {}).values())
        if st.fan_out:
            in_items = True
        if in_items:
            per_item.update(produced)
        available.update(produced)
    if cfg.outputs is not None:
        missing = [n for n in cfg.outputs if n not in available]
        if missing:
            hint = (
                "per-item tensors end at the fan_in stage: return them from it"
                if set(missing) & per_item
                else f"available at the end: {sorted(available)}"
            )
            raise ConfigError(
                f"{where}: outputs {missing} are not produced by any stage", hint=hint
            )


def load_pipeline(source: str | os.PathLike[str] | dict) -> PipelineConfig:
    """Load and validate a pipeline from a file, a YAML / JSON string, or a mapping.

    Raises:
        ConfigError: missing or unreadable file, bad YAML, or an invalid pipeline (naming
            the YAML path at fault).
    """
    if isinstance(source, dict):
        return validate_pipeline(source)
    text: str
    where: str
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith("{")):
        text, where = source, "pipeline"
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"pipeline file not found: {path}", hint="pass a pipeline.yaml")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read pipeline file {path}: {exc}") from None
        where = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    return validate_pipeline(data, where)


def pipeline_for_model(
    model: str | os.PathLike[str],
    *,
    name: str | None = None,
    partitions: int | None = None,
    shapes: str | None = None,
    engine: str = "cpu",
) -> PipelineConfig:
    """A one-stage pipeline serving a model or plan directory, named after its file stem.

    Raises:
        ConfigError: a name that is not a valid model name.
    """
    path = Path(model)
    is_plan = path.is_dir()
    stem = path.name if is_plan else path.stem if path.suffix == ".onnx" else str(model)
    stage: dict[str, Any] = {"name": "model", "engine": engine}
    if is_plan:
        stage["plan"] = str(path)
    else:
        stage["model"] = str(model)
        if partitions:
            stage["partitions"] = partitions
        if shapes:
            stage["shapes"] = shapes
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", name or stem)[:64] or "model"
    return validate_pipeline({"name": safe, "stages": [stage]}, f"model {model}")
