"""Planning several pipelines together within one device's cap.

:func:`plan_together` tries every combination of each pipeline's ``top_k`` candidates;
one fits when the summed :func:`usage` is within the cap. Among those: strict priority
(goodput within ``tie`` counts as equal), then the most goodput, the least memory, the
best-ranked. Why: docs/planner.md, "Joint planning". Pure: no I/O."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infscaler.base.errors import InfScalerError
from infscaler.runtime.planning.candidates import Candidate
from infscaler.runtime.planning.resources import busy_cores, cap_usage, pinned_threads
from infscaler.runtime.scaling.types import ResourceCap

__all__ = ["JointChoice", "JointPlan", "Member", "Usage", "plan_together", "usage"]

#: combinations tried at most; above it each pipeline's top-k is cut down until below
MAX_COMBINATIONS = 50_000


@dataclass(frozen=True)
class Usage:
    """What configurations take of the cap: ``memory_mb`` (MB), pinned cpu ``threads``, model
    instance ``slots`` per engine, and ``busy_cores`` at the goodput."""

    memory_mb: float = 0.0
    threads: int = 0
    slots: Mapping[str, int] = field(default_factory=dict)
    busy_cores: float = 0.0

    def __add__(self, o: Usage) -> Usage:
        slots = dict(self.slots)
        for e, n in o.slots.items():
            slots[e] = slots.get(e, 0) + n
        return Usage(
            self.memory_mb + o.memory_mb,
            self.threads + o.threads,
            slots,
            self.busy_cores + o.busy_cores,
        )

    def text(self) -> str:
        slots = ", ".join(f"{n} {e}" for e, n in sorted(self.slots.items())) or "no"
        return (
            f"{self.memory_mb:.0f} MB, {self.threads} pinned threads, {slots} instance "
            f"slots, {self.busy_cores:.2f} busy cores"
        )


def usage(c: Candidate) -> Usage:
    """What candidate ``c`` takes of the cap (see the module docstring); its busy cores
    at its goodput (requests/s)."""
    _mem, slots, _cores = cap_usage(c.units, c.config, 0.0)
    return Usage(
        memory_mb=float(c.memory_mb),
        threads=pinned_threads(c.units, c.config),
        slots=slots,
        busy_cores=busy_cores(c.units, c.config, c.goodput_rps),
    )


@dataclass(frozen=True)
class Member:
    """One pipeline of the set: ``name``, ``priority`` (1 the highest), its search's
    ``candidates`` best first, and the ``rate`` searched at (requests/s; None: max)."""

    name: str
    priority: int
    candidates: tuple[Candidate, ...]
    rate: float | None = None

    def usable(self) -> list[Candidate]:
        """The candidates that fit and answer requests within the SLO, best first, each
        configuration once (:meth:`~infscaler.runtime.planning.candidates.Candidate.
        config_key`)."""
        seen, out = set(), []
        for c in self.candidates:
            key = c.config_key()
            if c.fits and c.goodput_rps > 0 and key not in seen:
                seen.add(key)
                out.append(c)
        return out


@dataclass(frozen=True)
class JointChoice:
    """The configuration chosen for one pipeline: ``name`` / ``priority``, the ``candidate``,
    its ``rank`` in its own ranking, its ``best_alone``, and ``why`` in words."""

    name: str
    priority: int
    candidate: Candidate
    rank: int
    best_alone: Candidate
    why: str


@dataclass(frozen=True)
class JointPlan:
    """What :func:`plan_together` chose: ``choices`` per pipeline in order, ``used`` and
    ``available`` (:class:`Usage`), ``combinations`` tried and ``fitting``, and ``explain``."""

    choices: tuple[JointChoice, ...]
    used: Usage
    available: Usage
    combinations: int
    fitting: int
    explain: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipelines": {
                ch.name: {
                    "priority": ch.priority,
                    "chosen": ch.candidate.label(),
                    "identity": ch.candidate.identity(),
                    "goodput_rps": ch.candidate.goodput_rps,
                    "memory_mb": round(ch.candidate.memory_mb, 2),
                    "rank": ch.rank,
                    "best_alone": ch.best_alone.label(),
                    "best_alone_goodput_rps": ch.best_alone.goodput_rps,
                    "why": ch.why,
                }
                for ch in self.choices
            },
            "used": _usage_dict(self.used),
            "available": _usage_dict(self.available),
            "combinations": self.combinations,
            "fitting": self.fitting,
            "explain": list(self.explain),
        }


def _usage_dict(u: Usage) -> dict[str, Any]:
    return {
        "memory_mb": round(u.memory_mb, 2),
        "threads": u.threads,
        "slots": dict(u.slots),
        "busy_cores": round(u.busy_cores, 3),
    }


def _available(cap: ResourceCap, thread_slots: int | None, cores: int | None) -> Usage:
    """The cap as a :class:`Usage` (inf / a large count where there is no limit)."""
    slots = thread_slots if thread_slots is not None else (cap.cores or 10**9)
    phys = cores if cores is not None else (cap.physical_cores or 0)
    return Usage(
        memory_mb=cap.memory_cap_mb - cap.memory_used_mb,
        threads=slots,
        slots=dict(cap.max_instances),
        busy_cores=float(phys) if phys else math.inf,
    )


def _over(u: Usage, avail: Usage) -> list[str]:
    """What ``u`` takes beyond ``avail``, in words (empty: it fits)."""
    out = []
    if u.memory_mb > avail.memory_mb + 1e-6:
        out.append(f"memory {u.memory_mb:.0f} MB > {avail.memory_mb:.0f} MB")
    if u.threads > avail.threads:
        out.append(f"{u.threads} pinned threads > {avail.threads} thread slots")
    for e, n in u.slots.items():
        if e in avail.slots and n > avail.slots[e]:
            out.append(f"{n} {e} instances > {avail.slots[e]} {e} slots")
    if u.busy_cores > avail.busy_cores + 1e-6:
        out.append(f"{u.busy_cores:.2f} busy cores > {avail.busy_cores:g} cores")
    return out


def plan_together(
    members: Sequence[Member],
    cap: ResourceCap,
    *,
    thread_slots: int | None = None,
    cores: int | None = None,
    top_k: int = 6,
    tie: float = 0.05,
) -> JointPlan:
    """One configuration per pipeline of ``members`` that together fit ``cap``, by strict
    priority, then total goodput (see the module docstring).

    Args:
        members: the pipelines, each with its candidates (best first).
        cap: the device's cap.
        thread_slots: pinned threads allowed in all (None: ``cap.cores``; 0: no limit).
        cores: physical cores for the busy check (None: ``cap.physical_cores``; 0: none).
        top_k: candidates per pipeline tried.
        tie: a level's goodput within this fraction of its best counts as equal.

    Raises:
        InfScalerError: no members, a repeated name, a pipeline with no usable candidate,
            or no combination that fits (naming what the smallest ones need)."""
    if not members:
        raise InfScalerError("no pipelines to plan together")
    names = [m.name for m in members]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InfScalerError(
            f"pipelines named twice in the set: {dup}", hint="give each pipeline once"
        )
    avail = _available(cap, thread_slots, cores)
    options = []
    for m in members:
        ok = m.usable()
        if not ok:
            raise InfScalerError(
                f"pipeline {m.name}: no configuration meets its SLO within the device's cap "
                "even alone",
                hint=f"raise {m.name}'s SLO, or see `infscaler plan {m.name} --explain`",
            )
        options.append(ok)
    k = max(1, top_k)
    while k > 1 and math.prod(min(k, len(o)) for o in options) > MAX_COMBINATIONS:
        k -= 1
    pools = [[(i, c, usage(c)) for i, c in enumerate(o[:k])] for o in options]
    fitting, tried = [], 0
    for combo in itertools.product(*pools):
        tried += 1
        total = sum((u for _, _, u in combo), Usage())
        if not _over(total, avail):
            fitting.append((combo, total))
    if not fitting:
        raise InfScalerError(_no_fit(members, [o[:k] for o in options], avail), hint=_NO_FIT_HINT)
    best, total = _choose(members, fitting, tie)
    return _explained(members, options, best, total, avail, tried, len(fitting))


_NO_FIT_HINT = (
    "plan fewer pipelines on this device, raise their SLOs, or lower their rates "
    "(`infscaler plan` lists each one's configurations)"
)


def _no_fit(members: Sequence[Member], options: list[list[Candidate]], avail: Usage) -> str:
    """Why no combination fits: with each pipeline at its smallest configuration (least
    memory), which ones exceed the cap, in priority order."""
    smallest = [
        min(o, key=lambda c: (c.memory_mb, pinned_threads(c.units, c.config))) for o in options
    ]
    order = sorted(range(len(members)), key=lambda i: (members[i].priority, i))
    acc, parts = Usage(), []
    for i in order:
        u = usage(smallest[i])
        over = _over(acc + u, avail)
        if over:
            parts.append(
                f"{members[i].name} (priority {members[i].priority}) needs at least "
                f"{u.text()} ({smallest[i].label()}), and with the pipelines before it "
                f"that is {'; '.join(over)}"
            )
        acc = acc + u
    named = [
        members[i].name for i in order if any(p.startswith(members[i].name + " ") for p in parts)
    ]
    return (
        f"{', '.join(named) or 'the pipelines'} fit(s) beside the others in no way within "
        "the device's cap: " + "; ".join(parts or ["every combination exceeds the cap"])
    )


def _choose(
    members: Sequence[Member], fitting: list[tuple[tuple, Usage]], tie: float
) -> tuple[tuple, Usage]:
    """The combination chosen among ``fitting`` (strict priority with the tie, then
    total goodput, memory, the ranks)."""
    left = fitting
    for level in sorted({m.priority for m in members}):
        idx = [i for i, m in enumerate(members) if m.priority == level]

        def at(item: tuple[tuple, Usage], idx: list[int] = idx) -> float:
            return sum(item[0][i][1].goodput_rps for i in idx)

        top = max(at(x) for x in left)
        left = [x for x in left if at(x) >= (1 - tie) * top - 1e-9]
    return min(
        left,
        key=lambda x: (
            -round(sum(c.goodput_rps for _, c, _ in x[0]), 6),
            round(x[1].memory_mb, 3),
            sum(i for i, _, _ in x[0]),
        ),
    )


def _explained(
    members: Sequence[Member],
    options: list[list[Candidate]],
    combo: tuple,
    total: Usage,
    avail: Usage,
    tried: int,
    n_fit: int,
) -> JointPlan:
    """The :class:`JointPlan` of ``combo`` with each pipeline's why."""
    choices = []
    for j, (m, (rank, cand, u)) in enumerate(zip(members, combo, strict=True)):
        alone = options[j][0]
        if rank == 0:
            why = f"its best alone ({cand.goodput_text()}); it fits with the others' choices"
        else:
            others = sum((x[2] for i, x in enumerate(combo) if i != j), Usage())
            need = _over(others + usage(alone), avail)
            because = "; ".join(need) if need else "a better total goodput by the rules"
            higher = [x.name for x in members if x.priority < m.priority]
            by = f" (after {', '.join(higher)}, of higher priority)" if higher and need else ""
            why = (
                f"its #{rank + 1} ({cand.goodput_text()}, {u.text()}): its best alone, "
                f"{alone.label()} at {alone.goodput_text()} ({usage(alone).text()}), "
                f"would need with the others' choices{by}: {because}"
            )
        choices.append(JointChoice(m.name, m.priority, cand, rank, alone, why))
    head = (
        f"{len(members)} pipelines within the cap ({avail.text()}): {tried} combinations "
        f"tried, {n_fit} fit; chosen: {total.text()}, "
        f"total goodput {sum(c.candidate.goodput_rps for c in choices):.2f}/s"
    )
    lines = [head] + [
        f"{c.name} (priority {c.priority}): {c.candidate.label()} -- {c.why}" for c in choices
    ]
    return JointPlan(tuple(choices), total, avail, tried, n_fit, tuple(lines))
