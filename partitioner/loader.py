"""Load, check and concretise an ONNX model (InfScaler §IV-A, step 0 of the offline phase).

:func:`load_model` returns the canonical :class:`LoadedModel`: checked, unique node names,
concrete input shapes and a static shape and dtype for every top-level tensor.
More: docs/architecture.md, "`partitioner/loader.py`".
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from infscaler.base.errors import ModelLoadError, ShapeError
from infscaler.engines.onnxrt.loader import load_session
from infscaler.partitioner.subgraphs import node_reads
from infscaler.partitioner.weights import (
    MIN_REFERENCED_BYTES,
    StubModel,
    WeightRef,
    raw_data_offsets,
    stub_model,
    tensor_nbytes,
)

log = logging.getLogger(__name__)
_TWO_GB = 2**31


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's static shape (``()`` for a scalar) and numpy dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Size in bytes (int(prod(shape)) * itemsize)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype.name, "bytes": self.nbytes}


@dataclass
class LoadedModel:
    """A checked model with concrete shapes.

    Attributes:
        path, sha256: the file it came from and the hex digest of its bytes.
        model: the canonical ``onnx.ModelProto``.
        tensors: name -> :class:`TensorInfo` for every top-level value.
        input_shapes: graph input -> concrete shape; symbolic_inputs: the file's dims.
        external: external data or over 2 GB; file_runnable: the file runs as is.
        weight_refs: initializer -> :class:`~.weights.WeightRef` for located large ones.
        weights_dir: the model's folder (None without refs); weight_files: referenced file
            -> (size, mtime_ns).
    """

    path: Path
    model: onnx.ModelProto
    sha256: str
    tensors: dict[str, TensorInfo]
    input_shapes: dict[str, tuple[int, ...]]
    symbolic_inputs: dict[str, list[int | str]]
    external: bool = False
    initializer_names: set[str] = field(default_factory=set)
    file_runnable: bool = False
    weight_refs: dict[str, WeightRef] = field(default_factory=dict)
    weights_dir: Path | None = None
    weight_files: dict[str, tuple[int, int]] = field(default_factory=dict)

    def stub(self, model: onnx.ModelProto | None = None) -> StubModel | None:
        """``model`` (default: the canonical one; or a partition of it) with its large
        weights referenced from this model's files (:mod:`.weights`), for the
        partitioner's cpu sessions; None when nothing could be referenced or a
        referenced file changed on disk since it was loaded."""
        if not self.weight_refs or self.weights_dir is None:
            return None
        for location, stamp in self.weight_files.items():
            if _file_stamp(self.weights_dir / location) != stamp:
                return None
        target = self.model if model is None else model
        return stub_model(target, self.weight_refs, str(self.weights_dir))

    @property
    def session_source(self) -> str | onnx.ModelProto:
        """What to build an onnxruntime session of the whole model from: the file's path
        when it runs as is and its node names are the canonical ones (no re-serialisation
        of the weights), else the canonical model."""
        return str(self.path) if self.file_runnable else self.model

    @property
    def graph_inputs(self) -> list[str]:
        """Names of the runtime inputs (graph inputs that are not initializers)."""
        return [i.name for i in self.model.graph.input if i.name not in self.initializer_names]

    @property
    def graph_outputs(self) -> list[str]:
        return [o.name for o in self.model.graph.output]


def parse_shapes(spec: str | None) -> dict[str, tuple[int, ...]]:
    """Parse ``"x:1x3x640x640,mask:1x128"`` (trtexec) or ``"x:[1,3,640,640] mask:[1,128]"``
    (Polygraphy) into input name -> shape (the name ends at the last ``:``; ``name:`` is a scalar).

    Raises:
        ShapeError: a malformed entry (the message quotes it).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    if not spec:
        return shapes
    # Polygraphy's [1,3,640,640] -> trtexec's 1x3x640x640 ([] -> a scalar)
    spec = re.sub(
        r"\[([^\]]*)\]", lambda m: "x".join(d.strip() for d in m.group(1).split(",")), spec
    )
    for entry in re.split(r"[,\s]+", spec):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, dims = entry.rpartition(":")
        if not sep or not name:
            raise ShapeError(
                f"bad --shapes entry '{entry}': expected NAME:DxDxD",
                hint="e.g. --shapes x:1x3x640x640 (several entries separated by commas; "
                "Polygraphy's x:[1,3,640,640] works too)",
            )
        if dims == "":
            shapes[name] = ()
            continue
        if not re.fullmatch(r"\d+(x\d+)*", dims):
            raise ShapeError(
                f"bad --shapes entry '{entry}': dims must be positive integers joined by 'x'",
                hint="e.g. --shapes x:1x3x640x640",
            )
        shape = tuple(int(d) for d in dims.split("x"))
        if any(d <= 0 for d in shape):
            raise ShapeError(f"bad --shapes entry '{entry}': every dim must be >= 1")
        shapes[name] = shape
    return shapes


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dims(value: onnx.ValueInfoProto) -> list[int | str] | None:
    t = value.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    out: list[int | str] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append("?")
    return out


def _elem_dtype(value: onnx.ValueInfoProto) -> np.dtype | None:
    t = value.type
    if not t.HasField("tensor_type") or t.tensor_type.elem_type == TensorProto.UNDEFINED:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type))


@dataclass
class _ReadModel:
    model: onnx.ModelProto
    external: bool  # over 2 GB: weights stay in external files, not loaded
    sha256: str
    check_bytes: bytes | None  # the file's bytes, when onnx.checker may check them
    weight_refs: dict[str, WeightRef]
    weights_dir: Path | None
    weight_files: dict[str, tuple[int, int]]


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_model(path: Path) -> _ReadModel:
    """Parse the file, hash it and locate its large weights (see :class:`_ReadModel`).

    A file under 2 GB is read once: the same bytes are hashed (in a thread: hashlib
    releases the GIL) while protobuf parses them."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}", hint="check the path")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not an ONNX model file")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"cannot read {path}: permission denied")
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes), not an ONNX model")
    data: bytes | None = None
    try:
        if size < _TWO_GB:
            data = path.read_bytes()
            with ThreadPoolExecutor(max_workers=1) as pool:
                digest = pool.submit(_sha256_hex, data)
                try:
                    model = onnx.load_model_from_string(data)
                finally:
                    sha = digest.result()
        else:
            model = onnx.load(str(path), load_external_data=False)
            sha = file_sha256(path)
    except Exception as exc:  # protobuf DecodeError, or garbage that is not a ModelProto
        raise ModelLoadError(
            f"{path} is not a valid ONNX model: the protobuf could not be parsed "
            f"({type(exc).__name__}: {str(exc)[:200]}); the file may be truncated or another format",
            hint="re-export or re-download the model; an ONNX file is a binary ModelProto",
        ) from None
    if not model.opset_import or len(model.graph.node) == 0 or not model.graph.output:
        raise ModelLoadError(
            f"{path} does not hold an ONNX model (no graph, opset or outputs were found); "
            "it may be truncated or another format",
            hint="re-export or re-download the model",
        )
    external = size >= _TWO_GB or any(
        onnx.external_data_helper.uses_external_data(t)
        for t in onnx.external_data_helper._get_all_tensors(model)
    )
    refs, weights_dir, weight_files = _weight_refs(path, model, data)
    check_bytes = data if not external else None
    if external and size < _TWO_GB:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise ModelLoadError(
                f"{path} refers to external weight files that could not be read: {exc}",
                hint="keep the model's external data files beside the .onnx file",
            ) from None
        external = False
    return _ReadModel(model, external, sha, check_bytes, refs, weights_dir, weight_files)


def _file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _weight_refs(
    path: Path, model: onnx.ModelProto, data: bytes | None
) -> tuple[dict[str, WeightRef], Path | None, dict[str, tuple[int, int]]]:
    """Where the large top-level initializers' data lies on disk (see :mod:`.weights`)."""
    resolved = path.resolve()
    folder = resolved.parent
    refs: dict[str, WeightRef] = {}
    spans = raw_data_offsets(data) if data is not None else {}
    same_folder = path.absolute().parent.resolve() == folder
    for t in model.graph.initializer:
        size = tensor_nbytes(t)
        if size is None or size <= MIN_REFERENCED_BYTES:
            continue
        if onnx.external_data_helper.uses_external_data(t):
            info = onnx.external_data_helper.ExternalDataInfo(t)
            location = str(info.location or "")
            parts = Path(location).parts
            length = int(info.length) if info.length else size
            if (
                same_folder
                and parts
                and not Path(location).is_absolute()
                and ".." not in parts
                and length == size
            ):
                refs[t.name] = WeightRef(location, int(info.offset or 0), size)
            continue
        span = spans.get(t.name)
        if span is not None and span[1] == size:
            refs[t.name] = WeightRef(resolved.name, span[0], size)
    files: dict[str, tuple[int, int]] = {}
    for location in {r.location for r in refs.values()}:
        stamp = _file_stamp(folder / location)
        if stamp is None:  # vanished: reference nothing in it
            refs = {n: r for n, r in refs.items() if r.location != location}
        else:
            files[location] = stamp
    return refs, (folder if refs else None), files


def _check(model: onnx.ModelProto, path: Path, data: bytes | None = None) -> None:
    try:
        # The bytes already read when there are any (~6x faster than by path for
        # VGG-19, whose file onnx's C++ reads slowly); else by path: onnx's C++ reads the
        # file and its external data, no Python-side re-serialisation of the weights.
        onnx.checker.check_model(data if data is not None else str(path))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0][:300]
        raise ModelLoadError(
            f"{path} fails the ONNX checker: {first}",
            hint="fix or re-export the model (onnx.checker.check_model shows the full report)",
        ) from None
    _check_opsets(model, path)


def _check_opsets(model: onnx.ModelProto, path: Path) -> None:
    """Refuse default-domain opsets newer than this onnxruntime supports."""
    import onnxruntime as ort

    max_onnx = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > max_onnx:
            raise ModelLoadError(
                f"{path} uses ONNX opset {imp.version}, newer than this installation "
                f"supports (onnx {onnx.__version__}: opset {max_onnx}, onnxruntime {ort.__version__})",
                hint=f"re-export with opset <= {max_onnx}, or upgrade onnx and onnxruntime",
            )


def _check_runnable(model_bytes_or_path: bytes | str, path: Path) -> None:
    """Create an onnxruntime CPU session (no graph optimisation) to prove it can run."""
    import onnxruntime as ort

    try:
        load_session(model_bytes_or_path, threads=None, optimization="none", spinning=None)
    except ModelLoadError as exc:
        msg = str(exc.__cause__ or exc).strip().splitlines()[0][:300]
        raise ModelLoadError(
            f"onnxruntime {ort.__version__} cannot run {path}: {msg}",
            hint="check the model's opset and operators against onnxruntime's supported list",
        ) from None


def _name_nodes(model: onnx.ModelProto) -> bool:
    """Give every node a unique non-empty name; True when a name was changed."""
    changed = False
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{i}"
            name = base
            while name in seen:
                name += "_"
            node.name = name
            changed = True
        seen.add(node.name)
    return changed


def _apply_input_shapes(
    model: onnx.ModelProto,
    runtime_inputs: list[onnx.ValueInfoProto],
    shapes: dict[str, tuple[int, ...]],
    path: Path,
) -> dict[str, tuple[int, ...]]:
    names = [i.name for i in runtime_inputs]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ShapeError(
            f"--shapes names {', '.join(repr(u) for u in unknown)}, which "
            f"{'is not an input' if len(unknown) == 1 else 'are not inputs'} of {path.name}",
            hint=f"the model's inputs are: {', '.join(names)}",
        )
    concrete: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    for value in runtime_inputs:
        dims = _dims(value)
        if dims is None:
            raise ShapeError(f"input '{value.name}' of {path.name} is not a tensor with a shape")
        if value.name in shapes:
            given = shapes[value.name]
            if len(given) != len(dims):
                raise ShapeError(
                    f"--shapes gives input '{value.name}' rank {len(given)} "
                    f"({'x'.join(map(str, given))}), but the model declares rank {len(dims)} "
                    f"({'x'.join(map(str, dims))})"
                )
            for axis, (g, d) in enumerate(zip(given, dims, strict=True)):
                if isinstance(d, int) and d != g:
                    raise ShapeError(
                        f"--shapes gives input '{value.name}' dim {axis} = {g}, but the model "
                        f"fixes it to {d} ({'x'.join(map(str, dims))})"
                    )
            concrete[value.name] = given
        else:
            dynamic = [f"dim {a} '{d}'" for a, d in enumerate(dims) if not isinstance(d, int)]
            if len(dynamic) == 1 and not isinstance(dims[0], int) and len(dims) > 1:
                # only the leading (batch) dim is dynamic: take 1, as trtexec does
                concrete[value.name] = (1, *(int(d) for d in dims[1:]))
                example = "x".join(["4", *(str(d) for d in dims[1:])])
                log.warning(
                    "input '%s' of %s has a dynamic batch dim '%s': using 1 (trtexec's "
                    "default); give --shapes %s:%s for another",
                    value.name,
                    path.name,
                    dims[0],
                    value.name,
                    example,
                )
                continue
            if dynamic:
                example = "x".join(str(d) if isinstance(d, int) else "N" for d in dims)
                missing.append(
                    f"input '{value.name}' ({'x'.join(map(str, dims))}) has dynamic "
                    f"{', '.join(dynamic)}; e.g. --shapes {value.name}:{example}"
                )
            else:
                concrete[value.name] = tuple(int(d) for d in dims)
    if missing:
        raise ShapeError(
            f"{path.name} has dynamic dimensions and no concrete shape was given: "
            + "; ".join(missing),
            hint="give every dynamic input a concrete shape with --shapes NAME:DxDxD[,NAME:...] "
            "(trtexec's convention)",
        )
    for value in runtime_inputs:
        dim_protos = value.type.tensor_type.shape.dim
        for d, size in zip(dim_protos, concrete[value.name], strict=True):
            d.Clear()
            d.dim_value = size
    return concrete


def _collect_tensors(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for init in model.graph.initializer:
        tensors[init.name] = TensorInfo(
            tuple(int(d) for d in init.dims),
            np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)),
        )
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if value.name in tensors:
            continue
        dims, dtype = _dims(value), _elem_dtype(value)
        if dims is not None and dtype is not None and all(isinstance(d, int) for d in dims):
            tensors[value.name] = TensorInfo(tuple(dims), dtype)  # type: ignore[arg-type]
    return tensors


def random_feeds(inputs: dict[str, TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs: floats U[0, 1), integers in [0, 100), bools 50/50."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, info in inputs.items():
        if np.issubdtype(info.dtype, np.floating):
            feeds[name] = rng.random(info.shape).astype(info.dtype)
        elif info.dtype == np.bool_:
            feeds[name] = rng.random(info.shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 100, size=info.shape).astype(info.dtype)
    return feeds


def _shapes_by_execution(
    model: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray]
) -> dict[str, TensorInfo]:
    """Run ``model`` once with every name in ``names`` exposed as an output; record shapes."""

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = load_session(probe, threads=None, optimization="none", spinning=None)
    out_names = [o.name for o in sess.get_outputs()]
    values = sess.run(out_names, feeds)
    return {
        n: TensorInfo(tuple(int(d) for d in v.shape), np.asarray(v).dtype)
        for n, v in zip(out_names, values, strict=True)
        if n in names
    }


def _set_value_info(model: onnx.ModelProto, tensors: dict[str, TensorInfo]) -> None:
    """Write ``tensors`` into the graph's value_info (skipping inputs / outputs / inits)."""
    graph = model.graph
    skip = (
        {v.name for v in graph.input}
        | {v.name for v in graph.output}
        | {i.name for i in graph.initializer}
    )
    by_name = {v.name: v for v in graph.value_info}
    for name, info in tensors.items():
        if name in skip:
            continue
        vi = onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(info.dtype), list(info.shape)
        )
        if name in by_name:
            by_name[name].CopyFrom(vi)
        else:
            graph.value_info.append(vi)
    for out in graph.output:
        if out.name in tensors and _dims(out) != list(tensors[out.name].shape):
            info = tensors[out.name]
            out.CopyFrom(
                onnx.helper.make_tensor_value_info(
                    out.name, onnx.helper.np_dtype_to_tensor_dtype(info.dtype), list(info.shape)
                )
            )


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Strict ONNX shape inference with data propagation into ``model``, run weight-free.

    Raises:
        onnx.shape_inference.InferenceError: inference failed.
    """
    graph = model.graph
    itemsize = {}

    def nbytes(init: onnx.TensorProto) -> int:
        if init.data_type not in itemsize:
            itemsize[init.data_type] = np.dtype(
                onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
            ).itemsize
        return int(np.prod(init.dims, dtype=np.int64)) * itemsize[init.data_type]

    big = [i for i in graph.initializer if nbytes(i) > 4096]
    big_names = {i.name for i in big}
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    lg = light.graph
    lg.name = graph.name
    lg.node.extend(graph.node)
    lg.initializer.extend(i for i in graph.initializer if i.name not in big_names)
    lg.sparse_initializer.extend(graph.sparse_initializer)
    lg.input.extend(graph.input)
    declared = {v.name for v in graph.input}
    lg.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
        for i in big
        if i.name not in declared
    )
    lg.output.extend(graph.output)
    lg.value_info.extend(graph.value_info)
    inferred = onnx.shape_inference.infer_shapes(
        light, check_type=True, strict_mode=True, data_prop=True
    )
    del graph.value_info[:]
    graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in big_names)
    del graph.output[:]
    graph.output.extend(inferred.graph.output)
    # Inference also annotates subgraphs (If / Loop bodies) on the copy's nodes.
    for node, done in zip(graph.node, inferred.graph.node, strict=True):
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            node.CopyFrom(done)
    return model


def load_model(
    path: str | os.PathLike[str],
    shapes: dict[str, tuple[int, ...]] | str | None = None,
    *,
    check_runnable: bool = True,
) -> LoadedModel:
    """Load, check and concretise an ONNX model at ``path``.

    Args:
        shapes: concrete shapes for dynamic dims, a dict or a ``--shapes`` string.
        check_runnable: also build an onnxruntime CPU session.

    Raises:
        ModelLoadError: missing or bad file, checker failure, an opset or operator
            onnxruntime cannot run, unreadable external data.
        ShapeError: bad ``shapes``, dynamic dims left unset, or uninferable shapes.
    """
    path = Path(path)
    if isinstance(shapes, str) or shapes is None:
        shapes = parse_shapes(shapes)
    raw = _read_model(path)
    model, external, sha = raw.model, raw.external, raw.sha256
    _check(model, path, raw.check_bytes)
    raw.check_bytes = None

    init_names = {i.name for i in model.graph.initializer}
    runtime_inputs = [v for v in model.graph.input if v.name not in init_names]
    symbolic = {v.name: (_dims(v) or []) for v in runtime_inputs}
    concrete = _apply_input_shapes(model, runtime_inputs, shapes, path)
    renamed = _name_nodes(model)

    try:
        inferred = _infer_shapes(model)
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0][:300]
        raise ShapeError(
            f"ONNX shape inference failed for {path.name} with input shapes "
            f"{ {k: 'x'.join(map(str, v)) for k, v in concrete.items()} }: {msg}",
            hint="check --shapes against what the model expects (spatial sizes, multiples)",
        ) from None

    if check_runnable:
        # The file itself when only shapes differ (no re-serialisation of large weights);
        # the renamed model when the file's node names were missing or duplicated
        # (onnxruntime refuses duplicates).
        by_path = external or not renamed
        _check_runnable(str(path) if by_path else model.SerializeToString(), path)

    tensors = _collect_tensors(inferred)
    # Tensors that something reads (a node, a subgraph, or the graph's outputs) need a
    # shape; an optional output nobody reads (Dropout's mask) does not.
    read = {t for n in inferred.graph.node for t in node_reads(n)}
    needed = {o for n in inferred.graph.node for o in n.output if o and o in read} | {
        o.name for o in inferred.graph.output
    }
    unresolved = sorted(n for n in needed if n not in tensors)
    if unresolved:
        feeds = random_feeds({n: tensors[n] for n in concrete}, seed=0)
        try:
            tensors.update(_shapes_by_execution(inferred, unresolved, feeds))
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:300]
            raise ShapeError(
                f"shapes of {len(unresolved)} tensors of {path.name} (e.g. '{unresolved[0]}') "
                f"could not be inferred, and a trial run with the given input shapes failed: {msg}",
                hint="check --shapes against what the model expects",
            ) from None
        still = [n for n in unresolved if n not in tensors]
        if still:
            raise ShapeError(
                f"the shapes of {', '.join(still[:5])} in {path.name} cannot be inferred"
            )
        _set_value_info(inferred, tensors)

    return LoadedModel(
        path=path,
        model=inferred,
        sha256=sha,
        tensors=tensors,
        input_shapes=concrete,
        symbolic_inputs=symbolic,
        external=external,
        initializer_names=init_names,
        file_runnable=external or not renamed,
        weight_refs=raw.weight_refs,
        weights_dir=raw.weights_dir,
        weight_files=raw.weight_files,
    )
