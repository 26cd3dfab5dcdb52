"""Core sets by priority: which cpu cores each pipeline's instances may run on.

While a pipeline is **at risk** (it misses its SLO, or the queueing model says it will:
:func:`~infscaler.runtime.scaling.arbitration.pressure_ahead`), the cores its live
instances are pinned to are kept free of every pipeline of a strictly lower priority
level (a larger ``priority`` number): those run on the remaining cores, never fewer than
one. A risk counts until it has been absent for a hold time (:func:`hold_risk`), so the
lower pipelines do not flap between their cores and the remaining ones.

Pure functions of what the caller read (levels, the cores each live instance is pinned
to, the at-risk flags, the clock); the service re-pins the processes
(:mod:`infscaler.runtime.scaling.coreact`, ``os.sched_setaffinity``). Why core sets on
top of nice values: docs/scaling.md, "Several pipelines: priorities and arbitration".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["HOLD_S", "allowed_cores", "hold_risk", "reserved_cores", "target_affinity"]

#: seconds a risk keeps counting after it was last seen (the lower pipelines get their
#: cores back only then)
HOLD_S = 10.0


def reserved_cores(
    level: int,
    levels: Mapping[str, int],
    pinned: Mapping[str, Sequence[Sequence[int]]],
    at_risk: Mapping[str, bool],
) -> dict[int, int]:
    """The cores kept from a pipeline at ``level``: per core, how many live instances of
    at-risk pipelines of a strictly higher level (a smaller number) are pinned there.

    Args:
        level: the pipeline's priority level (1 the highest).
        levels: every pipeline's level.
        pinned: per pipeline, the core list of each of its live instances.
        at_risk: per pipeline, whether it is at risk (missing: not).
    """
    held: dict[int, int] = {}
    for name, lv in levels.items():
        if lv >= level or not at_risk.get(name, False):
            continue
        for cores in pinned.get(name, ()):
            for c in cores:
                held[c] = held.get(c, 0) + 1
    return held


def allowed_cores(
    cores: Sequence[int],
    levels: Mapping[str, int],
    pinned: Mapping[str, Sequence[Sequence[int]]],
    at_risk: Mapping[str, bool],
) -> dict[str, list[int]]:
    """The cores each pipeline's instances may run on, sorted: ``cores`` less
    :func:`reserved_cores` for its level; when that leaves none, the one core of
    ``cores`` the fewest higher at-risk instances are pinned to (ties: the last in
    ``cores``). A pipeline with nothing reserved (the highest level, or no higher one at
    risk) gets all of ``cores``.

    Args:
        cores: the cores cpu instances may be pinned to
            (:func:`~infscaler.runtime.scaling.placement.pinnable_cores`), not empty.
        levels: every pipeline's priority level (1 the highest).
        pinned: per pipeline, the core list of each of its live instances.
        at_risk: per pipeline, whether it is at risk (:func:`hold_risk`'s flags).

    Raises:
        ValueError: ``cores`` is empty.
    """
    if not cores:
        raise ValueError("no cores to share")
    out: dict[str, list[int]] = {}
    for name, lv in levels.items():
        held = reserved_cores(lv, levels, pinned, at_risk)
        free = [c for c in cores if c not in held]
        if not free:
            order = sorted(range(len(cores)), key=lambda i: (held.get(cores[i], 0), -i))
            free = [cores[order[0]]]
        out[name] = sorted(free)
    return out


def hold_risk(
    now: float, risk_now: Mapping[str, bool], last: Mapping[str, float], hold_s: float = HOLD_S
) -> tuple[dict[str, bool], dict[str, float]]:
    """The at-risk flags with the hold: a pipeline at risk now, or last at risk less than
    ``hold_s`` before ``now`` (s, one clock), counts as at risk.

    Returns:
        ``(flags, last)``: per pipeline of ``risk_now`` its flag, and the updated times
        each was last at risk (pipelines not in ``risk_now`` are dropped).
    """
    new = {n: now if r else last[n] for n, r in risk_now.items() if r or n in last}
    flags = {n: n in new and now - new[n] < hold_s for n in risk_now}
    return flags, new


def target_affinity(
    home: Sequence[int], allowed: Sequence[int], cores: Sequence[int], placed_in: bool
) -> list[int]:
    """The cores one instance runs on, sorted.

    Args:
        home: the cores it was pinned to when it started.
        allowed: its pipeline's :func:`allowed_cores`.
        cores: all the cores instances may use.
        placed_in: it started while its pipeline was kept off some cores (its ``home`` is
            a pick among the remaining ones).

    Returns:
        While ``allowed`` is all of ``cores``: ``home``, or all of ``cores`` for an
        instance ``placed_in`` a restricted set (it floats, as an instance placed when
        every core is taken does). Otherwise ``home`` within ``allowed``, or all of
        ``allowed`` where they do not meet.
    """
    if set(allowed) >= set(cores):
        return sorted(cores) if placed_in else sorted(home)
    inside = sorted(set(home) & set(allowed))
    return inside or sorted(allowed)
