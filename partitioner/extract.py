"""Partitions as ONNX sub-models, and the chain's verification (InfScaler §IV-A).

Partition k reads partition k-1's outputs (a tensor may pass through unchanged); tensor
names are the canonical model's. More: docs/architecture.md, "`partitioner/extract.py`".
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infscaler.base.errors import PartitionError, VerificationError
from infscaler.engines.onnxrt.loader import load_session, session_options
from infscaler.partitioner.loader import LoadedModel, random_feeds
from infscaler.partitioner.subgraphs import free_names, subgraphs
from infscaler.partitioner.weights import StubModel, structure_only

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "Chain",
    "PartitionSpec",
    "Verification",
    "check_verification",
    "extract_partition",
    "load_sessions",
    "save_partition",
    "verify_chain",
]

#: A sub-model whose serialised size exceeds this (2 GiB - 64 MiB, i.e. protobuf's 2 GiB
#: limit with a margin) is saved with its weights in one external data file.
EXTERNAL_DATA_THRESHOLD = 2**31 - 64 * 2**20

_PROTOBUF_LIMIT = 2**31

#: A part of a chain: an ``onnx.ModelProto``, a path to an ``.onnx`` file, a
#: :class:`~.weights.StubModel` (weights read from the model's file), or an
#: ``onnxruntime.InferenceSession``.
PartLike = Any


@dataclass
class PartitionSpec:
    """One operator group of a plan (a P_k of Eq. 1) and its boundary tensors.

    Attributes:
        index: position k in the chain (0-based).
        nodes: node names in topological order, with constant-foldable helpers feeding them.
        inputs / outputs: boundary tensor names (a name in both passes through).
    """

    index: int
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


# --------------------------------------------------------------------------- extraction


def _value_info(
    loaded: LoadedModel, name: str, originals: Mapping[str, onnx.ValueInfoProto]
) -> onnx.ValueInfoProto | None:
    """Typed ValueInfo for ``name``: static shape/dtype from ``loaded.tensors``, else the
    original model's declaration (e.g. a sequence type), else None."""
    info = loaded.tensors.get(name)
    if info is not None:
        return onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(info.dtype), list(info.shape)
        )
    orig = originals.get(name)
    if orig is not None and orig.type.WhichOneof("value") is not None:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(orig)
        return vi
    return None


def _describe_producer(name: str, producers: Mapping[str, str], loaded: LoadedModel) -> str:
    if name in producers:
        return f"it is produced by node '{producers[name]}'"
    if name in loaded.graph_inputs:
        return "it is a runtime input of the model"
    return "no node of the model produces it"


def extract_partition(loaded: LoadedModel, spec: PartitionSpec) -> onnx.ModelProto:
    """Build partition ``spec`` of ``loaded`` as a valid, stand-alone ONNX model (its nodes,
    the initializers they use, typed boundary inputs / outputs, opsets and functions).

    Raises:
        PartitionError: an unknown or repeated node, an input nothing provides, an output
            nothing makes, an untyped or initializer boundary, duplicate names, or an
            ``onnx.checker`` failure (the message names partition, tensor and node).
    """
    graph = loaded.model.graph
    k = spec.index
    where = f"partition {k}"
    inits = {t.name: t for t in graph.initializer}
    sparse_inits = {s.values.name: s for s in graph.sparse_initializer}
    originals: dict[str, onnx.ValueInfoProto] = {}
    for v in [*graph.output, *graph.value_info, *graph.input]:
        originals[v.name] = v

    _check_boundary_names(spec, where, inits, sparse_inits)
    chosen, used_inits = _chosen_nodes(loaded, spec, where, inits, sparse_inits)
    g_inputs = [_typed(loaded, n, "input", where, originals) for n in spec.inputs]
    g_outputs = [_typed(loaded, n, "output", where, originals) for n in spec.outputs]
    boundary = set(spec.inputs) | set(spec.outputs)
    internal: list[onnx.ValueInfoProto] = []
    for node in chosen:
        for out in node.output:
            if out and out not in boundary:
                vi = _value_info(loaded, out, originals)
                if vi is not None:
                    internal.append(vi)

    # --- the sub-model, built in place: each weight is copied once (in the original
    # order; loaded into memory if it was external)
    model = onnx.ModelProto()
    model.ir_version = loaded.model.ir_version
    model.opset_import.extend(loaded.model.opset_import)
    model.functions.extend(loaded.model.functions)
    model.producer_name = "infscaler"
    model.producer_version = _version()
    model.domain = loaded.model.domain
    model.model_version = loaded.model.model_version
    model.doc_string = (
        f"InfScaler partition {k} of {loaded.path.name} (sha256 {loaded.sha256[:12]})"
    )
    sub_graph = model.graph
    sub_graph.node.extend(chosen)
    sub_graph.name = f"{graph.name or 'graph'}_part{k}"
    _copy_initializers(loaded, sub_graph, used_inits, where)
    if loaded.model.ir_version < 4:
        listed = set(spec.inputs)
        for t in sub_graph.initializer:
            if t.name not in listed:
                g_inputs.append(
                    onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                )
    sub_graph.input.extend(g_inputs)
    sub_graph.output.extend(g_outputs)
    sub_graph.value_info.extend(internal)
    sub_graph.sparse_initializer.extend(s for name, s in sparse_inits.items() if name in used_inits)
    sub_graph.doc_string = (
        f"InfScaler partition {k} of {loaded.path.name}: {len(chosen)} nodes, "
        f"inputs {list(spec.inputs)}, outputs {list(spec.outputs)}"
    )
    _check_partition(model, where, loaded)
    return model


def _check_boundary_names(
    spec: PartitionSpec,
    where: str,
    inits: Mapping[str, onnx.TensorProto],
    sparse_inits: Mapping[str, onnx.SparseTensorProto],
) -> None:
    """Refuse a name listed twice in ``spec``'s inputs or outputs, and a weight as input."""
    for label, names in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PartitionError(f"{where} lists {label} {', '.join(map(repr, dup))} twice")
    for name in spec.inputs:
        if name in inits or name in sparse_inits:
            raise PartitionError(
                f"{where} input '{name}' is an initializer (a weight); weights are not "
                "passed between partitions, each partition holds the ones it uses"
            )


def _chosen_nodes(
    loaded: LoadedModel,
    spec: PartitionSpec,
    where: str,
    inits: Mapping[str, onnx.TensorProto],
    sparse_inits: Mapping[str, onnx.SparseTensorProto],
) -> tuple[list[onnx.NodeProto], dict[str, None]]:
    """``spec``'s nodes in order, each checked to read only the partition's inputs,
    weights and earlier nodes' outputs, and the names of the initializers they use (in
    first-use order); every spec output checked to be defined in the partition."""
    graph = loaded.model.graph
    nodes_by_name = {n.name: n for n in graph.node}
    producers = {o: n.name for n in graph.node for o in n.output if o}
    defined: set[str] = set(spec.inputs)
    used_inits: dict[str, None] = {}
    seen_nodes: set[str] = set()
    chosen: list[onnx.NodeProto] = []
    for node_name in spec.nodes:
        node = nodes_by_name.get(node_name)
        if node is None:
            raise PartitionError(
                f"{where} names node '{node_name}', which is not a node of {loaded.path.name}",
                hint="node names refer to the canonical model returned by load_model",
            )
        if node_name in seen_nodes:
            raise PartitionError(f"{where} lists node '{node_name}' twice")
        seen_nodes.add(node_name)
        refs = [(n, False) for n in node.input if n]
        for sub in subgraphs(node):
            refs.extend((n, True) for n in free_names(sub))
        for name, in_subgraph in refs:
            if name in defined:
                continue
            if name in inits or name in sparse_inits:
                used_inits.setdefault(name)
                continue
            how = (
                f"a subgraph of node '{node_name}' ({node.op_type}) refers to outer-scope "
                f"tensor '{name}'"
                if in_subgraph
                else f"node '{node_name}' ({node.op_type}) reads tensor '{name}'"
            )
            raise PartitionError(
                f"{where}: {how}, which is neither an input of the partition, an "
                f"initializer, nor produced by an earlier node of the partition "
                f"({_describe_producer(name, producers, loaded)})",
                hint=f"add '{name}' to the partition's inputs (and to the previous "
                "partition's outputs), or move its producer into the partition before "
                f"'{node_name}'",
            )
        for out in node.output:
            if out and out in spec.inputs:
                raise PartitionError(
                    f"{where}: tensor '{out}' is an input of the partition but node "
                    f"'{node_name}' of the same partition produces it"
                )
        defined.update(o for o in node.output if o)
        chosen.append(node)
    for name in spec.outputs:
        if name not in defined:
            raise PartitionError(
                f"{where}: output '{name}' is neither produced by a node of the partition "
                f"nor an input passing through ({_describe_producer(name, producers, loaded)})",
                hint=f"add '{name}' to the partition's inputs so that it passes through, or "
                "move its producer into the partition",
            )
    return chosen, used_inits


def _typed(
    loaded: LoadedModel,
    name: str,
    role: str,
    where: str,
    originals: Mapping[str, onnx.ValueInfoProto],
) -> onnx.ValueInfoProto:
    """The typed ValueInfo of boundary tensor ``name``; PartitionError without a static shape."""
    vi = _value_info(loaded, name, originals)
    if vi is None:
        raise PartitionError(
            f"{where}: {role} '{name}' has no known static shape and dtype",
            hint="load the model with concrete --shapes for its dynamic inputs",
        )
    return vi


def _copy_initializers(
    loaded: LoadedModel, sub_graph: onnx.GraphProto, used_inits: Mapping[str, None], where: str
) -> None:
    """Copy the initializers in ``used_inits`` into ``sub_graph`` in the model's order,
    external data read into memory. Raises: PartitionError (unreadable external data)."""
    base_dir = str(loaded.path.parent)
    for t in loaded.model.graph.initializer:
        if t.name in used_inits:
            copy = sub_graph.initializer.add()
            copy.CopyFrom(t)
            if onnx.external_data_helper.uses_external_data(copy):
                try:
                    onnx.external_data_helper.load_external_data_for_tensor(copy, base_dir)
                except Exception as exc:
                    raise PartitionError(
                        f"{where}: weight '{t.name}' could not be read from the external "
                        f"data beside {loaded.path}: {exc}"
                    ) from None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("infscaler")
    except Exception:
        return "0"


def _serialize(model: onnx.ModelProto) -> bytes | None:
    """The serialised model, or None over protobuf's 2 GB limit. (Serialising is the
    only way to learn the size: upb's ``ByteSize()`` serialises too.)"""
    try:
        return model.SerializeToString()
    except ValueError:  # upb / protobuf refuse messages over 2 GB
        return None


def _check_partition(model: onnx.ModelProto, where: str, loaded: LoadedModel) -> None:
    """``onnx.checker`` on the partition's structure, the loader-located weights
    (:attr:`LoadedModel.weight_refs`, over 4 KiB) declared as typed inputs
    (:func:`~.weights.structure_only`); they were checked when the whole model loaded."""
    checked = structure_only(model, loaded.weight_refs)
    try:
        data = _serialize(checked)
        if data is not None and len(data) < _PROTOBUF_LIMIT - 2**20:
            onnx.checker.check_model(data)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "part.onnx"
                save_partition(checked, path)
                onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0][:300]
        raise PartitionError(
            f"{where} is not a valid ONNX model: {first}",
            hint="check the partition's node list and boundary tensors",
        ) from None


def save_partition(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Write a sub-model to ``path`` (parents created); over
    :data:`EXTERNAL_DATA_THRESHOLD`, with all weights in ``<path.name>.data`` beside it
    (replaced if present; ONNX "External Data"). ``model`` is not modified."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = f"{path.name}.data"
    data = _serialize(model)
    if data is not None and len(data) <= EXTERNAL_DATA_THRESHOLD:
        path.write_bytes(data)
        return
    del data
    data_path = path.parent / data_name
    if data_path.exists():
        data_path.unlink()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(
        copy,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data_name,
        size_threshold=1024,
    )


# --------------------------------------------------------------------------- running


def _make_session(part: PartLike, engine: str, options: Any) -> Any:
    import onnxruntime as ort

    if isinstance(part, ort.InferenceSession):
        return part
    if isinstance(part, StubModel):
        return part.session(options, engine)
    if isinstance(part, onnx.ModelProto):
        data = _serialize(part)
        if data is not None and len(data) < _PROTOBUF_LIMIT - 2**20:
            return load_session(data, engine=engine, options=options)
        del data
        # Over protobuf's limit: onnxruntime must read it from a file with external data.
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "part.onnx"
            save_partition(part, path)
            return load_session(path, engine=engine, options=options)
    return load_session(part, engine=engine, options=options)


def load_sessions(
    parts: Sequence[PartLike], engine: str = "cpu", session_options: Any = None
) -> list[Any]:
    """One ``InferenceSession`` per part on ``engine`` (``ORT_ENABLE_ALL`` by default).

    Raises:
        EngineUnavailable: the host lacks ``engine`` or onnxruntime does not serve it.
        ModelLoadError: onnxruntime cannot load a part.
    """
    options = session_options if session_options is not None else _session_options()
    return [_make_session(p, engine, options) for p in parts]


class Chain:
    """Partitions run one after another in-process, each reading its inputs by name.

    Attributes:
        sessions: the ``InferenceSession`` of each part.
        part_inputs / part_outputs: each part's input / output names.
        inputs: names the chain needs from the caller; outputs: the last part's.
    """

    def __init__(
        self,
        parts: Sequence[PartLike],
        engine: str = "cpu",
        session_options: Any = None,
    ) -> None:
        if not parts:
            raise PartitionError("a chain needs at least one partition")
        self.sessions = load_sessions(parts, engine, session_options)
        self.part_inputs = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self.part_outputs = [[o.name for o in s.get_outputs()] for s in self.sessions]
        produced: set[str] = set()
        needed: dict[str, None] = {}
        for ins, outs in zip(self.part_inputs, self.part_outputs, strict=True):
            for n in ins:
                if n not in produced:
                    needed.setdefault(n)
            produced.update(outs)
        self.inputs = list(needed)
        self.outputs = list(self.part_outputs[-1])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The last part's outputs by name; PartitionError for a tensor nothing provides."""
        env: dict[str, np.ndarray] = dict(feeds)
        values: list[np.ndarray] = []
        for k, (sess, ins, outs) in enumerate(
            zip(self.sessions, self.part_inputs, self.part_outputs, strict=True)
        ):
            try:
                part_feeds = {n: env[n] for n in ins}
            except KeyError as exc:
                raise PartitionError(
                    f"partition {k} needs tensor '{exc.args[0]}', which neither the feeds "
                    "nor an earlier partition provides"
                ) from None
            values = sess.run(outs, part_feeds)
            env.update(zip(outs, values, strict=True))
        return dict(zip(self.outputs, values, strict=True))

    __call__ = run


# --------------------------------------------------------------------------- verification


@dataclass
class Verification:
    """Outcome of :func:`verify_chain`; ``max_rel`` = ``max |chain - whole| / max |whole|``.

    Attributes:
        max_abs, max_rel: largest errors over all outputs (``inf`` on mismatch or failure).
        per_output: name -> ``{"max_abs", "max_rel", "scale", "shape", "dtype", "ok", "reason"}``.
        rtol, passed, error, feeds_seed: the tolerance, the verdict, why a run failed, the seed.
        optimized: ``{"max_abs", "max_rel", "noise_max_rel"}`` fully optimised (not checked).
        reference: the whole model's unoptimised outputs (not serialised).
    """

    max_abs: float
    max_rel: float
    per_output: dict[str, dict]
    rtol: float
    passed: bool
    error: str | None = None
    feeds_seed: int | None = None
    optimized: dict | None = None
    reference: dict[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def worst_output(self) -> str | None:
        """The output with the largest ``max_rel`` (None without outputs)."""
        if not self.per_output:
            return None
        return max(self.per_output, key=lambda n: _nan_high(self.per_output[n]["max_rel"]))

    def to_dict(self) -> dict:
        """JSON-ready dict (``inf`` stays a float: ``json.dumps`` writes ``Infinity``)."""
        return {
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "rtol": self.rtol,
            "passed": self.passed,
            "error": self.error,
            "seed": self.feeds_seed,
            "worst_output": self.worst_output,
            "per_output": {k: dict(v) for k, v in self.per_output.items()},
            "optimized": self.optimized,
        }


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _compare(whole: np.ndarray, chain: np.ndarray | None) -> dict:
    """Per-output errors (see :class:`Verification`)."""
    ref = np.asarray(whole)
    res: dict[str, Any] = {
        "shape": list(ref.shape),
        "dtype": ref.dtype.name,
        "scale": 0.0,
        "max_abs": math.inf,
        "max_rel": math.inf,
        "ok": False,
        "reason": None,
    }
    if chain is None:
        res["reason"] = "the chain does not produce this output"
        return res
    got = np.asarray(chain)
    if got.shape != ref.shape:
        res["reason"] = f"shape {list(got.shape)} differs from the whole model's {list(ref.shape)}"
        return res
    if got.dtype != ref.dtype:
        res["reason"] = f"dtype {got.dtype.name} differs from the whole model's {ref.dtype.name}"
        return res
    if ref.dtype == np.bool_ or not np.issubdtype(ref.dtype, np.number):
        equal = bool(np.array_equal(ref, got))
        res.update(max_abs=0.0 if equal else math.inf, max_rel=0.0 if equal else math.inf)
        res["ok"] = equal
        res["reason"] = None if equal else "values differ"
        return res
    a = ref.astype(np.float64)
    b = got.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        res["reason"] = "NaN / inf values differ from the whole model's"
        return res
    if a.size == 0 or not fa.any():
        res.update(max_abs=0.0, max_rel=0.0, ok=True)
        return res
    max_abs = float(np.max(np.abs(a[fa] - b[fa])))
    scale = float(np.max(np.abs(a[fa])))
    # an all-zero reference: any difference is an infinite relative error
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    res.update(max_abs=max_abs, max_rel=max_rel, scale=scale, ok=True)
    return res


def _session_options(optimized: bool = True, threads: int | None = None) -> Any:
    """The engine layer's session options: full graph optimisations, or none; warnings
    silenced; ``threads`` intra-op threads (None: onnxruntime's default); spinning as
    onnxruntime's default (verification is not served)."""

    return session_options(threads, optimization="all" if optimized else "none", spinning=None)


def _max_errors(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]
) -> tuple[float, float]:
    per = [_compare(ref[n], got.get(n)) for n in ref]
    return (
        max((_nan_high(p["max_abs"]) for p in per), default=0.0),
        max((_nan_high(p["max_rel"]) for p in per), default=0.0),
    )


def verify_chain(
    loaded: LoadedModel,
    parts: Sequence[PartLike],
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-4,
    seed: int = 0,
    engine: str = "cpu",
    report_optimized: bool = True,
    reference: Mapping[str, np.ndarray] | None = None,
    threads: int | None = None,
) -> Verification:
    """Compare the chain of ``parts`` with the whole model on the same inputs, both without
    graph optimisation.

    Args:
        feeds: explicit inputs; default seeded random feeds (``seed``).
        rtol: tolerance on ``max_rel`` (default 1e-4).
        report_optimized: also measure the optimised comparison (two more runs).
        reference: the whole model's unoptimised outputs, if known (skips that run).
        threads: intra-op threads of every session (None: onnxruntime's default).

    Returns:
        The :class:`Verification`; a bad chain gives ``passed=False``, never an exception.
    """
    used_seed: int | None = None
    if feeds is None:
        feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs}, seed=seed)
        used_seed = seed
    out_names = loaded.graph_outputs
    whole_src: PartLike = loaded.session_source

    def failed(msg: str) -> Verification:
        per = {n: _failed_output(loaded, n, msg) for n in out_names}
        return Verification(math.inf, math.inf, per, rtol, False, error=msg, feeds_seed=used_seed)

    def run_whole(optimized: bool) -> dict[str, np.ndarray]:
        (sess,) = load_sessions([whole_src], engine, _session_options(optimized, threads))
        return dict(zip(out_names, sess.run(out_names, dict(feeds)), strict=True))

    if reference is not None:
        missing = [n for n in out_names if n not in reference]
        if missing:
            return failed(f"the reference lacks the model output '{missing[0]}'")
        whole = {n: reference[n] for n in out_names}
    else:
        try:
            whole = run_whole(False)
        except Exception as exc:
            return failed(f"the whole model failed to run: {_first_line(exc)}")
    try:
        got = Chain(parts, engine, _session_options(False, threads)).run(feeds)
    except Exception as exc:
        return failed(f"the chain failed to run: {_first_line(exc)}")

    per = {n: _compare(whole[n], got.get(n)) for n in out_names}
    max_abs = max((_nan_high(p["max_abs"]) for p in per.values()), default=0.0)
    max_rel = max((_nan_high(p["max_rel"]) for p in per.values()), default=0.0)
    passed = all(p["ok"] for p in per.values()) and max_rel <= rtol
    optimized = None
    if report_optimized and passed:
        try:
            whole_opt = run_whole(True)
            chain_opt = Chain(parts, engine, _session_options(True, threads)).run(feeds)
            optimized = optimized_errors(whole, whole_opt, chain_opt)
        except Exception:  # informational only; the unoptimised check already passed
            optimized = None
    return Verification(
        max_abs,
        max_rel,
        per,
        rtol,
        passed,
        feeds_seed=used_seed,
        optimized=optimized,
        reference=whole,
    )


def optimized_errors(
    reference: Mapping[str, np.ndarray],
    whole_optimized: Mapping[str, np.ndarray],
    chain_optimized: Mapping[str, np.ndarray],
) -> dict[str, float]:
    """The :attr:`Verification.optimized` dict from outputs a caller already has:
    ``{"max_abs", "max_rel"}`` of the optimised chain vs the optimised whole model, and
    ``noise_max_rel`` of the optimised vs the unoptimised (``reference``) whole model."""
    opt_abs, opt_rel = _max_errors(whole_optimized, chain_optimized)
    _, noise_rel = _max_errors(whole_optimized, reference)
    return {"max_abs": opt_abs, "max_rel": opt_rel, "noise_max_rel": noise_rel}


def _failed_output(loaded: LoadedModel, name: str, reason: str) -> dict:
    info = loaded.tensors.get(name)
    return {
        "shape": list(info.shape) if info else None,
        "dtype": info.dtype.name if info else None,
        "scale": 0.0,
        "max_abs": math.inf,
        "max_rel": math.inf,
        "ok": False,
        "reason": reason,
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def check_verification(v: Verification) -> None:
    """VerificationError (naming the worst output and tolerance) unless ``v.passed``."""
    if v.passed:
        return
    hint = "use fewer partitions or a looser --tolerance; report the model if the error is large"
    worst = v.worst_output
    if v.error is not None:
        raise VerificationError(
            f"the partitioned chain could not be verified against the whole model: {v.error}",
            hint=hint,
        )
    if worst is None:
        raise VerificationError("the partitioned chain failed verification", hint=hint)
    p = v.per_output[worst]
    reason = f" ({p['reason']})" if p.get("reason") else ""
    raise VerificationError(
        f"the partitioned chain does not reproduce the whole model: output '{worst}' "
        f"differs by max abs {p['max_abs']:.3g}, max rel {p['max_rel']:.3g} "
        f"(relative to the output's largest magnitude){reason}; tolerance rtol={v.rtol:g}",
        hint=hint,
    )
