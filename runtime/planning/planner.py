"""The planner: a pipeline's starting configuration for an arrival rate and an SLO, by one
configuration search (InfScaler §IV, InferLine §4.3; design and measurements:
docs/planner.md).

:func:`search` is the planner. For model stages (:class:`ModelStage`: per-operator
costs, valid cuts, the whole model's measured time per thread count) it proposes the
points of the runtime's configuration space (K, the cuts of each objective, intra-op
threads, the whole pipeline in one unit) from its candidate sources
(:mod:`~infscaler.runtime.planning.candidates`: instances grown by Algorithm 1, and the
greedy planner's least-memory configuration, :mod:`~infscaler.runtime.planning.greedy`),
scores each by simulated goodput with CPU contention and the front end's CPU
(:mod:`~infscaler.runtime.planning.scoring`), ranks them with goodput intervals and ties
(:mod:`~infscaler.runtime.planning.ranking`) and says why each lost
(:mod:`~infscaler.runtime.planning.explain`). Joint planning
(:mod:`~infscaler.runtime.planning.jointplan`) loops over its ranked candidates.

:func:`plan` runs the greedy source alone on fixed unit profiles (engines, batch,
instances; :class:`~infscaler.runtime.planning.greedy.PlanResult`);
:func:`predict` simulates a given configuration; :func:`autoscale_run` runs the scaler
(Algorithm 1) in the simulator on a device profile.

Pure: no I/O; profiles come from :mod:`infscaler.runtime.planning.unitprofile`,
:mod:`infscaler.runtime.planning.stageprofile` or by hand.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infscaler.base.errors import PartitionError
from infscaler.partitioner import search as _search
from infscaler.runtime.planning.candidates import (
    Limits,
    Point,
    hand_configurations,
    propose,
    rule_out_oversubscribed,
)
from infscaler.runtime.planning.explain import SearchOutcome, explanation, ranked
from infscaler.runtime.planning.greedy import PlanResult, PlanSearch
from infscaler.runtime.planning.ranking import Ties, finalists, rescore
from infscaler.runtime.planning.scoring import ArrivalsArg, Scorer, SearchSettings, arrivals_for
from infscaler.runtime.planning.simulator import (
    Autoscale,
    EngineProfile,
    SimResult,
    UnitConfig,
    UnitProfile,
    cap_from_profile,
    simulate,
)
from infscaler.runtime.scaling.types import ResourceCap, ScalerConfig

__all__ = [
    "FRONTEND_MS",
    "GOODPUT_TIE",
    "HANDOVER_MS",
    "ModelStage",
    "autoscale_run",
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
    """The greedy planner alone on fixed unit profiles: the least-memory configuration
    whose simulated P99 meets ``slo_ms`` at ``rate`` (the steps: :mod:`.greedy`).

    Args:
        units: the pipeline's unit profiles, in order.
        rate: mean arrival rate, requests/s.
        slo_ms: the end-to-end P99 latency SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no cap).
        arrivals: the sample arrival process (a spec, a callable or times).
        duration_s: length of the sample trace, s.
        seed: of the trace and the service times.
        handover_ms / pool_mb / warmup_s / max_inflight: see
            :func:`~infscaler.runtime.planning.simulator.simulate` (``"auto"``: the runtime's
            default window, the served instances + 1).
        batch_wait_ms: batch window when the search raises a unit's batch.
        max_steps: most changes the search makes.
        minimize: run the trimming phase.

    Raises:
        ValueError: bad rate / SLO / duration or an arrival spec that cannot be read.
    """
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    if not (isinstance(slo_ms, int | float) and math.isfinite(slo_ms) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number of ms, got {slo_ms!r}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    units = list(units)
    cap = resource_cap(device)
    times, label = arrivals_for(arrivals, rate, duration_s, seed)
    if times.size == 0:
        raise ValueError(f"the arrival trace ({label}) holds no requests")
    planning = PlanSearch(
        units,
        rate,
        slo_ms,
        cap,
        times,
        label,
        seed=seed,
        handover_ms=handover_ms,
        pool_mb=pool_mb,
        warmup_s=warmup_s,
        batch_wait_ms=batch_wait_ms,
        max_inflight=max_inflight,
    )
    return planning.plan(max_steps, minimize)


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


def autoscale_run(
    units: Sequence[UnitProfile],
    config: Sequence[UnitConfig] | None,
    arrivals: np.ndarray | Sequence[float],
    slo_ms: float,
    device: Any,
    *,
    interval_s: float = 1.0,
    window_s: float = 10.0,
    startup_s: float = 2.0,
    scaler_config: ScalerConfig | None = None,
    seed: int = 0,
    handover_ms: float = 0.0,
    pool_mb: float = 0.0,
    max_inflight: int | str | None = "auto",
    decide: Callable[..., Any] | None = None,
) -> SimResult:
    """Run the scaler (:func:`infscaler.runtime.scaling.scaler.decide`) in the simulator: the
    pipeline starts at ``config`` and the scaler acts every ``interval_s`` under the
    cap of ``device`` (a DeviceProfile or ResourceCap); the result's ``timeline`` holds
    the rate, P99 and instances per interval.

    ``scaler_config`` None takes :class:`ScalerConfig`'s defaults, ``settle_s`` (5 s)
    and ``sustain_s`` (2 s) included: the run predicts what the service's scaler does
    with a pipeline's ``autoscale: true``, and that scaler waits out both. The
    simulation models no warm-up, so a run that must react at once passes them as 0.
    The run starts with no change known (no settle window at t = 0)."""
    auto = Autoscale(
        slo_ms=slo_ms,
        cap=resource_cap(device),
        interval_s=interval_s,
        window_s=window_s,
        startup_s=startup_s,
        config=scaler_config or ScalerConfig(),
        decide=decide,
    )
    return simulate(
        units,
        config,
        arrivals,
        slo_ms=slo_ms,
        handover_ms=handover_ms,
        seed=seed,
        pool_mb=pool_mb,
        max_inflight=max_inflight,
        autoscale=auto,
    )


# -- the configuration-space search --------------------------------------------------------

#: Front-end CPU per request, ms: the service process's CPU time (HTTP server, admission,
#: token handover, reply; all its threads) per request of a 1x3x224x224 FP32 input (602 KB,
#: binary tensor data over the Unix socket), measured with ``bench/frontend_cpu.py`` on
#: the 2-core development host (2026-11-25: 1.67 ms over 200 requests, 1.55 ms over 600).
#: It grows with the request's bytes; pass the target's own figure with ``frontend_ms``.
FRONTEND_MS = 1.6

#: Time of one token handover in :func:`search`'s simulations, ms (every hop between the
#: front end and the units; :func:`~infscaler.runtime.planning.simulator.simulate`): the fixed
#: part of a hop between two served instances, compute end -> the next compute start,
#: one request at a time, measured with ``bench/hop_latency.py`` on the 2-core
#: development host (2026-11-27: 0.50 ms + 0.20 ms per MB crossing, fitted over six
#: cuts of ResNet-50 and PP-OCRv4 det; the per-MB part is close to the T_p an estimated
#: partition already carries, 0.14 ms per MB). It was 0.1, a figure never measured.
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
#: :data:`FINALIST_WITHIN` of the best short score, at most :data:`FINALISTS_MAX` of them.
#: The short score is a screen, not a prediction: the largest rate whose P99 over 600
#: simulated requests meets the SLO read 9.8-16.2 requests/s over 8 seeds for
#: ResNet-50 as 2 single-thread replicas on 2 cores at 2 x L0 (seed 0: 16.2), where the
#: same simulator's P99 over 20 000 requests crosses the SLO at about 10.5/s; over
#: 12 000 requests 6 seeds read 10.0-11.0, and the 2026-11-27 bench served 10.4/s
#: over 900 requests and missed at 11.8/s (bench/HISTORY.md, "2026-11-27, 12:45-13:25
#: UTC: the planner's screen, and idle wake-ups"). Picked on the short screen, the
#: deploy-time search gave that cell 2 x 1 thread in one deploy and 1 x 2 threads in the
#: next.
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


@dataclass(frozen=True)
class ModelStage:
    """One partitionable model stage, as the search needs it (all measured, none invented).

    Attributes:
        name: the stage (units are named ``name/k``; ``name`` when K = 1).
        costs: per operator in topological order, the complexity used to cut and to share
            the measured time among partitions: profiled ms at 1 thread (preferred) or FLOPs.
        valid_cuts: cut positions (cut p lies after operator p; ``OperatorGraph.valid_cuts``).
        whole_ms: intra-op threads -> measured time of the whole model, ms (batch 1). Key 1
            is required; a thread count not measured is not an option (no speedup is
            invented).
        weights_bytes: per operator, the weight bytes it reads (``OperatorCost.param_bytes``);
            empty: 0 (the ``weights`` objective then equals ``minmax``).
        flops: per operator FLOPs, for the bottleneck share reported (empty: ``costs``).
        op_ms: per operator profiled ms, to share the measured time among partitions
            (empty: ``costs``).
        cut_bytes: bytes crossing each valid cut (``OperatorGraph.crossing_bytes``).
        boundary_fixed_ms / boundary_per_mb_ms: the measured partition boundary overhead
            T_p = fixed + per_mb x MB crossing (``profiler.BoundaryOverhead``), added to the
            partition after each cut.
        activations_mb: peak activations of the whole model, MB (each instance counted
            with it: an upper bound for a partition).
        instance_overhead_mb: memory of an idle instance process, MB
            (:data:`infscaler.base.device.INSTANCE_OVERHEAD_MB`).
        cv: coefficient of variation of the measured whole-model time (used per unit at
            a thread count without its own ``cv_by_threads``).
        cv_by_threads: intra-op threads -> the CV of the whole model's timed runs at that
            count (:func:`infscaler.runtime.planning.stageprofile.spread_cv`); each unit's
            simulated service times are gamma with it (its partitions keep the whole
            model's spread: one run's slowness is the host's, not an operator's).
        corun_by_threads: intra-op threads -> how much slower the whole model runs while
            every other core runs a copy of it (:func:`infscaler.partitioner.profiler.
            measure_corun`, a fraction; each unit's :attr:`~infscaler.runtime.planning.simulator.
            EngineProfile.corun`; absent: 0).
        idle_by_threads: intra-op threads -> how much slower the whole model runs after
            the host sat idle, ``((idle s, factor), ...)`` (:func:`infscaler.partitioner.
            profiler.measure_idle`; each unit's :attr:`~infscaler.runtime.planning.simulator.
            EngineProfile.idle`, its partitions at the same factor; absent: none).
        unit_ms: measured per-partition times that replace the estimate: ``(cuts, threads)
            -> (ms per partition, ...)``.
        whole_ms_err: intra-op threads -> the uncertainty of ``whole_ms`` at that count,
            relative (a fraction of it, 0 <= err < 1): the distance from the median of
            its timed runs to the farther end of the median's 95 % confidence interval
            (:func:`infscaler.partitioner.profiler.median_err`); absent: 0 (a figure
            taken as exact). :func:`search` scores its finalists with every service time
            at x (1 + err) and x (1 - err) for a goodput interval (its ties).
        unit_ms_err: ``(cuts, threads) -> (relative err per partition, ...)``: the same
            for ``unit_ms`` (absent: the whole model's ``whole_ms_err`` at ``threads``).
        pre_ms / post_ms: function steps fused into this stage's instances
            (:func:`infscaler.runtime.serving.pipeline.fuse_units`): their measured cpu ms per call
            before partition 0 / after partition K-1, added to those partitions' service
            times (the same at every thread count: a function step runs on one thread).
        items: the stage's last unit fans out (a fused ``fan_out`` step after the model):
            the measured items per request, one drawn per request by the simulator;
            empty: it does not fan out. A stage after a fan-out (and before the fan-in)
            runs per item: its arrival rate is the requests' x the mean items
            (:func:`~infscaler.runtime.planning.resources.arrival_rates`).
    """

    name: str
    costs: tuple[float, ...]
    valid_cuts: tuple[int, ...]
    whole_ms: Mapping[int, float]
    weights_bytes: tuple[float, ...] = ()
    flops: tuple[float, ...] = ()
    op_ms: tuple[float, ...] = ()
    cut_bytes: Mapping[int, float] = field(default_factory=dict)
    boundary_fixed_ms: float = 0.0
    boundary_per_mb_ms: float = 0.0
    activations_mb: float = 0.0
    instance_overhead_mb: float = 0.0
    cv: float = 0.0
    cv_by_threads: Mapping[int, float] = field(default_factory=dict)
    corun_by_threads: Mapping[int, float] = field(default_factory=dict)
    idle_by_threads: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    unit_ms: Mapping[tuple[tuple[int, ...], int], tuple[float, ...]] = field(default_factory=dict)
    whole_ms_err: Mapping[int, float] = field(default_factory=dict)
    unit_ms_err: Mapping[tuple[tuple[int, ...], int], tuple[float, ...]] = field(
        default_factory=dict
    )
    pre_ms: float = 0.0
    post_ms: float = 0.0
    items: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "costs", tuple(float(c) for c in self.costs))
        for name in ("pre_ms", "post_ms"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"stage {self.name}: {name} must be a time >= 0 ms, got {v!r}")
        object.__setattr__(self, "items", tuple(int(n) for n in self.items))
        if any(n < 0 for n in self.items):
            raise ValueError(f"stage {self.name}: items must be counts >= 0, got {self.items}")
        object.__setattr__(self, "valid_cuts", tuple(sorted(int(c) for c in self.valid_cuts)))
        if not self.costs or any(not math.isfinite(c) or c < 0 for c in self.costs):
            raise ValueError(f"stage {self.name}: costs must be finite numbers >= 0")
        if 1 not in self.whole_ms:
            raise ValueError(f"stage {self.name}: whole_ms needs the 1-thread time")
        for t, ms in self.whole_ms.items():
            if int(t) < 1 or not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"stage {self.name}: whole_ms[{t}] = {ms!r} is not a time")
        for t, cv in {None: self.cv, **self.cv_by_threads}.items():
            if not (isinstance(cv, int | float) and math.isfinite(cv) and cv >= 0):
                at = "" if t is None else f"_by_threads[{t}]"
                raise ValueError(f"stage {self.name}: cv{at} = {cv!r} is not a CV >= 0")
        errs = [(f"whole_ms_err[{t}]", e) for t, e in self.whole_ms_err.items()]
        errs += [(f"unit_ms_err[{k}]", e) for k, v in self.unit_ms_err.items() for e in v]
        for at, e in errs:
            if not (isinstance(e, int | float) and math.isfinite(e) and 0 <= e < 1):
                raise ValueError(f"stage {self.name}: {at} = {e!r} is not a relative err in [0, 1)")
        for t, f in self.corun_by_threads.items():
            if not (isinstance(f, int | float) and math.isfinite(f) and f >= 0):
                raise ValueError(f"stage {self.name}: corun_by_threads[{t}] = {f!r} is not >= 0")
        for t, pts in self.idle_by_threads.items():
            try:
                EngineProfile("cpu", 1.0, idle=tuple(pts))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"stage {self.name}: idle_by_threads[{t}]: {exc}") from None
        for name in ("weights_bytes", "flops", "op_ms"):
            v = getattr(self, name)
            if v and len(v) != len(self.costs):
                raise ValueError(f"stage {self.name}: {len(v)} {name} for {len(self.costs)} ops")

    def tp_ms(self, cut: int) -> float:
        """T_p of one cut, ms."""
        return self.boundary_fixed_ms + self.boundary_per_mb_ms * self.cut_bytes.get(cut, 0) / 1e6

    def cut_sets(
        self, max_partitions: int, objectives: Sequence[str]
    ) -> dict[tuple[int, ...], list[str]]:
        """Candidate cut sets -> the objectives that chose them (K = 1: ``()``, ``["k1"]``)."""

        out: dict[tuple[int, ...], list[str]] = {(): ["k1"]}
        w = self.weights_bytes or None
        for k in range(2, max_partitions + 1):
            if k > len(self.valid_cuts) + 1:
                break
            for obj in objectives:
                try:
                    if obj == "eq1":
                        r = _search.search_partitions(
                            self.costs,
                            self.valid_cuts,
                            num_partitions=k,
                            cut_bytes=self.cut_bytes or None,
                        )
                    elif obj == "minmax":
                        r = _search.search_minmax(self.costs, self.valid_cuts, k)
                    elif obj == "weights":
                        r = _search.search_minmax(self.costs, self.valid_cuts, k, weights=w)
                    else:
                        raise ValueError(f"unknown objective {obj!r}: use {_search.OBJECTIVES}")
                except PartitionError:
                    continue  # e.g. Eq. 1 has too few representative operators for K
                out.setdefault(r.cuts, []).append(f"{obj}")
        return out

    def eq1_cuts(self, max_partitions: int) -> tuple[int, ...]:
        """The cuts Eq. 1 chooses on its own (K in 1..``max_partitions``, no SLO bound)."""

        return _search.search_partitions(
            self.costs,
            self.valid_cuts,
            max_partitions=max_partitions,
            cut_bytes=self.cut_bytes or None,
        ).cuts

    def bounds(self, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
        ends = [*cuts, len(self.costs) - 1]
        starts = [0, *(c + 1 for c in cuts)]
        return list(zip(starts, ends, strict=True))

    def share(self, cuts: tuple[int, ...]) -> float:
        """The largest partition's share of the FLOPs (of ``costs`` without ``flops``)."""
        v = self.flops or self.costs
        total = math.fsum(v) or 1.0
        return max(math.fsum(v[s : e + 1]) for s, e in self.bounds(cuts)) / total

    def units(self, cuts: tuple[int, ...], threads: int) -> list[UnitProfile]:
        """Unit profiles of this stage cut at ``cuts``, each instance on ``threads`` threads.

        Service time of partition k: ``unit_ms[(cuts, threads)][k]`` when measured, else
        ``whole_ms[threads] x S_k / S`` (its share of ``op_ms``, else of ``costs``) + T_p
        of its input cut; plus ``pre_ms`` on partition 0 and ``post_ms`` on the last (the
        fused function steps). The last unit fans out when ``items`` is given.
        Memory: overhead + its weights + the whole model's activations, MB.
        """
        bounds = self.bounds(cuts)
        share_of = self.op_ms or self.costs
        total = math.fsum(share_of) or 1.0
        measured = self.unit_ms.get((cuts, threads))
        out = []
        for k, (s, e) in enumerate(bounds):
            if measured is not None:
                ms = float(measured[k])
            else:
                ms = self.whole_ms[threads] * math.fsum(share_of[s : e + 1]) / total
                if k > 0:
                    ms += self.tp_ms(cuts[k - 1])
            if k == 0:
                ms += self.pre_ms
            if k == len(bounds) - 1:
                ms += self.post_ms
            mem = self.instance_overhead_mb + self.activations_mb
            if self.weights_bytes:
                mem += math.fsum(self.weights_bytes[s : e + 1]) / 1e6
            cv = self.cv_by_threads.get(threads, self.cv)
            corun = self.corun_by_threads.get(threads, 0.0)
            idle = tuple(self.idle_by_threads.get(threads, ()))
            prof = EngineProfile(
                "cpu", ms, cv=cv, memory_mb=mem, cores=threads, corun=corun, idle=idle
            )
            name = self.name if len(bounds) == 1 else f"{self.name}/{k}"
            fans = bool(self.items) and k == len(bounds) - 1
            out.append(
                UnitProfile(name, {"cpu": prof}, fan_out=fans, items=self.items if fans else (1,))
            )
        return out

    def unit_errs(self, cuts: tuple[int, ...], threads: int) -> list[float]:
        """The relative uncertainty of each unit's service time of :meth:`units` (same
        order): a measured partition's ``unit_ms_err`` (else the whole model's
        ``whole_ms_err`` at ``threads``); an estimated one's share of the whole model's
        time carries ``whole_ms_err``, its T_p and the fused function steps none, so the
        unit's err is that share's absolute err over its whole service time. 0 where
        nothing is known.

        E.g. 10 ms whole with a 4 % err, cut in two equal halves with a 1 ms T_p: the
        first partition 5 ms +- 0.2 (0.04), the second 6 ms +- 0.2 (0.0333).
        """
        base = float(self.whole_ms_err.get(threads, 0.0))
        measured = self.unit_ms.get((cuts, threads))
        errs = self.unit_ms_err.get((cuts, threads))
        units = self.units(cuts, threads)
        bounds = self.bounds(cuts)
        share_of = self.op_ms or self.costs
        total = math.fsum(share_of) or 1.0
        out = []
        for k, ((s, e), u) in enumerate(zip(bounds, units, strict=True)):
            if measured is not None:
                part = float(measured[k])
                err = float(errs[k]) if errs is not None and k < len(errs) else base
            else:
                part = self.whole_ms[threads] * math.fsum(share_of[s : e + 1]) / total
                err = base
            ms = u.engines["cpu"].mean_ms
            out.append(part * err / ms if ms > 0 else 0.0)
        return out


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


def _physical_cores(cap: ResourceCap, cores: int | None) -> int:
    """The cores :func:`search` simulates: ``cores``, else the cap's, or ValueError."""
    n_cores = int(cores or cap.cores or 0)
    if n_cores < 1:
        raise ValueError("cores unknown: give cores= or a device profile with a cpu entry")
    return n_cores


def _model_stages(stages: Sequence[ModelStage | UnitProfile]) -> list[int]:
    """Where the :class:`ModelStage` are in ``stages``, or ValueError (none)."""
    models = [i for i, s in enumerate(stages) if isinstance(s, ModelStage)]
    if not models:
        raise ValueError("no model stage to search: pass at least one ModelStage")
    return models


def _space(
    stages: Sequence[ModelStage | UnitProfile],
    models: Sequence[int],
    cores: int,
    max_partitions: int,
    objectives: Sequence[str],
    max_candidates: int,
    whole: Mapping[int, UnitProfile] | None,
    frontend_ms: float,
) -> list[Point]:
    """The points of the space :func:`search` grows: every combination over the model
    stages (at ``models`` in ``stages``) of their cut sets and thread counts (``t <=
    cores``), then the whole pipeline in one unit at each of its thread counts; each
    behind the front end (none at ``frontend_ms`` 0).

    Raises:
        ValueError: more than ``max_candidates`` combinations."""
    options = []  # per model stage: (cuts, objectives, threads) options
    for i in models:
        st = stages[i]
        assert isinstance(st, ModelStage)
        sets = st.cut_sets(max_partitions, objectives)
        threads = sorted(t for t in st.whole_ms if t <= cores)
        options.append([(c, tuple(o), t) for c, o in sets.items() for t in threads])
    combos = list(itertools.product(*options))
    if len(combos) > max_candidates:
        raise ValueError(
            f"{len(combos)} combinations > max_candidates {max_candidates}: lower "
            "max_partitions or the thread counts measured"
        )
    fe = [frontend_profile(frontend_ms)] if frontend_ms > 0 else []
    jobs = [_combo_job(stages, models, combo, fe) for combo in combos]
    for t, wu in sorted((whole or {}).items()):  # the whole pipeline in one unit
        if t <= cores:
            jobs.append(_whole_job(stages, models, t, wu, fe))
    return jobs


def _combo_job(
    stages: Sequence[ModelStage | UnitProfile],
    models: Sequence[int],
    combo: Sequence[tuple[tuple[int, ...], tuple[str, ...], int]],
    fe: list[UnitProfile],
) -> Point:
    """The units of one combination (per model stage: cuts, objectives, threads), each
    model stage's measured uncertainty with them."""
    units: list[UnitProfile] = list(fe)
    errs: list[float] = [0.0] * len(fe)
    it = iter(combo)
    for s in stages:
        if isinstance(s, ModelStage):
            cuts, _, t = next(it)
            units.extend(s.units(cuts, t))
            errs.extend(s.unit_errs(cuts, t))
        else:
            units.append(s)
            errs.append(0.0)
    share = tuple(st.share(c[0]) for st, c in zip((stages[i] for i in models), combo, strict=True))
    base = {
        "cuts": tuple(c[0] for c in combo),
        "objectives": tuple(c[1] for c in combo),
        "threads": tuple(c[2] for c in combo),
        "units": tuple(units),
        "share": share,
        "unit_err": tuple(errs),
    }
    return units, base


def _whole_job(
    stages: Sequence[ModelStage | UnitProfile],
    models: Sequence[int],
    t: int,
    wu: UnitProfile,
    fe: list[UnitProfile],
) -> Point:
    """The whole pipeline in one unit ``wu`` at ``t`` threads: its model stages'
    whole-model times carry their errs (absolute, summed), its function steps none."""
    units = [*fe, wu]
    abs_err = math.fsum(
        m.whole_ms.get(t, 0.0) * m.whole_ms_err.get(t, 0.0)
        for m in (stages[i] for i in models)
        if isinstance(m, ModelStage)
    )
    w_ms = wu.fastest().mean_ms
    base = {
        "cuts": tuple(() for _ in models),
        "objectives": tuple(("whole",) for _ in models),
        "threads": tuple(t for _ in models),
        "units": tuple(units),
        "share": tuple(1.0 for _ in models),
        "whole": True,
        "unit_err": (*(0.0 for _ in fe), min(0.99, abs_err / w_ms) if w_ms > 0 else 0.0),
    }
    return units, base


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
) -> SearchOutcome:
    """Search the runtime's configuration space for the most goodput within the SLO.

    Every hand configuration is a point here: per model stage K = 1 .. ``max_partitions``
    (the cuts of each objective) at each measured thread count, and the whole pipeline in
    one unit, with instances grown within the cap (:mod:`.candidates`); each **scored** by
    the simulator with CPU contention and the front end's CPU (:mod:`.scoring`); the
    finalists scored again with a **goodput interval**, the **ties** to the simpler
    configuration (:mod:`.ranking`); why each lost (:mod:`.explain`).

    Args:
        stages: the pipeline in order: :class:`ModelStage` (searched) or fixed
            :class:`UnitProfile` (function stages; their instances grow too).
        slo_ms: end-to-end P99 SLO, ms.
        device: a DeviceProfile, a ResourceCap, or None (no memory / slot cap).
        rate: expected mean arrival rate, requests/s (None: score by the max rate).
        cores: physical cpu cores the instances and the front end share: the CPU
            contention of the simulator and the largest thread count tried (default: the
            cap's ``cores``; give the physical count when the profile's thread slots
            oversubscribe them, :func:`cpu_cores`).
        arrivals: arrival process spec (:func:`infscaler.runtime.planning.arrivals.from_spec`).
        requests: requests simulated per screening score (trace length = requests / rate).
        final_requests / finalist_within / finalists_max: the finalists' long score (0: no
            second score, the screen decides).
        seed / handover_ms: see :func:`~infscaler.runtime.planning.simulator.simulate`.
        frontend_ms: front-end CPU per request, ms (0: not modelled).
        max_partitions: largest K per model stage.
        objectives: partition objectives tried (``("eq1",)``: the paper's only).
        whole: the whole pipeline as one unit (``fuse: whole``,
            :func:`infscaler.runtime.planning.inputs.whole_profiles`): intra-op threads -> its
            profile; each (``t <= cores``) is a candidate too, its instances grown by the
            same loop (``cuts`` all ``()``, ``objectives`` ``whole``, ``whole`` True).
        oversubscribe: pinned threads allowed per core (default 1: no more pinned
            threads than ``cores``), and never more than the cap's thread slots. A
            candidate whose one instance per unit already pins more is ruled out while
            any candidate within them meets the SLO (why: :mod:`.candidates`).
        max_candidates: most (cuts x threads) combinations over the stages.
        goodput_tie: relative goodput difference counted as a tie, 0-1 (0: only
            overlapping goodput intervals tie; with no uncertainty, exact).
        incumbent: the configuration planned before for this pipeline
            (:meth:`~infscaler.runtime.planning.candidates.Candidate.identity`; None:
            none): scored as a finalist, and while it ties the best goodput it wins the
            tie before every other rule (why: :mod:`.ranking`).

    Returns:
        :class:`~.explain.SearchOutcome`: ``best`` (None when no candidate answers any
        request within the SLO) and every candidate with why it lost.

    Raises:
        ValueError: bad SLO / rate / cores, no model stage, an unknown objective, or more
            than ``max_candidates`` combinations.
    """
    _check_search(slo_ms, rate, objectives, goodput_tie)
    _check_traces(
        frontend_ms, requests, max_partitions, final_requests, finalists_max, finalist_within
    )
    cap = resource_cap(device)
    n_cores = _physical_cores(cap, cores)
    models = _model_stages(stages)
    jobs = _space(
        stages, models, n_cores, max_partitions, objectives, max_candidates, whole, frontend_ms
    )
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
    grown = propose(jobs, limits, scorer)
    cands = rule_out_oversubscribed(grown, limits.thread_slots, n_cores)
    hands = hand_configurations(cands, len(models))
    screen, final, chosen = finalists(cands, hands, s)
    cands = rescore(cands, chosen, scorer, final)
    out, best = ranked(cands, Ties.of(cands, final, s, cap), screen, s)
    lines = explanation(out, best, hands, s, scorer.simulations, final)
    return SearchOutcome(
        best=best,
        candidates=tuple(out),
        explain=tuple(lines),
        simulations=scorer.simulations,
        rate=rate,
        slo_ms=float(slo_ms),
    )
