"""Why :func:`~infscaler.runtime.planning.planner.search` chose its winner, in words
(``infscaler plan --explain``): the candidates ranked with why each lost, a head line,
and the winner against each hand configuration; and :class:`SearchOutcome`. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from infscaler.runtime.planning.candidates import Candidate
from infscaler.runtime.planning.greedy import PlanResult
from infscaler.runtime.planning.ranking import MEMORY_AMPLE, Ties, processes, served_units
from infscaler.runtime.planning.scoring import SearchSettings, fmt_num

__all__ = ["SearchOutcome", "explanation", "ranked"]


@dataclass(frozen=True)
class SearchOutcome:
    """What :func:`~infscaler.runtime.planning.planner.search` found: the winner, every
    candidate (best first), the reasons, and ``greedy``: per point, the greedy source's result."""

    best: Candidate | None
    candidates: tuple[Candidate, ...]
    explain: tuple[str, ...]
    simulations: int
    rate: float | None
    slo_ms: float
    greedy: tuple[PlanResult, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate) -> dict[str, Any]:
            return {
                "label": c.label(),
                "whole": c.whole,
                "cuts": [list(x) for x in c.cuts],
                "objectives": [list(x) for x in c.objectives],
                "threads": list(c.threads),
                "instances": {
                    u.name: c2.total for u, c2 in zip(c.units, c.config, strict=True) if u.served
                },
                "goodput_rps": c.goodput_rps,
                "goodput_lo_rps": c.goodput_lo,
                "goodput_hi_rps": c.goodput_hi,
                "max_rate_rps": c.max_rate_rps,
                "p99_ms": c.p99_ms,
                "attainment": c.attainment,
                "memory_mb": round(c.memory_mb, 2),
                "bottleneck_share": list(c.share),
                "finalist": c.finalist,
                "why": c.why,
            }

        return {
            "rate": self.rate,
            "slo_ms": self.slo_ms,
            "simulations": self.simulations,
            "best": None if self.best is None else cand(self.best),
            "candidates": [cand(c) for c in self.candidates],
            "explain": list(self.explain),
        }


def ranked(
    cands: Sequence[Candidate], ties: Ties, screen: float, s: SearchSettings
) -> tuple[list[Candidate], Candidate | None]:
    """``(cands best first, each with its why; the winner)``: the winner is the first
    when it fits and answers requests within the SLO (None: no candidate does).
    ``screen``: the best screen's goodput (what the screened-out ones are compared with)."""
    cands = sorted(cands, key=ties.rank)
    top = cands[0] if cands and cands[0].fits and cands[0].goodput_rps > 0 else None
    out = [replace(c, why=_why(c, top, ties, screen, s)) for c in cands]
    return out, (out[0] if top is not None else None)


def _why(c: Candidate, top: Candidate | None, ties: Ties, screen: float, s: SearchSettings) -> str:
    """Why ``c`` lost to ``top`` (or ``WINNER``)."""
    if c is top:
        return _why_winner(c, ties)
    if not c.fits:
        return c.note
    if c.goodput_rps <= 0:
        return (
            f"SLO: P99 {fmt_num(c.p99_ms)} ms > {s.slo_ms:g} ms at every instance count tried"
            + (f" ({c.note})" if c.note else "")
        )
    if top is not None and c.finalist != ties.final:
        return (
            f"screened out: {c.goodput_rps:.2f}/s on the {s.requests}-request screen, more "
            f"than {s.finalist_within:.0%} below the best screen ({screen:.2f}/s)"
            if c.goodput_rps < (1 - s.finalist_within) * screen - 1e-9
            else f"screened out: {c.goodput_rps:.2f}/s on the {s.requests}-request screen, "
            f"below the {s.finalists_max} best"
        ) + (f"; {c.note}" if c.note else "")
    if top is not None and not ties.tied(c):
        assert ties.lead is not None
        return (
            f"lower goodput ({c.goodput_text()} < the best {ties.lead.goodput_text()}): more "
            f"than {ties.goodput_tie:.0%} below it and its interval does not reach the best's"
        ) + (f"; {c.note}" if c.note else "")
    if top is not None:
        return _why_tied(c, top, ties)
    return f"no candidate answers requests within the SLO ({c.goodput_text()})"


def _why_winner(c: Candidate, ties: Ties) -> str:
    why = "WINNER" + (f" ({c.note})" if c.note else "")
    if ties.is_incumbent(c):
        why += (
            f" (planned before; kept while within {ties.goodput_tie:.0%} of the best)"
            if ties.within(c)
            else " (planned before; kept while its goodput interval reaches the best's)"
        )
    return why


def _why_tied(c: Candidate, top: Candidate, ties: Ties) -> str:
    """Why ``c``, tied with the best goodput, lost the tie to ``top``: the first rule of
    the tie that tells them apart."""
    lead, goodput_tie = ties.lead, ties.goodput_tie
    assert lead is not None
    if c is lead:  # the best goodput itself, tied by a simpler winner
        how = f"within {goodput_tie:.0%}" if ties.within(top) else "by overlapping intervals"
        tie = (
            f"the best goodput ({c.goodput_text()}), tied {how} by the winner "
            f"({top.goodput_text()})"
        )
    else:
        how = f"within {goodput_tie:.0%}" if ties.within(c) else "by overlapping intervals"
        tie = f"ties the best goodput {how} ({c.goodput_text()} vs {lead.goodput_text()})"
    to = f"; the tie goes to {top.label()}"
    if ties.is_incumbent(top):
        return (
            f"{tie}; the configuration planned before ties it too and is kept "
            "(a replan changes the configuration only for one better by more than "
            "the tie)"
        )
    if served_units(c) > served_units(top):
        return (
            f"{tie}{to} (rule: fewer partitions) with more units ({served_units(c)} > "
            f"{served_units(top)}: partitions and stages)"
        )
    if ties.scarce(c) and not ties.scarce(top):
        return (
            f"{tie}{to} (rule: memory within {MEMORY_AMPLE:.0%} of the cap) with "
            f"more than {MEMORY_AMPLE:.0%} of the memory cap ({c.memory_mb:.0f} > "
            f"{ties.ample_mb:.0f} MB)"
        )
    if not ties.scarce(c) and max(c.threads, default=1) > max(top.threads, default=1):
        return (
            f"{tie}{to} (rule: fewer threads per instance) with more threads per "
            f"instance ({max(c.threads)} > {max(top.threads)}; the memory cap is "
            "ample: one stalled core delays every request of an intra-op parallel "
            "instance)"
        )
    if processes(c) > processes(top):
        return (
            f"{tie}{to} (rule: fewer processes) with more processes ({processes(c)} "
            f"> {processes(top)} served instances)"
        )
    if c.memory_mb > top.memory_mb + 1e-6:
        return (
            f"{tie}{to} (rule: less memory) with more memory ({c.memory_mb:.0f} > "
            f"{top.memory_mb:.0f} MB)"
        )
    return (
        f"{tie}{to} (rule: fewer threads in all, then the better goodput) "
        "with as many units, processes and as much memory"
    )


def explanation(
    ranked: Sequence[Candidate],
    best: Candidate | None,
    hands: Mapping[str, Callable[[Candidate], bool]],
    s: SearchSettings,
    simulations: int,
    final: bool,
) -> list[str]:
    """The head line (``simulations`` in all, ``final``: the finalists rescored), a line per
    candidate, then the winner against each other hand configuration (``hands``)."""
    slo_ms, rate, requests = s.slo_ms, s.rate, s.requests
    head = (
        f"{len(ranked)} candidates, {simulations} simulations, SLO {slo_ms:g} ms, "
        + (f"rate {rate:g}/s ({s.arrivals})" if rate is not None else "score: max rate within SLO")
        + f", {s.cores} cores, front end {s.frontend_ms:g} ms/request"
        + (
            f"; screened on {requests} requests, {sum(c.finalist for c in ranked)} finalists "
            f"scored on {s.final_requests}"
            if final
            else f"; scored on {requests} requests"
        )
    )
    lines = [head, *(c.line() for c in ranked)]
    if best is not None:
        # every hand configuration is a point of this space: say how the winner compares
        for name, is_hand in hands.items():
            hand = next((c for c in ranked if c.fits and is_hand(c)), None)
            if hand is None or hand is best:
                continue
            ratio = best.goodput_rps / hand.goodput_rps if hand.goodput_rps > 0 else math.inf
            lines.append(
                f"vs {name}: {hand.goodput_rps:.2f}/s ({hand.label()}); the winner "
                f"{best.goodput_rps:.2f}/s = {ratio:.2f}x"
            )
    if best is None:
        lines.append("no candidate answers requests within the SLO within the cap")
    return lines
