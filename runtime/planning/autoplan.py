"""Deploy with the planner's choice (InfScaler's design principle 1: the user names no K,
threads or instances; conditions and the why: docs/planner.md, "Deploy").

:func:`needs_planning`: whether a pipeline is left to the planner (an ``slo`` and
``autoscale``, model stages on the cpu engine with no bound the user set).
:func:`plan_measured` is the planning entry: it measures the pipeline on this host
(:func:`~infscaler.runtime.planning.inputs.planner_inputs`) and runs
:func:`~infscaler.runtime.planning.stageprofile.search_measured` (the search, with the
best candidates' partitions measured), for the deploy and for ``infscaler plan
--explain``. :func:`plan_pipeline` runs it at deploy, writes each model stage's chosen
cuts as a plan directory (:func:`infscaler.partitioner.api.partition_model`) and returns
the pipeline set to the plan (``fuse: whole`` with :func:`whole_config` when the whole
pipeline in one unit wins); it keeps its decision
(:mod:`infscaler.runtime.planning.decisions`). :func:`plan_set_measured` / :func:`plan_set`
plan several pipelines on one device together
(:func:`~infscaler.runtime.planning.jointplan.plan_together`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infscaler.base.config import validate_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.base.slo import SLO, parse_slo
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.profiler import usable_cores
from infscaler.runtime.planning.candidates import Limits
from infscaler.runtime.planning.decisions import (
    cap_changed,
    decision_path,
    keep_decision,
    planned_before,
    write_json,
)
from infscaler.runtime.planning.inputs import PlannerInputs, planner_inputs
from infscaler.runtime.planning.jointplan import JointPlan, Member, plan_together
from infscaler.runtime.planning.livecheck import Expected, expected_from
from infscaler.runtime.planning.planner import ModelStage, cpu_cores, resource_cap
from infscaler.runtime.planning.stageprofile import search_measured
from infscaler.runtime.scaling.types import ResourceCap
from infscaler.runtime.serving.pipeline import keyed_plan_dir

__all__ = [
    "START_WITH_ENV",
    "LivePlan",
    "MeasuredSearch",
    "candidate_pipeline",
    "keep_live",
    "live_plan",
    "needs_planning",
    "plan_measured",
    "plan_pipeline",
    "plan_set",
    "plan_set_measured",
    "runner_up",
    "stage_order",
    "whole_config",
]


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


@dataclass(frozen=True)
class MeasuredSearch:
    """What :func:`plan_measured` measured and found.

    Attributes:
        inputs: the pipeline as the search takes it
            (:func:`~infscaler.runtime.planning.inputs.planner_inputs`).
        slo_ms: the SLO searched for, ms (a factor resolved against ``inputs.base_ms``).
        outcome: the search's :class:`~infscaler.runtime.planning.explain.SearchOutcome`.
        stages: ``inputs.stages`` with the partitions the search measured
            (:func:`~infscaler.runtime.planning.stageprofile.search_measured`).
    """

    inputs: PlannerInputs
    slo_ms: float
    outcome: Any
    stages: list[Any]


def plan_measured(
    cfg: Any,
    slo: SLO,
    *,
    device: Any,
    cap: Any = None,
    state_dir: Path | None = None,
    allowed_functions: Sequence[str] | None = None,
    wake_latency_us: int | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    searching: Callable[[float], AbstractContextManager[Any]] = lambda _slo: nullcontext(),
    incumbent: Callable[[], Sequence[Any] | None] = lambda: None,
    **search: Any,
) -> MeasuredSearch:
    """The configuration search on ``cfg`` measured on this host: the one planning entry of
    the deploy (:func:`plan_pipeline`) and of ``infscaler plan --explain``.

    Measures ``cfg`` (:func:`~infscaler.runtime.planning.inputs.planner_inputs`), resolves
    ``slo`` (a factor is of its 1-thread latency) and searches with the best candidates'
    partitions measured (:func:`~infscaler.runtime.planning.stageprofile.search_measured`)
    within ``cap`` (None: :func:`~infscaler.runtime.planning.planner.resource_cap` of
    ``device``) on the device profile's cpu cores (else this host's usable cores).

    Args:
        searching: given the SLO in ms, what the search runs within (a status line).
        incumbent: read just before the search: the configuration planned before
            (:func:`~infscaler.runtime.planning.planner.search`'s ``incumbent``).
        search: the search's other arguments (``rate``, ``objectives``, ``refine``, ...).
        device / state_dir / allowed_functions / wake_latency_us / progress: as
            :func:`~infscaler.runtime.planning.inputs.planner_inputs` takes them.

    Raises:
        InfScalerError: as :func:`~infscaler.runtime.planning.inputs.planner_inputs`.
    """
    cores = cpu_cores(device) or usable_cores()
    cap = resource_cap(device) if cap is None else cap
    inp = planner_inputs(
        cfg, device=device, state_dir=state_dir, allowed_functions=allowed_functions,
        progress=progress, wake_latency_us=wake_latency_us,
    )  # fmt: skip
    for note in inp.notes:
        progress(note)
    # a factor is of the pipeline's own 1-thread latency (its units in turn)
    slo_ms = slo.resolve(inp.base_ms)
    assert slo_ms is not None
    with searching(slo_ms):
        outcome, stages = search_measured(
            inp.stages,
            inp.paths,
            slo_ms,
            cap,
            shapes=inp.shapes,
            progress=progress,
            cores=cores,
            whole=inp.whole,
            incumbent=incumbent(),
            **search,
        )
    return MeasuredSearch(inp, slo_ms, outcome, stages)


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

    The decision is kept (``state_dir/plans/decisions/<digest>.json``,
    :func:`~infscaler.runtime.planning.decisions.decision_path`); with ``reuse`` a later
    deploy of the same pipeline on the same device deploys it again without measuring
    (outcome None) while it fits the cap and the cap has not grown past
    :data:`~infscaler.runtime.planning.decisions.CAP_GROWTH_REPLAN` x (why: docs/planner.md,
    "Deploy"). Delete the file to plan again.

    Args:
        cfg: the pipeline; its ``slo`` in ms or a factor (``3x``) of its measured 1-thread
            latency (:attr:`~infscaler.runtime.planning.inputs.PlannerInputs.base_ms`).
        device: its DeviceProfile (the cap). state_dir: where the plan directories go
            (``state_dir/plans/auto-<model>-<digest>``).
        rate: expected requests/s (None: the search maximises the rate within the SLO).
        objectives: partition objectives tried.
        allowed_functions: the modules function stages may come from (None: any); they run
            in this process on a sample request.
        wake_latency_us: the PM QoS CPU latency limit the service holds (None: none): plans
            with the idle slowdown learned under it (:mod:`infscaler.runtime.scaling.idlecurve`;
            part of the decision's key).

    Raises:
        InfScalerError: no SLO, a sample request the pipeline fails on, or no candidate
            meets the SLO (the message carries the search's last explain line).
    """
    spec = parse_slo(cfg.slo)
    if spec.ms is None and spec.factor is None:
        raise InfScalerError("the planner needs an SLO", hint="e.g. slo: 200ms or slo: 3x")
    kept = decision_path(
        cfg, device, state_dir, rate, objectives, wake_latency_us, allowed_functions
    )
    cap = resource_cap(device)
    if reuse and kept.is_file():
        planned = _kept_decision(cfg, kept, cap.memory_cap_mb, progress)
        if planned is not None:
            return planned, None
    found = plan_measured(
        cfg,
        spec,
        device=device,
        cap=cap,
        state_dir=state_dir,
        allowed_functions=allowed_functions,
        wake_latency_us=wake_latency_us,
        progress=progress,
        searching=lambda slo: _say_searching(slo, progress),
        incumbent=lambda: _incumbent(cfg, kept, progress),
        rate=rate,
        objectives=objectives,
    )
    out = found.outcome
    if out.best is None:
        raise InfScalerError(
            f"no configuration meets the SLO of {found.slo_ms:g} ms within the device's cap: "
            f"{out.explain[-1]}",
            hint="raise the SLO, or see `infscaler plan PIPELINE --slo X --explain`",
        )
    serving, other, serving_exp = _start_with(out, cfg.name, progress)
    data = candidate_pipeline(cfg, found.inputs, serving, state_dir, device, progress)
    live: dict[str, Any] = {"serving": serving_exp.to_dict()}
    if other is not None:
        live["other"] = {
            **expected_from(other).to_dict(),
            "pipeline": candidate_pipeline(cfg, found.inputs, other, state_dir, device, progress),
        }
    planned = validate_pipeline(data, f"pipeline {cfg.name} (planned)")
    keep_decision(kept, data, serving, cap.memory_cap_mb, live)
    return planned, out


def _kept_decision(
    cfg: Any, kept: Path, cap_mb: float, progress: Callable[[str], None]
) -> Any | None:
    """The planned pipeline of the decision kept in ``kept`` when it still holds: readable,
    within the memory cap ``cap_mb`` now
    (:func:`~infscaler.runtime.planning.decisions.cap_changed`) and its plan directories
    all there; else None (``progress`` says why it is planned again)."""
    try:
        data = json.loads(kept.read_text())
        planned = validate_pipeline(data["pipeline"], f"pipeline {cfg.name} (planned)")
    except Exception as exc:  # noqa: BLE001 - a bad kept decision is planned again
        progress(f"{cfg.name}: the kept decision {kept} is unusable ({exc}); planning again")
        return None
    stale = cap_changed(data, cap_mb)
    if stale is not None:
        progress(f"{cfg.name}: the kept decision {kept} {stale}; planning again")
    elif all(Path(st.plan).joinpath("plan.yaml").is_file() for st in planned.stages
             if getattr(st, "plan", None)):  # fmt: skip
        progress(f"{cfg.name}: the planner's decision for it is kept in {kept}")
        return planned
    return None


def _say_searching(slo_ms: float, progress: Callable[[str], None]) -> AbstractContextManager[Any]:
    """The deploy's search: ``progress`` says the SLO it searches for."""
    progress(f"searching K, cuts, threads and instances for an SLO of {slo_ms:.1f} ms")
    return nullcontext()


def _incumbent(cfg: Any, kept: Path, progress: Callable[[str], None]) -> list[Any] | None:
    """The configuration planned before for ``cfg`` under another key
    (:func:`~infscaler.runtime.planning.decisions.planned_before`), said through
    ``progress``; None when there is none."""
    incumbent = planned_before(kept, cfg.name)
    if incumbent is not None:
        progress(f"{cfg.name}: the configuration planned before keeps a tie: {incumbent}")
    return incumbent


def _start_with(
    outcome: Any, name: str, progress: Callable[[str], None]
) -> tuple[Any, Any, Expected]:
    """``(candidate deployed, its runner-up, the prediction the live check is told for
    the one deployed)``: the search's best, :func:`runner_up` and the best's prediction,
    unless :data:`START_WITH_ENV` asks for a wrong start.

    Raises:
        InfScalerError: :data:`START_WITH_ENV` set to a start it does not know.
    """
    best = outcome.best
    runner = runner_up(outcome)
    serving, other = best, runner
    serving_exp = expected_from(best)
    forced = os.environ.get(START_WITH_ENV, "")
    if forced:
        worst = _worst(outcome)
        if forced != "worst":
            raise InfScalerError(
                f"{START_WITH_ENV}={forced!r} is not a start this test hook knows",
                hint=f"unset {START_WITH_ENV}, or set it to worst",
            )
        if worst is None:
            progress(
                f"{name}: {START_WITH_ENV}=worst: no candidate is below "
                f"{WRONG_START_AT:.0%} of the choice's capacity; deploying the choice"
            )
        else:
            progress(f"{name}: {START_WITH_ENV}=worst: wrong start {worst.label()}")
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
    return serving, other, serving_exp


#: The test hook that starts a planned pipeline with a deliberately wrong configuration:
#: ``worst`` deploys the fitting candidate with the least goodput in place of the
#: planner's choice, with the choice's predicted capacity, as a planner that
#: mispredicted it would, and the choice as its runner-up, so that the live check
#: (:mod:`infscaler.runtime.planning.livecheck`) has a wrong start to correct. For tests and
#: bench/ only.
START_WITH_ENV = "INFSCALER_TEST_START_WITH"


def runner_up(outcome: Any) -> Any:
    """The best-ranked candidate after the winner that fits, answers requests within the
    SLO and is another configuration (its :meth:`~infscaler.runtime.planning.candidates.Candidate.
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
    path = decision_path(
        cfg, device, state_dir, rate, objectives, wake_latency_us, allowed_functions
    )
    return _live_at(path)


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
    write_json(plan.path, data)


# -- a set of pipelines planned together --------------------------------------------------


def set_shares(n: int) -> tuple[float, ...]:
    """The shares of the cap each of ``n`` pipelines planned together is searched
    within: the whole cap, half, and 1/n (so that the equal split is always among the
    candidates), largest first."""
    return tuple(sorted({1.0, 0.5, 1.0 / max(1, n)}, reverse=True))


def share_of(cap: ResourceCap, f: float) -> ResourceCap:
    """``f`` of ``cap``'s free memory (MB, the memory in use kept), instance slots per
    engine and thread slots, each at least 1 (an unlimited one stays unlimited)."""
    free = cap.memory_cap_mb - cap.memory_used_mb
    return ResourceCap(
        memory_cap_mb=cap.memory_used_mb + free * f,
        memory_used_mb=cap.memory_used_mb,
        max_instances={e: max(1, int(n * f + 1e-9)) for e, n in cap.max_instances.items()},
        cores=max(1, int(cap.cores * f + 1e-9)) if cap.cores else 0,
        physical_cores=max(1, int(cap.physical_cores * f + 1e-9)) if cap.physical_cores else 0,
    )


def plan_set_measured(
    cfgs: Sequence[Any],
    slos: Sequence[SLO],
    *,
    rates: Sequence[float | None],
    device: Any,
    cap: Any = None,
    state_dir: Path | None = None,
    allowed_functions: Sequence[str] | None = None,
    wake_latency_us: int | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    searching: Callable[[str, float, float], AbstractContextManager[Any]] = (
        lambda _n, _slo, _f: nullcontext()
    ),
    top_k: int = 6,
    **search: Any,
) -> tuple[list[MeasuredSearch], JointPlan]:
    """The pipelines ``cfgs`` planned together within one cap: each measured once, searched
    at its SLO (``slos``) and rate (``rates``; None: its max rate) within each share of the
    cap (:func:`set_shares`, :func:`share_of`), one configuration per pipeline chosen by
    :func:`~infscaler.runtime.planning.jointplan.plan_together` (by ``priority``).

    Returns ``(per pipeline its search within the whole cap, with every share's
    candidates, the joint plan)``.

    Args:
        searching: given a pipeline's name, its SLO in ms and the share, a status line.
        top_k: candidates per pipeline the joint choice tries.
        search: the search's other arguments (``objectives``, ``refine``, ...).

    Raises:
        InfScalerError: as :func:`plan_measured` and
            :func:`~infscaler.runtime.planning.jointplan.plan_together` (a pipeline that
            fits in no way, named).
    """
    cores = cpu_cores(device) or usable_cores()
    cap = resource_cap(device) if cap is None else cap
    shares = set_shares(len(cfgs))
    found, members = [], []
    for cfg, slo, rate in zip(cfgs, slos, rates, strict=True):
        inp = planner_inputs(
            cfg, device=device, state_dir=state_dir, allowed_functions=allowed_functions,
            progress=progress, wake_latency_us=wake_latency_us,
        )  # fmt: skip
        for note in inp.notes:
            progress(f"{cfg.name}: {note}")
        slo_ms = slo.resolve(inp.base_ms)
        assert slo_ms is not None
        outcomes = []
        for f in shares:
            with searching(cfg.name, slo_ms, f):
                outcome, stages = search_measured(
                    inp.stages, inp.paths, slo_ms, share_of(cap, f), shapes=inp.shapes,
                    progress=progress, cores=max(1, int(cores * f + 1e-9)), whole=inp.whole,
                    rate=rate, **search,
                )  # fmt: skip
            outcomes.append((outcome, stages))
        whole, stages = outcomes[0]
        merged = tuple(c for o, _ in outcomes for c in o.candidates)
        found.append(
            MeasuredSearch(inp, slo_ms, dataclasses.replace(whole, candidates=merged), stages)
        )
        members.append(Member(cfg.name, int(getattr(cfg, "priority", 1)), merged, rate))
    limits = Limits.of(cap, cores, 1.0)
    joint = plan_together(members, cap, thread_slots=limits.thread_slots, cores=cores, top_k=top_k)
    return found, joint


def _set_decision_path(cfg: Any, cfgs: Sequence[Any], **key: Any) -> Path:
    """Where the decision for ``cfg`` planned together with ``cfgs`` is kept: beside its
    own decision (:func:`~infscaler.runtime.planning.decisions.decision_path`), keyed by
    the others' decision paths too (a pipeline planned alone, or with another set, is
    another decision)."""
    import hashlib

    own = decision_path(cfg, **key)
    others = sorted(str(decision_path(c, **key).name) for c in cfgs if c.name != cfg.name)
    digest = hashlib.sha256("\n".join(others).encode()).hexdigest()[:12]
    return own.with_name(f"{own.stem}-set-{digest}.json")


def plan_set(
    cfgs: Sequence[Any],
    *,
    device: Any,
    state_dir: Path,
    objectives: tuple[str, ...] = ("eq1", "minmax", "weights"),
    allowed_functions: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
    reuse: bool = True,
    wake_latency_us: int | None = None,
) -> dict[str, tuple[Any, LivePlan | None]]:
    """Deploy-time planning of several pipelines that :func:`needs_planning` together
    within the device's cap (:func:`plan_set_measured`, at their max rates): per
    pipeline name, ``(the planned PipelineConfig, its LivePlan)``.

    Each decision is kept per pipeline as :func:`plan_pipeline` keeps it, keyed by the
    set too (:func:`_set_decision_path`), and reused while every pipeline's still holds
    (:func:`_kept_decision`: under the memory cap now, its plan directories there). The
    kept decision records the configuration serving, no runner-up: the live check has
    nothing to switch to (another configuration of one pipeline may not fit beside the
    others').

    Raises:
        InfScalerError: a pipeline without an SLO, or one that fits in no way (named).
    """
    specs = []
    for cfg in cfgs:
        spec = parse_slo(cfg.slo)
        if spec.ms is None and spec.factor is None:
            raise InfScalerError(f"pipeline {cfg.name}: the planner needs an SLO",
                                 hint="e.g. slo: 200ms or slo: 3x")  # fmt: skip
        specs.append(spec)
    key = {"device": device, "state_dir": state_dir, "rate": None, "objectives": objectives,
           "wake_latency_us": wake_latency_us, "allowed_functions": allowed_functions}  # fmt: skip
    paths = {cfg.name: _set_decision_path(cfg, cfgs, **key) for cfg in cfgs}
    cap = resource_cap(device)
    if reuse and all(p.is_file() for p in paths.values()):
        kept = {c.name: _kept_decision(c, paths[c.name], cap.memory_cap_mb, progress) for c in cfgs}
        if all(v is not None for v in kept.values()):
            return {n: (v, _live_at(paths[n])) for n, v in kept.items()}
    names = ", ".join(c.name for c in cfgs)
    progress(f"planning {names} together within the device's cap")
    found, joint = plan_set_measured(
        cfgs, specs, rates=[None] * len(cfgs), device=device, cap=cap, state_dir=state_dir,
        allowed_functions=allowed_functions, wake_latency_us=wake_latency_us,
        progress=progress, objectives=objectives,
    )  # fmt: skip
    for line in joint.explain:
        progress(line)
    out = {}
    for cfg, ms, choice in zip(cfgs, found, joint.choices, strict=True):
        data = candidate_pipeline(cfg, ms.inputs, choice.candidate, state_dir, device, progress)
        live = {"serving": expected_from(choice.candidate).to_dict(), "set": choice.why}
        keep_decision(paths[cfg.name], data, choice.candidate, cap.memory_cap_mb, live)
        out[cfg.name] = (validate_pipeline(data, f"pipeline {cfg.name} (planned)"),
                         _live_at(paths[cfg.name]))  # fmt: skip
    return out


def _live_at(path: Path) -> LivePlan | None:
    """The :class:`LivePlan` of the decision kept at ``path`` (None: none readable)."""
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
