"""The live check of a planned configuration: does it serve what the planner predicted, and
does the runner-up serve more? Pure: no I/O, no clock.

:func:`check` maps ``(Observed, LiveState, Expected serving, Expected other, LiveConfig)``
to a :class:`Verdict` (``wait``, ``keep`` or ``switch``) and the new state; at most
``max_switches``. Source: InferLine's Tuner (SoCC '20 §5), here between the planner's two
best configurations. In full: docs/scaling.md, "The live check in full"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infscaler.runtime.planning.resources import arrival_rates
from infscaler.runtime.queueing import capacity_rps

__all__ = [
    "Expected",
    "LiveConfig",
    "LiveState",
    "Observed",
    "Verdict",
    "check",
    "expected_from",
]


@dataclass(frozen=True)
class Expected:
    """What the planner predicted for one configuration: its ``label``; per served unit
    ``unit_ms`` (ms per item on one instance), ``instances`` and ``items`` per request; the
    ``goodput_rps`` (requests/s) and its relative uncertainty ``err`` (0: unknown)."""

    label: str
    unit_ms: tuple[float, ...]
    instances: tuple[int, ...]
    items: tuple[float, ...]
    goodput_rps: float
    err: float = 0.0

    @property
    def capacity_rps(self) -> float:
        """Predicted instance capacity at the planned instances, requests/s: the queueing
        model's :func:`~infscaler.runtime.queueing.capacity_rps` (``inf``: no unit bounds
        it; a unit with no instance bounds it at 0)."""
        return capacity_rps(self.unit_ms, self.instances, self.items)

    def capacity_at(self, instances: Sequence[int] | None) -> float:
        """Predicted instance capacity at ``instances`` per served unit, requests/s (the planned
        capacity when None or not matching the units)."""
        if instances is None or len(instances) != len(self.unit_ms):
            return self.capacity_rps
        return capacity_rps(self.unit_ms, instances, self.items)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (kept with the planner's decision); :meth:`from_dict` reads it."""
        return {
            "label": self.label,
            "unit_ms": [round(x, 4) for x in self.unit_ms],
            "instances": list(self.instances),
            "items": list(self.items),
            "goodput_rps": round(self.goodput_rps, 4),
            "err": round(self.err, 4),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Expected:
        """Raises: KeyError / TypeError / ValueError on a malformed dict."""
        return cls(
            str(d["label"]),
            tuple(float(x) for x in d["unit_ms"]),
            tuple(int(x) for x in d["instances"]),
            tuple(float(x) for x in d["items"]),
            float(d["goodput_rps"]),
            float(d.get("err", 0.0)),
        )


@dataclass(frozen=True)
class Observed:
    """What the deployed configuration serves now (the monitor's window).

    Attributes:
        since_change_s: seconds since it was deployed or last changed.
        answered: requests answered in the window.
        capacity_rps: measured instance capacity, requests/s (None: not yet).
        p99_ms: end-to-end P99, ms (None: no sample). slo_ms: the SLO, ms.
        offered_rps: requests/s submitted (refused included).
        instances: per served unit, its instances now (None: as planned)."""

    since_change_s: float
    answered: int
    capacity_rps: float | None
    p99_ms: float | None
    offered_rps: float
    slo_ms: float
    instances: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LiveConfig:
    """Tuning of :func:`check`.

    Attributes:
        settle_s: seconds a configuration serves before it is judged.
        min_answered: requests answered in the window before it is judged.
        shortfall: relative shortfall of measured against predicted capacity (beyond
            ``err``) that counts as falling short, 0-1.
        better_by: relative margin another configuration must serve more by, 0-1.
        max_switches: most switches per pipeline."""

    settle_s: float = 10.0
    min_answered: int = 50
    shortfall: float = 0.15
    better_by: float = 0.10
    max_switches: int = 2


@dataclass(frozen=True)
class LiveState:
    """What :func:`check` carries: ``phase`` (``watch``, ``trial`` or ``settled``), ``measured``
    (label -> capacity, requests/s), ``switches`` so far and the last verdict's ``reason``."""

    phase: str = "watch"
    measured: tuple[tuple[str, float], ...] = ()
    switches: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """``wait`` (not judged yet), ``keep`` (settled on the configuration serving) or
    ``switch`` (deploy the other configuration), with a reason a user can read."""

    action: str
    reason: str


def _measured(state: LiveState, label: str) -> float | None:
    return next((v for k, v in state.measured if k == label), None)


def check(
    obs: Observed,
    state: LiveState,
    serving: Expected,
    other: Expected | None,
    config: LiveConfig = LiveConfig(),
) -> tuple[Verdict, LiveState]:
    """Judge the configuration serving (see the module docstring).

    Args:
        obs: what it serves now. state: the previous call's state.
        serving: the prediction for the configuration serving.
        other: the prediction for the other one (None: none).
        config: thresholds.

    Returns:
        ``(verdict, new state)``; after ``switch`` the caller deploys ``other`` and calls
        again with ``serving`` and ``other`` swapped."""
    if state.phase == "settled":
        return Verdict("keep", state.reason), state
    if obs.since_change_s < config.settle_s:
        return Verdict(
            "wait", f"settling ({obs.since_change_s:.0f} of {config.settle_s:g} s)"
        ), state
    if obs.answered < config.min_answered or obs.capacity_rps is None:
        return (
            Verdict("wait", f"{obs.answered} of {config.min_answered} requests answered"),
            state,
        )
    got = float(obs.capacity_rps)
    measured = tuple((k, v) for k, v in state.measured if k != serving.label) + (
        (serving.label, got),
    )
    if state.phase == "trial":
        first = None if other is None else _measured(state, other.label)
        if (
            other is not None
            and first is not None
            and first > got * (1 + config.better_by)
            and state.switches < config.max_switches
        ):
            why = (
                f"back to {other.label}: it measured {first:.1f}/s, the trial "
                f"{serving.label} {got:.1f}/s"
            )
            return Verdict("switch", why), LiveState("settled", measured, state.switches + 1, why)
        why = f"kept {serving.label}: measured {got:.1f}/s" + (
            f" against {first:.1f}/s for {other.label}" if other and first is not None else ""
        )
        return Verdict("keep", why), LiveState("settled", measured, state.switches, why)
    # watch: the planner's choice, judged against its own prediction
    predicted = serving.capacity_at(obs.instances)
    floor = predicted * (1 - config.shortfall - serving.err)
    short = []
    if got < floor:
        short.append(
            f"measured capacity {got:.1f}/s < {floor:.1f}/s "
            f"(predicted {predicted:.1f}/s less {config.shortfall + serving.err:.0%})"
        )
    late_floor = serving.goodput_rps * (1 - config.shortfall)
    if obs.p99_ms is not None and obs.p99_ms > obs.slo_ms and obs.offered_rps < late_floor:
        short.append(
            f"P99 {obs.p99_ms:.0f} ms > SLO {obs.slo_ms:g} ms at {obs.offered_rps:.1f}/s, "
            f"below the {serving.goodput_rps:.1f}/s predicted within it"
        )
    if not short:
        why = f"kept {serving.label}: measured {got:.1f}/s of a predicted {predicted:.1f}/s"
        return Verdict("keep", why), LiveState("settled", measured, state.switches, why)
    want = got * (1 + config.better_by)
    if (
        other is not None
        and other.capacity_rps * (1 - other.err) > want
        and state.switches < config.max_switches
    ):
        why = (
            f"{serving.label} falls short ({'; '.join(short)}); trying {other.label}, "
            f"predicted {other.capacity_rps:.1f}/s"
        )
        return Verdict("switch", why), LiveState("trial", measured, state.switches + 1, why)
    why = f"kept {serving.label}, though it falls short ({'; '.join(short)}): " + (
        "no runner-up"
        if other is None
        else f"the runner-up {other.label} is predicted {other.capacity_rps:.1f}/s, not "
        f"more than {config.better_by:.0%} above what this one measures"
    )
    return Verdict("keep", why), LiveState("settled", measured, state.switches, why)


def expected_from(candidate: Any, err: float = 0.0) -> Expected:
    """An :class:`Expected` from a :class:`~infscaler.runtime.planning.candidates.Candidate`: its
    served units' mean ms per item on one instance (the cpu profile, else the fastest
    engine's), their instances and items per request, and its goodput."""
    per_req = arrival_rates(candidate.units, 1.0)
    ms, inst, items = [], [], []
    for k, (u, c) in enumerate(zip(candidate.units, candidate.config, strict=True)):
        if not u.served:
            continue
        p = u.engines["cpu"] if "cpu" in u.engines else u.fastest()
        ms.append(float(p.mean_ms))
        inst.append(int(c.total))
        items.append(float(per_req[k]))
    return Expected(
        candidate.label(), tuple(ms), tuple(inst), tuple(items), float(candidate.goodput_rps), err
    )
