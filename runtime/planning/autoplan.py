"""Deploy with the planner's choice: the user names no K, threads or instances
(conditions: docs/planner.md, "Deploy").

:func:`plan_measured` measures a pipeline on this host and searches it;
:func:`plan_pipeline` runs it at deploy, writes the chosen cuts as plan directories and
keeps the decision; :func:`plan_set_measured` / :func:`plan_set` plan several pipelines
on one device together."""

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
    """A cpu model stage whose K, threads, instances and bounds are the defaults (compared by
    value: a re-validated dump sets every field)."""
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
        and stage.max_instances == defaults["max_instances"].default
    )


def _function_left(stage: Any) -> bool:
    """A function stage with ``instances``, ``max_instances`` and ``threads`` at the defaults."""
    defaults = type(stage).model_fields
    return (
        stage.threads == defaults["threads"].default
        and stage.instances == defaults["instances"].default
        and stage.max_instances is None
    )


def needs_planning(cfg: Any) -> bool:
    """True when ``cfg`` (a PipelineConfig) has ``slo`` and ``autoscale``, is not
    ``fuse: whole``, has a model stage, and leaves every stage's scaling to the planner."""
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
    """``cfg`` as one unit (``fuse: whole``): the model stages at ``model_index`` at ``threads``
    and ``instances``, the function stages as written.

    Raises:
        ConfigError: ``cfg`` cannot run as one unit."""
    data = cfg.model_dump(exclude_none=True)
    data["fuse"] = "whole"
    for k, st in enumerate(cfg.stages):
        if st.kind == "function":  # as written
            data["stages"][k] = st.model_dump(exclude_unset=True, exclude_none=True)
    for k in model_index:
        data["stages"][k] = {**data["stages"][k], "threads": threads, "instances": instances}
    return validate_pipeline(data, f"pipeline {cfg.name} (planned)")


def stage_order(inputs: PlannerInputs, cuts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Per ModelStage of ``inputs``, ``(first unit, number of units)`` in a candidate's unit
    list with ``cuts`` (a simulated front end comes first: offset from the end)."""
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
    """What :func:`plan_measured` measured and found: the pipeline's ``inputs``, the SLO
    searched for (ms), the search's ``outcome`` and ``stages`` with the partitions it measured."""

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
    """The configuration search on ``cfg`` measured on this host (deploy and
    ``infscaler plan --explain``): ``slo`` resolved against the 1-thread latency, searched
    within ``cap`` (None: the device's) on the device's cpu cores (else this host's).

    Args:
        searching: given the SLO in ms, a context the search runs within.
        incumbent: read before the search: the configuration planned before.
        search: the search's other arguments (``rate``, ``objectives``, ``refine``, ...).
        device / state_dir / allowed_functions / wake_latency_us / progress: as
            :func:`~infscaler.runtime.planning.inputs.planner_inputs` takes them.

    Raises:
        InfScalerError: as :func:`~infscaler.runtime.planning.inputs.planner_inputs`."""
    cores = cpu_cores(device) or usable_cores()
    cap = resource_cap(device) if cap is None else cap
    inp = planner_inputs(
        cfg, device=device, state_dir=state_dir, allowed_functions=allowed_functions,
        progress=progress, wake_latency_us=wake_latency_us,
    )  # fmt: skip
    for note in inp.notes:
        progress(note)
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

    The decision is kept (:func:`~infscaler.runtime.planning.decisions.decision_path`); with
    ``reuse`` a later deploy reuses it without measuring (outcome None) while it fits the cap
    and the cap has not grown past ``CAP_GROWTH_REPLAN`` x (docs/planner.md, "Deploy").

    Args:
        cfg: the pipeline; its ``slo`` in ms or a factor (``3x``) of its 1-thread latency.
        device: its DeviceProfile. state_dir: where plan directories and decisions go.
        rate: expected requests/s (None: the search maximises the rate within the SLO).
        objectives: partition objectives tried.
        allowed_functions: modules function stages may come from (None: any).
        wake_latency_us: the PM QoS CPU latency limit the service holds (None: none).

    Raises:
        InfScalerError: no SLO, a sample request the pipeline fails on, or no candidate
            meets the SLO."""
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
    """The planned pipeline kept in ``kept`` while it is readable, within ``cap_mb`` and its
    plan directories exist; else None (``progress`` says why)."""
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
    """``progress`` says the SLO searched for."""
    progress(f"searching K, cuts, threads and instances for an SLO of {slo_ms:.1f} ms")
    return nullcontext()


def _incumbent(cfg: Any, kept: Path, progress: Callable[[str], None]) -> list[Any] | None:
    """The configuration planned before for ``cfg`` under another key, or None."""
    incumbent = planned_before(kept, cfg.name)
    if incumbent is not None:
        progress(f"{cfg.name}: the configuration planned before keeps a tie: {incumbent}")
    return incumbent


def _start_with(
    outcome: Any, name: str, progress: Callable[[str], None]
) -> tuple[Any, Any, Expected]:
    """``(candidate deployed, its runner-up, the prediction the live check gets)``: the best,
    :func:`runner_up` and its prediction, unless :data:`START_WITH_ENV` asks a wrong start.

    Raises:
        InfScalerError: :data:`START_WITH_ENV` set to an unknown start."""
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
            w = expected_from(worst)
            scale = w.capacity_rps / serving_exp.capacity_rps
            serving_exp = dataclasses.replace(
                w,
                unit_ms=tuple(ms * scale for ms in w.unit_ms),
                goodput_rps=serving_exp.goodput_rps,
            )
    return serving, other, serving_exp


#: Test hook (tests and bench/ only): ``worst`` deploys the least-capacity fitting candidate
#: with the choice's prediction and the choice as runner-up, for the live check to correct.
START_WITH_ENV = "INFSCALER_TEST_START_WITH"


def runner_up(outcome: Any) -> Any:
    """The best-ranked fitting candidate after the winner that answers within the SLO and is
    another configuration, finalists first; None when there is none."""
    best = outcome.best
    if best is None:
        return None
    ok = [
        c for c in outcome.candidates
        if c.fits and c.goodput_rps > 0 and c.identity() != best.identity()
    ]  # fmt: skip
    return next((c for c in ok if c.finalist == best.finalist), ok[0] if ok else None)


def _worst(outcome: Any) -> Any:
    """The fitting candidate with the least predicted capacity when below
    :data:`WRONG_START_AT` of the winner's; else None."""
    best = outcome.best
    ok = [c for c in outcome.candidates if c.fits and c.goodput_rps > 0]
    if best is None or len(ok) < 2:
        return None
    worst = min(ok, key=lambda c: expected_from(c).capacity_rps)
    if expected_from(worst).capacity_rps > WRONG_START_AT * expected_from(best).capacity_rps:
        return None
    return worst


#: ``worst`` starts only with a candidate below this fraction of the choice's capacity
WRONG_START_AT = 0.7


def candidate_pipeline(
    cfg: Any,
    inp: PlannerInputs,
    cand: Any,
    state_dir: Path,
    device: Any,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """``cfg`` as data with its model stages set to ``cand``'s cuts (plan directories written),
    threads and instances, or ``fuse: whole`` for a whole candidate.

    Raises:
        InfScalerError: partitioning at the candidate's cuts failed."""
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
    """``<state_dir>/plans/auto-<stem>-<12 hex>`` for ``model`` cut at ``cuts``, keyed by the
    model file's path, size and mtime, the shapes and the cuts.

    Raises:
        OSError: ``model`` cannot be stat'ed."""
    return keyed_plan_dir(state_dir, model, (shapes, list(cuts)), prefix="auto-")


@dataclass(frozen=True)
class LivePlan:
    """What the live check compares, read from a kept decision: its ``path``, the prediction
    for the ``serving`` configuration, the runner-up's (``other``) and its pipeline data."""

    path: Path
    serving: Expected
    other: Expected | None
    other_pipeline: dict[str, Any] | None

    def swapped(self, serving_pipeline: dict[str, Any]) -> LivePlan:
        """The plan once the other configuration serves (``serving_pipeline``: serving now)."""
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
    """The :class:`LivePlan` kept with the decision :func:`plan_pipeline` made for ``cfg``
    with these arguments; None when none is kept or readable."""
    path = decision_path(
        cfg, device, state_dir, rate, objectives, wake_latency_us, allowed_functions
    )
    return _live_at(path)


def keep_live(plan: LivePlan, serving_pipeline: dict[str, Any], reason: str) -> None:
    """Rewrite the kept decision for the configuration now serving (``serving_pipeline``), with
    ``reason``; the next start deploys it and checks it again."""
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
    """Shares of the cap each of ``n`` pipelines is searched within: 1, 1/2, 1/n, largest first."""
    return tuple(sorted({1.0, 0.5, 1.0 / max(1, n)}, reverse=True))


def share_of(cap: ResourceCap, f: float) -> ResourceCap:
    """``f`` of ``cap``'s free memory, instance slots and thread slots, each at least 1."""
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
    """``cfgs`` planned together within one cap: each searched at its SLO and rate (None: max)
    within each :func:`set_shares` share, one configuration each chosen by
    :func:`~infscaler.runtime.planning.jointplan.plan_together`.

    Returns ``(per pipeline its whole-cap search with every share's candidates, the plan)``.

    Raises:
        InfScalerError: as :func:`plan_measured`, or a pipeline that fits in no way."""
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
    """The decision path of ``cfg`` planned together with ``cfgs`` (keyed by the others too)."""
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
    """Deploy-time planning of several pipelines together (:func:`plan_set_measured` at max
    rates): per name, ``(planned PipelineConfig, its LivePlan)``. Decisions are kept and
    reused as :func:`plan_pipeline` does; they keep no runner-up.

    Raises:
        InfScalerError: a pipeline without an SLO, or one that fits in no way."""
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
