"""How :func:`~infscaler.runtime.planning.planner.search` ranks its candidates: finalists
(those within ``finalist_within`` of the best screen, rescored on ``final_requests``),
their goodput intervals (service times at x (1 +/- err)), and the ties (:meth:`Ties.rank`:
incumbent, fewer units, memory within :data:`MEMORY_AMPLE`, fewer threads per instance,
fewer processes, less memory, fewer threads). Why: docs/planner.md, "Ranking".
Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from infscaler.runtime.planning.candidates import Candidate, is_incumbent
from infscaler.runtime.planning.scoring import Scorer, SearchSettings, scaled_units
from infscaler.runtime.scaling.types import ResourceCap

__all__ = ["MEMORY_AMPLE", "Ties", "finalists", "processes", "rescore", "served_units"]

#: Tied candidates within this fraction of the memory cap are not ranked by memory
#: (docs/planner.md, "Ranking").
MEMORY_AMPLE = 0.5


def finalists(
    cands: Sequence[Candidate],
    hands: Mapping[str, Callable[[Candidate], bool]],
    s: SearchSettings,
) -> tuple[float, bool, list[Candidate]]:
    """``(the best screen, whether finalists are rescored, the finalists)``: those within
    ``finalist_within`` of the best screen (at most ``finalists_max``), plus the best of each
    hand configuration and the ``incumbent``."""
    screen = max((c.goodput_rps for c in cands if c.fits), default=0.0)
    final = bool(s.final_requests) and s.final_requests > s.requests and screen > 0
    chosen: list[Candidate] = []
    if screen > 0:
        ok = sorted(
            (c for c in cands if c.fits and c.goodput_rps > 0), key=lambda c: -c.goodput_rps
        )
        chosen = [c for c in ok if c.goodput_rps >= (1 - s.finalist_within) * screen - 1e-9]
        chosen = chosen[: s.finalists_max]
        for is_hand in hands.values():
            hand = next((c for c in ok if is_hand(c)), None)
            if hand is not None and all(hand is not c for c in chosen):
                chosen.append(hand)
        kept = next((c for c in ok if is_incumbent(c, s.incumbent)), None)
        if kept is not None and all(kept is not c for c in chosen):
            chosen.append(kept)
    return screen, final, chosen


def rescore(
    cands: Sequence[Candidate], chosen: Sequence[Candidate], scorer: Scorer, final: bool
) -> list[Candidate]:
    """``cands`` with the finalists (``chosen``) scored again: on ``final_requests``
    when ``final`` (``finalist`` True), and with their goodput interval where a unit
    carries an err (on the same trace length as their goodput)."""
    final_requests = scorer.settings.final_requests
    n_final = final_requests if final else scorer.settings.requests
    rescored = {}
    for c in chosen:
        new = c
        if final:
            good, max_rate, res = scorer.score(c.units, c.config, final_requests)
            new = replace(
                c,
                goodput_rps=good,
                max_rate_rps=max_rate,
                p99_ms=None if res is None else res.p99_ms,
                attainment=None if res is None else res.slo_attainment,
                finalist=True,
            )
        if any(e > 0 for e in c.unit_err):
            new = _with_interval(new, scorer, n_final)
        rescored[id(c)] = new
    return [rescored.get(id(c), c) for c in cands]


def _with_interval(c: Candidate, scorer: Scorer, n: int) -> Candidate:
    """``c`` with its goodput interval: scored on ``n`` requests with every unit's
    service time at x (1 + err), then x (1 - err), each probed first near ``c``'s max
    rate over (1 +- the largest err)."""
    ends = []
    worst = max(c.unit_err)
    for sign in (1.0, -1.0):  # pessimistic (slower), then optimistic
        scaled = scaled_units(c.units, c.unit_err, sign)
        near = c.max_rate_rps
        guess = None if near is None else near / (1 + sign * worst)
        ends.append(scorer.score(scaled, c.config, n, guess)[0])
    return replace(c, goodput_lo=ends[0], goodput_hi=ends[1])


def served_units(c: Candidate) -> int:
    """The units a request passes through as instances (partitions, model and function
    stages; a fused unit once): each is a process and hops the simulator underrates, so
    the tie goes to fewer of them (docs/planner.md, "Ranking").
    """
    return sum(1 for u in c.units if u.served)


def processes(c: Candidate) -> int:
    """The served instances in all (each a process)."""
    return sum(x.total for u, x in zip(c.units, c.config, strict=True) if u.served)


@dataclass(frozen=True)
class Ties:
    """The best goodput and the rules that rank the candidates (see the module docstring).

    Attributes:
        final: the finalists were scored again (they then rank first).
        goodput_tie: relative goodput difference counted as a tie.
        ample_mb: memory within :data:`MEMORY_AMPLE` of the cap.
        incumbent: the configuration planned before, as JSON (None: none).
        gmax: the best goodput among those that rank first.
        lead / lead_lo: the candidate at ``gmax`` with the lowest interval end, and that end
            (None / inf: none answers anything)."""

    final: bool
    goodput_tie: float
    ample_mb: float
    incumbent: str | None
    gmax: float
    lead: Candidate | None
    lead_lo: float

    @classmethod
    def of(
        cls, cands: Sequence[Candidate], final: bool, s: SearchSettings, cap: ResourceCap
    ) -> Ties:
        gmax = max((c.goodput_rps for c in cands if c.fits and c.finalist == final), default=0.0)
        # the best goodput's interval: its lowest end among the candidates at gmax
        leads = [c for c in cands if c.fits and c.finalist == final and c.goodput_rps >= gmax]
        lead = min(leads, key=lambda c: c.interval()[0]) if gmax > 0 and leads else None
        lead_lo = lead.interval()[0] if lead is not None else math.inf
        return cls(
            final=final,
            goodput_tie=s.goodput_tie,
            ample_mb=MEMORY_AMPLE * (cap.memory_cap_mb - cap.memory_used_mb),
            incumbent=s.incumbent,
            gmax=gmax,
            lead=lead,
            lead_lo=lead_lo,
        )

    def within(self, c: Candidate) -> bool:
        """Within ``goodput_tie`` of the best goodput."""
        return c.goodput_rps >= (1 - self.goodput_tie) * self.gmax - 1e-9

    def tied(self, c: Candidate) -> bool:
        """Within ``goodput_tie`` of the best, or its goodput interval reaches the best's."""
        return (
            c.fits
            and c.finalist == self.final
            and self.gmax > 0
            and (self.within(c) or c.interval()[1] >= self.lead_lo - 1e-9)
        )

    def is_incumbent(self, c: Candidate) -> bool:
        return is_incumbent(c, self.incumbent)

    def scarce(self, c: Candidate) -> bool:
        """Takes more than :data:`MEMORY_AMPLE` of the memory cap."""
        return c.memory_mb > self.ample_mb

    def rank(self, c: Candidate) -> tuple[float, ...]:
        """The sort key, best first: within the cap, then the finalists, then the tied
        by the rules of the tie, then the rest by goodput."""
        t = self.tied(c)
        return (
            0 if c.fits else 1,
            0 if c.finalist == self.final else 1,
            0 if t else 1,
            (0 if self.is_incumbent(c) else 1) if t else 0,
            served_units(c) if t else -round(c.goodput_rps, 6),
            (1 if self.scarce(c) else 0) if t else 0,
            (max(c.threads, default=1) if not self.scarce(c) else 0) if t else 0,
            processes(c) if t else 0,
            c.memory_mb if t else 0.0,
            -round(c.goodput_rps, 6),
            sum(c.threads),
        )
