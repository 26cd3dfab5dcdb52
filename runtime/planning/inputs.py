"""What the deploy-time planner's configuration search takes, measured on this host.

:func:`planner_inputs` builds :class:`PlannerInputs`: each model stage measured, function
stages run in-process on a sample request, units fused as the runtime fuses them (a
model stage with varying input shapes is searched whole); :func:`whole_profiles`: the
pipeline as one unit per thread count. Details: docs/planner.md, "Inputs"."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS, resolve_model
from infscaler.partitioner.loader import parse_shapes
from infscaler.partitioner.profiler import usable_cores
from infscaler.runtime.planning.planner import ModelStage
from infscaler.runtime.planning.resources import arrival_rates
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
from infscaler.runtime.planning.stageprofile import measure_model_stage
from infscaler.runtime.scaling.idlecurve import curve_for

__all__ = [
    "PlannerInputs",
    "base_latency_ms",
    "planned_thread_counts",
    "planner_inputs",
    "whole_pipeline",
    "whole_profiles",
]

#: Stage fields that hold the user's own K / threads / instances / batching choice: a
#: model stage is searched with them dropped (``infscaler plan`` explores every K).
_MODEL_CHOICES = ("partitions", "slo", "max_partitions", "threads", "max_threads", "instances",
                  "max_instances", "batching")  # fmt: skip


@dataclass(frozen=True)
class PlannerInputs:
    """What :func:`planner_inputs` measured, as :func:`~infscaler.runtime.planning.planner.search`
    takes it.

    Attributes:
        stages: in pipeline order, a ModelStage per model stage (with its fused steps) and a
            fixed UnitProfile per function unit fused into no model.
        model_index: per ModelStage, its index in the pipeline's ``stages``.
        paths / shapes: per ModelStage, its ONNX file and shapes (``x:1x3x224x224``).
        base_ms: the pipeline's 1-thread latency per request, ms (a factor SLO's reference).
        notes: what a reader should know (stages searched whole and why).
        whole: threads -> the whole pipeline as one unit; empty when not a candidate."""

    stages: tuple[ModelStage | UnitProfile, ...]
    model_index: tuple[int, ...]
    paths: tuple[Path, ...]
    shapes: tuple[str | None, ...]
    base_ms: float
    notes: tuple[str, ...] = ()
    whole: Mapping[int, UnitProfile] = field(default_factory=dict)


def whole_pipeline(cfg: Any) -> Any:
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
    """The intra-op thread counts each model is measured at: 1, 2 and this host's usable cores."""
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
        cfg: a PipelineConfig whose model stages name ONNX models; their own K / threads /
            instances are ignored.
        device: its DeviceProfile. state_dir: where compiling keeps plans (none made).
        allowed_functions: the modules function stages may come from (None: any); their code
            runs in this process on the sample request.
        repeats: timed runs per measurement.
        wake_latency_us: the PM QoS CPU latency limit held (None: none): selects the idle
            slowdown kept under it (:func:`infscaler.runtime.scaling.idlecurve.load_curve`).

    Raises:
        InfScalerError: a stage given as a plan directory, no model stage, a function failing
            on the sample request, or a fan-out that made no items."""
    run = _Gathering(
        cfg, device, state_dir, allowed_functions, repeats, progress, wake_latency_us,
        planned_thread_counts(),
    )  # fmt: skip
    _check_searchable(cfg)
    if not any(st.kind == "function" for st in cfg.stages):
        return _models_only(run)
    return _with_functions(run)


def _check_searchable(cfg: Any) -> None:
    """Raise when ``cfg`` has a model stage given as a plan directory, or no model stage
    (:func:`planner_inputs`' first two errors)."""
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


def _shapes_of(st: Any) -> str | None:
    """A model stage's input shapes: its own, else its bundled model's (None: none)."""
    return st.shapes if st.shapes is not None else getattr(MODELS.get(st.model), "shapes", None)


@dataclass(frozen=True)
class _Gathering:
    """One :func:`planner_inputs` call: its arguments and the thread counts every model
    is measured at (:func:`~infscaler.runtime.planning.stageprofile.planned_thread_counts`),
    shared by its steps."""

    cfg: Any
    device: Any
    state_dir: Path | None
    allowed_functions: Sequence[str] | None
    repeats: int
    progress: Callable[[str], None]
    wake_latency_us: int | None
    threads: list[int]

    def measure(self, st: Any) -> tuple[ModelStage, Path, str | None]:
        """Model stage ``st`` measured whole (:func:`measure_model_stage`, with the idle
        slowdown it served under :attr:`wake_latency_us`), its ONNX file and shapes."""
        path = resolve_model(st.model)
        shp = _shapes_of(st)
        ms = measure_model_stage(
            path,
            name=st.name,
            shapes=shp,
            threads=self.threads,
            repeats=self.repeats,
            progress=self.progress,
            learned_idle=lambda t: curve_for(path, t, self.wake_latency_us, tuple(self.threads)),
        )
        return ms, path, shp

    def whole(self, stages: Sequence[ModelStage | UnitProfile]) -> dict[int, UnitProfile]:
        """The whole pipeline as one unit (:func:`whole_profiles`) when it is a candidate:
        at least two model stages, the pipeline fused (``fuse`` true or ``whole``) and no
        stage setting its own ``fuse``; else empty."""
        cfg = self.cfg
        offer_whole = (
            cfg.fuse in (True, "whole")
            and sum(st.kind == "model" for st in cfg.stages) >= 2
            and all(st.fuse is None for st in cfg.stages)
        )
        whole_name = ">".join(st.name for st in cfg.stages)
        return whole_profiles(stages, whole_name) if offer_whole else {}


def _models_only(run: _Gathering) -> PlannerInputs:
    """The inputs of a pipeline of model stages only: each measured whole, in turn."""
    got = [run.measure(st) for st in run.cfg.stages]
    models = [g[0] for g in got]
    return PlannerInputs(
        stages=tuple(models),
        model_index=tuple(range(len(got))),
        paths=tuple(g[1] for g in got),
        shapes=tuple(g[2] for g in got),
        base_ms=sum(g[0].whole_ms[1] for g in got),
        whole=run.whole(models),
    )


def _with_functions(run: _Gathering) -> PlannerInputs:
    """The inputs of a pipeline with function stages: it is compiled with its model stages
    whole (:func:`whole_pipeline`) and run in-process on a sample request (:func:`_sample_request`,
    else made up); its runtime units are the search's (see the module docstring)."""
    from infscaler.runtime.planning.unitprofile import profile_pipeline, sample_inputs
    from infscaler.runtime.serving.pipeline import compile_pipeline

    cfg = run.cfg
    whole = whole_pipeline(cfg)
    run.progress(f"{cfg.name}: running the pipeline in-process on a sample request")
    compiled = compile_pipeline(
        whole, state_dir=run.state_dir, device=run.device, allowed_functions=run.allowed_functions
    )
    notes: list[str] = []
    feeds = _sample_request(run, whole, notes)
    try:
        if feeds is None:
            feeds = sample_inputs(compiled)
        prof = profile_pipeline(compiled, feeds, repeats=run.repeats)
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
            # a function unit fused into no model: as measured, one instance
            stages.append(dataclasses.replace(up, max_instances=1) if up.served else up)
            continue
        k, ms, path, shp = _fused_model_stage(run, u, prof, by_name, notes)
        stages.append(ms)
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
        whole=run.whole(stages),
    )


def _sample_request(run: _Gathering, whole: Any, notes: list[str]) -> dict[str, Any] | None:
    """The request of the first function stage of ``whole`` that has a ``sample`` hook
    (None: none has one, or its hook failed: then a note says so)."""
    from infscaler.runtime.serving.pipeline import load_function

    feeds = None
    for st in whole.stages:  # the first function stage's sample hook, if it has one
        hook = getattr(load_function(st.function, run.allowed_functions), "sample", None) if (
            st.kind == "function"
        ) else None  # fmt: skip
        if not callable(hook):
            continue
        try:
            feeds = dict(hook())
            run.progress(f"{run.cfg.name}: the sample request of {st.function}.sample")
        except Exception as exc:  # noqa: BLE001 - e.g. an optional dependency missing
            notes.append(f"{st.name}: its sample hook failed ({exc}); a made-up request instead")
        break
    return feeds


def _fused_model_stage(
    run: _Gathering,
    u: Any,
    prof: Any,
    by_name: Mapping[str, tuple[int, Any]],
    notes: list[str],
) -> tuple[int, ModelStage, Path, str | None]:
    """Runtime unit ``u`` around a model stage as a :class:`ModelStage` with its fused steps
    (``pre_ms`` / ``post_ms``) and fan-out items; searched whole when the sample did not feed
    it its shapes. Returns ``(stage index, stage, ONNX file, shapes)``.

    Raises:
        InfScalerError: it fuses the fan-out and the fan-out recorded no item counts."""
    steps = u.step_units
    m = next(i for i, s in enumerate(steps) if s.kind == "model")
    pre = sum(prof.step_ms.get(s.name, 0.0) for s in steps[:m])
    post = sum(prof.step_ms.get(s.name, 0.0) for s in steps[m + 1 :])
    k, st = by_name[steps[m].stage]
    ms, path, shp = run.measure(st)
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
    return k, dataclasses.replace(ms, pre_ms=pre, post_ms=post, items=items), path, shp


def _units_at(stages: Sequence[ModelStage | UnitProfile], threads: int = 1) -> list[UnitProfile]:
    """The units of ``stages`` with every model stage whole at ``threads`` threads."""
    out: list[UnitProfile] = []
    for s in stages:
        out.extend(s.units((), threads) if isinstance(s, ModelStage) else [s])
    return out


def base_latency_ms(stages: Sequence[ModelStage | UnitProfile], threads: int = 1) -> float:
    """A request's latency through ``stages`` with every model at ``threads`` threads, ms: each
    unit's mean time (fused steps included) x its items per request.

    Raises:
        KeyError: a model stage not measured at ``threads``."""
    units = _units_at(stages, threads)
    return sum(
        r * u.fastest().mean_ms for r, u in zip(arrival_rates(units, 1.0), units, strict=True)
    )


def whole_profiles(
    stages: Sequence[ModelStage | UnitProfile], name: str = "whole"
) -> dict[int, UnitProfile]:
    """The whole pipeline as one unit (``fuse: whole``) per thread count every model stage was
    measured at: time :func:`base_latency_ms` at ``t``; memory the stages' weights and
    activations plus the largest overhead; ``cores`` = ``t`` (docs/planner.md, "Inputs")."""
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
    """The whole pipeline's idle slowdown at ``t`` threads: per gap measured for every stage,
    their factors weighted by whole-model time (an upper bound); none when a stage has none."""
    pts = [dict(m.idle_by_threads.get(t, ())) for m in models]
    gaps = sorted(set.intersection(*(set(p) for p in pts))) if all(pts) else []
    weights = [m.whole_ms.get(t, m.whole_ms[1]) for m in models]
    total = math.fsum(weights)
    return tuple(
        (g, math.fsum(w * p[g] for w, p in zip(weights, pts, strict=True)) / total) for g in gaps
    )
