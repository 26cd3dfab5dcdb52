"""Measure a model stage for the planner's configuration search.

:func:`measure_model_stage` builds a :class:`~infscaler.runtime.planning.planner.ModelStage`
from an ONNX model with the partitioner's steps (per-operator costs, valid cuts, whole
model latency per thread count, slowdowns, T_p). :func:`search_measured` searches,
measures the best candidates' partitions and searches again. Details: docs/planner.md,
"Stage profiles". Not pure (it runs onnxruntime)."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from infscaler.base.device import INSTANCE_OVERHEAD_MB
from infscaler.partitioner import cost as cost_mod
from infscaler.partitioner import profiler
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.graph import OperatorGraph
from infscaler.partitioner.loader import load_model, random_feeds
from infscaler.runtime.planning.planner import ModelStage, search

__all__ = [
    "measure_model_stage",
    "measure_units_err",
    "search_measured",
    "spread_cv",
    "with_drift",
]

#: The whole model is timed at each thread count for at least ``repeats`` runs, then on
#: while the timed runs took less than this many seconds in all (ResNet-50 on 2 cores:
#: about 27 runs at 1 thread, 30 at 2; VGG-19: the ``repeats`` only) ...
SPREAD_BUDGET_S = 2.0
#: ... and at most this many runs.
SPREAD_MAX_RUNS = 30
#: Fewest runs whose spread is used (fewer: the simulator's service time stays
#: deterministic at that thread count).
SPREAD_MIN_RUNS = 10


#: :func:`measure_model_stage` measures the idle slowdown only when asked.
IDLE_DEFAULT = False


#: The least relative uncertainty of a measured median: the host's drift between two
#: measurements minutes apart (docs/planner.md, "The constants' measurements").
DRIFT_ERR = 0.10


def with_drift(err: float | None) -> float:
    """A measured median's relative uncertainty for the planner: ``err`` (None: not
    known) at least :data:`DRIFT_ERR`, at most 0.99."""
    return min(max(float(err or 0.0), DRIFT_ERR), 0.99)


def spread_cv(times_ms: Sequence[float]) -> float | None:
    """Coefficient of variation (sample standard deviation / mean) of one thread count's
    timed runs, ms; None for fewer than :data:`SPREAD_MIN_RUNS` runs. The simulator draws
    gamma service times with it (why: docs/planner.md, "Stage profiles").
    """
    if len(times_ms) < SPREAD_MIN_RUNS:
        return None
    mean = statistics.fmean(times_ms)
    if not mean > 0:
        return None
    return float(statistics.stdev(times_ms) / mean)


def measure_model_stage(
    model: str | os.PathLike[str],
    *,
    name: str = "model",
    shapes: str | None = None,
    threads: Sequence[int] = (1, 2),
    repeats: int = 5,
    use_cache: bool = True,
    idle: bool = IDLE_DEFAULT,
    learned_idle: Callable[[int], tuple[tuple[float, float], ...]] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> ModelStage:
    """A :class:`ModelStage` measured on this host (see the module docstring).

    Args:
        model: ONNX file. name: the stage's name. shapes: concrete input shapes.
        threads: intra-op thread counts to time the whole model at (above this host's
            cores: skipped; 1 always).
        repeats: timed runs per measurement (median taken).
        use_cache: reuse the partitioner's cached per-operator profile.
        idle: also time the whole model after idle gaps (``idle_by_threads``).
        learned_idle: threads -> the idle slowdown this model served; where given, it is
            ``idle_by_threads`` at that count.

    Raises:
        ModelLoadError, ShapeError: a bad model file or shapes."""

    progress(f"{name}: loading the model and costing operators")
    loaded = load_model(model, shapes, check_runnable=False)
    graph = OperatorGraph.from_loaded(loaded)
    costs = cost_mod.model_costs(loaded)
    feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs}, seed=0)
    stub = loaded.stub()  # what the cpu engine's sessions are built from
    whole = stub if stub is not None else loaded.session_source
    progress(f"{name}: profiling operators at 1 thread")
    prof = profiler.profile_model(
        whole,
        feeds,
        engine="cpu",
        model_sha256=loaded.sha256,
        warmup=2,
        repeats=repeats,
        threads=1,
        cache=use_cache,
        node_names=[n.name for n in loaded.model.graph.node],
    )
    cores = profiler.usable_cores()
    whole_ms: dict[int, float] = {}
    whole_ms_err: dict[int, float] = {}
    cv_by_threads: dict[int, float] = {}
    corun_by_threads: dict[int, float] = {}
    idle_by_threads: dict[int, tuple[tuple[float, float], ...]] = {}
    for t in sorted({1, *(int(x) for x in threads if 1 <= int(x) <= cores)}):
        progress(f"{name}: timing the whole model at {t} thread(s)")
        times = profiler.measure_latency_samples(
            whole,
            feeds,
            engine="cpu",
            warmup=2,
            repeats=repeats,
            threads=t,
            budget_s=SPREAD_BUDGET_S,
            max_repeats=SPREAD_MAX_RUNS,
        )
        whole_ms[t] = float(statistics.median(times))
        whole_ms_err[t] = with_drift(profiler.median_err(times))
        cv = spread_cv(times)
        if cv is not None:
            cv_by_threads[t] = cv
        if cores // t >= 2:
            progress(f"{name}: timing {cores // t} copies at once at {t} thread(s)")
            corun_by_threads[t] = profiler.measure_corun(whole, feeds, threads=t)
        served = learned_idle(t) if learned_idle is not None else ()
        if served:
            progress(f"{name}: the idle slowdown it served at {t} thread(s): {served}")
            idle_by_threads[t] = served
        elif idle:
            progress(f"{name}: timing the whole model after idle gaps at {t} thread(s)")
            idle_by_threads[t] = profiler.measure_idle(whole, feeds, threads=t)
    boundary = profiler.measure_boundary_overhead(engine="cpu", cache=use_cache)
    ops = graph.operators
    valid = graph.valid_cuts()
    n = len(ops)
    return ModelStage(
        name=name,
        costs=tuple(float(costs[o.node].flops) for o in ops),
        valid_cuts=tuple(valid),
        whole_ms=whole_ms,
        whole_ms_err=whole_ms_err,
        cv_by_threads=cv_by_threads,
        corun_by_threads=corun_by_threads,
        idle_by_threads=idle_by_threads,
        weights_bytes=tuple(float(costs[o.node].param_bytes) for o in ops),
        flops=tuple(float(costs[o.node].flops) for o in ops),
        op_ms=tuple(float(prof.node_ms.get(o.node, 0.0)) for o in ops),
        cut_bytes={c: float(graph.crossing_bytes(c)) for c in valid},
        boundary_fixed_ms=float(boundary.fixed_ms),
        boundary_per_mb_ms=float(boundary.per_mb_ms),
        activations_mb=graph.peak_activation_bytes(0, n - 1) / 1e6,
        instance_overhead_mb=INSTANCE_OVERHEAD_MB,
    )


def measure_units_err(
    model: str | os.PathLike[str],
    cuts: Sequence[int],
    threads: int,
    *,
    shapes: str | None = None,
    repeats: int = 5,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Measured latency of each partition of ``model`` cut at ``cuts`` at ``threads`` threads,
    ms (batch 1; the partitioner's own per-part timing, nothing written), with each one's
    relative uncertainty (``profiler.median_err``, at least :data:`DRIFT_ERR`):
    ``(ms per partition, err per partition)``.

    Raises:
        PartitionError: an invalid cut. ModelLoadError / ShapeError: a bad model or shapes.
        VerificationError: the parts do not reproduce the model."""

    plan = partition_model(model, shapes=shapes, cuts=list(cuts), threads=threads, repeats=repeats)
    parts = plan.summary["partitions"]
    ms = tuple(float(p["latency_ms"]["cpu"]) for p in parts)
    err = tuple(with_drift(p.get("latency_err", {}).get("cpu")) for p in parts)
    return ms, err


def search_measured(
    stages: Sequence[ModelStage | Any],
    models: Sequence[str | os.PathLike[str]],
    slo_ms: float,
    device: Any,
    *,
    shapes: Sequence[str | None] | None = None,
    refine: int = 3,
    rounds: int = 3,
    progress: Callable[[str], None] = lambda _m: None,
    **kwargs: Any,
) -> tuple[Any, list[Any]]:
    """:func:`~infscaler.runtime.planning.planner.search`, then the partitions of the
    ``refine`` best candidates measured in place of their estimates and the search run
    again, until all are measured or after ``rounds``. Returns the last outcome and the
    stages with ``unit_ms`` / ``unit_ms_err``.

    Args:
        stages: as ``search`` takes them.
        models / shapes: the ONNX file (and shapes) of each ModelStage, in order; ``kwargs``
            go to ``search``."""

    stages = list(stages)
    pos = [i for i, s in enumerate(stages) if isinstance(s, ModelStage)]
    shapes = list(shapes) if shapes is not None else [None] * len(pos)
    out = search(stages, slo_ms, device, **kwargs)
    for _ in range(rounds):
        todo: list[tuple[int, tuple[int, ...], int]] = []
        for c in out.candidates[:refine]:
            if not c.fits:
                continue
            for m, (cuts, t) in enumerate(zip(c.cuts, c.threads, strict=True)):
                st = stages[pos[m]]
                if cuts and (cuts, t) not in st.unit_ms and (m, cuts, t) not in todo:
                    todo.append((m, cuts, t))
        if not todo:
            break
        for m, cuts, t in todo:
            i = pos[m]
            progress(
                f"{stages[i].name}: measuring the partitions of cuts {list(cuts)} at {t} thread(s)"
            )
            ms, err = measure_units_err(models[m], cuts, t, shapes=shapes[m])
            stages[i] = dataclasses.replace(
                stages[i],
                unit_ms={**stages[i].unit_ms, (cuts, t): ms},
                unit_ms_err={**stages[i].unit_ms_err, (cuts, t): err},
            )
        out = search(stages, slo_ms, device, **kwargs)
    return out, stages
