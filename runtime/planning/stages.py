"""The model stages of a pipeline as the search sees them, and the points of the
configuration space they span.

:class:`ModelStage`: one measured, partitionable model stage and its units at a cut set
and thread count (Eq. 1 of InfScaler §IV-A for the cuts). :func:`points`: every
combination of the stages' cut sets and thread counts, and the whole pipeline in one unit
per thread count. Design: docs/planner.md. Pure: no I/O."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infscaler.base.errors import PartitionError
from infscaler.partitioner import search as _search
from infscaler.runtime.planning.candidates import Point
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile

__all__ = ["ModelStage", "points"]


@dataclass(frozen=True)
class ModelStage:
    """One partitionable model stage, as the search needs it (all measured, none invented).

    Attributes:
        name: the stage (units are named ``name/k``; ``name`` when K = 1).
        costs: per operator in topological order, the complexity that cuts and shares the
            measured time: profiled ms at 1 thread (preferred) or FLOPs.
        valid_cuts: cut positions (cut p lies after operator p).
        whole_ms: intra-op threads -> whole-model time, ms (batch 1); key 1 required.
        weights_bytes / flops / op_ms: per operator, weight bytes, FLOPs (the bottleneck
            share) and profiled ms (the time share); empty: 0 / ``costs`` / ``costs``.
        cut_bytes: bytes crossing each valid cut.
        boundary_fixed_ms / boundary_per_mb_ms: T_p = fixed + per_mb x MB crossing, ms,
            added after each cut.
        activations_mb: peak activations of the whole model, MB.
        instance_overhead_mb: memory of an idle instance process, MB.
        cv / cv_by_threads: coefficient of variation of the whole-model time.
        corun_by_threads / idle_by_threads: threads -> co-running / idle slowdown, as
            :class:`~.simtypes.EngineProfile`.
        unit_ms: ``(cuts, threads) -> (ms per partition, ...)`` measured, replacing the estimate.
        whole_ms_err / unit_ms_err: relative uncertainty (0 <= err < 1) of those times.
        pre_ms / post_ms: cpu ms per call of function steps fused before / after the model.
        items: measured items per request when the last unit fans out (empty: it does not)."""

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

        Partition k's service time: ``unit_ms[(cuts, threads)][k]`` when measured, else
        ``whole_ms[threads] x S_k / S`` + T_p of its input cut; plus ``pre_ms`` / ``post_ms`` on
        the first / last. Memory: overhead + its weights + the whole model's activations, MB."""
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
        """The relative uncertainty of each unit's service time of :meth:`units`: a measured
        partition's ``unit_ms_err``; an estimated one's share of the whole time carries
        ``whole_ms_err`` (T_p and fused steps none), over its service time; 0: unknown."""
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


def points(
    stages: Sequence[ModelStage | UnitProfile],
    models: Sequence[int],
    cores: int,
    max_partitions: int,
    objectives: Sequence[str],
    max_candidates: int,
    whole: Mapping[int, UnitProfile] | None,
    fe: list[UnitProfile],
) -> list[Point]:
    """The points the search grows: every combination of the model stages' (at ``models``)
    cut sets and thread counts (``t <= cores``), then the whole pipeline in one unit per
    thread count, each behind the front end units ``fe``.

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
