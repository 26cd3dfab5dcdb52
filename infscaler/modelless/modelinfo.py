"""Model inspection for registration: a model's inputs / outputs, the shapes and feeds a
task needs, and int8 weights dequantised to fp32 (the cpu engine's fp32 variant of an
int8 model). Used by :func:`infscaler.modelless.register.register`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.errors import ModelLoadError, ShapeError
from infscaler.base.models import package_asset
from infscaler.engines.onnxrt.loader import load_session, session_options
from infscaler.modelless.stages import load_charset
from infscaler.modelless.variants import RegistrationError
from infscaler.partitioner.loader import parse_shapes

__all__ = [
    "ModelInfo",
    "concrete_shapes",
    "dequantize",
    "inspect_model",
    "profile_feeds",
    "shapes_text",
    "task_io",
]

# -- model inspection ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class ModelInfo:
    """What registration needs to know of an ONNX file."""

    path: Path
    inputs: tuple[_Tensor, ...]
    outputs: tuple[_Tensor, ...]
    precision: str
    metadata: dict[str, str]

    @property
    def dynamic_batch(self) -> bool:
        return all(
            t.shape and not (isinstance(t.shape[0], int) and t.shape[0] > 0) for t in self.inputs
        )


def _dim(d: Any) -> int | str | None:
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    return d.dim_param or None


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Inputs, outputs, weight precision and metadata of an ONNX file.

    Raises:
        ModelLoadError: not a readable ONNX file.
    """
    import onnx

    p = Path(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many kinds
        raise ModelLoadError(f"{p} is not a readable ONNX model: {exc}") from None
    g = model.graph
    inits = {i.name for i in g.initializer}

    def tensors(vis: Iterable[Any]) -> tuple[_Tensor, ...]:
        out = []
        for vi in vis:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "?"
            out.append(_Tensor(vi.name, dtype, tuple(_dim(d) for d in tt.shape.dim)))
        return tuple(out)

    int8 = fp16 = 0
    for init in g.initializer:
        n = math.prod(init.dims) if init.dims else 1
        if init.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and n >= 1024:
            int8 += n
        elif init.data_type == onnx.TensorProto.FLOAT16 and n >= 1024:
            fp16 += n
    quant_ops = {"QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger"}
    has_q = any(n.op_type in quant_ops or n.op_type.startswith("QLinear") for n in g.node)
    precision = "int8" if (int8 or has_q) else "fp16" if fp16 else "fp32"
    return ModelInfo(
        path=p,
        inputs=tensors(g.input),
        outputs=tensors(g.output),
        precision=precision,
        metadata={m.key: m.value for m in model.metadata_props},
    )


def dequantize(src: Path, out: Path) -> Path:
    """An fp32 copy of a weight-only int8 model (``Cast`` + ``Mul`` folded by onnxruntime's basic
    optimisation), cached at ``out``.

    Raises:
        RegistrationError: int8 weights remain (not a weight-only model).
    """

    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.onnx")
    so = session_options(None, optimization="basic", spinning=None, optimized_model_path=tmp)
    load_session(src, options=so)
    if inspect_model(tmp).precision != "fp32":
        tmp.unlink(missing_ok=True)
        raise RegistrationError(
            f"{src.name}: constant folding left int8 tensors (activations are quantised), "
            "so no fp32 variant can be made from it"
        )
    tmp.replace(out)
    return out


# -- tasks: interface checks, profiling inputs, accuracy ------------------------------------


def _parse_shapes(spec: str | None) -> dict[str, list[int]]:

    return {k: list(v) for k, v in parse_shapes(spec).items()}


def shapes_text(shapes: dict[str, list[int]]) -> str:
    return ",".join(f"{k}:{'x'.join(str(d) for d in v)}" for k, v in shapes.items())


_TASK_DIMS: dict[str, Callable[[_Tensor], list[int] | None]] = {
    "text-recognition": lambda t: [1, 3, 48, 320] if len(t.shape) == 4 else None,
    "text-detection": lambda t: [1, 3, 640, 640] if len(t.shape) == 4 else None,
    "text-embedding": lambda t: [1, 32] if len(t.shape) == 2 else None,
}


def concrete_shapes(info: ModelInfo, task: str, spec: str | None) -> dict[str, list[int]]:
    """Batch-1 shapes of every input: ``spec``, else the task's defaults."""
    given = _parse_shapes(spec)
    out = {}
    for t in info.inputs:
        dims = given.get(t.name)
        if dims is None:
            if all(isinstance(d, int) for d in t.shape):
                dims = [int(d) for d in t.shape]  # type: ignore[arg-type]
            else:
                default = _TASK_DIMS.get(task, lambda _t: None)(t)
                if default is None:
                    raise ShapeError(
                        f"input {t.name} has dynamic dims {list(t.shape)}: give --shapes",
                        hint=f"e.g. --shapes {t.name}:1x"
                        + "x".join(str(d) if isinstance(d, int) else "N" for d in t.shape[1:]),
                    )
                dims = [
                    int(d) if isinstance(d, int) else int(default[i]) for i, d in enumerate(t.shape)
                ]
        if len(dims) != len(t.shape):
            raise ShapeError(f"--shapes {t.name}: {dims} has not the input's rank {len(t.shape)}")
        out[t.name] = [int(d) for d in dims]
        out[t.name][0] = 1 if info.dynamic_batch else out[t.name][0]
    return out


def profile_feeds(
    info: ModelInfo, shapes: dict[str, list[int]], batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Profiling inputs: the shapes at ``batch``; token ids for int64 id inputs, ones for
    masks, uniform [-1, 1) floats for images."""
    feeds = {}
    for t in info.inputs:
        shape = list(shapes[t.name])
        if info.dynamic_batch:
            shape[0] = batch
        dt = np.dtype(t.dtype) if t.dtype != "?" else np.dtype(np.float32)
        if dt.kind == "f":
            feeds[t.name] = rng.uniform(-1.0, 1.0, shape).astype(dt)
        elif dt.kind in "iu":
            if "mask" in t.name:
                feeds[t.name] = np.ones(shape, dtype=dt)
            elif "type" in t.name:
                feeds[t.name] = np.zeros(shape, dtype=dt)
            else:
                ids = rng.integers(1000, 5000, size=shape).astype(dt)
                if ids.ndim == 2 and ids.shape[1] >= 2:
                    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
                feeds[t.name] = ids
        elif dt.kind == "b":
            feeds[t.name] = np.ones(shape, dtype=dt)
        else:
            raise RegistrationError(f"cannot make profiling data for input {t.name} ({t.dtype})")
    return feeds


def task_io(
    task: str,
    info: ModelInfo,
    *,
    alias: Any,
    charset: str | None,
    tokenizer: str | None,
    files_dir: Path,
    model_name: str,
) -> dict[str, Any]:
    """Check that the model fits the task's interface; the names the pipeline needs."""

    ins, outs = info.inputs, info.outputs
    io: dict[str, Any] = {
        f"model_{side}": [
            {"name": t.name, "datatype": _v2(t.dtype), "shape": [_v2dim(d) for d in t.shape]}
            for t in tensors
        ]
        for side, tensors in (("inputs", ins), ("outputs", outs))
    }
    if task in ("text-recognition", "text-detection"):
        if len(ins) != 1 or len(ins[0].shape) != 4 or ins[0].dtype != "float32":
            raise RegistrationError(
                f"a {task} model takes one float32 image batch [N, 3, H, W]; "
                f"{info.path.name} takes {[(t.name, t.dtype, list(t.shape)) for t in ins]}"
            )
        io["input"], io["output"] = ins[0].name, outs[0].name
    if task == "text-recognition":
        classes = outs[0].shape[-1] if outs[0].shape else None
        path = Path(charset) if charset else None
        if path is None and alias is not None:
            path = package_asset(alias, "charset")
        if path is None and "character" in info.metadata:
            path = files_dir / "charsets" / f"{model_name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(info.metadata["character"].rstrip("\n") + "\n", encoding="utf-8")
        if path is None or not path.is_file():
            raise RegistrationError(
                f"{info.path.name} has no character list (no 'character' metadata)",
                hint="give --charset FILE (one character per line, PaddleOCR's dict file)",
            )

        n = len(load_charset(str(path)))
        if isinstance(classes, int) and classes != n + 2:
            raise RegistrationError(
                f"the character list {path} has {n} characters but the model has {classes} "
                f"classes (characters + blank + space = {n + 2} expected)",
                hint="give the character list the model was trained with (--charset)",
            )
        io["charset"] = str(path)
        io["min_width"] = 320
    elif task == "text-embedding":
        names = [t.name for t in ins]
        if "input_ids" not in names or "attention_mask" not in names or len(names) > 3:
            raise RegistrationError(
                "a text-embedding model takes input_ids and attention_mask (and optionally "
                f"token_type_ids); {info.path.name} takes {names}"
            )
        token_outs = [t for t in outs if len(t.shape) == 3 and t.dtype == "float32"]
        if not token_outs:
            raise RegistrationError(
                f"{info.path.name} has no [N, L, D] float32 output (token embeddings) to pool"
            )
        path = Path(tokenizer) if tokenizer else None
        if path is None and alias is not None:
            path = package_asset(alias, "tokenizer")
        if path is None or not path.is_file():
            raise RegistrationError(
                f"{info.path.name} needs a tokenizer",
                hint="give --tokenizer FILE (a HuggingFace tokenizer.json)",
            )
        io.update(
            inputs=names,
            output=token_outs[-1].name,
            tokenizer=str(path),
            max_length=128,
            dim=token_outs[-1].shape[-1],
        )
    elif task == "text-detection":
        io["side"] = 640
    return io


def _v2(dtype: str) -> str:
    return {
        "float32": "FP32",
        "float16": "FP16",
        "float64": "FP64",
        "int64": "INT64",
        "int32": "INT32",
        "int8": "INT8",
        "uint8": "UINT8",
        "bool": "BOOL",
    }.get(dtype, "BYTES")


def _v2dim(d: Any) -> int:
    return int(d) if isinstance(d, int) else -1
