"""Triton model repositories served as they are: ``config.pbtxt`` -> a pipeline.

More (details, why it is so, history, figures): docs/serving.md, "`infscaler/base/triton.py`".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infscaler.base.config import DATATYPES as V2_DATATYPES
from infscaler.base.config import PipelineConfig, pipeline_for_model, validate_pipeline
from infscaler.base.errors import ConfigError

__all__ = [
    "TritonModel",
    "is_model_dir",
    "parse_model_config",
    "repository_models",
    "served_config",
    "triton_pipeline",
]

CONFIG_FILE = "config.pbtxt"
DEFAULT_MODEL_FILENAME = "model.onnx"
#: the largest batch our dynamic batching forms (:class:`~infscaler.base.config.BatchingConfig`)
MAX_BATCH = 64

#: Triton ``DataType`` -> v2 datatype (Triton ``model_configuration.md``, "Datatypes").
#: TYPE_STRING (BYTES) and TYPE_BF16 are refused: ONNX models served here take numbers.
DATATYPES = {f"TYPE_{t}": t for t in V2_DATATYPES if t != "BYTES"}
#: ONNX ``TensorProto`` element type -> v2 datatype.
_ONNX_TYPES = {t: t for t in V2_DATATYPES if t.startswith(("BOOL", "UINT", "INT"))} | {
    "FLOAT16": "FP16",
    "FLOAT": "FP32",
    "DOUBLE": "FP64",
}
_PLATFORMS = ("", "onnxruntime_onnx")
_BACKENDS = ("", "onnxruntime")
#: ModelConfig fields the mapping reads; every other field set is a warning
_MAPPED = {
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "instance_group",
    "dynamic_batching",
    "version_policy",
    "default_model_filename",
}
_TENSOR_MAPPED = {"name", "data_type", "dims"}
_GROUP_MAPPED = {"name", "kind", "count"}
_BATCHING_MAPPED = {"max_queue_delay_microseconds", "preferred_batch_size"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True)
class TritonModel:
    """One Triton model directory as a pipeline: ``config`` (one stage), ``version`` served,
    ``model_path``, and ``warnings`` (one per ignored ``config.pbtxt`` field).
    """

    config: PipelineConfig
    version: int
    model_path: Path
    warnings: tuple[str, ...] = ()


def _model_config_class() -> Any:
    """The ``inference.ModelConfig`` message class (:mod:`infscaler.proto`, a private
    descriptor pool); protobuf loads on the first ``config.pbtxt`` read."""
    from infscaler.proto import model_config_pb2

    return model_config_pb2.ModelConfig


def parse_model_config(path: str | Path) -> Any:
    """A ``config.pbtxt`` as an ``inference.ModelConfig`` (Triton ``model_config.proto``).

    Raises:
        ConfigError: unreadable, or not a ModelConfig (``<file>:<line>:<column>: ...``;
            unknown fields are errors, as in Triton).
    """
    from google.protobuf import text_format

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    msg = _model_config_class()()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        where = f"{path}:{exc.GetLine()}:{exc.GetColumn()}" if exc.GetLine() else str(path)
        detail = re.sub(r"^\d+:\d+ ?: ?", "", str(exc))
        raise ConfigError(
            f"{where}: {detail}",
            hint="see Triton's model_configuration.md for the config.pbtxt fields",
        ) from None
    return msg


def _versions(model_dir: Path, filename: str) -> dict[int, Path]:
    """Numeric version directories holding ``filename``: ``{version: file}``."""
    try:
        entries = list(model_dir.iterdir())
    except OSError:
        return {}
    return {
        int(v.name): v / filename
        for v in entries
        if v.name.isdigit() and v.is_dir() and (v / filename).is_file()
    }


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Triton model directory: a ``config.pbtxt``, or a numeric
    version directory holding ``model.onnx``."""
    p = Path(path)
    return p.is_dir() and (
        (p / CONFIG_FILE).is_file() or bool(_versions(p, DEFAULT_MODEL_FILENAME))
    )


def repository_models(repo: str | Path) -> list[Path]:
    """The model directories of a Triton model repository, sorted by name (empty when
    ``repo`` is not a directory or holds none; hidden directories are skipped)."""
    p = Path(repo)
    if not p.is_dir():
        return []
    return sorted(d for d in p.iterdir() if not d.name.startswith(".") and is_model_dir(d))


def _set_fields(msg: Any) -> list[str]:
    return [f.name for f, _v in msg.ListFields()]


def _ignored(where: str, prefix: str, msg: Any, mapped: set[str]) -> list[str]:
    return [f"{where}: {prefix}{f} is ignored" for f in _set_fields(msg) if f not in mapped]


def _version(cfg: Any, model_dir: Path, where: str, warnings: list[str]) -> tuple[int, Path]:
    """The version served under the version policy, and its model file."""
    filename = cfg.default_model_filename or DEFAULT_MODEL_FILENAME
    if "/" in filename or filename in (".", ".."):
        raise ConfigError(
            f"{where}: default_model_filename {filename!r} must be a file name",
            hint="name the file inside the version directory, e.g. model.onnx",
        )
    found = _versions(model_dir, filename)
    if not found:
        raise ConfigError(
            f"{model_dir}: no version directory holds {filename} (Triton's layout: "
            f"{model_dir.name}/1/{filename})",
            hint="put the model in a numeric version directory",
        )
    choice = cfg.version_policy.WhichOneof("policy_choice")
    if choice == "specific":
        listed = sorted(set(cfg.version_policy.specific.versions))
        missing = [v for v in listed if v not in found]
        if missing or not listed:
            raise ConfigError(
                f"{where}: version_policy.specific.versions {listed} names versions with no "
                f"{filename} ({missing or 'none listed'}); the directory has {sorted(found)}",
                hint="list existing version directories, or drop version_policy (latest)",
            )
        version = listed[-1]
        if len(listed) > 1:
            warnings.append(f"{where}: version_policy serves version {version} only")
    else:
        version = max(found)
        wanted = cfg.version_policy.latest.num_versions if choice == "latest" else 1
        if choice == "all" or wanted > 1:
            warnings.append(f"{where}: version_policy serves version {version} only")
    return version, found[version]


def _tensor(t: Any, i: int, kind: str, batch: bool, where: str, problems: list[str]) -> dict:
    """One ``input`` / ``output`` entry as ``{name, datatype, shape}``."""
    field = f"{kind}[{i}]"
    type_name = _model_config_class().DESCRIPTOR.fields_by_name["input"].message_type
    dtype = type_name.fields_by_name["data_type"].enum_type.values_by_number[t.data_type].name
    if not t.name:
        problems.append(f"{field}.name is missing")
    if dtype not in DATATYPES:
        problems.append(
            f"{field}.data_type {dtype} is not supported"
            + (" (TYPE_INVALID: data_type is missing)" if dtype == "TYPE_INVALID" else "")
        )
    bad = [d for d in t.dims if d < -1]
    if bad:
        problems.append(f"{field}.dims {list(t.dims)}: dims are >= 0 or -1 (any size)")
    shape = ([-1] if batch else []) + [int(d) for d in t.dims]
    return {"name": t.name, "datatype": DATATYPES.get(dtype, "FP32"), "shape": shape}


def _onnx_io(path: Path) -> tuple[list[tuple[str, str, list[int] | None]], ...]:
    """Graph inputs and outputs as ``(name, v2 datatype, dims)`` (-1: dynamic; None: no shape).

    Raises:
        ConfigError: a file onnx cannot load.
    """
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError / OSError / ValueError
        raise ConfigError(f"cannot load {path}: {exc}") from None
    inits = {i.name for i in model.graph.initializer}

    def tensors(values: Any) -> list[tuple[str, str, list[int] | None]]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            tt = v.type.tensor_type
            dtype = _ONNX_TYPES.get(onnx.TensorProto.DataType.Name(tt.elem_type), "?")
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            out.append((v.name, dtype, dims if tt.HasField("shape") else None))
        return out

    return tensors(model.graph.input), tensors(model.graph.output)


def served_config(cfg: Any, name: str, path: Path) -> str:
    """The ``ModelConfig`` a model is served with, as protobuf text: ``cfg`` plus Triton's
    auto-filled ``name``, ``platform``, ``backend`` and ``input`` / ``output`` from the ONNX
    model (Triton ``model_configuration.md``).
    """
    from google.protobuf import text_format

    msg = _model_config_class()()
    msg.CopyFrom(cfg)
    msg.name = msg.name or name
    msg.platform = msg.platform or "onnxruntime_onnx"
    msg.backend = msg.backend or "onnxruntime"
    if not msg.input or not msg.output:
        model_in, model_out = _onnx_io(path)
        skip = 1 if msg.max_batch_size > 0 else 0
        config_types = {v: k for k, v in DATATYPES.items()}
        for field, tensors in (("input", model_in), ("output", model_out)):
            target = getattr(msg, field)
            if target:
                continue
            for t_name, dtype, dims in tensors:
                t_type = config_types.get(dtype, "TYPE_INVALID")
                target.add(name=t_name, data_type=t_type, dims=(dims or [])[skip:])
    return text_format.MessageToString(msg)


def _check_against_model(
    tensors: list[dict], kind: str, model: dict[str, tuple[str, int]], path: Path
) -> list[str]:
    """Problems of the config's tensors against the ONNX model's (name, type, rank)."""
    problems = []
    given = {t["name"] for t in tensors}
    if kind == "input" and tensors and set(model) - given:
        problems.append(f"the model's inputs {sorted(set(model) - given)} are not listed")
    for i, t in enumerate(tensors):
        if t["name"] not in model:
            problems.append(
                f"{kind}[{i}].name {t['name']!r} is not an {kind} of {path.name} "
                f"(its {kind}s: {sorted(model)})"
            )
            continue
        dtype, rank = model[t["name"]]
        if dtype != t["datatype"]:
            problems.append(
                f"{kind}[{i}].data_type is TYPE_{t['datatype']} but the model's "
                f"{t['name']!r} is {dtype}"
            )
        if rank >= 0 and len(t["shape"]) != rank:
            problems.append(
                f"{kind}[{i}].dims give rank {len(t['shape'])} (with the batch dim when "
                f"max_batch_size > 0) but the model's {t['name']!r} has rank {rank}"
            )
    return problems


def _engine(cfg: Any, where: str, gpu_available: bool, warnings: list[str]) -> tuple[str, int]:
    """``(engine, instances)`` from ``instance_group``."""
    if not cfg.instance_group:
        return ("gpu" if gpu_available else "cpu"), 1
    group_cls = cfg.instance_group[0].DESCRIPTOR
    kinds: dict[str, int] = {}
    for i, g in enumerate(cfg.instance_group):
        kind = group_cls.fields_by_name["kind"].enum_type.values_by_number[g.kind].name
        warnings += _ignored(where, f"instance_group[{i}].", g, _GROUP_MAPPED)
        if kind == "KIND_MODEL":
            raise ConfigError(
                f"{where}: instance_group[{i}].kind KIND_MODEL is not supported",
                hint="use KIND_CPU or KIND_GPU",
            )
        if g.count < 0:
            raise ConfigError(f"{where}: instance_group[{i}].count {g.count} is below 0")
        engine = {"KIND_CPU": "cpu", "KIND_GPU": "gpu"}.get(kind, "gpu" if gpu_available else "cpu")
        kinds[engine] = kinds.get(engine, 0) + (g.count or 1)
    if len(kinds) > 1:
        raise ConfigError(
            f"{where}: instance_group mixes cpu and gpu instances ({kinds}); a model here "
            "runs on one engine",
            hint="keep one kind (KIND_CPU or KIND_GPU) in instance_group",
        )
    ((engine, count),) = kinds.items()
    return engine, count


def _batching(cfg: Any, where: str, warnings: list[str]) -> dict | None:
    """``batching`` from ``dynamic_batching`` (None without it)."""
    if not cfg.HasField("dynamic_batching"):
        return None
    db = cfg.dynamic_batching
    if cfg.max_batch_size <= 0:
        raise ConfigError(
            f"{where}: dynamic_batching needs max_batch_size > 0 (it is {cfg.max_batch_size})",
            hint="set max_batch_size, or drop dynamic_batching",
        )
    warnings += _ignored(where, "dynamic_batching.", db, _BATCHING_MAPPED)
    preferred = sorted(db.preferred_batch_size)
    if any(b < 1 or b > cfg.max_batch_size for b in preferred):
        raise ConfigError(
            f"{where}: dynamic_batching.preferred_batch_size {preferred} must lie in 1.."
            f"{cfg.max_batch_size} (max_batch_size)"
        )
    size = preferred[-1] if preferred else cfg.max_batch_size
    if len(preferred) > 1:
        warnings.append(
            f"{where}: dynamic_batching.preferred_batch_size: batches grow up to {size} "
            f"(the largest of {preferred})"
        )
    if size > MAX_BATCH:
        warnings.append(f"{where}: dynamic batches are capped at {MAX_BATCH} (not {size})")
        size = MAX_BATCH
    delay_ms = db.max_queue_delay_microseconds / 1000
    if delay_ms > 1000:
        raise ConfigError(
            f"{where}: dynamic_batching.max_queue_delay_microseconds "
            f"{db.max_queue_delay_microseconds} is over 1 s (1000000)",
            hint="batching delays here are at most 1000000 microseconds",
        )
    return {"max_batch": size, "max_delay_ms": delay_ms, "policy": "fixed"}


def triton_pipeline(
    model_dir: str | Path,
    *,
    gpu_available: bool = False,
    partitions: int | None = None,
    shapes: str | None = None,
) -> TritonModel:
    """A Triton model directory (``config.pbtxt`` + ``<version>/model.onnx``) as a pipeline.

    Args:
        gpu_available: KIND_AUTO without ``instance_group`` runs on gpu when True.
        partitions / shapes: as ``infscaler serve MODEL.onnx``.

    Raises:
        ConfigError: every file or field that cannot be served, named.
    """
    model_dir = Path(model_dir)
    name = model_dir.name
    if not _NAME.match(name):
        raise ConfigError(
            f"{model_dir}: model name {name!r} is not a valid model name ([A-Za-z0-9_.-], "
            "up to 64 characters, starting with a letter or digit)",
            hint="rename the model directory",
        )
    cfg_path = model_dir / CONFIG_FILE
    if not cfg_path.is_file():  # Triton's auto-complete: the model's own signature
        version, path = _version(_model_config_class()(), model_dir, str(model_dir), [])
        engine = "gpu" if gpu_available else "cpu"
        cfg = pipeline_for_model(
            path, name=name, partitions=partitions, shapes=shapes, engine=engine
        )
        served = served_config(_model_config_class()(), name, path)
        return TritonModel(cfg.model_copy(update={"triton_config": served}), version, path)
    return _from_config(parse_model_config(cfg_path), model_dir, gpu_available, partitions, shapes)


def _from_config(
    cfg: Any, model_dir: Path, gpu_available: bool, partitions: int | None, shapes: str | None
) -> TritonModel:
    """:func:`triton_pipeline` for a parsed ``config.pbtxt``."""
    where = str(model_dir / CONFIG_FILE)
    if cfg.name and cfg.name != model_dir.name:
        raise ConfigError(
            f"{where}: name {cfg.name!r} differs from the model directory {model_dir.name!r}",
            hint="Triton requires them equal: fix name, or drop it",
        )
    if cfg.platform not in _PLATFORMS or cfg.backend not in _BACKENDS:
        which = f"platform {cfg.platform!r}" if cfg.platform not in _PLATFORMS else ""
        which = which or f"backend {cfg.backend!r}"
        raise ConfigError(
            f"{where}: {which} is not supported: ONNX models only (platform "
            '"onnxruntime_onnx" or backend "onnxruntime")',
            hint="export the model to ONNX, or serve it with Triton",
        )
    if cfg.max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size {cfg.max_batch_size} is below 0")
    warnings = [f"{where}: {f} is ignored" for f in _set_fields(cfg) if f not in _MAPPED]
    version, path = _version(cfg, model_dir, where, warnings)
    batching = _batching(cfg, where, warnings)
    batch = cfg.max_batch_size > 0
    problems: list[str] = []
    inputs = [_tensor(t, i, "input", batch, where, problems) for i, t in enumerate(cfg.input)]
    outputs = [_tensor(t, i, "output", batch, where, problems) for i, t in enumerate(cfg.output)]
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        for i, t in enumerate(tensors):
            warnings += _ignored(where, f"{kind}[{i}].", t, _TENSOR_MAPPED)
    if not problems:
        model_in, model_out = (
            {n: (dt, -1 if dims is None else len(dims)) for n, dt, dims in side}
            for side in _onnx_io(path)
        )
        problems += _check_against_model(inputs, "input", model_in, path)
        problems += _check_against_model(outputs, "output", model_out, path)
    if problems:
        raise ConfigError(
            f"{where}: " + "; ".join(problems),
            hint="see Triton's model_configuration.md; names, types and ranks must match "
            "the ONNX model's",
        )
    engine, instances = _engine(cfg, where, gpu_available, warnings)
    stage: dict[str, Any] = {
        "name": "model",
        "model": str(path),
        "engine": engine,
        "instances": instances,
    }
    if batching is not None:
        stage["batching"] = batching
    if partitions:
        stage["partitions"] = partitions
    if shapes:
        stage["shapes"] = shapes
    data: dict[str, Any] = {
        "name": model_dir.name,
        "stages": [stage],
        "triton_config": served_config(cfg, model_dir.name, path),
    }
    if inputs:
        data["inputs"] = inputs
        stage["inputs"] = {t["name"]: t["name"] for t in inputs}
    if outputs:
        data["outputs"] = [t["name"] for t in outputs]
        stage["outputs"] = {t["name"]: t["name"] for t in outputs}
    return TritonModel(validate_pipeline(data, where), version, path, tuple(warnings))
