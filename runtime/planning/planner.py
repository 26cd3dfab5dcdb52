"""The planner: a pipeline's starting configuration for an arrival rate and an SLO, by one
configuration search (InfScaler §IV, InferLine §4.3; design: docs/planner.md).

:func:`search` is the planner. Over the points of the runtime's configuration space
(:mod:`~infscaler.runtime.planning.stages`: per model stage K, the cuts of each
objective, intra-op threads; the whole pipeline in one unit; a pipeline of fixed units
is one point) it runs the candidate sources (:mod:`~infscaler.runtime.planning.candidates`:
instances grown by Algorithm 1, and the greedy planner's least-memory configuration,
:mod:`~infscaler.runtime.planning.greedy`), scores each candidate by simulated goodput
with CPU contention and the front end's CPU (:mod:`~infscaler.runtime.planning.scoring`),
ranks them with goodput intervals and ties (:mod:`~infscaler.runtime.planning.ranking`)
and says why each lost (:mod:`~infscaler.runtime.planning.explain`).

:func:`plan` is :func:`search` on fixed unit profiles with the greedy source alone (its
:class:`~infscaler.runtime.planning.greedy.PlanResult`: steps, reason). Joint planning
(:mod:`~infscaler.runtime.planning.jointplan`) and the fleet planner
(:mod:`~infscaler.runtime.planning.fleet`) are loops over its results. :func:`predict`
simulates a given configuration.

Pure: no I/O.
"""

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
    """R^m from a :class:`~infscaler.base.device.DeviceProfile`, a :class:`ResourceCap`, or None
    (no limit but the control path's :data:`MAX_PER_UNIT` per unit)."""
    if device is None:
        return ResourceCap(memory_cap_mb=math.inf, memory_used_mb=0.0, max_instances={}, cores=0)
    if isinstance(device, ResourceCap):
        return device
    return cap_from_profile(device)


# -- the search ---------------------------------------------------------------------------


#: Requests of the search's own score of the one candidate :func:`plan` returns: the
#: least :func:`search` takes (the greedy source simulates ``duration_s``; this score ranks
#: nothing).
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
    """:func:`search` on fixed unit profiles with its greedy source alone (:mod:`.greedy`):
    the least-memory configuration whose simulated P99 meets ``slo_ms`` at ``rate``, with
    the steps and, where none meets the SLO, why.

    Args:
        units: the pipeline's unit profiles, in order.
        rate: mean arrival rate, requests/s. slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no cap).
        arrivals: the sample arrival process (a spec, a callable or times).
        duration_s: length of the sample trace, s. seed: of the trace and service times.
        handover_ms / pool_mb / warmup_s / max_inflight: as
            :func:`~infscaler.runtime.planning.simulator.simulate` (``"auto"``: served
            instances + 1).
        batch_wait_ms: batch window when the search raises a unit's batch.
        max_steps: most changes the search makes. minimize: run the trimming phase.

    Raises:
        ValueError: bad rate / SLO / duration or an arrival spec that cannot be read.
    """
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
    ``arrivals``: explicit times, or a spec / callable at ``rate`` over ``duration_s``;
    ``cpu_cores``: the cores cpu instances share (contention, see
    :func:`~infscaler.runtime.planning.simulator.simulate`; None: none modelled).

    Raises:
        ValueError: a spec without a rate, or bad arguments.
    """
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


#: Front-end CPU per request, ms: the service process's CPU time per request of a
#: 1x3x224x224 FP32 input over the Unix socket, measured with ``bench/frontend_cpu.py``
#: (docs/planner.md, "The constants' measurements"); pass the target's own figure with
#: ``frontend_ms``.
FRONTEND_MS = 1.6

#: Time of one token handover in :func:`search`'s simulations, ms (every hop between the
#: front end and the units): the fixed part of a hop between two served instances,
#: measured with ``bench/chain_latency.py --served`` (docs/planner.md, "The constants'
#: measurements").
HANDOVER_MS = 0.5


def frontend_profile(frontend_ms: float = FRONTEND_MS) -> UnitProfile:
    """The front end as :func:`search` simulates it: a single-threaded cpu server of
    ``frontend_ms`` per request ahead of the pipeline's units, competing with them for
    the cores, not itself served by instances (``served=False``). Put it first in the
    units (with a ``UnitConfig({"cpu": 1})``) to score a configuration as the search
    does.

    Raises:
        ValueError: ``frontend_ms`` <= 0 (as :class:`EngineProfile`)."""
    return UnitProfile(
        "frontend",
        {"cpu": EngineProfile("cpu", frontend_ms, cores=1)},
        kind="function",
        served=False,
    )


#: :func:`search` counts candidates within this fraction of the best goodput as tied
#: (and also those whose goodput interval overlaps the best's: the floor of the tie when
#: the measurements carry no uncertainty) and gives the tie to the simpler one: fewer
#: units (partitions and stages), then one within
#: :data:`~infscaler.runtime.planning.ranking.MEMORY_AMPLE` of the cap, then
#: fewer intra-op threads per instance, then fewer processes, then less memory.
GOODPUT_TIE = 0.05

#: :func:`search` scores every candidate on a short trace (``requests``, 600), then
#: scores again, on a trace of this many requests, the finalists: the candidates within
#: :data:`FINALIST_WITHIN` of the best short score, at most :data:`FINALISTS_MAX` of them
#: (the short score is a screen, not a prediction: docs/planner.md, "The constants'
#: measurements").
FINAL_REQUESTS = 12_000
#: Finalists are the candidates whose short score is within this fraction of the best.
FINALIST_WITHIN = 0.3
#: At most this many finalists (the best short scores first).
FINALISTS_MAX = 4


def cpu_cores(device: Any) -> int | None:
    """Physical cores of a DeviceProfile's cpu entry (its listed ``cores``; None when it
    lists none or has no cpu entry): the contention count for :func:`search`, where
    ``ResourceCap.cores`` counts thread slots (cores x ``threads_per_core``)."""
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
    """The cores :func:`search` simulates: ``cores``, else the cap's; 0 (unknown, no
    contention modelled) only for a pipeline of fixed units (no ``models``), else
    ValueError."""
    n_cores = int(cores or cap.cores or 0)
    if n_cores < 1 and models:
        raise ValueError("cores unknown: give cores= or a device profile with a cpu entry")
    return max(0, n_cores)


def _model_stages(stages: Sequence[ModelStage | UnitProfile]) -> list[int]:
    """Where the :class:`ModelStage` are in ``stages``, or ValueError (no stage at all,
    or one neither)."""
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
    """Search the runtime's configuration space for the most goodput within the SLO.

    Candidates: per model stage K = 1 .. ``max_partitions`` (each objective's cuts) at each
    measured thread count, and the whole pipeline in one unit, instances grown within the
    cap (:mod:`.candidates`); each scored by the simulator with CPU contention and the
    front end's CPU (:mod:`.scoring`); finalists scored again for a goodput interval, ties
    to the simpler configuration (:mod:`.ranking`); why each lost (:mod:`.explain`).
    Design and measurements: docs/planner.md, "The search".

    Args:
        stages: the pipeline in order: :class:`ModelStage` (searched) or fixed
            :class:`UnitProfile` (function stages or given units; their instances grow
            too). With no ModelStage the space is one point.
        slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no memory / slot cap).
        rate: expected mean arrival rate, requests/s (None: score by the max rate).
        cores: physical cpu cores the instances and the front end share (default: the
            cap's ``cores``; give the physical count when thread slots oversubscribe them,
            :func:`cpu_cores`).
        arrivals: arrival process spec (:func:`infscaler.runtime.planning.arrivals.from_spec`).
        requests: requests simulated per screening score.
        final_requests / finalist_within / finalists_max: the finalists' long score (0: the
            screen decides).
        seed / handover_ms: as :func:`~infscaler.runtime.planning.simulator.simulate`.
        frontend_ms: front-end CPU per request, ms (0: not modelled).
        max_partitions: largest K per model stage.
        objectives: partition objectives tried (``("eq1",)``: the paper's only).
        whole: the whole pipeline as one unit, intra-op threads -> its profile
            (:func:`infscaler.runtime.planning.inputs.whole_profiles`); each ``t <= cores``
            is a candidate.
        oversubscribe: pinned threads allowed per core (default 1), never more than the
            cap's thread slots; candidates pinning more are ruled out while any within them
            meets the SLO.
        max_candidates: most (cuts x threads) combinations over the stages.
        goodput_tie: relative goodput difference counted as a tie, 0-1.
        incumbent: the configuration planned before
            (:meth:`~infscaler.runtime.planning.candidates.Candidate.identity`; None: none):
            a finalist that wins a goodput tie before every other rule.
        sources: candidate sources (:data:`~.candidates.SOURCES`; ``greedy`` needs ``rate``).
        greedy: how the greedy source simulates (:class:`~.greedy.GreedyOptions`; None: the
            screen's trace).

    Returns:
        :class:`~.explain.SearchOutcome`: ``best`` (None when no candidate answers any
        request within the SLO) and every candidate with why it lost.

    Raises:
        ValueError: bad SLO / rate / cores, no stage, an unknown objective or source, or
            more than ``max_candidates`` combinations.
    """
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
