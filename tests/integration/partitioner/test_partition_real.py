"""The offline partitioner on real models (InfScaler §IV-A, Eq. 1), end to end.

Models: PP-OCRv4 det (x:1x3x640x640) and rec (x:1x3x48x320), trained, from the
``rapidocr_onnxruntime`` wheel, and the onnx wheel's ResNet-50, VGG-19, ShuffleNet,
Inception v1 and v2 (seeded random weights).

Each model is loaded once per module (its operator graph, FLOPs and valid cuts too). For
K = 2..5 the plan comes from the pieces (``search_partitions`` on FLOPs, ``specs``,
``extract_partition``, ``verify_chain``) without profiling; ``partition_model`` with
profiling and a plan directory runs once per model, at K = 3, and is handed the model
already loaded instead of loading it again.

Besides ``verify_chain`` (the final outputs), every tensor crossing a cut is compared with
the whole model's: the random-weight ResNet-50 and ShuffleNet saturate their softmax to
one-hot, which hides any error inside the chain from a check of the final output alone.

Run time is dominated by VGG-19 (550 MB of weights: every load, extraction or session
build of its classifier part copies ~0.5 GB), so a partition that plans of several K share
(the same operator range) is extracted, checked and given a session once (from a file,
which halves onnxruntime's memory), and the chains are verified with those sessions.
"""

from __future__ import annotations

import gc
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from infscaler.base.errors import ShapeError
from infscaler.base.models import MODELS, resolve_model
from infscaler.partitioner import api, profiler
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.cost import model_costs
from infscaler.partitioner.extract import (
    PartitionSpec,
    Verification,
    extract_partition,
    save_partition,
    verify_chain,
)
from infscaler.partitioner.graph import OperatorGraph, node_reads
from infscaler.partitioner.loader import LoadedModel, file_sha256, load_model, random_feeds
from infscaler.partitioner.plan import PLAN_FILE, Plan, read_plan
from infscaler.partitioner.search import SearchResult, search_partitions

pytestmark = pytest.mark.slow

#: alias -> ``--shapes`` (None: the model's inputs are static).
SHAPES: dict[str, str | None] = {
    "ppocrv4-det": MODELS["ppocrv4-det"].shapes,  # x:1x3x640x640
    "ppocrv4-rec": MODELS["ppocrv4-rec"].shapes,  # x:1x3x48x320
    "resnet50": None,
    "vgg19": None,
    "shufflenet": None,
    "inception-v1": None,
    "inception-v2": None,
}
#: Models that are a plain chain of operators (no skip or branch edge).
CHAIN_MODELS = {"vgg19"}
KS = (2, 3, 4, 5)
PLAN_K = 3
RTOL = 1e-4
ENGINES = ("cpu", "gpu", "dla")


# --------------------------------------------------------------------------- fixtures


_CPU = ["CPUExecutionProvider"]


def _unoptimised() -> ort.SessionOptions:
    """Session options of ``verify_chain``'s exact check: no graph optimisation."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return so


@dataclass
class Part:
    """One extracted partition: its onnxruntime session and what the tests read of its
    ONNX model (the model itself is dropped: VGG-19's classifier part is 0.5 GB)."""

    spec: PartitionSpec
    session: ort.InferenceSession
    checker_error: str | None
    inputs: list[str]
    outputs: list[str]
    boundary: dict[str, tuple[list[int], np.dtype]]  # graph input / output -> dims, dtype
    nodes: list[str]
    initializers: list[tuple[str, tuple[int, ...]]]
    reads: set[str]  # every tensor a node reads (subgraph references included)
    constants: list[str]  # outputs of Constant nodes

    @classmethod
    def build(cls, loaded: LoadedModel, spec: PartitionSpec) -> Part:
        model = extract_partition(loaded, spec)
        try:
            onnx.checker.check_model(model, full_check=True)
            checker_error = None
        except onnx.checker.ValidationError as exc:
            checker_error = str(exc)
        # from a file: onnxruntime then holds one copy of the weights, not two (from bytes)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"part_{spec.index}.onnx"
            save_partition(model, path)
            session = ort.InferenceSession(str(path), _unoptimised(), providers=_CPU)
        g = model.graph
        return cls(
            spec=spec,
            session=session,
            checker_error=checker_error,
            inputs=[v.name for v in g.input],
            outputs=[v.name for v in g.output],
            boundary={
                v.name: (
                    [
                        d.dim_value if d.HasField("dim_value") else -1
                        for d in v.type.tensor_type.shape.dim
                    ],
                    np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
                )
                for v in [*g.input, *g.output]
            },
            nodes=[n.name for n in g.node],
            initializers=[(t.name, tuple(t.dims)) for t in g.initializer],
            reads={name for n in g.node for name in node_reads(n)},
            constants=[n.output[0] for n in g.node if n.op_type == "Constant"],
        )


@dataclass
class Real:
    """A real model loaded once, with its operator graph, FLOPs per operator and valid cuts.

    Plans for K = 2..5 are computed lazily and memoised. A partition is extracted, checked
    and given a session once per operator range: the same range in plans of different K is
    the same sub-model (its spec is checked to be identical), which halves VGG-19's work.

    ``reference`` holds the whole model's values of every tensor crossing a cut of the
    K = 2..5 plans, on ``verify_chain``'s default inputs (``feeds``): random-weight
    ResNet-50 and ShuffleNet saturate their softmax to one-hot, so comparing the chain's
    final output alone would not see a wrong partition.
    """

    alias: str
    path: Path
    shapes: str | None
    loaded: LoadedModel = field(repr=False)
    graph: OperatorGraph = field(repr=False)
    flops: list[int] = field(repr=False)
    valid: list[int] = field(repr=False)
    feeds: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    reference: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _results: dict[int, SearchResult] = field(default_factory=dict, repr=False)
    _parts: dict[tuple[int, int], Part] = field(default_factory=dict, repr=False)
    _verifications: dict[int, Verification] = field(default_factory=dict, repr=False)

    def result(self, k: int) -> SearchResult:
        """Eq. 1 with the FLOPs measure for a fixed K."""
        if k not in self._results:
            costs = [float(f) for f in self.flops]
            self._results[k] = search_partitions(
                costs,
                self.valid,
                num_partitions=k,
                cut_bytes={c: self.graph.crossing_bytes(c) for c in self.valid},
            )
        return self._results[k]

    def parts(self, k: int) -> list[Part]:
        """The K partitions: specs from the graph, sub-models from ``extract_partition``."""
        res = self.result(k)
        specs = self.graph.specs(list(res.cuts))
        out: list[Part] = []
        for spec, bounds in zip(specs, res.bounds, strict=True):
            part = self._parts.get(bounds)
            if part is None:
                part = self._parts[bounds] = Part.build(self.loaded, spec)
            else:
                assert (part.spec.nodes, part.spec.inputs, part.spec.outputs) == (
                    spec.nodes,
                    spec.inputs,
                    spec.outputs,
                ), f"operators {bounds} give a different partition in plans of different K"
            out.append(part)
        return out

    def compute_reference(self) -> None:
        """Run the whole model once (unoptimised) with every boundary tensor of the K = 2..5
        plans exposed as an output."""
        inputs_info = {n: self.loaded.tensors[n] for n in self.loaded.graph_inputs}
        self.feeds = random_feeds(inputs_info, seed=0)  # verify_chain's default inputs
        inputs = set(self.loaded.graph_inputs)
        names = sorted(
            {t for k in KS for c in self.result(k).cuts for t in self.graph.crossing(c)} - inputs
        )
        probe = onnx.ModelProto()
        probe.CopyFrom(self.loaded.model)
        declared = {o.name for o in probe.graph.output}
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in declared)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probe.onnx"
            onnx.save(probe, str(path))
            del probe
            session = ort.InferenceSession(str(path), _unoptimised(), providers=_CPU)
        self.reference = dict(zip(names, session.run(names, self.feeds), strict=True))

    def release_parts(self) -> None:
        """Drop the parts' sessions (VGG-19's hold ~1 GB)."""
        self._parts.clear()
        gc.collect()

    def verification(self, k: int) -> Verification:
        """The chain of the K partitions against the whole model (``verify_chain``)."""
        if k not in self._verifications:
            sessions = [p.session for p in self.parts(k)]
            self._verifications[k] = verify_chain(
                self.loaded, sessions, rtol=RTOL, report_optimized=False
            )
        return self._verifications[k]


@pytest.fixture(scope="module", params=list(SHAPES))
def real(request) -> Real:
    alias = request.param
    path = resolve_model(alias)
    loaded = load_model(path, SHAPES[alias])
    graph = OperatorGraph.from_loaded(loaded)
    costs = model_costs(loaded)
    flops = [int(costs[op.node].flops) for op in graph.operators]
    model = Real(alias, path, SHAPES[alias], loaded, graph, flops, graph.valid_cuts())
    model.compute_reference()
    return model


@pytest.fixture(scope="module")
def plan_run(real: Real, tmp_path_factory) -> tuple[Plan, Path]:
    """``partition_model`` with profiling, once per model, writing a plan directory.

    Its load step gets the model this module already loaded with the same path and shapes
    (VGG-19 takes ~15 s to load on a 2-core host); any other call loads normally.
    """
    out = tmp_path_factory.mktemp(f"plan-{real.alias}") / "plan"
    real_load = api.load_model
    calls: list[tuple] = []

    def load_once(model, shapes=None, **kwargs):
        calls.append((Path(model), shapes, kwargs))
        # (partition_model loads with check_runnable=False: its first session proves it)
        if Path(model) == real.path and shapes == real.shapes and not kwargs.get("check_runnable"):
            return real.loaded
        return real_load(model, shapes, **kwargs)

    real.release_parts()  # partition_model builds its own; keep the peak memory down
    nodes_before = [n.name for n in real.loaded.model.graph.node]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "load_model", load_once)
        plan = partition_model(
            real.path,
            shapes=real.shapes,
            num_partitions=PLAN_K,
            out_dir=out,
            warmup=1,
            repeats=2,
            use_cache=False,
        )
    assert [c[0] for c in calls] == [real.path]  # the model is loaded once
    # partition_model must not have changed the model it was given
    assert [n.name for n in real.loaded.model.graph.node] == nodes_before
    return plan, out


def _io(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


# --------------------------------------------------------------------------- K = 2..5


@pytest.mark.parametrize("k", KS)
def test_cuts_are_valid_and_every_partition_has_a_representative(real: Real, k: int) -> None:
    res = real.result(k)
    assert res.num_partitions == k and len(res.cuts) == k - 1
    assert list(res.cuts) == sorted(set(res.cuts))
    valid = set(real.valid)
    for cut in res.cuts:
        assert cut in valid, f"cut {cut} is not a valid cut"
        assert real.graph.invalid_reason(cut) is None
        assert real.graph.crossing(cut), f"nothing crosses cut {cut}"
    # Eq. 1's representative operators: FLOPs strictly above the mean over all operators.
    flops = np.asarray(real.flops, dtype=np.float64)
    rep = flops > flops.mean()
    assert list(res.representative) == rep.tolist()
    assert res.bounds[0][0] == 0 and res.bounds[-1][1] == real.graph.num_operators - 1
    for (_first, last), nxt in zip(res.bounds, res.bounds[1:], strict=False):
        assert nxt[0] == last + 1
    for kk, (first, last) in enumerate(res.bounds):
        assert rep[first : last + 1].any(), f"partition {kk} has no representative operator"
        assert res.bottleneck[kk] == pytest.approx(
            float(flops[first : last + 1][rep[first : last + 1]].sum())
        )
    assert math.isfinite(res.objective) and res.objective == pytest.approx(sum(res.sigmas))


@pytest.mark.parametrize("k", KS)
def test_parts_pass_checker_and_load_in_onnxruntime(real: Real, k: int) -> None:
    parts = real.parts(k)  # extract_partition, onnx.checker, one InferenceSession per part
    assert len(parts) == k
    for kk, part in enumerate(parts):
        assert part.checker_error is None, f"part {kk}: {part.checker_error}"
        assert [i.name for i in part.session.get_inputs()] == part.spec.inputs
        assert [o.name for o in part.session.get_outputs()] == part.spec.outputs
        assert part.nodes == part.spec.nodes


@pytest.mark.parametrize("k", KS)
def test_parts_hold_only_the_weights_they_read(real: Real, k: int) -> None:
    whole_inits = {t.name: tuple(t.dims) for t in real.loaded.model.graph.initializer}
    seen_ops: list[str] = []
    for kk, part in enumerate(real.parts(k)):
        names = [name for name, _ in part.initializers]
        assert len(names) == len(set(names)), f"part {kk} repeats an initializer"
        unused = set(names) - part.reads
        assert not unused, f"part {kk} holds initializers no node reads: {sorted(unused)[:5]}"
        for name, dims in part.initializers:
            assert whole_inits.get(name) == dims, name
        # PP-OCR keeps its weights in Constant nodes: those must be read in the part too
        unread = set(part.constants) - part.reads
        assert not unread, f"part {kk} holds Constant nodes no node reads: {sorted(unread)[:5]}"
        seen_ops += [n for n in part.nodes if n not in real.graph.constant_nodes]
    # every operator is in exactly one part
    assert seen_ops == [op.node for op in real.graph.operators]


@pytest.mark.parametrize("k", KS)
def test_partitions_chain_inputs_to_outputs(real: Real, k: int) -> None:
    parts = real.parts(k)
    assert parts[0].inputs == real.loaded.graph_inputs
    assert parts[-1].outputs == real.loaded.graph_outputs
    for kk in range(k - 1):
        assert parts[kk].outputs == parts[kk + 1].inputs, (
            f"part {kk} outputs != part {kk + 1} inputs"
        )
        assert parts[kk].outputs == real.graph.crossing(real.result(k).cuts[kk])
    # boundary tensors carry the whole model's static shapes and dtypes
    for part in parts:
        for name, (dims, dtype) in part.boundary.items():
            info = real.loaded.tensors[name]
            assert dims == list(info.shape) and dtype == info.dtype, name


@pytest.mark.parametrize("k", KS)
def test_chain_reproduces_whole_model(real: Real, k: int) -> None:
    v = real.verification(k)
    assert v.error is None, v.error
    assert v.passed, v.to_dict()
    assert v.max_rel <= RTOL
    assert set(v.per_output) == set(real.loaded.graph_outputs)
    assert all(p["ok"] for p in v.per_output.values())


@pytest.mark.parametrize("k", KS)
def test_every_boundary_tensor_matches_whole_model(real: Real, k: int) -> None:
    """Part by part, each output equals the whole model's tensor of that name (1e-4 of its
    largest magnitude): inside the chain, before a saturating softmax hides errors."""
    env = dict(real.feeds)
    for kk, part in enumerate(real.parts(k)[:-1]):
        values = part.session.run(part.outputs, {n: env[n] for n in part.inputs})
        env.update(zip(part.outputs, values, strict=True))
        for name, got in zip(part.outputs, values, strict=True):
            want = real.feeds[name] if name in real.feeds else real.reference[name]
            assert got.shape == want.shape and got.dtype == want.dtype, (kk, name)
            err = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
            scale = float(np.max(np.abs(want), initial=0.0))
            assert err <= RTOL * scale, f"part {kk} output {name}: error {err:g}, scale {scale:g}"


# --------------------------------------------------------------------------- skip edges


def test_skip_and_branch_edges_cross_cuts(real: Real) -> None:
    """Residual / branch edges make cuts with several crossing tensors; a tensor crossing
    two consecutive cuts passes through the middle partition, and the chain still verifies."""
    g = real.graph
    multi = [c for c in real.valid if len(g.crossing(c)) >= 2]
    pair = next(
        (
            (a, b)
            for a, b in zip(real.valid, real.valid[1:], strict=False)
            if set(g.crossing(a)) & set(g.crossing(b)) - set(real.loaded.graph_inputs)
        ),
        None,
    )
    if real.alias in CHAIN_MODELS:
        assert not multi and pair is None, "a plain chain has one crossing tensor per cut"
        return
    assert multi, "no valid cut is crossed by a skip or branch edge"
    if real.alias == "resnet50":
        # Eq. 1 itself picks a cut inside a residual block for some K = 2..5, whose chain
        # verifies (the skip tensor crosses the cut next to the branch's tensor)
        chosen = {k: [c for c in real.result(k).cuts if c in multi] for k in KS}
        assert any(chosen.values()), f"no chosen cut is crossed by a skip edge: {chosen}"
        for k in KS:
            if chosen[k]:
                v = real.verification(k)
                assert v.passed and v.max_rel <= RTOL, v.to_dict()
    assert pair is not None
    a, b = pair
    through = set(g.crossing(a)) & set(g.crossing(b))
    specs = g.specs([a, b])
    parts = [extract_partition(real.loaded, s) for s in specs]
    middle_in, middle_out = _io(parts[1])
    assert through <= set(middle_in) & set(middle_out)  # passed through unchanged
    v = verify_chain(real.loaded, parts, rtol=RTOL)
    assert v.passed and v.max_rel <= RTOL, v.to_dict()


# --------------------------------------------------------------------------- partition_model


def test_partition_model_writes_and_reads_back_plan(real: Real, plan_run) -> None:
    plan, out = plan_run
    files = {p.name for p in out.iterdir()}
    assert files == {PLAN_FILE} | {f"part_{k}.onnx" for k in range(PLAN_K)}
    back = read_plan(out)
    assert back.num_partitions == PLAN_K and back.cuts == plan.cuts
    assert back.summary == yaml.safe_load(yaml.safe_dump(plan.summary, sort_keys=False))
    # the API's cuts are Eq. 1's optimum found by the pieces above, and its parts are the
    # partitions the graph specifies for them
    assert tuple(plan.cuts) == real.result(PLAN_K).cuts
    specs = real.graph.specs(plan.cuts)
    for k, (mem, disk, spec) in enumerate(zip(plan.parts, back.parts, specs, strict=True)):
        assert _io(disk) == _io(mem) == (spec.inputs, spec.outputs), k
        assert [n.name for n in disk.graph.node] == [n.name for n in mem.graph.node] == spec.nodes
        assert [t.name for t in disk.graph.initializer] == [t.name for t in mem.graph.initializer]
        onnx.checker.check_model(disk)


def test_plan_yaml_records_the_plan(real: Real, plan_run) -> None:
    _, out = plan_run
    summary = yaml.safe_load((out / PLAN_FILE).read_text())
    g = real.graph
    model = summary["model"]
    assert model["sha256"] == file_sha256(real.path) == real.loaded.sha256
    assert model["flops"] == sum(real.flops)
    assert summary["objective"]["measure"] == "flops"
    assert summary["objective"]["num_partitions"] == PLAN_K

    cuts = summary["cuts"]
    assert len(cuts) == PLAN_K - 1
    for cut in cuts:
        c = cut["after_operator"]
        assert c in real.valid
        assert cut["node"] == g.operators[c].node
        assert [t["name"] for t in cut["crossing"]] == g.crossing(c)
        assert cut["crossing_bytes"] == g.crossing_bytes(c) > 0

    parts = summary["partitions"]
    assert [p["index"] for p in parts] == list(range(PLAN_K))
    available = profiler.profiled_engines()
    for p in parts:
        first, last = p["operators"]
        assert isinstance(p["bottleneck"], float) and p["bottleneck"] > 0
        assert p["flops"] == sum(real.flops[first : last + 1])
        assert isinstance(p["memory_mb"], float) and p["memory_mb"] > 0
        assert p["memory_mb"] == pytest.approx(p["weights_mb"] + p["activations_mb"], abs=2e-3)
        assert p["representative_operators"] >= 1
        lat = p["latency_ms"]
        assert set(lat) == set(ENGINES)
        assert isinstance(lat["cpu"], float) and lat["cpu"] > 0
        for engine in ("gpu", "dla"):
            if available[engine] is None:
                assert set(lat[engine]) == {"unavailable"}, lat[engine]
                assert isinstance(lat[engine]["unavailable"], str) and lat[engine]["unavailable"]
            else:
                assert isinstance(lat[engine], float)
        assert [t["name"] for t in p["inputs"]] and [t["name"] for t in p["outputs"]]
    # partition inputs / outputs are the crossing tensors of the cuts around them
    assert [t["name"] for t in parts[0]["inputs"]] == real.loaded.graph_inputs
    assert [t["name"] for t in parts[-1]["outputs"]] == real.loaded.graph_outputs
    for p, nxt, cut in zip(parts, parts[1:], cuts, strict=False):
        assert p["outputs"] == nxt["inputs"] == cut["crossing"]
    # the partitions' FLOPs add up to the model's
    assert sum(p["flops"] for p in parts) == model["flops"]

    ver = summary["verification"]
    assert ver["passed"] is True
    assert ver["max_rel"] <= RTOL and ver["rtol"] == RTOL


# --------------------------------------------------------------------------- dynamic dims


def test_ppocrv4_rec_dynamic_dims_need_shapes() -> None:
    path = resolve_model("ppocrv4-rec")
    declared = onnx.load(str(path), load_external_data=False).graph.input[0]
    dims = declared.type.tensor_type.shape.dim
    dynamic = [a for a, d in enumerate(dims) if not d.HasField("dim_value")]
    assert 0 in dynamic and 3 in dynamic  # batch and width
    with pytest.raises(ShapeError) as info:
        load_model(path)
    msg = str(info.value)
    assert "--shapes" in msg and f"'{declared.name}'" in msg
    for axis in dynamic:
        assert f"dim {axis}" in msg, msg
        if dims[axis].dim_param:
            assert dims[axis].dim_param in msg
    # with concrete shapes it loads and partitions (K = 2..5 in the tests above)
    loaded = load_model(path, "x:1x3x48x320")
    assert loaded.input_shapes == {"x": (1, 3, 48, 320)}
    assert [not isinstance(d, int) for d in loaded.symbolic_inputs["x"]] == [
        not d.HasField("dim_value") for d in dims
    ]
    graph = OperatorGraph.from_loaded(loaded)
    costs = model_costs(loaded)
    res = search_partitions(
        [float(costs[op.node].flops) for op in graph.operators],
        graph.valid_cuts(),
        num_partitions=2,
    )
    parts = [extract_partition(loaded, spec) for spec in graph.specs(list(res.cuts))]
    first_input = parts[0].graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in first_input] == [1, 3, 48, 320]
    v = verify_chain(loaded, parts, rtol=RTOL)
    assert v.passed and v.max_rel <= RTOL, v.to_dict()


# --------------------------------------------------------------------------- measure = time


def test_time_measure_partitions_shufflenet(tmp_path: Path) -> None:
    path = resolve_model("shufflenet")
    out = tmp_path / "plan"
    plan = partition_model(
        path, num_partitions=2, measure="time", out_dir=out, warmup=1, repeats=2, use_cache=False
    )
    assert plan.summary["objective"]["measure"] == "time"
    back = read_plan(out)
    assert back.summary["objective"]["measure"] == "time"
    assert back.num_partitions == 2 and len(back.parts) == 2
    assert back.summary["verification"]["passed"] is True
    # the complexities were times (ms per operator), not FLOPs
    model = plan.summary["model"]
    flops_mean = model["flops"] / model["operators"]
    assert plan.summary["objective"]["mean_complexity"] != pytest.approx(flops_mean, rel=0.5)
    assert sum(p["flops"] for p in plan.summary["partitions"]) == model["flops"]
    (cut,) = plan.cuts
    loaded = load_model(path)
    assert cut in OperatorGraph.from_loaded(loaded).valid_cuts()
