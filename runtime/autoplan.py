"""Deploy with the planner's choice (issue 15; InfScaler's design principle 1: the user
names no K, threads or instances).

:func:`needs_planning` tells whether a pipeline is left to the planner: it has an
``slo`` and ``autoscale``, and every stage is a model stage naming an ONNX ``model`` on
the cpu engine with no ``partitions``, stage ``slo``, ``batching`` or ``max_threads``, and
``threads`` and ``instances`` at their defaults (1). :func:`plan_pipeline` then measures those stages on this host
(:func:`~infscaler.runtime.stageprofile.measure_model_stage`), runs the configuration
search with the best candidates' partitions measured
(:func:`~infscaler.runtime.stageprofile.search_measured`, over
:func:`infscaler.runtime.planner.search`), writes each stage's chosen cuts as a plan
directory (:func:`infscaler.partitioner.api.partition_model` with ``cuts``; K = 1 keeps
the model whole) and returns the pipeline with those stages set to the plan, the threads
and the instances per partition (the scaler's minimum, which it grows from).

Pipelines with function stages, or with a stage the user configured, are not planned
(the search measures ONNX model stages only); they deploy as written, as does every
pipeline under ``serve --objective eq1`` (Eq. 1 at deploy,
:mod:`infscaler.runtime.pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS, resolve_model
from infscaler.base.slo import parse_slo
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.profiler import usable_cores
from infscaler.runtime.planner import cpu_cores, resource_cap
from infscaler.runtime.stageprofile import measure_model_stage, search_measured

__all__ = ["needs_planning", "plan_pipeline"]


def _left_to_planner(stage: Any) -> bool:
    """A cpu model stage whose K, threads and instances are the defaults (a pipeline
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
    )


def needs_planning(cfg: Any) -> bool:
    """True when ``cfg`` (a PipelineConfig) has ``slo`` and ``autoscale`` and every stage
    is a model stage left to the planner (see the module docstring)."""
    return (
        cfg.slo is not None
        and cfg.autoscale is not None
        and all(_left_to_planner(s) for s in cfg.stages)
    )


def plan_pipeline(
    cfg: Any,
    *,
    device: Any,
    state_dir: Path,
    rate: float | None = None,
    objectives: tuple[str, ...] = ("eq1", "minmax", "weights"),
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[Any, Any]:
    """``(planned PipelineConfig, SearchOutcome)`` for a pipeline :func:`needs_planning`.

    Args:
        cfg: the pipeline. device: its DeviceProfile (the cap). state_dir: where the plan
            directories go (``state_dir/plans/auto-<model>-<digest>``).
        rate: expected requests/s (None: the search maximises the rate within the SLO).
        objectives: partition objectives tried.

    The pipeline's ``slo`` is in ms, or a factor (``3x``) of the sum of its model stages'
    measured 1-thread latencies.

    Raises:
        InfScalerError: no SLO, or no candidate meets it (the message carries the
            search's last explain line).
    """
    import hashlib

    spec = parse_slo(cfg.slo)
    if spec.ms is None and spec.factor is None:
        raise InfScalerError("the planner needs an SLO", hint="e.g. slo: 200ms or slo: 3x")
    cap = resource_cap(device)
    cores = cpu_cores(device) or usable_cores()
    stages, paths, shapes = [], [], []
    for st in cfg.stages:
        path = resolve_model(st.model)
        shp = st.shapes if st.shapes is not None else getattr(MODELS.get(st.model), "shapes", None)
        stages.append(
            measure_model_stage(
                path, name=st.name, shapes=shp, threads=sorted({1, 2, cores}), progress=progress
            )
        )
        paths.append(path)
        shapes.append(shp)
    # a factor is of the pipeline's own 1-thread latency (its model stages in turn)
    slo = spec.resolve(sum(st.whole_ms[1] for st in stages))
    assert slo is not None
    progress(f"searching K, cuts, threads and instances for an SLO of {slo:.1f} ms")
    out, stages = search_measured(
        stages,
        paths,
        slo,
        cap,
        shapes=shapes,
        progress=progress,
        rate=rate,
        cores=cores,
        objectives=objectives,
    )
    if out.best is None:
        raise InfScalerError(
            f"no configuration meets the SLO of {slo:g} ms within the device's cap: "
            f"{out.explain[-1]}",
            hint="raise the SLO, or see `infscaler plan MODEL --slo X --explain`",
        )
    best = out.best
    data = cfg.model_dump(exclude_none=True)
    served = [(u, c) for u, c in zip(best.units, best.config, strict=True) if u.served]
    i = 0
    for k, st in enumerate(cfg.stages):
        cuts = best.cuts[k]
        n_units = len(cuts) + 1
        inst = [c.total for _, c in served[i : i + n_units]]
        i += n_units
        sd = dict(data["stages"][k])
        sd["threads"] = best.threads[k]
        sd["instances"] = inst if n_units > 1 else inst[0]
        if cuts:
            key = f"{paths[k].resolve()}|{paths[k].stat().st_mtime_ns}|{shapes[k]}|{cuts}"
            digest = hashlib.sha256(key.encode()).hexdigest()[:12]
            plan_dir = Path(state_dir) / "plans" / f"auto-{paths[k].stem}-{digest}"
            if not (plan_dir / "plan.yaml").is_file():
                progress(f"{st.name}: writing the chosen plan K={n_units} cuts {list(cuts)}")
                partition_model(
                    paths[k], shapes=shapes[k], cuts=cuts, device=device, out_dir=plan_dir,
                    force=True,
                )  # fmt: skip
            for f in ("model", "shapes", "partitions", "slo", "max_partitions"):
                sd.pop(f, None)
            sd["plan"] = str(plan_dir)
        data["stages"][k] = sd
    return validate_pipeline(data, f"pipeline {cfg.name} (planned)"), out
