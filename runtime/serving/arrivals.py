"""What the front end knows as a request arrives, how it decides, and how it counts a refusal.

:func:`arrival_snapshot` gathers, from a pipeline's :class:`~infscaler.runtime.serving.route.Route`
and the front end's own counts (:class:`FrontCounts`), the
:class:`~infscaler.runtime.serving.admission.ArrivalSnapshot` that the pure
:func:`~infscaler.runtime.serving.admission.admit_request` decides on;
:func:`admit_arrival` adds admission across pipelines; :func:`count_refusal` records a
refusal where the statistics, the status and ``/metrics`` read it, and
:func:`refusal_error` is the error it answers with. :func:`first_slot` lays out a
request's first slot and refuses one too large for the pool (413). They run under the
front end's lock (:func:`first_slot` before it); none blocks.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from infscaler.runtime.serving.admission import (
    ArrivalDecision,
    ArrivalSnapshot,
    Refusal,
    admit_request,
)
from infscaler.runtime.serving.pipeline import TRACE
from infscaler.runtime.serving.priority_admission import HigherLoad, admit_across, higher_load
from infscaler.runtime.serving.requests import RequestError
from infscaler.runtime.serving.route import Route
from infscaler.shm.tensors import SlotFormatError, tensors_nbytes

__all__ = [
    "COUNTED_REFUSALS",
    "REFUSAL_COUNTERS",
    "FrontCounts",
    "HeldRefusals",
    "MAX_HELD",
    "admit_arrival",
    "arrival_snapshot",
    "count_refusal",
    "first_slot",
    "higher_loads",
    "refusal_error",
]

#: the trace a request's first slot starts with (no rows yet)
EMPTY_TRACE = np.zeros((0, 4), dtype=np.int64)

#: refusals that count in the pipeline's offered load (its ``rejected`` statistics)
COUNTED_REFUSALS = frozenset(
    {
        Refusal.UNAVAILABLE,
        Refusal.OVERLOADED,
        Refusal.SHED,
        Refusal.SLO,
        Refusal.DEADLINE,
        Refusal.QUEUE_FULL,
    }
)
#: the front end's counter of each refusal that has one
REFUSAL_COUNTERS = {
    Refusal.SHED: "shed",
    Refusal.SLO: "slo_refused",
    Refusal.DEADLINE: "deadline_refused",
    Refusal.QUEUE_FULL: "queue_full",
    Refusal.OVERLOADED: "overloaded",
    Refusal.UID_QUOTA: "uid_quota",
    Refusal.PRIORITY: "priority_refused",
}


@dataclass(frozen=True)
class FrontCounts:
    """The front end's side of an arrival: ``failure`` (why it died, None: alive),
    ``closing``, requests ``pending`` (admitted, not answered) of ``max_pending``, the
    client uid's own (``uid_pending``) of ``pending_per_uid`` (None: no per-uid cap), and
    ``operator_pending``, the share only the operator may use."""

    failure: str | None
    closing: bool
    pending: int
    max_pending: int
    uid_pending: int
    pending_per_uid: int | None
    operator_pending: int


def arrival_snapshot(
    route: Route,
    front: FrontCounts,
    *,
    timeout_s: float | None,
    now: float,
    arrived: float,
    overloaded: bool,
    level: int,
    uid: int | None,
    held: int = 0,
) -> ArrivalSnapshot:
    """The snapshot admission decides a request on: ``timeout_s`` the request's own
    deadline (s; None: the pipeline's), ``now`` / ``arrived`` monotonic s (the difference
    is what reading and decoding it took), ``overloaded`` the route's overload state at
    ``now``, ``level`` its priority level, ``uid`` the client's (None: the operator),
    ``held`` the route's refusals held and not answered yet (:class:`HeldRefusals`)."""
    config = route.pipeline.config
    service_ms, interval_ms = route.estimates(overloaded)
    # in overload admission judges on the drain time: the progress is not read
    if overloaded:
        remaining_ms, units = None, route.units(overloaded)
    else:
        remaining_ms, units = route.progress(now)
    return ArrivalSnapshot(
        pipeline=route.pipeline.name,
        timeout_s=timeout_s,
        default_timeout_s=config.request_timeout_s,
        spent_ms=(now - arrived) * 1e3,
        failure=front.failure,
        accepting=route.accepting and not front.closing,
        unavailable_reason=route.unavailable_reason,
        unavailable_retry_s=route.retry_after_s,
        pending=front.pending,
        max_pending=front.max_pending,
        uid=uid,
        uid_pending=front.uid_pending,
        pending_per_uid=front.pending_per_uid,
        operator_pending=front.operator_pending,
        ahead=route.admitted,
        queue_limit=route.queue_limit,
        shed_reason=route.shed_reason,
        slo_ms=config.slo_ms,
        service_ms=service_ms,
        interval_ms=interval_ms,
        remaining_ms=remaining_ms,
        units=units,
        lenience=route.lenience(now, overloaded),
        overloaded=overloaded,
        level=level,
        queued=tuple(route.queued.items()),
        max_queue_size=config.queue_policy.max_queue_size,
        held=held,
    )


#: the most refusals :class:`HeldRefusals` keeps per pipeline (past it, a refusal is not
#: counted: a flood costs each refusal one bounded insertion; a hold is at most its
#: request's estimate whatever the count)
MAX_HELD = 1024


class HeldRefusals:
    """The refusals held per pipeline and not answered yet (the requests queued at its
    gate), as the release times their ``hold_s`` gives them; not thread-safe (the
    intake's lock guards it). Refusals are counted when the admission decides them
    (the server holds each ``hold_s`` before it answers): one the server answered
    sooner counts until its release time all the same."""

    def __init__(self) -> None:
        self._due: dict[int, list[float]] = {}

    def count(self, key: int, now: float) -> int:
        """Refusals of pipeline ``key`` (the route's ``id``) held at ``now`` (monotonic s)."""
        due = self._due.get(key)
        if due is None:
            return 0
        del due[: bisect.bisect_right(due, now)]
        if not due:
            del self._due[key]
        return len(due)

    def add(self, key: int, now: float, hold_s: float) -> None:
        """A refusal of pipeline ``key`` held ``hold_s`` s from ``now`` (none held, or
        :data:`MAX_HELD` kept already: not kept)."""
        due = self._due.setdefault(key, [])
        if hold_s > 0 and len(due) < MAX_HELD:
            bisect.insort(due, now + hold_s)
        elif not due:
            del self._due[key]


def higher_loads(routes: Iterable[Route], route: Route, level: int) -> tuple[HigherLoad, ...]:
    """The :class:`~infscaler.runtime.serving.priority_admission.HigherLoad` of each of
    ``routes`` (the pipelines with requests in flight) other than ``route`` whose priority
    level is strictly higher than ``level`` (a smaller number), that has an SLO, a measured
    service time and requests admitted: what
    :func:`~infscaler.runtime.serving.priority_admission.admit_across` decides on."""
    out = []
    for other in routes:
        config = other.pipeline.config
        if other is route or config.priority >= level or config.slo_ms is None:
            continue
        if other.admitted <= 0 or not other.measured:
            continue
        service_ms, interval_ms = other.estimates(True)
        if service_ms is None:
            continue
        out.append(
            higher_load(
                other.pipeline.name,
                config.priority,
                config.slo_ms,
                other.admitted,
                service_ms,
                interval_ms,
                other.units(True),
            )  # fmt: skip
        )
    return tuple(out)


def count_refusal(route: Route, counters: collections.Counter, decision: ArrivalDecision) -> None:
    """Record a refusal: by its code in ``route.refusals``, in the pipeline's offered load
    when it is one of :data:`COUNTED_REFUSALS`, and in the front end's ``counters`` under
    its :data:`REFUSAL_COUNTERS` name."""
    if decision.refusal is not None:
        route.refusals[decision.refusal.value] += 1
    if decision.refusal in COUNTED_REFUSALS:
        route.stats.record_rejection(slo=decision.refusal is Refusal.SLO)
    counter = REFUSAL_COUNTERS.get(decision.refusal)  # type: ignore[arg-type]
    if counter is not None:
        counters[counter] += 1


def refusal_error(decision: ArrivalDecision) -> RequestError:
    """The error a refused arrival answers with: the decision's status, reason, hint,
    ``retry_after_s``, reason code and ``hold_s``."""
    return RequestError(
        decision.reason,
        decision.status,
        decision.hint,
        retry_after_s=decision.retry_after_s,
        code=None if decision.refusal is None else decision.refusal.value,
        hold_s=decision.hold_s,
    )


def admit_arrival(snap: ArrivalSnapshot, route: Route, live: Iterable[Route]) -> ArrivalDecision:
    """:func:`~infscaler.runtime.serving.admission.admit_request`, then admission across
    pipelines (:func:`~infscaler.runtime.serving.priority_admission.admit_across`) over
    ``live``, the pipelines with requests in flight (``route`` among them or not)."""
    decision = admit_request(snap)
    if not decision.admit:
        return decision
    higher = higher_loads(live, route, snap.level)
    if not higher:
        return decision
    bound_s = snap.slo_ms / 1e3 if snap.slo_ms is not None else decision.timeout_s
    left_ms = max(0.0, (bound_s or 0.0) * 1e3 - snap.spent_ms)
    return admit_across(
        decision, pipeline=snap.pipeline, level=snap.level, higher=higher, left_ms=left_ms
    )


def first_slot(
    route: Route, inputs: dict[str, Any], limit: int | None
) -> tuple[dict[str, Any], int | None]:
    """The tensors of a request's first slot (the pipeline's front inputs and the empty
    trace) and their size, bytes (:func:`~infscaler.shm.tensors.tensors_nbytes`; None: a
    tensor the slot format refuses, and sending it fails with the reason). ``inputs``:
    name -> array, or -> ``(shape, dtype)`` for a slot laid out before its bytes are read.

    Raises:
        RequestError: (413) larger than ``limit`` bytes (None: no limit).
    """
    first = {n: inputs[n] for n in route.pipeline.front_inputs}
    first[TRACE] = EMPTY_TRACE
    try:
        nbytes = tensors_nbytes(first)
    except SlotFormatError:
        return first, None
    if limit is not None and nbytes > limit:
        raise RequestError(
            f"the request's inputs take {nbytes} bytes in the tensor pool; pipeline "
            f"{route.pipeline.name} takes at most {limit} bytes a request (the pool's "
            "largest slot or its cap)",
            413,
            "send a smaller batch, or split it over several requests",
            code="too_large",
        )
    return first, nbytes
