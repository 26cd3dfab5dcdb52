"""The candidates of :func:`~infscaler.runtime.planning.planner.search`: the points of the
configuration space (:func:`~infscaler.runtime.planning.stages.points`) and the sources
that give each its instances (:data:`SOURCES`, each
``(units, base, limits, scorer) -> Candidate``): :func:`grow` (Algorithm 1) and
:func:`greedy` (InferLine §4.3). Also :func:`rule_out_oversubscribed` (docs/planner.md,
"Oversubscription") and :func:`hand_configurations`. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from infscaler.runtime.planning.greedy import GreedyOptions, PlanResult, PlanSearch
from infscaler.runtime.planning.resources import (
    add_instances,
    arrival_rates,
    per_item_ms,
    pinned_threads,
    with_unit,
)
from infscaler.runtime.planning.scoring import Score, Scorer, fmt_num
from infscaler.runtime.planning.simulator import (
    MAX_PER_UNIT,
    UnitConfig,
    UnitProfile,
    config_memory_mb,
)
from infscaler.runtime.scaling.types import ResourceCap

__all__ = [
    "Candidate",
    "Limits",
    "Point",
    "SOURCES",
    "greedy",
    "grow",
    "hand_configurations",
    "is_incumbent",
    "propose",
    "rule_out_oversubscribed",
]


@dataclass(frozen=True)
class Candidate:
    """One point of the configuration space, with its predicted figures.

    Attributes:
        cuts / objectives / threads: per model stage, the cuts, the objectives that chose
            them (``k1`` for K = 1) and the intra-op threads of each instance.
        units / config: the units simulated (the front end first) and their instances.
        goodput_rps: requests/s answered within the SLO at ``rate`` (no rate: the max rate).
        max_rate_rps: the largest rate whose simulated P99 <= SLO, or None.
        p99_ms / attainment: at ``rate`` (at the max rate without one).
        memory_mb: instances' memory. share: per stage, the bottleneck partition's FLOPs
            share. fits: within the cap. why: why it lost.
        whole: the whole pipeline in one unit (``cuts`` all ``()``).
        finalist: scored again on the long trace.
        unit_err: per unit, the relative uncertainty of its service time.
        goodput_lo / goodput_hi: goodput at service times x (1 + err) / x (1 - err), or None."""

    cuts: tuple[tuple[int, ...], ...]
    objectives: tuple[tuple[str, ...], ...]
    threads: tuple[int, ...]
    units: tuple[UnitProfile, ...]
    config: tuple[UnitConfig, ...]
    goodput_rps: float
    max_rate_rps: float | None
    p99_ms: float | None
    attainment: float | None
    memory_mb: float
    share: tuple[float, ...]
    fits: bool = True
    note: str = ""
    why: str = ""
    whole: bool = False
    finalist: bool = False
    unit_err: tuple[float, ...] = ()
    goodput_lo: float | None = None
    goodput_hi: float | None = None

    def interval(self) -> tuple[float, float]:
        """``(goodput_lo, goodput_hi)``, requests/s, widened to hold ``goodput_rps`` (both ends
        ``goodput_rps`` where not scored)."""
        g = self.goodput_rps
        lo = g if self.goodput_lo is None else min(self.goodput_lo, g)
        hi = g if self.goodput_hi is None else max(self.goodput_hi, g)
        return lo, hi

    def goodput_text(self) -> str:
        """``12.30/s [11.10, 13.00]`` (the interval only where it was scored)."""
        if self.goodput_lo is None and self.goodput_hi is None:
            return f"{self.goodput_rps:.2f}/s"
        lo, hi = self.interval()
        return f"{self.goodput_rps:.2f}/s [{lo:.2f}, {hi:.2f}]"

    def identity(self) -> list[Any]:
        """The configuration itself, JSON-able: ``[whole, cuts, threads, instances per served unit,
        {engine: instances} per served unit]``; the search's ``incumbent`` is compared with it."""
        served = [(u, c) for u, c in zip(self.units, self.config, strict=True) if u.served]
        return [
            bool(self.whole),
            [list(c) for c in self.cuts],
            list(self.threads),
            [c.total for _, c in served],
            [dict(sorted(c.instances.items())) for _, c in served],
        ]

    def config_key(self) -> str:
        """:meth:`identity` as a key (the front end's engines with it)."""
        return repr((self.identity(), [sorted(x.instances.items()) for x in self.config]))

    def label(self) -> str:
        if self.whole:  # one unit: the whole pipeline (fuse: whole), every model K = 1
            inst = "+".join(
                str(c.total) for u, c in zip(self.units, self.config, strict=True) if u.served
            )
            return f"whole pipeline in one unit (fuse: whole) t={self.threads[0]} inst={inst}"
        parts = []
        for i, (c, o, t) in enumerate(zip(self.cuts, self.objectives, self.threads, strict=True)):
            pre = f"s{i}:" if len(self.cuts) > 1 else ""
            parts.append(f"{pre}K={len(c) + 1} cuts={list(c)} [{'/'.join(o)}] t={t}")
        inst = "+".join(
            str(c.total) for u, c in zip(self.units, self.config, strict=True) if u.served
        )
        return f"{' '.join(parts) or 'units as given'} inst={inst}"

    def line(self) -> str:
        mr = "" if self.max_rate_rps is None else f" max {self.max_rate_rps:.1f}/s"
        share = "/".join(f"{s:.0%}" for s in self.share)
        return (
            f"{self.label()}: goodput {self.goodput_text()}{mr} P99 {fmt_num(self.p99_ms)} ms "
            f"mem {self.memory_mb:.0f} MB bottleneck {share}"
            + (f" -- {self.why}" if self.why else "")
        )


def is_incumbent(c: Candidate, incumbent: str | None) -> bool:
    """``c`` is the configuration planned before (``incumbent``: its identity as JSON; a
    four-field identity kept before engines counted matches on those four)."""
    if incumbent is None:
        return False
    kept = json.loads(incumbent)
    return json.dumps(c.identity()[: len(kept)]) == json.dumps(kept)


@dataclass(frozen=True)
class Limits:
    """What a candidate's instances grow within: the device's ``cap``, the pinned
    ``thread_slots`` and the cpu instance ``slots`` (None: no limit)."""

    cap: ResourceCap
    thread_slots: int
    slots: int | None

    @classmethod
    def of(cls, cap: ResourceCap, cores: int, oversubscribe: float) -> Limits:
        """The limits on ``cores`` physical cores: ``oversubscribe`` x the cores, never more than
        the cap's thread slots."""
        slots = cap.max_instances.get("cpu") if cap.max_instances else None
        if cores < 1:  # cores unknown (a pipeline of fixed units only): the cap's slots
            return cls(cap=cap, thread_slots=cap.cores or 10**9, slots=slots)
        by_cores = max(1, int(oversubscribe * cores + 1e-9))
        thread_slots = min(cap.cores, by_cores) if cap.cores else by_cores
        return cls(cap=cap, thread_slots=thread_slots, slots=slots)


def grow(
    units: list[UnitProfile], base: Mapping[str, Any], limits: Limits, scorer: Scorer
) -> Candidate:
    """The candidate of one point: from one instance per unit (``units``, front end first;
    ``base``: the other :class:`Candidate` fields), one more at a time (:func:`_one_more`)
    while the cap allows, every step scored; the best step kept (most goodput, then least
    memory). Stops after two steps adding < 0.5 % goodput, or when nothing fits."""
    cap = limits.cap
    cfg = [UnitConfig({"cpu": 1} if "cpu" in u.engines else {u.fastest().engine: 1}) for u in units]
    note = ""
    mem = config_memory_mb(units, cfg)
    if mem > cap.memory_cap_mb:
        return Candidate(
            **base,
            config=tuple(cfg),
            goodput_rps=0.0,
            max_rate_rps=None,
            p99_ms=None,
            attainment=None,
            memory_mb=mem,
            fits=False,
            note=f"cap: one instance per unit needs {mem:.0f} MB > {cap.memory_cap_mb:.0f} MB",
        )
    pinned = pinned_threads(units, cfg)
    if pinned > limits.thread_slots:
        note = f"one instance per unit pins {pinned} threads > {limits.thread_slots} thread slots"
    best_here: tuple[float, float, list[UnitConfig], Score] | None = None
    stale = 0
    stop = ""
    while True:
        sc = scorer.score(units, cfg)
        mem = config_memory_mb(units, cfg)
        key = (sc[0], -mem)
        if best_here is None or key > (best_here[0], best_here[1]):
            if best_here is not None and sc[0] <= best_here[0] * 1.005:
                stale += 1
            else:
                stale = 0
            best_here = (sc[0], -mem, list(cfg), sc)
        else:
            stale += 1
        if stale >= 2:
            break
        grown, stop = _one_more(units, cfg, mem, limits)
        if grown is None:
            break
        cfg = grown
    assert best_here is not None
    good, max_rate, res = best_here[3]
    return Candidate(
        **base,
        config=tuple(best_here[2]),
        goodput_rps=good,
        max_rate_rps=max_rate,
        p99_ms=None if res is None else res.p99_ms,
        attainment=None if res is None else res.slo_attainment,
        memory_mb=-best_here[1],
        note="; ".join(x for x in (note, stop) if x),
    )


#: A point of the space: its units (the front end first) and the fields they give its
#: :class:`Candidate` (cuts, objectives, threads, units, share, unit_err, whole).
Point = tuple[list[UnitProfile], dict[str, Any]]


#: The candidate sources, in the order :func:`propose` runs them.
SOURCES = ("grow", "greedy")


def propose(
    points: Sequence[Point],
    limits: Limits,
    scorer: Scorer,
    sources: Sequence[str] = SOURCES,
    options: GreedyOptions | None = None,
) -> tuple[list[Candidate], list[PlanResult]]:
    """``(every source's candidates of points, the greedy result per point)``: each point
    grown, then the greedy configuration where no candidate has it already.

    Raises:
        ValueError: an unknown source, or none."""
    bad = [x for x in sources if x not in SOURCES]
    if bad or not sources:
        raise ValueError(f"unknown candidate sources {bad or list(sources)}: use {SOURCES}")
    out = [grow(units, base, limits, scorer) for units, base in points] if "grow" in sources else []
    seen = {c.config_key() for c in out}
    found: list[PlanResult] = []
    for units, base in points if "greedy" in sources else ():
        g, res = greedy(units, base, limits, scorer, options or GreedyOptions())
        if res is not None:
            found.append(res)
        if g is not None and g.config_key() not in seen:
            seen.add(g.config_key())
            out.append(g)
    return out, found


def greedy(
    units: list[UnitProfile],
    base: Mapping[str, Any],
    limits: Limits,
    scorer: Scorer,
    options: GreedyOptions,
) -> tuple[Candidate | None, PlanResult | None]:
    """The greedy planner's configuration of one point as a scored candidate (InferLine §4.3):
    ``(candidate or None, its PlanResult)``; ``(None, None)`` without a rate."""
    s = scorer.settings
    if s.rate is None:
        return None, None
    times, label = options.trace(s.arrivals, s.rate, s.requests, s.seed)
    found = PlanSearch(
        list(units),
        s.rate,
        s.slo_ms,
        limits.cap,
        times,
        label,
        seed=s.seed,
        handover_ms=s.handover_ms,
        pool_mb=options.pool_mb,
        warmup_s=options.warmup_s,
        batch_wait_ms=options.batch_wait_ms,
        max_inflight=options.max_inflight,
    ).plan(options.max_steps, options.minimize)
    scorer.simulations += found.simulations
    if not found.feasible or found.config is None:
        return None, found
    good, max_rate, res = scorer.score(units, found.config)
    cand = Candidate(
        **base,
        config=tuple(found.config),
        goodput_rps=good,
        max_rate_rps=max_rate,
        p99_ms=None if res is None else res.p99_ms,
        attainment=None if res is None else res.slo_attainment,
        memory_mb=config_memory_mb(units, found.config),
        note="greedy: the least memory meeting the P99 (InferLine §4.3)",
    )
    return cand, found


def _one_more(
    units: Sequence[UnitProfile], cfg: list[UnitConfig], mem: float, limits: Limits
) -> tuple[list[UnitConfig] | None, str]:
    """``(cfg with one more instance, the last limit met)`` for the served unit with the most
    work per request the limits allow (cpu where it runs there, else its fastest engine);
    ``(None, why)`` when none can take one."""
    cap, thread_slots, slots = limits.cap, limits.thread_slots, limits.slots
    per_req = arrival_rates(units, 1.0)
    order = sorted(
        (k for k, u in enumerate(units) if u.served),
        key=lambda k: -per_req[k] * per_item_ms(units[k], cfg[k]),
    )
    stop = ""
    pinned = pinned_threads(units, cfg)
    n_inst = sum(c.total for u, c in zip(units, cfg, strict=True) if u.served and u.kind == "model")
    for k in order:
        u = units[k]
        p = u.engines["cpu"] if "cpu" in u.engines else u.fastest()
        if cfg[k].total + 1 > min(u.max_instances or MAX_PER_UNIT, MAX_PER_UNIT):
            stop = f"{u.name} at its max instances"
            continue
        if mem + p.memory_mb > cap.memory_cap_mb:
            stop = f"cap: memory {mem:.0f}+{p.memory_mb:.0f} > {cap.memory_cap_mb:.0f} MB"
            continue
        if p.engine == "cpu" and pinned + max(1, p.cores) > thread_slots:
            stop = f"cap: {pinned}+{max(1, p.cores)} pinned threads > {thread_slots} thread slots"
            continue
        if u.kind == "model" and slots is not None and n_inst + 1 > slots:
            stop = f"cap: {slots} cpu instance slots"
            continue
        return with_unit(cfg, k, add_instances(cfg[k], p.engine)), stop
    return None, stop


def rule_out_oversubscribed(
    cands: list[Candidate], thread_slots: int, cores: int
) -> list[Candidate]:
    """``cands`` with those pinning more threads than the slots ruled out (``fits`` False), only
    while one within them answers anything."""
    within = {
        id(c)
        for c in cands
        if c.fits and c.goodput_rps > 0 and pinned_threads(c.units, c.config) <= thread_slots
    }
    if not within:
        return cands
    return [
        c
        if id(c) in within or not c.fits or pinned_threads(c.units, c.config) <= thread_slots
        else replace(
            c,
            fits=False,
            note=f"pins {pinned_threads(c.units, c.config)} threads on {thread_slots} thread slots "
            f"({cores} cores): oversubscribed, while candidates within them meet the SLO",
        )
        for c in cands
    ]


def hand_configurations(
    cands: Sequence[Candidate], n_models: int
) -> dict[str, Callable[[Candidate], bool]]:
    """The hand configurations over ``n_models`` model stages: name -> whether a candidate is it."""
    tmax = [max((c.threads[i] for c in cands), default=1) for i in range(n_models)]
    return {
        "replication (K=1, 1 thread)": lambda c: (
            not c.whole and all(not x for x in c.cuts) and all(t == 1 for t in c.threads)
        ),
        "one session (K=1, one instance, all cores)": lambda c: (
            not c.whole
            and all(not x for x in c.cuts)
            and list(c.threads) == tmax
            and all(x.total == 1 for u, x in zip(c.units, c.config, strict=True) if u.served)
        ),
        "the whole pipeline in one unit (fuse: whole)": lambda c: c.whole,
    }
