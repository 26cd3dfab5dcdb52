"""The planner: a pipeline's starting configuration for an arrival rate and an SLO, by one
configuration search (InfScaler §IV, InferLine §4.3; design: docs/planner.md).

:func:`search` scores every candidate of the configuration space
(:mod:`~infscaler.runtime.planning.candidates`) by simulated goodput
(:mod:`~infscaler.runtime.planning.scoring`), ranks them
(:mod:`~infscaler.runtime.planning.ranking`) and says why each lost. :func:`plan` is the
search on fixed unit profiles with the greedy source alone; :func:`predict` simulates a
given configuration. Pure: no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from infscaler.partitioner import search as _search
from infscaler.runtime.planning.candidates import (
    SOURCES,
    Candidate,
    Limits,
    hand_configurations,
    propose,
    rule_out_oversubscribed,
)
from infscaler.runtime.planning.explain import SearchOutcome, explanation, ranked
from infscaler.runtime.planning.greedy import GreedyOptions, PlanResult
from infscaler.runtime.planning.ranking import Ties, finalists, rescore
from infscaler.runtime.planning.scoring import ArrivalsArg, Scorer, SearchSettings, arrivals_for
from infscaler.runtime.planning.simulator import (
    EngineProfile,
    SimResult,
    UnitConfig,
    UnitProfile,
    cap_from_profile,
    simulate,
)
from infscaler.runtime.planning.stages import ModelStage, points
from infscaler.runtime.scaling.types import ResourceCap

__all__ = [
    "FRONTEND_MS",
    "GOODPUT_TIE",
    "HANDOVER_MS",
    "ModelStage",
    "cpu_cores",
    "frontend_profile",
    "plan",
    "predict",
    "resource_cap",
    "search",
]


# -- helpers -------------------------------------------------------------------------------


def resource_cap(device: Any) -> ResourceCap:
    """R^m from a DeviceProfile, a :class:`ResourceCap`, or None (no limit)."""
    if device is None:
        return ResourceCap(memory_cap_mb=math.inf, memory_used_mb=0.0, max_instances={}, cores=0)
    if isinstance(device, ResourceCap):
        return device
    return cap_from_profile(device)


# -- the search ---------------------------------------------------------------------------


#: Requests of the search's own score of :func:`plan`'s one candidate (ranks nothing).
_PLAN_SCREEN = 50


def plan(
    units: Sequence[UnitProfile],
    rate: float,
    slo_ms: float,
    device: Any = None,
    *,
    arrivals: ArrivalsArg = "poisson",
    duration_s: float = 60.0,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    warmup_s: float = 0.0,
    batch_wait_ms: float = 2.0,
    max_inflight: int | str | None = "auto",
    max_steps: int = 64,
    minimize: bool = True,
) -> PlanResult:
    """:func:`search` on fixed unit profiles with the greedy source alone: the least-memory
    configuration whose simulated P99 meets ``slo_ms`` at ``rate``, with its steps and, where
    none meets the SLO, why.

    Args:
        units: the pipeline's unit profiles, in order.
        rate: mean arrival rate, requests/s. slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no cap).
        arrivals: the sample arrival process (a spec, a callable or times).
        duration_s: length of the sample trace, s. seed: of the trace and service times.
        handover_ms / pool_mb / warmup_s / max_inflight: as
            :func:`~infscaler.runtime.planning.simulator.simulate`.
        batch_wait_ms: batch window when a unit's batch is raised.
        max_steps: most changes made. minimize: run the trimming phase.

    Raises:
        ValueError: bad rate / SLO / duration or an unreadable arrival spec."""
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    options = GreedyOptions(
        arrivals=arrivals,
        duration_s=duration_s,
        pool_mb=pool_mb,
        warmup_s=warmup_s,
        batch_wait_ms=batch_wait_ms,
        max_inflight=max_inflight,
        max_steps=max_steps,
        minimize=minimize,
    )
    outcome = search(
        list(units),
        slo_ms,
        device,
        rate=rate,
        seed=seed,
        handover_ms=handover_ms,
        frontend_ms=0.0,
        requests=_PLAN_SCREEN,
        final_requests=0,
        sources=("greedy",),
        greedy=options,
    )
    return outcome.greedy[0]


def predict(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig] | None,
    arrivals: ArrivalsArg,
    *,
    rate: float | None = None,
    duration_s: float = 60.0,
    slo_ms: float | None = None,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    warmup_s: float = 0.0,
    max_inflight: int | str | None = "auto",
    cpu_cores: int | None = None,
) -> SimResult:
    """Simulate ``config`` (None: each unit's minimum on its fastest engine) under
    ``arrivals`` (times, or a spec / callable at ``rate`` over ``duration_s``); ``cpu_cores``:
    the cores cpu instances share (None: no contention).

    Raises:
        ValueError: a spec without a rate, or bad arguments."""
    if isinstance(arrivals, str) or callable(arrivals):
        if rate is None:
            raise ValueError(f"arrivals {arrivals!r} need a rate")
        times, _ = arrivals_for(arrivals, rate, duration_s, seed)
    else:
        times = np.asarray(arrivals, dtype=float)
    return simulate(
        units,
        config,
        times,
        slo_ms=slo_ms,
        handover_ms=handover_ms,
        seed=seed,
        warmup_s=warmup_s,
        pool_mb=pool_mb,
        max_inflight=max_inflight,
        cpu_cores=cpu_cores,
    )


#: Front-end CPU per request, ms (``bench/frontend_cpu.py``; docs/planner.md, "The
#: constants' measurements").
FRONTEND_MS = 1.6

#: One token handover between served instances in :func:`search`'s simulations, ms
#: (``bench/chain_latency.py --served``).
HANDOVER_MS = 0.5


def frontend_profile(frontend_ms: float = FRONTEND_MS) -> UnitProfile:
    """The front end as :func:`search` simulates it: a single-threaded cpu server of
    ``frontend_ms`` per request, not served by instances; put it first in the units.

    Raises:
        ValueError: ``frontend_ms`` <= 0."""
    return UnitProfile(
        "frontend",
        {"cpu": EngineProfile("cpu", frontend_ms, cores=1)},
        kind="function",
        served=False,
    )


#: Candidates within this fraction of the best goodput (or whose interval overlaps the
#: best's) tie; the tie goes to the simpler one (:meth:`~.ranking.Ties.rank`).
GOODPUT_TIE = 0.05

#: Requests of the finalists' second, long score (the short one is a screen).
FINAL_REQUESTS = 12_000
#: Finalists are the candidates whose short score is within this fraction of the best.
FINALIST_WITHIN = 0.3
#: At most this many finalists (the best short scores first).
FINALISTS_MAX = 4


def cpu_cores(device: Any) -> int | None:
    """Physical cores of a DeviceProfile's cpu entry (None: none listed), where
    ``ResourceCap.cores`` counts thread slots."""
    for acc in getattr(device, "accelerators", ()):
        if acc.engine == "cpu" and acc.count >= 1 and acc.cores:
            return len(acc.cores)
    return None


def _check_search(
    slo_ms: float, rate: float | None, objectives: Sequence[str], goodput_tie: float
) -> None:
    """:func:`search`'s SLO, rate, objectives and tie, or ValueError."""
    if not (isinstance(slo_ms, int | float) and math.isfinite(slo_ms) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number of ms, got {slo_ms!r}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    bad = [o for o in objectives if o not in _search.OBJECTIVES]
    if bad:
        raise ValueError(f"unknown objectives {bad}: use {_search.OBJECTIVES}")
    if not 0 <= goodput_tie < 1:
        raise ValueError(f"goodput_tie must be in [0, 1), got {goodput_tie!r}")


def _check_traces(
    frontend_ms: float,
    requests: int,
    max_partitions: int,
    final_requests: int,
    finalists_max: int,
    finalist_within: float,
) -> None:
    """:func:`search`'s front end, partitions, trace lengths and finalists, or ValueError."""
    if frontend_ms < 0 or requests < 50 or max_partitions < 1:
        raise ValueError("frontend_ms must be >= 0, requests >= 50, max_partitions >= 1")
    if final_requests and final_requests < requests or finalists_max < 1:
        raise ValueError(
            f"final_requests must be 0 or >= requests ({requests}), finalists_max >= 1; got "
            f"{final_requests}, {finalists_max}"
        )
    if not 0 <= finalist_within < 1:
        raise ValueError(f"finalist_within must be in [0, 1), got {finalist_within!r}")


def _physical_cores(cap: ResourceCap, cores: int | None, models: Sequence[int]) -> int:
    """The cores :func:`search` simulates: ``cores``, else the cap's; 0 only without
    ``models``, else ValueError."""
    n_cores = int(cores or cap.cores or 0)
    if n_cores < 1 and models:
        raise ValueError("cores unknown: give cores= or a device profile with a cpu entry")
    return max(0, n_cores)


def _model_stages(stages: Sequence[ModelStage | UnitProfile]) -> list[int]:
    """Where the :class:`ModelStage` are in ``stages``; ValueError on none or a foreign stage."""
    if not stages:
        raise ValueError("no stage to plan: pass the pipeline's stages in order")
    bad = [type(s).__name__ for s in stages if not isinstance(s, ModelStage | UnitProfile)]
    if bad:
        raise ValueError(f"stages must be ModelStage or UnitProfile, got {bad}")
    return [i for i, s in enumerate(stages) if isinstance(s, ModelStage)]


def search(
    stages: Sequence[ModelStage | UnitProfile],
    slo_ms: float,
    device: Any = None,
    *,
    rate: float | None = None,
    cores: int | None = None,
    arrivals: str = "poisson",
    requests: int = 600,
    seed: int = 0,
    handover_ms: float = HANDOVER_MS,
    frontend_ms: float = FRONTEND_MS,
    max_partitions: int = 3,
    objectives: Sequence[str] = ("eq1", "minmax", "weights"),
    oversubscribe: float = 1.0,
    max_candidates: int = 400,
    goodput_tie: float = GOODPUT_TIE,
    whole: Mapping[int, UnitProfile] | None = None,
    final_requests: int = FINAL_REQUESTS,
    finalist_within: float = FINALIST_WITHIN,
    finalists_max: int = FINALISTS_MAX,
    incumbent: Sequence[Any] | None = None,
    sources: Sequence[str] = SOURCES,
    greedy: GreedyOptions | None = None,
) -> SearchOutcome:
    """Search the runtime's configuration space for the most goodput within the SLO
    (docs/planner.md, "The search").

    Args:
        stages: the pipeline in order: :class:`ModelStage` (searched) or fixed
            :class:`UnitProfile`; with no ModelStage the space is one point.
        slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no memory / slot cap).
        rate: expected mean arrival rate, requests/s (None: score by the max rate).
        cores: physical cpu cores the instances and the front end share (default: the
            cap's ``cores``; see :func:`cpu_cores`).
        arrivals: arrival process spec (:func:`infscaler.runtime.planning.arrivals.from_spec`).
        requests: requests simulated per screening score.
        final_requests / finalist_within / finalists_max: the finalists' long score (0: the
            screen decides).
        seed / handover_ms: as :func:`~infscaler.runtime.planning.simulator.simulate`.
        frontend_ms: front-end CPU per request, ms (0: not modelled).
        max_partitions: largest K per model stage.
        objectives: partition objectives tried.
        whole: intra-op threads -> the whole pipeline as one unit; each ``t <= cores`` is a
            candidate.
        oversubscribe: pinned threads allowed per core, within the cap's thread slots.
        max_candidates: most (cuts x threads) combinations over the stages.
        goodput_tie: relative goodput difference counted as a tie, 0-1.
        incumbent: the identity of the configuration planned before (wins a tie first).
        sources: candidate sources (``greedy`` needs ``rate``).
        greedy: how the greedy source simulates (None: the screen's trace).

    Returns:
        :class:`~.explain.SearchOutcome`: ``best`` (None when no candidate answers within
        the SLO) and every candidate with why it lost.

    Raises:
        ValueError: bad SLO / rate / cores, no stage, an unknown objective or source, or
            more than ``max_candidates`` combinations."""
    _check_search(slo_ms, rate, objectives, goodput_tie)
    _check_traces(
        frontend_ms, requests, max_partitions, final_requests, finalists_max, finalist_within
    )
    cap = resource_cap(device)
    models = _model_stages(stages)
    n_cores = _physical_cores(cap, cores, models)
    fe = [frontend_profile(frontend_ms)] if frontend_ms > 0 else []
    jobs = points(stages, models, n_cores, max_partitions, objectives, max_candidates, whole, fe)
    s = SearchSettings(
        slo_ms=slo_ms,
        rate=rate,
        arrivals=arrivals,
        requests=requests,
        seed=seed,
        handover_ms=handover_ms,
        frontend_ms=frontend_ms,
        cores=n_cores,
        final_requests=final_requests,
        finalist_within=finalist_within,
        finalists_max=finalists_max,
        goodput_tie=goodput_tie,
        incumbent=None if incumbent is None else json.dumps(list(incumbent)),
    )
    scorer = Scorer(s)
    limits = Limits.of(cap, n_cores, oversubscribe)
    grown, planned = propose(jobs, limits, scorer, sources, greedy)
    cands = rule_out_oversubscribed(grown, limits.thread_slots, n_cores)
    return _ranked(cands, len(models), scorer, cap, tuple(planned))


def _ranked(
    cands: list[Candidate],
    n_models: int,
    scorer: Scorer,
    cap: ResourceCap,
    planned: tuple[PlanResult, ...],
) -> SearchOutcome:
    """:func:`search`'s last steps: the finalists scored again, the candidates ranked
    with the ties, each one's why (``planned``: the greedy source's results)."""
    s = scorer.settings
    hands = hand_configurations(cands, n_models)
    screen, final, chosen = finalists(cands, hands, s)
    cands = rescore(cands, chosen, scorer, final)
    out, best = ranked(cands, Ties.of(cands, final, s, cap), screen, s)
    lines = explanation(out, best, hands, s, scorer.simulations, final)
    return SearchOutcome(
        best=best,
        candidates=tuple(out),
        explain=tuple(lines),
        simulations=scorer.simulations,
        rate=s.rate,
        slo_ms=float(s.slo_ms),
        greedy=planned,
    )
