"""Deploy with the planner's choice (InfScaler's design principle 1: the user names no
K, threads or instances).

:func:`needs_planning` tells whether a pipeline is left to the planner: it has an
``slo`` and ``autoscale``, at least one model stage, every model stage names an ONNX
``model`` on the cpu engine with no ``partitions``, stage ``slo``, ``batching``,
``max_threads`` or ``max_instances`` (a bound the user, or the model-less layer for its
profiled variants, put on the replicas), and ``threads`` and ``instances`` at their
defaults (1), and every
function stage leaves ``instances``, ``max_instances`` and ``threads`` at their defaults
(a function stage that sets them is scaled on its own, not fused, by the user's choice:
the pipeline then deploys as written).

:func:`planner_inputs` builds what the search takes. Each model stage is measured on this
host (:func:`~infscaler.runtime.planning.stageprofile.measure_model_stage`). With function stages
the pipeline is compiled with its model stages whole and run in-process on a sample
request (:func:`~infscaler.runtime.planning.unitprofile.profile_pipeline`), giving each
function step's cpu ms per call and the fan-out's items per request. The sample request
is the first function stage's ``sample`` hook's (a callable attribute of the function
returning ``{input: array}``, like its ``warmup`` hook; the bundled ``dddd`` pipeline's
gives a click-captcha image) when it has one, else
:func:`~infscaler.runtime.planning.unitprofile.sample_inputs`'s (an RGB image input gets a
rendered text image). The search's units are then the runtime's fused units
(:func:`~infscaler.runtime.serving.pipeline.fuse_units`): a model stage carries the function
steps fused before and after it (``ModelStage.pre_ms`` / ``post_ms``, on its first / last
partition) and the fan-out's items when the fan-out step is fused after it
(``ModelStage.items``); a model stage after the fan-out runs per item (the simulator
routes items x the request rate to it); a function unit that fuses into no model is a
fixed unit of its measured times (one instance: function stages deploy as written); the
fan-in runs in the front end (one server, on the cpu). A model stage whose sample
inputs did not all have its configured ``shapes`` (an input size that varies per
request or item) is searched whole (K = 1: a partitioned plan is cut at fixed shapes),
its times scaled to what it took on the sample.

:func:`plan_pipeline` runs the configuration search with the best candidates'
partitions measured (:func:`~infscaler.runtime.planning.stageprofile.search_measured`, over
:func:`infscaler.runtime.planning.planner.search`), writes each model stage's chosen cuts as a
plan directory (:func:`infscaler.partitioner.api.partition_model` with ``cuts``; K = 1
keeps the model whole) and returns the pipeline with those stages set to the plan, the
threads and the instances per partition (the scaler's minimum, which it grows from);
function stages are returned unchanged. ``infscaler plan PIPELINE --slo X --explain``
prints the same search (:mod:`infscaler.cli.plan`).

The whole pipeline in one unit (``fuse: whole``: replicas of the whole
pipeline, each running its models one after another, can beat stages that contend for
few cores) is a candidate too for a pipeline of at least two model stages that sets no
stage's ``fuse`` nor the pipeline's ``fuse: false``: :func:`whole_profiles` gives
its time per request at each thread count every model was measured at (the sum
:func:`base_latency_ms` takes, at that count), and the search grows its instances and
scores it like any candidate; when it wins the pipeline deploys with ``fuse: whole`` and
every model stage at its threads and instances.

A pipeline with a stage the user configured, with ``fuse: whole`` already, or with no
model stage, is not planned; it deploys as written, as does every pipeline under
``serve --objective eq1`` (Eq. 1 at deploy, :mod:`infscaler.runtime.serving.pipeline`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS, file_key, resolve_model
from infscaler.base.slo import parse_slo
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.loader import parse_shapes
from infscaler.partitioner.profiler import usable_cores
from infscaler.runtime.planning.livecheck import Expected, expected_from
from infscaler.runtime.planning.planner import ModelStage, cpu_cores, resource_cap
from infscaler.runtime.planning.resources import arrival_rates
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
from infscaler.runtime.planning.stageprofile import measure_model_stage, search_measured
from infscaler.runtime.scaling.idlecurve import curve_for, load_curve
from infscaler.runtime.serving.pipeline import keyed_plan_dir

__all__ = [
    "START_WITH_ENV",
    "LivePlan",
    "PlannerInputs",
    "base_latency_ms",
    "candidate_pipeline",
    "keep_live",
    "live_plan",
    "needs_planning",
    "plan_pipeline",
    "planner_inputs",
    "runner_up",
    "stage_order",
    "whole_config",
    "whole_profiles",
]

#: Stage fields that hold the user's own K / threads / instances / batching choice: a
#: model stage is searched with them dropped (``infscaler plan`` explores every K).
_MODEL_CHOICES = ("partitions", "slo", "max_partitions", "threads", "max_threads", "instances",
                  "max_instances", "batching")  # fmt: skip


def _left_to_planner(stage: Any) -> bool:
    """A cpu model stage whose K, threads, instances and max_instances are the defaults (a pipeline
    re-validated from a dump has every field set, so the values are compared, not the
    fields set: ``threads: 1`` / ``instances: 1`` written out count as left open)."""
    defaults = type(stage).model_fields
    return (
        stage.model is not None
        and stage.engine == "cpu"
        and stage.batching is None
        and stage.partitions is None
        and stage.slo is None
        and stage.threads == defaults["threads"].default
        and stage.instances == defaults["instances"].default
        and getattr(stage, "max_threads", None) is None  # the user bounded the threads
        # the user bounded the replicas (the model-less variants' pipelines do: their
        # profiles are of the pipeline as written)
        and stage.max_instances == defaults["max_instances"].default
    )


def _function_left(stage: Any) -> bool:
    """A function stage that leaves its own scaling (``instances``, ``max_instances``,
    ``threads``) at the defaults, compared by value as :func:`_left_to_planner` does."""
    defaults = type(stage).model_fields
    return (
        stage.threads == defaults["threads"].default
        and stage.instances == defaults["instances"].default
        and stage.max_instances is None
    )


def needs_planning(cfg: Any) -> bool:
    """True when ``cfg`` (a PipelineConfig) has ``slo`` and ``autoscale``, is not
    ``fuse: whole``, has at least one model stage, every model stage left to the planner
    and every function stage leaving its own scaling open (see the module docstring)."""
    return (
        cfg.slo is not None
        and cfg.autoscale is not None
        and cfg.fuse != "whole"
        and any(s.kind == "model" for s in cfg.stages)
        and all(
            _function_left(s) if s.kind == "function" else _left_to_planner(s) for s in cfg.stages
        )
    )


@dataclass(frozen=True)
class PlannerInputs:
    """What :func:`planner_inputs` measured, as :func:`~infscaler.runtime.planning.planner.search`
    takes it.

    Attributes:
        stages: in pipeline order, a :class:`~infscaler.runtime.planning.planner.ModelStage` per
            model stage (with its fused steps) and a fixed
            :class:`~infscaler.runtime.planning.simulator.UnitProfile` per function unit that
            fuses into no model (the fan-in among them).
        model_index: per ModelStage in ``stages``, the index of its stage in the
            pipeline's ``stages``.
        paths / shapes: per ModelStage, its ONNX file and shapes (``x:1x3x224x224``).
        base_ms: the pipeline's 1-thread latency per request, ms: every unit's time at 1
            thread (fused steps included) x its items per request; the reference of a
            factor SLO (``3x``).
        notes: what a reader should know (stages searched whole and why).
        whole: the whole pipeline as one unit (:func:`whole_profiles`), threads -> its
            profile; empty when it is not a candidate (see the module docstring).
    """

    stages: tuple[ModelStage | UnitProfile, ...]
    model_index: tuple[int, ...]
    paths: tuple[Path, ...]
    shapes: tuple[str | None, ...]
    base_ms: float
    notes: tuple[str, ...] = ()
    whole: Mapping[int, UnitProfile] = field(default_factory=dict)


def _whole(cfg: Any) -> Any:
    """``cfg`` with its model stages whole and the user's choices of K, threads,
    instances and batching dropped (function stages as written: their fields set decide
    whether they fuse; ``fuse: whole`` searched as ``fuse: true``)."""
    data = cfg.model_dump(exclude_none=True)
    if cfg.fuse == "whole":  # searched staged too: the whole unit is one candidate
        data["fuse"] = True
    for k, st in enumerate(cfg.stages):
        sd = st.model_dump(exclude_unset=True, exclude_none=True)
        if st.kind == "model":
            for f in _MODEL_CHOICES:
                sd.pop(f, None)
        data["stages"][k] = sd
    return validate_pipeline(data, f"pipeline {cfg.name}")


def planned_thread_counts() -> list[int]:
    """The intra-op thread counts :func:`planner_inputs` asks each model to be measured
    at: 1, 2 and this host's usable cores (:func:`measure_model_stage` skips those above
    the cores); the decision key reads the kept idle curves at the same counts."""
    return sorted({1, 2, usable_cores()})


def planner_inputs(
    cfg: Any,
    *,
    device: Any = None,
    state_dir: Path | None = None,
    allowed_functions: Sequence[str] | None = None,
    repeats: int = 5,
    progress: Callable[[str], None] = lambda _m: None,
    wake_latency_us: int | None = None,
) -> PlannerInputs:
    """Measure ``cfg``'s stages on this host for the search (see the module docstring).

    Args:
        cfg: a PipelineConfig whose model stages name ONNX models (``model``); the
            stages' own K / threads / instances are ignored (searched).
        device: its DeviceProfile (for compiling; cpu is what is measured).
        state_dir: where compiling keeps plans (none are made: models run whole).
        allowed_functions: the modules function stages may come from (None: any), as
            at deploy (:func:`infscaler.runtime.serving.pipeline.load_function`): their code runs
            in this process on the sample request.
        repeats: timed runs per measurement.
        wake_latency_us: the PM QoS CPU latency limit the service holds (None: none):
            selects the idle slowdown a model served under the same setting
            (:func:`infscaler.runtime.scaling.idlecurve.load_curve`), planned with where kept.

    Raises:
        InfScalerError: a stage given as a plan directory (the search measures whole
            ONNX models), no model stage, a function failing on the sample request, or
            a fan-out that made no items on it (the message says which).
    """
    threads = planned_thread_counts()
    for st in cfg.stages:
        if st.kind == "model" and st.model is None:
            raise InfScalerError(
                f"stage {st.name} is a plan directory: the configuration search takes "
                "model stages that name an ONNX model",
                hint="name the model (`model: FILE.onnx` or a bundled alias) instead of `plan`",
            )
    if not any(st.kind == "model" for st in cfg.stages):
        raise InfScalerError(
            f"pipeline {cfg.name} has no model stage: there is nothing to search",
            hint="plan its instances with `infscaler plan PIPELINE --rate R --slo X`; "
            "deployed, it runs as written",
        )

    def shapes_of(st: Any) -> str | None:
        return st.shapes if st.shapes is not None else getattr(MODELS.get(st.model), "shapes", None)

    def measure(st: Any) -> tuple[ModelStage, Path, str | None]:
        path = resolve_model(st.model)
        shp = shapes_of(st)
        ms = measure_model_stage(
            path,
            name=st.name,
            shapes=shp,
            threads=threads,
            repeats=repeats,
            progress=progress,
            learned_idle=lambda t: curve_for(path, t, wake_latency_us, tuple(threads)),
        )
        return ms, path, shp

    offer_whole = (
        cfg.fuse in (True, "whole")
        and sum(st.kind == "model" for st in cfg.stages) >= 2
        and all(st.fuse is None for st in cfg.stages)
    )
    whole_name = ">".join(st.name for st in cfg.stages)

    if not any(st.kind == "function" for st in cfg.stages):
        got = [measure(st) for st in cfg.stages]
        models = [g[0] for g in got]
        return PlannerInputs(
            stages=tuple(models),
            model_index=tuple(range(len(got))),
            paths=tuple(g[1] for g in got),
            shapes=tuple(g[2] for g in got),
            base_ms=sum(g[0].whole_ms[1] for g in got),
            whole=whole_profiles(models, whole_name) if offer_whole else {},
        )

    # why: compiling and profiling load the function modules and onnxruntime sessions;
    # a pipeline of model stages only never needs them
    from infscaler.runtime.planning.unitprofile import profile_pipeline, sample_inputs
    from infscaler.runtime.serving.pipeline import compile_pipeline, load_function

    whole = _whole(cfg)
    progress(f"{cfg.name}: running the pipeline in-process on a sample request")
    compiled = compile_pipeline(
        whole, state_dir=state_dir, device=device, allowed_functions=allowed_functions
    )
    notes: list[str] = []
    feeds = None
    for st in whole.stages:  # the first function stage's sample hook, if it has one
        hook = getattr(load_function(st.function, allowed_functions), "sample", None) if (
            st.kind == "function"
        ) else None  # fmt: skip
        if not callable(hook):
            continue
        try:
            feeds = dict(hook())
            progress(f"{cfg.name}: the sample request of {st.function}.sample")
        except Exception as exc:  # noqa: BLE001 - e.g. an optional dependency missing
            notes.append(f"{st.name}: its sample hook failed ({exc}); a made-up request instead")
        break
    try:
        if feeds is None:
            feeds = sample_inputs(compiled)
        prof = profile_pipeline(compiled, feeds, repeats=repeats)
    except Exception as exc:  # noqa: BLE001 - the function's own error, said once
        msg = exc.message if isinstance(exc, InfScalerError) else f"{type(exc).__name__}: {exc}"
        raise InfScalerError(
            f"pipeline {cfg.name}: the planner could not run it on a sample request "
            f"(to time its function stages): {msg}",
            hint="set the model stages' partitions / instances to deploy it as written, "
            "or serve with --objective eq1",
        ) from None
    by_name = {st.name: (k, st) for k, st in enumerate(cfg.stages)}
    stages: list[ModelStage | UnitProfile] = []
    index: list[int] = []
    paths: list[Path] = []
    shapes: list[str | None] = []
    for u, up in zip(compiled.units, prof.units, strict=True):
        if u.kind != "model":
            # a function unit fused into no model (the fan-in among them): as measured,
            # one instance (function stages deploy as written)
            stages.append(dataclasses.replace(up, max_instances=1) if up.served else up)
            continue
        steps = u.step_units
        m = next(i for i, s in enumerate(steps) if s.kind == "model")
        pre = sum(prof.step_ms.get(s.name, 0.0) for s in steps[:m])
        post = sum(prof.step_ms.get(s.name, 0.0) for s in steps[m + 1 :])
        k, st = by_name[steps[m].stage]
        ms, path, shp = measure(st)
        fed = prof.model_shapes.get(steps[m].name, [])
        want = {n: list(v) for n, v in parse_shapes(shp).items()} if shp else None
        if want is None or fed != [want]:
            ran = prof.step_ms.get(steps[m].name)
            scale = ran / ms.whole_ms[1] if ran else 1.0
            seen = "; ".join(
                ", ".join(f"{n}:{'x'.join(map(str, d))}" for n, d in f.items()) for f in fed[:3]
            )
            notes.append(
                f"{st.name}: searched whole (K = 1): the sample fed it {seen or 'nothing'}"
                f"{'' if want is None else f', not its shapes {shp}'}; its times scaled "
                f"x{scale:.3g} to the sample's {ran or 0:.3g} ms"
            )  # fmt: skip
            ms = dataclasses.replace(
                ms,
                valid_cuts=(),
                whole_ms={t: v * scale for t, v in ms.whole_ms.items()},
            )
        items = tuple(prof.items) if u.fan_out else ()
        if u.fan_out and not items:
            raise InfScalerError(f"stage {st.name}: the fan-out recorded no item counts")
        stages.append(dataclasses.replace(ms, pre_ms=pre, post_ms=post, items=items))
        index.append(k)
        paths.append(path)
        shapes.append(shp)
    return PlannerInputs(
        stages=tuple(stages),
        model_index=tuple(index),
        paths=tuple(paths),
        shapes=tuple(shapes),
        base_ms=base_latency_ms(stages),
        notes=tuple(notes),
        whole=whole_profiles(stages, whole_name) if offer_whole else {},
    )


def _units_at(stages: Sequence[ModelStage | UnitProfile], threads: int = 1) -> list[UnitProfile]:
    """The units of ``stages`` with every model stage whole at ``threads`` threads."""
    out: list[UnitProfile] = []
    for s in stages:
        out.extend(s.units((), threads) if isinstance(s, ModelStage) else [s])
    return out


def base_latency_ms(stages: Sequence[ModelStage | UnitProfile], threads: int = 1) -> float:
    """A request's latency through ``stages`` with every model at ``threads`` intra-op
    threads (default 1: the reference of a factor SLO), ms: each unit's mean time (a
    model stage whole at that count, its measured ``whole_ms[threads]``, with its fused
    steps) x its items per request (:func:`~infscaler.runtime.planning.planner.arrival_rates`).

    E.g. a 5 ms step fused before a 10 ms model, then a 4 ms model per item with 3 items
    per request and a 1 ms fan-in: 15 + 3 x 4 + 1 = 28 ms.

    Raises:
        KeyError: a model stage not measured at ``threads``."""
    units = _units_at(stages, threads)
    return sum(
        r * u.fastest().mean_ms for r, u in zip(arrival_rates(units, 1.0), units, strict=True)
    )


def whole_profiles(
    stages: Sequence[ModelStage | UnitProfile], name: str = "whole"
) -> dict[int, UnitProfile]:
    """The whole pipeline as one unit (``fuse: whole``), per intra-op thread count every
    model stage was measured at (``whole_ms``'s keys; no count is extrapolated): the
    planner's candidate "replicas of the whole pipeline".

    Its cpu profile at ``t`` threads: the time per request is :func:`base_latency_ms` at
    ``t`` (each unit's mean x its items per request, the fan-in included: it runs in the
    unit); with a fan-out, one sample per measured item count n (the units outside the
    fan-out once, the per-item ones n times), resampled by the simulator as the staged
    units draw their items; without one, the mean with the largest ``cv`` of the model
    stages at ``t`` (``cv_by_threads``). Memory: the model stages' (each whole: weights +
    activations) plus one instance overhead (the largest of theirs), MB; ``cores`` =
    ``t``; kind ``model``.

    E.g. a 2 ms step fused before a 10 ms (1 thread) / 6 ms (2 threads) model that fans
    out 1 or 3 items, a 4 / 3 ms model per item and a 1 ms fan-in: at 1 thread samples
    (12 + 4 + 1, 12 + 12 + 1) = (17, 25) ms, at 2 threads (8 + 3 + 1, 8 + 9 + 1) =
    (12, 18) ms.
    """
    models = [s for s in stages if isinstance(s, ModelStage)]
    if not models:
        return {}
    counts = sorted(set.intersection(*(set(int(t) for t in m.whole_ms) for m in models)))
    overhead = max(m.instance_overhead_mb for m in models)
    memory = overhead + sum(
        m.units((), 1)[0].engines["cpu"].memory_mb - m.instance_overhead_mb for m in models
    )
    out: dict[int, UnitProfile] = {}
    for t in counts:
        units = _units_at(stages, t)
        fo = next((i for i, u in enumerate(units) if u.fan_out), None)
        fi = next((i for i, u in enumerate(units) if u.fan_in), None)
        per_item = [fo is not None and fi is not None and fo < i < fi for i in range(len(units))]
        fixed = sum(u.fastest().mean_ms for u, p in zip(units, per_item, strict=True) if not p)
        each = sum(u.fastest().mean_ms for u, p in zip(units, per_item, strict=True) if p)
        mean = base_latency_ms(stages, t)
        samples = tuple(fixed + n * each for n in units[fo].items) if fo is not None else ()
        cv = 0.0 if samples else max(m.cv_by_threads.get(t, m.cv) for m in models)
        corun = max(m.corun_by_threads.get(t, 0.0) for m in models)
        prof = EngineProfile(
            "cpu",
            mean,
            cv=cv,
            samples_ms=samples,
            memory_mb=memory,
            cores=t,
            corun=corun,
            idle=_idle_of(models, t),
        )
        out[t] = UnitProfile(name, {"cpu": prof}, kind="model")
    return out


def _idle_of(models: Sequence[ModelStage], t: int) -> tuple[tuple[float, float], ...]:
    """The whole pipeline's idle slowdown at ``t`` threads (``EngineProfile.idle``): at
    each gap measured for every model stage, their factors weighted by their whole-model
    times at ``t`` (every model run as if the host had sat idle before it: an upper
    bound, since the first one wakes the cores for the rest); none when a stage has none."""
    pts = [dict(m.idle_by_threads.get(t, ())) for m in models]
    gaps = sorted(set.intersection(*(set(p) for p in pts))) if all(pts) else []
    weights = [m.whole_ms.get(t, m.whole_ms[1]) for m in models]
    total = math.fsum(weights)
    return tuple(
        (g, math.fsum(w * p[g] for w, p in zip(weights, pts, strict=True)) / total) for g in gaps
    )


def whole_config(cfg: Any, model_index: Sequence[int], threads: int, instances: int) -> Any:
    """``cfg`` (a PipelineConfig) deployed as one unit: ``fuse: whole``, every model stage
    (``model_index``: their positions in ``cfg.stages``) at ``threads`` intra-op threads
    and ``instances`` instances (the unit's; the scaler grows it from there), the function
    stages as written.

    Raises:
        ConfigError: ``cfg`` cannot run as one unit (a stage setting its own ``fuse``, a
            function stage its own scaling: :func:`needs_planning` rules them out).
    """
    data = cfg.model_dump(exclude_none=True)
    data["fuse"] = "whole"
    for k, st in enumerate(cfg.stages):
        if st.kind == "function":  # as written
            data["stages"][k] = st.model_dump(exclude_unset=True, exclude_none=True)
    for k in model_index:
        data["stages"][k] = {**data["stages"][k], "threads": threads, "instances": instances}
    return validate_pipeline(data, f"pipeline {cfg.name} (planned)")


def stage_order(inputs: PlannerInputs, cuts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Per ModelStage of ``inputs`` (in order), ``(first unit, number of units)`` in a
    candidate's unit list that had ``cuts`` (the front end, when simulated, comes first:
    the offset is taken from the end). Used to read a candidate's instances per stage."""
    counts = []
    it = iter(cuts)
    for s in inputs.stages:
        counts.append(len(next(it)) + 1 if isinstance(s, ModelStage) else 1)
    out, at = [], 0
    for n in counts:
        out.append((at, n))
        at += n
    return out


def plan_pipeline(
    cfg: Any,
    *,
    device: Any,
    state_dir: Path,
    rate: float | None = None,
    objectives: tuple[str, ...] = ("eq1", "minmax", "weights"),
    allowed_functions: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    reuse: bool = True,
    wake_latency_us: int | None = None,
) -> tuple[Any, Any]:
    """``(planned PipelineConfig, SearchOutcome)`` for a pipeline :func:`needs_planning`.

    The decision is kept (``state_dir/plans/decisions/<digest>.json``, the digest of
    the pipeline as given, the device profile but its memory cap, ``rate``,
    ``objectives``, the package version, each model file's path, size and mtime and each
    function stage's module file's, :func:`_decision_path`) and,
    with ``reuse``, a later deploy of the same pipeline on the same device deploys it
    again without measuring anything (the outcome is then None) while the chosen
    configuration fits the cap at that deploy and the cap has not grown past
    :data:`CAP_GROWTH_REPLAN` x the one it was planned under (:func:`_cap_changed`).
    A search measures the candidates' partitions on the host as it is at deploy: on
    the 2-core host five deploys of the same ResNet-50 pipeline chose four different
    configurations (K = 1 at 1 or 2 threads, K = 2), whose throughput at SLO differed
    3x (bench/HISTORY.md, "Admission, the scaler's cores rule and the bench's steps",
    its "The planner keeps its decision" item). Delete the file (or the directory) to
    plan again.

    Args:
        cfg: the pipeline. device: its DeviceProfile (the cap). state_dir: where the plan
            directories go (``state_dir/plans/auto-<model>-<digest>``).
        rate: expected requests/s (None: the search maximises the rate within the SLO).
        objectives: partition objectives tried.
        allowed_functions: the modules function stages may come from (None: any): they
            run in this process on a sample request (:func:`planner_inputs`).
        wake_latency_us: the PM QoS CPU latency limit the service holds (None: none):
            the search plans with the idle slowdown each model served under it before
            (:mod:`infscaler.runtime.scaling.idlecurve`), and a newly kept one plans again (it is
            part of the decision's key).

    The pipeline's ``slo`` is in ms, or a factor (``3x``) of its measured 1-thread
    latency (:attr:`PlannerInputs.base_ms`: its model stages in turn, with its function
    steps and fan-out items when it has them).

    Raises:
        InfScalerError: no SLO, a sample request the pipeline fails on, or no candidate
            meets the SLO (the message carries the search's last explain line).
    """
    spec = parse_slo(cfg.slo)
    if spec.ms is None and spec.factor is None:
        raise InfScalerError("the planner needs an SLO", hint="e.g. slo: 200ms or slo: 3x")
    kept = _decision_path(
        cfg, device, state_dir, rate, objectives, wake_latency_us, allowed_functions
    )
    cap = resource_cap(device)
    if reuse and kept.is_file():
        try:
            data = json.loads(kept.read_text())
            planned = validate_pipeline(data["pipeline"], f"pipeline {cfg.name} (planned)")
        except Exception as exc:  # noqa: BLE001 - a bad kept decision is planned again
            progress(f"{cfg.name}: the kept decision {kept} is unusable ({exc}); planning again")
        else:
            stale = _cap_changed(data, cap.memory_cap_mb)
            if stale is not None:
                progress(f"{cfg.name}: the kept decision {kept} {stale}; planning again")
            elif all(Path(st.plan).joinpath("plan.yaml").is_file() for st in planned.stages
                     if getattr(st, "plan", None)):  # fmt: skip
                progress(f"{cfg.name}: the planner's decision for it is kept in {kept}")
                return planned, None
    cores = cpu_cores(device) or usable_cores()
    inp = planner_inputs(
        cfg, device=device, state_dir=state_dir, allowed_functions=allowed_functions,
        progress=progress, wake_latency_us=wake_latency_us,
    )  # fmt: skip
    for n in inp.notes:
        progress(n)
    # a factor is of the pipeline's own 1-thread latency
    slo = spec.resolve(inp.base_ms)
    assert slo is not None
    progress(f"searching K, cuts, threads and instances for an SLO of {slo:.1f} ms")
    incumbent = _planned_before(kept, cfg.name)
    if incumbent is not None:
        progress(f"{cfg.name}: the configuration planned before keeps a tie: {incumbent}")
    out, _ = search_measured(
        inp.stages,
        inp.paths,
        slo,
        cap,
        shapes=inp.shapes,
        progress=progress,
        rate=rate,
        cores=cores,
        objectives=objectives,
        whole=inp.whole,
        incumbent=incumbent,
    )
    if out.best is None:
        raise InfScalerError(
            f"no configuration meets the SLO of {slo:g} ms within the device's cap: "
            f"{out.explain[-1]}",
            hint="raise the SLO, or see `infscaler plan PIPELINE --slo X --explain`",
        )
    best = out.best
    runner = runner_up(out)
    serving, other = best, runner
    serving_exp = expected_from(best)
    forced = os.environ.get(START_WITH_ENV, "")
    if forced:
        worst = _worst(out)
        if forced != "worst":
            raise InfScalerError(
                f"{START_WITH_ENV}={forced!r} is not a start this test hook knows",
                hint=f"unset {START_WITH_ENV}, or set it to worst",
            )
        if worst is None:
            progress(
                f"{cfg.name}: {START_WITH_ENV}=worst: no candidate is below "
                f"{WRONG_START_AT:.0%} of the choice's capacity; deploying the choice"
            )
        else:
            progress(f"{cfg.name}: {START_WITH_ENV}=worst: wrong start {worst.label()}")
            serving, other = worst, best
            # the live check is told the best's prediction for it: a planner that
            # mispredicted a configuration by that much
            w = expected_from(worst)
            scale = w.capacity_rps / serving_exp.capacity_rps
            serving_exp = dataclasses.replace(
                w,
                unit_ms=tuple(ms * scale for ms in w.unit_ms),
                goodput_rps=serving_exp.goodput_rps,
            )
    data = candidate_pipeline(cfg, inp, serving, state_dir, device, progress)
    live: dict[str, Any] = {"serving": serving_exp.to_dict()}
    if other is not None:
        live["other"] = {
            **expected_from(other).to_dict(),
            "pipeline": candidate_pipeline(cfg, inp, other, state_dir, device, progress),
        }
    planned = validate_pipeline(data, f"pipeline {cfg.name} (planned)")
    _keep(kept, data, serving, cap.memory_cap_mb, live)
    return planned, out


#: The test hook that starts a planned pipeline with a deliberately wrong configuration:
#: ``worst`` deploys the fitting candidate with the least goodput in place of the
#: planner's choice, with the choice's predicted capacity, as a planner that
#: mispredicted it would, and the choice as its runner-up, so that the live check
#: (:mod:`infscaler.runtime.planning.livecheck`) has a wrong start to correct. For tests and
#: bench/ only.
START_WITH_ENV = "INFSCALER_TEST_START_WITH"


def runner_up(outcome: Any) -> Any:
    """The best-ranked candidate after the winner that fits, answers requests within the
    SLO and is another configuration (its :meth:`~infscaler.runtime.planning.planner.Candidate.
    identity`); preferring the search's finalists (scored on the long trace). None when
    there is none."""
    best = outcome.best
    if best is None:
        return None
    ok = [
        c for c in outcome.candidates
        if c.fits and c.goodput_rps > 0 and c.identity() != best.identity()
    ]  # fmt: skip
    return next((c for c in ok if c.finalist == best.finalist), ok[0] if ok else None)


def _worst(outcome: Any) -> Any:
    """The fitting candidate with the least predicted instance capacity, when it is
    below :data:`WRONG_START_AT` of the winner's (a start the live check can tell
    apart); else None."""
    best = outcome.best
    ok = [c for c in outcome.candidates if c.fits and c.goodput_rps > 0]
    if best is None or len(ok) < 2:
        return None
    worst = min(ok, key=lambda c: expected_from(c).capacity_rps)
    if expected_from(worst).capacity_rps > WRONG_START_AT * expected_from(best).capacity_rps:
        return None
    return worst


#: :data:`START_WITH_ENV` ``worst`` starts with a candidate only when its predicted
#: capacity is below this fraction of the planner's choice's
WRONG_START_AT = 0.7


def candidate_pipeline(
    cfg: Any,
    inp: PlannerInputs,
    cand: Any,
    state_dir: Path,
    device: Any,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """The pipeline ``cfg`` as data with its model stages set to ``cand``'s cuts (a plan
    directory written for each partitioned stage, :func:`chosen_plan_dir`), threads and
    instances, or as one unit (``fuse: whole``) when ``cand`` is the whole pipeline;
    function stages as written.

    Raises:
        InfScalerError: partitioning at the candidate's cuts failed.
    """
    data = cfg.model_dump(exclude_none=True)
    for k, st in enumerate(cfg.stages):
        if st.kind == "function":  # as written (its fields set decide whether it fuses)
            data["stages"][k] = st.model_dump(exclude_unset=True, exclude_none=True)
    if cand.whole:  # one unit: every model whole, at the unit's threads and instances
        served = [c.total for u, c in zip(cand.units, cand.config, strict=True) if u.served]
        return whole_config(cfg, inp.model_index, cand.threads[0], served[0]).model_dump(
            exclude_none=True
        )
    spans = stage_order(inp, cand.cuts)
    offset = len(cand.units) - sum(n for _, n in spans)  # the front end's unit, if any
    m = 0
    for s, (at, n_units) in zip(inp.stages, spans, strict=True):
        if not isinstance(s, ModelStage):
            continue
        k = inp.model_index[m]
        st = cfg.stages[k]
        path, shape = inp.paths[m], inp.shapes[m]
        cuts = cand.cuts[m]
        inst = [c.total for c in cand.config[offset + at : offset + at + n_units]]
        m += 1
        sd = dict(data["stages"][k])
        sd["threads"] = cand.threads[m - 1]
        sd["instances"] = inst if n_units > 1 else inst[0]
        if cuts:
            plan_dir = chosen_plan_dir(state_dir, path, shape, cuts)
            if not (plan_dir / "plan.yaml").is_file():
                progress(f"{st.name}: writing the plan K={n_units} cuts {list(cuts)}")
                partition_model(
                    path, shapes=shape, cuts=cuts, device=device, out_dir=plan_dir, force=True,
                )  # fmt: skip
            for f in ("model", "shapes", "partitions", "slo", "max_partitions"):
                sd.pop(f, None)
            sd["plan"] = str(plan_dir)
        data["stages"][k] = sd
    return data


#: a kept decision is planned again when the device's memory cap grew past this factor
#: of the cap it was planned under (more memory may afford a better configuration)
CAP_GROWTH_REPLAN = 1.25


def chosen_plan_dir(state_dir: str | Path, model: Path, shapes: Any, cuts: Sequence[int]) -> Path:
    """Where the plan of ``model`` cut at ``cuts`` (for input ``shapes``) is written:
    ``<state_dir>/plans/auto-<stem>-<12 hex>``
    (:func:`~infscaler.runtime.serving.pipeline.keyed_plan_dir`: keyed by the model file's
    path, size and modification time, the shapes and the cuts), so that a model file
    replaced in place (a new export under the same name) is partitioned anew rather than
    served from the old file's partitions.

    Raises:
        OSError: ``model`` cannot be stat'ed.
    """
    return keyed_plan_dir(state_dir, model, (shapes, list(cuts)), prefix="auto-")


def _keep(
    path: Path,
    data: dict[str, Any],
    best: Any,
    cap_mb: float,
    live: dict[str, Any] | None = None,
) -> None:
    """Write a decision (the planned pipeline as data, the chosen candidate's line, its
    memory and the cap it was planned under, MB, and ``live``: what the live check
    compares, :func:`live_plan`) for :func:`plan_pipeline` to reuse; atomically, so a
    concurrent deploy reads the old file or the new one."""
    kept = {
        "pipeline": data,
        "chosen": best.line(),
        "identity": best.identity(),
        "memory_mb": round(float(best.memory_mb), 1),
        "memory_cap_mb": None if not math.isfinite(cap_mb) else round(float(cap_mb), 1),
    }
    if live is not None:
        kept["live"] = live
    _write_json(path, kept)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


@dataclass(frozen=True)
class LivePlan:
    """What the live check (:mod:`infscaler.runtime.planning.livecheck`) of a planned pipeline
    compares, read from its kept decision (:func:`live_plan`).

    Attributes:
        path: the kept decision (rewritten by :func:`keep_live` when the live check
            settles on the other configuration).
        serving: the prediction for the configuration deployed.
        other: the prediction for the runner-up (None: the search had none).
        other_pipeline: the runner-up as pipeline data (None: none).
    """

    path: Path
    serving: Expected
    other: Expected | None
    other_pipeline: dict[str, Any] | None

    def swapped(self, serving_pipeline: dict[str, Any]) -> LivePlan:
        """The plan once the other configuration serves (``serving_pipeline``: the one
        serving now, as data, which becomes the other)."""
        assert self.other is not None
        return LivePlan(self.path, self.other, self.serving, serving_pipeline)


def live_plan(
    cfg: Any,
    *,
    device: Any,
    state_dir: Path,
    rate: float | None = None,
    objectives: tuple[str, ...] = ("eq1", "minmax", "weights"),
    allowed_functions: Sequence[str] | None = None,
    wake_latency_us: int | None = None,
) -> LivePlan | None:
    """The :class:`LivePlan` kept with the decision :func:`plan_pipeline` made for
    ``cfg`` with these arguments; None when there is no decision, or it predates the
    live check, or it is unreadable (then nothing is checked live)."""
    path = _decision_path(
        cfg, device, state_dir, rate, objectives, wake_latency_us, allowed_functions
    )
    try:
        live = json.loads(path.read_text())["live"]
        serving = Expected.from_dict(live["serving"])
        other = live.get("other")
        return LivePlan(
            path,
            serving,
            None if other is None else Expected.from_dict(other),
            None if other is None else dict(other["pipeline"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_live(plan: LivePlan, serving_pipeline: dict[str, Any], reason: str) -> None:
    """Rewrite the kept decision after the live check settled on the configuration
    now serving (``plan.serving``, as ``serving_pipeline`` data) with ``reason``: the
    next start deploys it and checks it again (a kept decision is where the live check
    starts, never a verdict). The identity of a switched-to configuration is not known
    to the search's incumbent rule, so the next replan gives no tie to either."""
    try:
        data = json.loads(plan.path.read_text())
    except (OSError, ValueError):
        return
    data["pipeline"] = serving_pipeline
    data["live"] = {
        "serving": plan.serving.to_dict(),
        **(
            {"other": {**plan.other.to_dict(), "pipeline": plan.other_pipeline}}
            if plan.other is not None and plan.other_pipeline is not None
            else {}
        ),
        "reason": reason,
    }
    if data.get("chosen") and plan.serving.label not in str(data["chosen"]):
        data["chosen"] = f"{plan.serving.label} (the live check's choice: {reason})"
        data.pop("identity", None)
    _write_json(plan.path, data)


#: hex digits of the key digest in a kept decision's file name, ``<pipeline>-<digest>.json``
#: (:func:`_decision_path` writes it, :func:`_planned_before` finds a pipeline's others)
_DECISION_DIGEST = 16


def _planned_before(kept: Path, name: str) -> list[Any] | None:
    """The configuration (:meth:`~infscaler.runtime.planning.planner.Candidate.identity`) of the
    most recent other decision kept for pipeline ``name`` (another key: a model file,
    a curve or the device changed), for :func:`~infscaler.runtime.planning.planner.search`'s
    ``incumbent``; None when there is none or it is unreadable."""
    import re

    pattern = re.compile(rf"{re.escape(name)}-[0-9a-f]{{{_DECISION_DIGEST}}}\.json")
    try:
        others = [
            p for p in kept.parent.iterdir()
            if p != kept and pattern.fullmatch(p.name) and p.is_file()
        ]  # fmt: skip
        for p in sorted(others, key=lambda p: p.stat().st_mtime_ns, reverse=True):
            data = json.loads(p.read_text())
            identity = data.get("identity")
            if data.get("pipeline", {}).get("name") == name and isinstance(identity, list):
                return identity
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _cap_changed(kept: dict[str, Any], cap_mb: float) -> str | None:
    """Why a kept decision no longer holds under the memory cap ``cap_mb`` (None: it
    does). The cap is not part of the decision's key: the host profile's cap is a
    share of the memory available at deploy, which moved by 240 MB between two deploys
    a minute apart, so every deploy planned again and the bench's steps of one
    configuration ran K = 1 and K = 2 (PP-OCRv4 det at SLO 3x, bench/HISTORY.md). The
    decision stands while its configuration still fits and the cap has not grown past
    :data:`CAP_GROWTH_REPLAN` x the one it was planned under (a smaller cap only removes
    configurations, and the chosen one is still among those left)."""
    need, then = kept.get("memory_mb"), kept.get("memory_cap_mb")
    if need is not None and math.isfinite(cap_mb) and float(need) > cap_mb:
        return f"needs {float(need):.0f} MB, more than the cap of {cap_mb:.0f} MB now"
    if then is not None and cap_mb > CAP_GROWTH_REPLAN * float(then):
        return (
            f"was planned under a {float(then):.0f} MB cap; the cap is {cap_mb:.0f} MB now "
            f"(> {CAP_GROWTH_REPLAN:g}x)"
        )
    if then is None and math.isfinite(cap_mb):
        return f"was planned with no memory cap; the cap is {cap_mb:.0f} MB now"
    return None


def _function_key(spec: str, allowed: Sequence[str] | None) -> str:
    """``module:attr|<file_key of the module's source file>`` for a function stage, without
    importing the module (``importlib.util.find_spec``; a dotted name imports its parent
    packages, so the allowed modules are checked first, as
    :func:`~infscaler.runtime.serving.pipeline.load_function` does); ``module:attr|?`` where the
    file cannot be found or the module is not allowed (the deploy then says why). Only
    the module's own file: an edit to a module it imports does not plan again."""
    import importlib.util
    import sys

    from infscaler.base.security import check_function_module

    module = spec.partition(":")[0]
    try:
        if allowed is not None:
            check_function_module(spec, allowed)
        origin = getattr(sys.modules.get(module), "__file__", None)
        if origin is None:
            found = importlib.util.find_spec(module)
            origin = found.origin if found is not None else None
        if origin and Path(origin).is_file():
            return f"{spec}|{file_key(Path(origin))}"
    except Exception:  # noqa: BLE001 - planning or the deploy reports it
        pass
    return f"{spec}|?"


def _decision_path(
    cfg: Any,
    device: Any,
    state_dir: Path,
    rate: float | None,
    objectives: Sequence[str],
    wake_latency_us: int | None = None,
    allowed_functions: Sequence[str] | None = None,
) -> Path:
    """Where :func:`plan_pipeline` keeps its decision for these inputs (see there).

    The idle slowdowns kept for its models (:func:`~infscaler.runtime.scaling.idlecurve.load_curve`,
    at the thread counts :func:`planner_inputs` measures) are part of the key, their
    factors to the nearest 0.25: a curve kept after the last decision, or one that moved,
    plans again; one re-kept each minute with the same shape does not. So are its
    function stages' source files (:func:`_function_key`): the planner measured their
    cost, so an edited pre- or post-processing step plans again."""
    import hashlib

    from infscaler import __version__

    files = []
    learned = []
    for st in cfg.stages:
        if getattr(st, "function", None):
            files.append(_function_key(st.function, allowed_functions))
        if getattr(st, "kind", "") == "model" and getattr(st, "model", None):
            try:
                f = Path(resolve_model(st.model))
                files.append(file_key(f))
                for t in planned_thread_counts():
                    pts = load_curve(f, t, wake_latency_us)
                    if pts:
                        learned.append([st.name, t, [round(x * 4) / 4 for _, x in pts]])
            except Exception:  # noqa: BLE001 - planning then reports it
                files.append(f"{st.model}|?")
    # the memory cap is checked on reuse instead (:func:`_cap_changed`): the host
    # profile's moves with the memory available at each deploy, and so does its
    # ``sources`` text (which quotes it)
    dev = (
        device.model_dump_json(exclude={"memory_cap_mb", "sources"})
        if hasattr(device, "model_dump_json")
        else repr(device)
    )
    key = json.dumps(
        [cfg.model_dump_json(), dev, rate, list(objectives), __version__, files]
        + ([learned] if learned else []),
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:_DECISION_DIGEST]
    return Path(state_dir) / "plans" / "decisions" / f"{cfg.name}-{digest}.json"
