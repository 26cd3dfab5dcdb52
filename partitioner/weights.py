"""Weights by reference: onnxruntime sessions of *stubs* (large initializers as external-data
references to the bytes on disk) memory-map the weights instead of copying them.

More: docs/architecture.md, "`partitioner/weights.py`".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from infscaler.engines.onnxrt.loader import load_session

__all__ = [
    "MIN_REFERENCED_BYTES",
    "StubModel",
    "WeightRef",
    "raw_data_offsets",
    "structure_only",
    "stub_model",
    "tensor_nbytes",
]

#: Initializers of at most this many bytes stay embedded in a stub (shape constants that
#: shape inference and constant folding read; copying them costs nothing).
MIN_REFERENCED_BYTES = 4096

#: TensorProto fields that hold (or locate) a tensor's data; a reference replaces them.
_DATA_FIELDS = frozenset(
    {
        "raw_data",
        "float_data",
        "int32_data",
        "string_data",
        "int64_data",
        "double_data",
        "uint64_data",
        "external_data",
        "data_location",
    }
)


@dataclass(frozen=True)
class WeightRef:
    """Where one initializer's data lies: ``location`` (relative file), ``offset``, ``length`` bytes."""

    location: str
    offset: int
    length: int


@dataclass(frozen=True)
class StubModel:
    """A serialised stub (``data``) and the absolute ``folder`` its weight references are relative to."""

    data: bytes
    folder: str

    def session(self, options: Any, engine: str = "cpu") -> Any:
        """An ``InferenceSession`` of the stub on ``engine`` (``options`` gets the initializer folder).

        Raises:
            EngineUnavailable: the host lacks ``engine`` or onnxruntime does not serve it.
            ModelLoadError: onnxruntime cannot load the stub (or a referenced file).
        """

        return load_session(
            self.data, engine=engine, options=options, external_data_folder=self.folder
        )


# ------------------------------------------------------------------------ wire format


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message in
    ``buf[start:end]``; other wire types are skipped."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > end:
                raise ValueError("field runs past its message")
            yield number, i, i + n
            i += n
        else:  # groups (3, 4): not used by ONNX
            raise ValueError(f"unsupported wire type {wire}")
    if i != end:
        raise ValueError("message does not end on a field boundary")


# ModelProto.graph = 7; GraphProto.initializer = 5; TensorProto.name = 8, raw_data = 9.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_NAME, _TENSOR_RAW_DATA = 7, 5, 8, 9


def raw_data_offsets(data: bytes | memoryview) -> dict[str, tuple[int, int]]:
    """Top-level initializer name -> (offset, length) of its ``raw_data`` in serialised ``data``.

    Reads only the protobuf field headers (onnx.proto fields: graph 7, initializer 5, name 8,
    raw_data 9). Initializers without ``raw_data`` and repeated names are left out;
    malformed input gives ``{}``.
    """
    buf = memoryview(data)
    found: dict[str, tuple[int, int]] = {}
    seen: set[str] = set()
    duplicated: set[str] = set()
    try:
        for number, g_start, g_end in _fields(buf, 0, len(buf)):
            if number != _MODEL_GRAPH:
                continue
            for field, t_start, t_end in _fields(buf, g_start, g_end):
                if field != _GRAPH_INITIALIZER:
                    continue
                name: str | None = None
                span: tuple[int, int] | None = None
                for tf, start, end in _fields(buf, t_start, t_end):
                    if tf == _TENSOR_NAME:
                        name = bytes(buf[start:end]).decode("utf-8")
                    elif tf == _TENSOR_RAW_DATA:
                        span = (start, end - start)
                if name is None:
                    continue
                if name in seen:
                    duplicated.add(name)
                seen.add(name)
                if span is not None:
                    found[name] = span
    except (ValueError, IndexError, UnicodeDecodeError):
        return {}
    for name in duplicated:
        found.pop(name, None)
    return found


# --------------------------------------------------------------------------------- stubs


def tensor_nbytes(tensor: TensorProto) -> int | None:
    """dims x element size of a dense numeric tensor in bytes (its ``raw_data`` length);
    None for types whose raw size is not that (strings, packed 4-bit types)."""
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except Exception:
        return None
    if dtype.kind not in "biufc" or dtype.itemsize == 0:
        return None
    if tensor.data_type in _PACKED_TYPES:
        return None
    return math.prod(int(d) for d in tensor.dims) * dtype.itemsize


_PACKED_TYPES = frozenset(
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
)


def _is_repeated(fd: Any) -> bool:
    # protobuf >= 5.29 has ``is_repeated``; ``label`` is gone from recent upb builds
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def _copy_fields(src: Any, dst: Any, skip: frozenset[str] | set[str]) -> None:
    """Copy the set fields of message ``src`` into ``dst`` except ``skip``. Reads no field
    it copies as a whole value (so a skipped ``raw_data`` is never materialised)."""
    for fd in src.DESCRIPTOR.fields:
        name = fd.name
        if name in skip:
            continue
        if _is_repeated(fd):
            values = getattr(src, name)
            if len(values):
                getattr(dst, name).extend(values)
        elif src.HasField(name):
            if fd.type == fd.TYPE_MESSAGE:
                getattr(dst, name).CopyFrom(getattr(src, name))
            else:
                setattr(dst, name, getattr(src, name))


def _referenced(tensor: TensorProto, refs: Mapping[str, WeightRef]) -> WeightRef | None:
    ref = refs.get(tensor.name)
    if ref is None or ref.length <= MIN_REFERENCED_BYTES:
        return None
    if tensor.data_location != TensorProto.EXTERNAL and not tensor.HasField("raw_data"):
        return None  # data in typed fields (float_data, ...): not the referenced bytes
    return ref if tensor_nbytes(tensor) == ref.length else None


def stub_model(model: onnx.ModelProto, refs: Mapping[str, WeightRef], folder: str) -> StubModel:
    """``model`` with each initializer ``refs`` names (exact size, over
    :data:`MIN_REFERENCED_BYTES`) turned into an external-data reference under ``folder``.
    """
    out = onnx.ModelProto()
    _copy_fields(model, out, skip={"graph"})
    graph = model.graph
    _copy_fields(graph, out.graph, skip={"initializer"})
    for tensor in graph.initializer:
        ref = _referenced(tensor, refs)
        dst = out.graph.initializer.add()
        if ref is None:
            dst.CopyFrom(tensor)
            continue
        _copy_fields(tensor, dst, skip=_DATA_FIELDS)
        dst.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", ref.location),
            ("offset", str(ref.offset)),
            ("length", str(ref.length)),
        ):
            entry = dst.external_data.add()
            entry.key = key
            entry.value = value
    return StubModel(out.SerializeToString(), str(folder))


def structure_only(model: onnx.ModelProto, refs: Mapping[str, WeightRef]) -> onnx.ModelProto:
    """``model`` for a structural ``onnx.checker`` pass: each initializer
    :func:`stub_model` would reference becomes a typed graph input (dropped for IR < 4);
    everything else is kept and checked."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip={"graph"})
    graph = model.graph
    _copy_fields(graph, out.graph, skip={"initializer"})
    declared = {v.name for v in graph.input}
    for tensor in graph.initializer:
        if _referenced(tensor, refs) is None:
            out.graph.initializer.add().CopyFrom(tensor)
        elif tensor.name not in declared:
            out.graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    return out
