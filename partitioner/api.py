"""``partition_model``: the offline partitioning pipeline (InfScaler §IV-A, Eq. 1).

Load -> operator costs -> per-engine profile, T_o, T_p -> valid cuts -> search -> sub-models
verified as a chain -> the :class:`~.plan.Plan`, written atomically once all succeeded.
More: docs/architecture.md, "`partitioner/api.py`".
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from infscaler.base import __version__
from infscaler.base.device import DeviceProfile
from infscaler.base.errors import InfScalerError
from infscaler.base.slo import SLO, parse_slo  # noqa: F401 - re-exported
from infscaler.engines import available
from infscaler.partitioner import cost as cost_mod
from infscaler.partitioner import extract, profiler, search
from infscaler.partitioner.graph import OperatorGraph
from infscaler.partitioner.loader import LoadedModel, load_model, random_feeds
from infscaler.partitioner.plan import (
    PLAN_FORMAT,
    Plan,
    check_output_dir,
    tensor_list,
    write_plan,
)

Measure = Literal["flops", "time"]
Progress = Callable[[str], None]

__all__ = ["inspect_model", "partition_model"]

_MB = 1e6


_EQUATIONS = {
    "minmax": "balanced: min max_k S_k, S_k = sum of c_n in partition k",
    "weights": "balanced, weights apart: min sum_k W_k S_k s.t. S_k <= 1.1 min max S",
    "given": "cuts given by the caller (the planner's search)",
}


def _noop(_: str) -> None:
    return None


def partition_model(
    model: str | os.PathLike[str],
    *,
    shapes: dict[str, tuple[int, ...]] | str | None = None,
    slo: SLO | str | float | None = None,
    num_partitions: int | None = None,
    max_partitions: int = 4,
    measure: Measure = "flops",
    device: DeviceProfile | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    rtol: float = 1e-4,
    warmup: int = 2,
    repeats: int = 5,
    threads: int | None = None,
    use_cache: bool = True,
    max_crossing_mb: float | None = None,
    progress: Progress = _noop,
    objective: str = "eq1",
    cuts: Sequence[int] | None = None,
) -> Plan:
    """Partition an ONNX model and (with ``out_dir``) write the plan directory.

    Args:
        model: path of the ``.onnx`` file.
        shapes: concrete shapes of dynamic inputs (:func:`~.loader.parse_shapes`).
        slo: latency SLO (``100ms``, ``1.5x``); None = unconstrained.
        num_partitions: exact K; None searches K in 1..``max_partitions``.
        measure: c_n as ``flops`` or ``time`` (profiled ms on the cpu engine).
        device: target device profile; its engines are reported per partition.
        out_dir: where ``plan.yaml`` + ``part_<k>.onnx`` go (``force`` replaces a plan).
        rtol: verification tolerance; warmup, repeats, threads, use_cache: profiling settings.
        max_crossing_mb: refuse cuts whose crossing tensors exceed this (MB).
        progress: called with a short description as each step starts.
        objective: ``eq1``, ``minmax`` or ``weights`` (weights = ``param_bytes``); without K
            the balanced ones take the K with the least largest partition cost (< 1 % gain
            loses to fewer partitions).
        cuts: explicit valid cut positions; override ``objective`` and ``num_partitions``.

    Raises:
        ModelLoadError, ShapeError: as :func:`~.loader.load_model`.
        PartitionError: infeasible request (SLO below T_o, K too large, no valid cuts).
        VerificationError: the chain does not reproduce the model within ``rtol``.
    """
    _check_request(objective, measure, max_partitions, num_partitions)
    slo = slo if isinstance(slo, SLO) else parse_slo(slo)
    if out_dir is not None:
        check_output_dir(Path(out_dir), force=force)
    found = _search_plan(
        model,
        shapes=shapes,
        slo=slo,
        num_partitions=num_partitions,
        max_partitions=max_partitions,
        measure=measure,
        warmup=warmup,
        repeats=repeats,
        threads=threads,
        use_cache=use_cache,
        max_crossing_mb=max_crossing_mb,
        progress=progress,
        objective=objective,
        cuts=cuts,
    )
    return _build_plan(
        found,
        slo=slo,
        measure=measure,
        device=device,
        out_dir=out_dir,
        force=force,
        rtol=rtol,
        warmup=warmup,
        repeats=repeats,
        progress=progress,
    )


@dataclass
class _Found:
    """Steps 1-5 of :func:`partition_model`: the model, what was measured of it, and the
    cuts chosen (Eq. 1, or the objective asked for)."""

    loaded: LoadedModel
    graph: OperatorGraph
    costs: dict[str, cost_mod.OperatorCost]
    feeds: dict[str, np.ndarray]
    threads: int
    whole_cpu: extract.PartLike
    engines: dict[str, str | None]
    profiles: dict[str, profiler.ModelProfile]
    boundary: profiler.BoundaryOverhead
    slo_ms: float | None
    t_p: float
    c: list[float]
    result: search.SearchResult


def _search_plan(
    model: str | os.PathLike[str],
    *,
    shapes: dict[str, tuple[int, ...]] | str | None,
    slo: SLO,
    num_partitions: int | None,
    max_partitions: int,
    measure: Measure,
    warmup: int,
    repeats: int,
    threads: int | None,
    use_cache: bool,
    max_crossing_mb: float | None,
    progress: Progress,
    objective: str,
    cuts: Sequence[int] | None,
) -> _Found:
    """Steps 1-5 of :func:`partition_model`: load the model, cost and profile its
    operators, measure T_o and T_p, and choose the cuts (Eq. 1: min sum_k sigma(P_k)
    s.t. T_o + (K-1) T_p <= SLO, or the objective asked for)."""
    progress("loading and checking the model")
    # onnxruntime's acceptance of the model is proven by the first profiling session
    # (a clear ModelLoadError, before anything is written); no separate check session.
    loaded = load_model(model, shapes, check_runnable=False)

    progress("computing operator costs")
    graph = OperatorGraph.from_loaded(loaded)
    costs = cost_mod.model_costs(loaded)

    feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs}, seed=0)
    n_threads = int(threads or profiler.usable_cores())
    whole_cpu = _cpu_source(loaded)
    engines = profiler.profiled_engines()
    profiles = _profile_engines(
        loaded, whole_cpu, feeds, engines, n_threads, warmup, repeats, use_cache, progress
    )
    progress("measuring the partition boundary overhead T_p")
    boundary = profiler.measure_boundary_overhead(engine="cpu", cache=use_cache)

    t_o = profiles["cpu"].total_ms
    slo_ms = slo.resolve(t_o)
    valid = graph.valid_cuts(None if max_crossing_mb is None else int(max_crossing_mb * _MB))
    cut_bytes = {c: graph.crossing_bytes(c) for c in valid}  # also Eq. 1's tie-break
    mean_crossing = float(np.mean(list(cut_bytes.values()))) if valid else 0.0
    t_p = boundary.ms(int(mean_crossing))

    if measure == "flops":
        c = [float(costs[op.node].flops) for op in graph.operators]
    else:
        node_ms = profiles["cpu"].node_ms
        c = [float(node_ms.get(op.node, 0.0)) for op in graph.operators]

    progress(f"searching cut points ({'given' if cuts is not None else objective})")
    result = _search_cuts(
        c,
        valid,
        cut_bytes,
        graph,
        costs,
        objective=objective,
        cuts=cuts,
        num_partitions=num_partitions,
        max_partitions=max_partitions,
        t_o=t_o,
        t_p=t_p,
        slo_ms=slo_ms,
    )
    return _Found(
        loaded=loaded,
        graph=graph,
        costs=costs,
        feeds=feeds,
        threads=n_threads,
        whole_cpu=whole_cpu,
        engines=engines,
        profiles=profiles,
        boundary=boundary,
        slo_ms=slo_ms,
        t_p=t_p,
        c=c,
        result=result,
    )


def _build_plan(
    found: _Found,
    *,
    slo: SLO,
    measure: Measure,
    device: DeviceProfile | None,
    out_dir: str | os.PathLike[str] | None,
    force: bool,
    rtol: float,
    warmup: int,
    repeats: int,
    progress: Progress,
) -> Plan:
    """Steps 6-7 of :func:`partition_model`: extract the parts of ``found``'s cuts,
    verify the chain against the whole model, time each part per engine, build the
    :class:`~.plan.Plan` and, given ``out_dir``, write it atomically."""
    loaded, profiles, feeds, n_threads = found.loaded, found.profiles, found.feeds, found.threads
    result = found.result
    # Parts are saved (once, into a staging directory beside the target that becomes the
    # plan directory) only when a plan is written or an engine other than the CPU builds
    # its sessions from files; the CPU sessions are built from stubs of the parts.
    save_parts = out_dir is not None or any(e != "cpu" for e in profiles)
    stage_parent = Path(out_dir).parent if out_dir is not None else None
    if stage_parent is not None:
        stage_parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".infscaler-plan-", dir=stage_parent))
    try:
        progress(f"extracting {result.num_partitions} partitions")
        specs = found.graph.specs(list(result.cuts))
        parts, part_files, part_cpu = _extract_parts(loaded, specs, stage, save_parts)

        progress("verifying the chain against the whole model")
        # The whole model's unoptimised outputs on these feeds come from the per-node
        # profiling run (same session settings); from a cached profile they are absent
        # and verify_chain runs the whole model itself.
        cpu_outputs = profiles["cpu"].outputs or {}
        verification = extract.verify_chain(
            loaded,
            part_cpu,
            feeds=feeds,
            rtol=rtol,
            report_optimized=False,
            reference=cpu_outputs.get("unoptimized"),
            threads=n_threads,
        )
        extract.check_verification(verification)

        progress("measuring partition latency")
        part_ms, part_err, env = _measure_parts(
            specs, profiles, part_cpu, part_files, feeds, warmup, repeats, n_threads
        )
        # The optimised chain's outputs are in env now: compare them with the optimised
        # whole model (informational: graph fusion differs across a boundary), whose
        # outputs the T_o session gave (from a cached profile: one more run).
        whole_opt = cpu_outputs.get("optimized")
        if whole_opt is None:
            _, whole_opt = profiler.measure_latency(
                found.whole_cpu, feeds, engine="cpu", warmup=0, repeats=1, threads=n_threads
            )
        verification.optimized = extract.optimized_errors(
            verification.reference or {}, whole_opt, {n: env[n] for n in loaded.graph_outputs}
        )

        summary = _summary(
            loaded,
            found.graph,
            found.costs,
            found.c,
            result,
            specs,
            part_ms,
            part_err,
            profiles,
            found.boundary,
            verification,
            slo,
            found.slo_ms,
            found.t_p,
            measure,
            device,
            found.engines,
        )
        plan = Plan(summary=summary, parts=parts)
        if out_dir is not None:
            progress("writing the plan")
            write_plan(plan, Path(out_dir), force=force, staged=stage)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return plan


def _check_request(
    objective: str, measure: str, max_partitions: int, num_partitions: int | None
) -> None:
    """Refuse an unknown objective or measure, or a K below 1 (InfScalerError)."""
    if objective not in search.OBJECTIVES:
        raise InfScalerError(
            f"unknown partition objective '{objective}'",
            hint=f"use one of {', '.join(search.OBJECTIVES)}",
        )
    if measure not in ("flops", "time"):
        raise InfScalerError(f"unknown complexity measure '{measure}'", hint="use flops or time")
    if max_partitions < 1 or (num_partitions is not None and num_partitions < 1):
        raise InfScalerError("the number of partitions must be >= 1")


def _profile_engines(
    loaded: LoadedModel,
    whole_cpu: extract.PartLike,
    feeds: dict[str, np.ndarray],
    engines: dict[str, str | None],
    threads: int,
    warmup: int,
    repeats: int,
    use_cache: bool,
    progress: Progress,
) -> dict[str, profiler.ModelProfile]:
    """Every operator and the whole model's T_o on each engine this host has (cpu
    first; engines it lacks skipped): engine -> :class:`~.profiler.ModelProfile`."""
    node_names = [n.name for n in loaded.model.graph.node]
    profiles: dict[str, profiler.ModelProfile] = {}
    for engine, backend in engines.items():  # cpu first; engines this host lacks skipped
        if backend is None:
            continue
        progress(f"profiling operators on {engine}")
        profiles[engine] = profiler.profile_model(
            whole_cpu if engine == "cpu" else loaded.session_source,
            feeds,
            engine=engine,
            model_sha256=loaded.sha256,
            warmup=warmup,
            repeats=repeats,
            threads=threads,
            cache=use_cache,
            node_names=node_names,
        )
    return profiles


def _search_cuts(
    c: list[float],
    valid: list[int],
    cut_bytes: dict[int, int],
    graph: OperatorGraph,
    costs: dict[str, cost_mod.OperatorCost],
    *,
    objective: str,
    cuts: Sequence[int] | None,
    num_partitions: int | None,
    max_partitions: int,
    t_o: float,
    t_p: float,
    slo_ms: float | None,
) -> search.SearchResult:
    """The given cuts, Eq. 1's, or the balanced ones (see :func:`partition_model`).

    Raises:
        PartitionError: T_o > SLO, and as the search.
    """
    k_slo = max_partitions
    if slo_ms is not None:  # raises if T_o > SLO
        k_slo = search.max_partitions_for_slo(t_o, t_p, slo_ms, max_partitions)
    weights = [float(costs[op.node].param_bytes) for op in graph.operators]
    if cuts is not None:
        return search.evaluate_cuts(c, valid, cuts, weights=weights, cut_bytes=cut_bytes)
    if objective == "eq1":
        return search.search_partitions(
            c,
            valid,
            num_partitions=num_partitions,
            max_partitions=max_partitions,
            t_o_ms=t_o,
            t_p_ms=t_p,
            slo_ms=slo_ms,
            cut_bytes=cut_bytes,
        )
    w = weights if objective == "weights" else None
    ks = [num_partitions] if num_partitions else range(1, min(k_slo, len(valid) + 1) + 1)
    result = None
    for k in ks:
        r = search.search_minmax(c, valid, k, weights=w, cut_bytes=cut_bytes)
        if result is None or r.objective < 0.99 * result.objective:
            result = r
    assert result is not None
    return result


def _extract_parts(
    loaded: LoadedModel, specs: list[extract.PartitionSpec], stage: Path, save_parts: bool
) -> tuple[list[onnx.ModelProto], list[str | None], list[extract.PartLike]]:
    """Each partition as an ONNX sub-model, saved as ``stage/part_<k>.onnx`` when
    ``save_parts``: ``(parts, their files or None, what the CPU engine's sessions of
    each are built from)``."""
    parts = []
    part_files: list[str | None] = []
    part_cpu: list[extract.PartLike] = []
    for k, spec in enumerate(specs):
        part = extract.extract_partition(loaded, spec)
        part_file = None
        if save_parts:
            part_file = str(stage / f"part_{k}.onnx")
            extract.save_partition(part, part_file)
        parts.append(part)
        part_files.append(part_file)
        part_cpu.append(_cpu_source(loaded, part, part_file))
    return parts, part_files, part_cpu


def _measure_parts(
    specs: list[extract.PartitionSpec],
    profiles: dict[str, profiler.ModelProfile],
    part_cpu: list[extract.PartLike],
    part_files: list[str | None],
    feeds: dict[str, np.ndarray],
    warmup: int,
    repeats: int,
    threads: int,
) -> tuple[list[dict[str, float]], list[dict[str, float]], dict[str, np.ndarray]]:
    """Each partition's latency per profiled engine (A_k^m of §IV-A): ``(part_ms,
    part_err (:func:`~.profiler.median_err`), the last part's cpu outputs)``; each part
    is fed the previous part's cpu outputs."""
    part_ms: list[dict[str, float]] = [{} for _ in specs]
    part_err: list[dict[str, float]] = [{} for _ in specs]
    env = feeds
    for k, spec in enumerate(specs):
        part_feeds = {n: env[n] for n in spec.inputs}
        for engine in profiles:
            source = part_cpu[k] if engine == "cpu" else part_files[k]
            assert source is not None
            times, outputs = profiler.measure_latency_runs(
                source,
                part_feeds,
                engine=engine,
                warmup=warmup,
                repeats=repeats,
                threads=threads,
            )
            part_ms[k][engine] = float(statistics.median(times))
            err = profiler.median_err(times)
            if err is not None:
                part_err[k][engine] = err
            if engine == "cpu":
                env = outputs
    return part_ms, part_err, env


def _cpu_source(
    loaded: LoadedModel, part: onnx.ModelProto | None = None, part_file: str | None = None
) -> extract.PartLike:
    """What the CPU engine's sessions of the whole model (``part`` None) or of a part are
    built from: a stub reading the weights from the model's file when any could be
    located (:meth:`~.loader.LoadedModel.stub`), else the part's saved file or the part
    itself, or the whole model's :attr:`~.loader.LoadedModel.session_source`."""
    stub = loaded.stub(part)
    if stub is not None:
        return stub
    if part is None:
        return loaded.session_source
    return part_file if part_file is not None else part


def _engine_report(
    engine: str, measured: dict[str, float], engines: dict[str, str | None]
) -> float | dict[str, str]:
    if engine in measured:
        return round(measured[engine], 4)
    ok, reason = available(engine)
    reason = "not profiled" if ok else reason
    return {"unavailable": reason}


def _summary(
    loaded: LoadedModel,
    graph: OperatorGraph,
    costs: dict[str, cost_mod.OperatorCost],
    c: list[float],
    result: search.SearchResult,
    specs: list[extract.PartitionSpec],
    part_ms: list[dict[str, float]],
    part_err: list[dict[str, float]],
    profiles: dict[str, profiler.ModelProfile],
    boundary: profiler.BoundaryOverhead,
    verification: extract.Verification,
    slo: SLO,
    slo_ms: float | None,
    t_p: float,
    measure: str,
    device: DeviceProfile | None,
    engines: dict[str, str | None],
) -> dict:
    tensors = loaded.tensors
    report_engines = device.engines if device is not None else ["cpu", "gpu", "dla"]
    cuts = []
    for cut in result.cuts:
        op = graph.operators[cut]
        cuts.append(
            {
                "after_operator": int(cut),
                "node": op.node,
                "crossing_bytes": graph.crossing_bytes(cut),
                "crossing": tensor_list(graph.crossing(cut), tensors),
                "t_p_ms": round(boundary.ms(graph.crossing_bytes(cut)), 4),
            }
        )
    partitions = []
    for k, ((first, last), spec) in enumerate(zip(result.bounds, specs, strict=True)):
        ops = graph.operators[first : last + 1]
        weights = graph.weight_bytes(first, last)
        acts = graph.peak_activation_bytes(first, last)
        partitions.append(
            {
                "index": k,
                "file": f"part_{k}.onnx",
                "operators": [int(first), int(last)],
                "num_operators": len(ops),
                "first_node": ops[0].node,
                "last_node": ops[-1].node,
                "representative_operators": int(sum(result.representative[first : last + 1])),
                "bottleneck": float(result.bottleneck[k]),
                "sigma": float(result.sigmas[k]),
                "flops": int(sum(costs[o.node].flops for o in ops)),
                "weights_mb": round(weights / _MB, 3),
                "activations_mb": round(acts / _MB, 3),
                "memory_mb": round((weights + acts) / _MB, 3),
                "latency_ms": {e: _engine_report(e, part_ms[k], engines) for e in report_engines},
                # relative uncertainty of each measured median (profiler.median_err)
                "latency_err": {e: round(v, 4) for e, v in part_err[k].items()},
                "inputs": tensor_list(spec.inputs, tensors),
                "outputs": tensor_list(spec.outputs, tensors),
            }
        )
    t_o = profiles["cpu"].total_ms
    predicted = t_o + sum(boundary.ms(graph.crossing_bytes(cut)) for cut in result.cuts)
    total_flops = int(sum(cost.flops for cost in costs.values()))
    return {
        "format": PLAN_FORMAT,
        "infscaler_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "path": str(loaded.path.resolve()),
            "sha256": loaded.sha256,
            "inputs": [
                {
                    "name": n,
                    **tensors[n].to_dict(),
                    "declared_shape": [
                        str(d) if isinstance(d, str) else d
                        for d in loaded.symbolic_inputs.get(n, [])
                    ],
                }
                for n in loaded.graph_inputs
            ],
            "outputs": tensor_list(loaded.graph_outputs, tensors),
            "operators": graph.num_operators,
            "constant_nodes": len(graph.constant_nodes),
            "flops": total_flops,
        },
        "device": None if device is None else {"name": device.name, "soc": device.soc},
        "host": profiler.host_description(),
        "slo": {"requested": str(slo), "ms": None if slo_ms is None else round(slo_ms, 4)},
        "objective": {
            "equation": _EQUATIONS.get(
                result.objective_name,
                "InfScaler Eq. 1: min sum_k sigma(P_k), P_k = {c_n > mean(c)}",
            ),
            "name": result.objective_name,
            "measure": measure,
            "mean_complexity": float(np.mean(c)),
            "value": float(result.objective),
            "num_partitions": result.num_partitions,
        },
        "timing": {
            "engine": "cpu",
            "t_o_ms": round(t_o, 4),
            "t_p_ms": round(t_p, 4),
            "t_p_fixed_ms": round(boundary.fixed_ms, 4),
            "t_p_per_mb_ms": round(boundary.per_mb_ms, 4),
            "predicted_chain_ms": round(predicted, 4),
            "profiled_engines": sorted(profiles),
        },
        "cuts": cuts,
        "partitions": partitions,
        "verification": verification.to_dict(),
    }


def inspect_model(
    model: str | os.PathLike[str],
    *,
    shapes: dict[str, tuple[int, ...]] | str | None = None,
    profile: bool = False,
    warmup: int = 2,
    repeats: int = 5,
    use_cache: bool = True,
) -> dict:
    """Per-operator cost table for ``infscaler inspect``: ``{"model", "operators": [{index,
    node, op_type, flops, params_mb, input_mb, output_mb, output_shape, ms, representative}],
    "constant_nodes", "mean_flops"}``.

    Raises:
        ModelLoadError, ShapeError: as :func:`~.loader.load_model`.
    """
    loaded = load_model(model, shapes)
    graph = OperatorGraph.from_loaded(loaded)
    costs = cost_mod.model_costs(loaded)
    node_ms: dict[str, float] = {}
    t_o = None
    if profile:
        feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs}, seed=0)
        prof = profiler.profile_model(
            _cpu_source(loaded),
            feeds,
            engine="cpu",
            model_sha256=loaded.sha256,
            warmup=warmup,
            repeats=repeats,
            cache=use_cache,
            node_names=[n.name for n in loaded.model.graph.node],
        )
        node_ms, t_o = prof.node_ms, prof.total_ms
    flops = np.array([costs[op.node].flops for op in graph.operators], dtype=float)
    mask = search.representative_mask(flops)
    nodes = {n.name: n for n in loaded.model.graph.node}
    rows = []
    for op, rep in zip(graph.operators, mask, strict=True):
        cost = costs[op.node]
        out = next((o for o in nodes[op.node].output if o in loaded.tensors), None)
        row = {
            "index": op.index,
            "node": op.node,
            "op_type": op.op_type,
            "output_shape": list(loaded.tensors[out].shape) if out else None,
            "flops": int(cost.flops),
            "params_mb": round(cost.param_bytes / _MB, 4),
            "input_mb": round(cost.input_bytes / _MB, 4),
            "output_mb": round(cost.output_bytes / _MB, 4),
            "representative": bool(rep),
        }
        if profile:
            row["ms"] = round(node_ms.get(op.node, 0.0), 4)
        rows.append(row)
    return {
        "model": {
            "path": str(loaded.path),
            "sha256": loaded.sha256,
            "inputs": {n: list(loaded.tensors[n].shape) for n in loaded.graph_inputs},
            "operators": graph.num_operators,
            "constant_nodes": len(graph.constant_nodes),
            "flops": int(flops.sum()),
            "t_o_ms": t_o,
        },
        "mean_flops": float(flops.mean()),
        "operators": rows,
    }
