"""Admission across pipelines (pure functions, no state): a request of a lower priority
level is refused while a pipeline of a higher level is at risk of missing its SLO.

For each other pipeline of a strictly higher level (a smaller number) with an SLO, a
measured service time and requests in flight, the front end passes a :class:`HigherLoad`:
what a request of it arriving now would take
(:func:`~infscaler.runtime.serving.admission.admit_latency` on its drain time). While that
exceeds :data:`PRIORITY_HEADROOM` x its SLO, :func:`admit_across` refuses the lower
request (code ``priority``), held like a latency refusal
(:func:`~infscaler.runtime.serving.admission.refusal_hold_s`). Pipelines of equal level
never refuse each other here. Why: docs/scaling.md, "Priorities and queue policies"
(INFaaS admits lower-priority work only on spare capacity, Romero et al., ATC'21 §4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from infscaler.runtime.serving.admission import (
    MAX_RETRY_S,
    MIN_RETRY_S,
    ArrivalDecision,
    Refusal,
    admit_latency,
    refusal_hold_s,
)

__all__ = ["PRIORITY_HEADROOM", "HigherLoad", "admit_across", "higher_load"]

#: A higher-level pipeline is at risk while a request of it arriving now is estimated past
#: this fraction of its SLO: the margin left for what the estimate does not see (the
#: estimate is a median; the lower level's requests admitted meanwhile still run).
PRIORITY_HEADROOM = 0.8


@dataclass(frozen=True)
class HigherLoad:
    """A pipeline of a higher priority level as a lower request arrives.

    Attributes:
        pipeline: its name (for the message).
        level: its priority level (1 highest).
        slo_ms: its SLO, ms (> 0).
        estimate_ms: what a request of it arriving now would take, ms (>= 0).
    """

    pipeline: str
    level: int
    slo_ms: float
    estimate_ms: float


def higher_load(
    pipeline: str,
    level: int,
    slo_ms: float,
    ahead: int,
    service_ms: float,
    interval_ms: float | None,
    units: Sequence[tuple[float, int]] | None,
) -> HigherLoad:
    """A :class:`HigherLoad` from a pipeline's measured estimates: ``ahead`` requests of
    it in flight, ``service_ms`` one request's compute (ms, already scaled by its
    correction), ``interval_ms`` its bottleneck interval (ms) and ``units``
    (``(ms, instances)`` per unit). The estimate is
    :func:`~infscaler.runtime.serving.admission.admit_latency`'s drain-time estimate (the
    progress of the requests ahead is not credited: a conservative bound).

    Raises:
        ValueError: ``slo_ms`` not a positive finite number, or negative estimates.
    """
    verdict = admit_latency(
        ahead, service_ms, interval_ms, slo_ms, units=units, overloaded=True
    )  # fmt: skip
    assert verdict.estimate_ms is not None  # a bound and a service time: always estimated
    return HigherLoad(pipeline, int(level), float(slo_ms), float(verdict.estimate_ms))


def admit_across(
    decision: ArrivalDecision,
    *,
    pipeline: str,
    level: int,
    higher: Sequence[HigherLoad],
    left_ms: float,
    headroom: float = PRIORITY_HEADROOM,
) -> ArrivalDecision:
    """``decision`` (a pipeline's own admission of a request), refused when a pipeline of
    a strictly higher level than ``level`` is at risk: its ``estimate_ms`` exceeds
    ``headroom`` x its ``slo_ms``. A refusal already made is returned unchanged.

    Args:
        decision: :func:`~infscaler.runtime.serving.admission.admit_request`'s answer.
        pipeline: the request's pipeline (for the message).
        level: the request's priority level.
        higher: the other pipelines (any level; those not strictly higher are ignored).
        left_ms: what is left of the request's own bound (its SLO, else its timeout), ms:
            the longest the refusal is held.
        headroom: in (0, 1].

    Returns:
        ``decision``, or a refusal with code ``priority`` (503), naming the pipeline most
        at risk, ``retry_after_s`` the time its estimate needs to come back under the
        bound and ``hold_s`` (:func:`~infscaler.runtime.serving.admission.refusal_hold_s`).

    Raises:
        ValueError: ``headroom`` outside (0, 1], ``left_ms`` negative, or a
        :class:`HigherLoad` with a non-positive SLO or a negative estimate.
    """
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    if not decision.admit:
        return decision
    worst: HigherLoad | None = None
    for h in higher:
        if not (math.isfinite(h.slo_ms) and h.slo_ms > 0) or not h.estimate_ms >= 0:
            raise ValueError(
                f"pipeline {h.pipeline!r}: slo_ms must be > 0 and estimate_ms >= 0, "
                f"got {h.slo_ms}, {h.estimate_ms}"
            )
        if h.level >= level or h.estimate_ms <= headroom * h.slo_ms:
            continue
        if worst is None or h.estimate_ms / h.slo_ms > worst.estimate_ms / worst.slo_ms:
            worst = h
    if worst is None:
        return decision
    over_s = (worst.estimate_ms - headroom * worst.slo_ms) / 1e3
    retry = round(min(MAX_RETRY_S, max(MIN_RETRY_S, over_s)), 3)
    return replace(
        decision,
        admit=False,
        refusal=Refusal.PRIORITY,
        status=503,
        reason=(
            f"pipeline {pipeline} (priority {level}) refuses the request at arrival: "
            f"pipeline {worst.pipeline} (priority {worst.level}) is at risk of missing its "
            f"SLO (a request of it would take about {worst.estimate_ms:.0f} ms of "
            f"{worst.slo_ms:.0f})"
        ),
        hint="a higher-priority pipeline needs the device now; retry after Retry-After "
        "seconds, or raise this pipeline's priority",
        retry_after_s=retry,
        hold_s=refusal_hold_s(retry, left_ms),
    )
