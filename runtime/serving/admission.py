"""Admission control: what the service accepts at arrival (pure functions, no state).

- :func:`admit_request` (:class:`ArrivalSnapshot` -> :class:`ArrivalDecision`): the front
  end's whole decision, in order: bad timeout (400), front end dead, pipeline not
  accepting, no live instance, pending quotas (:func:`admit_pending`), ``max_queue_size``,
  load shedding, then the latency bound (:func:`admit_latency`). Refusals are 503 with a
  reason code (:class:`Refusal`), a hint, ``retry_after_s`` and ``hold_s``
  (:func:`refusal_hold_s`: how long the server holds the answer, s).
- :func:`admit_latency`: with an SLO (ms), refuse a request whose estimate
  (:func:`estimate_ms`, :func:`drain_ms`: FIFO units of ``c_u`` instances at ``S_u`` ms,
  InferLine's pipeline model, Crankshaw et al. SoCC'20 section 4) exceeds it: "drop
  early" (Clipper NSDI'17 section 4.3, INFaaS ATC'21 section 4.2).
- :func:`admit_bytes` / :class:`ByteBudget`: the service-wide bytes-in-flight budget,
  checked on the declared size before a body is read (:func:`request_reservation`).

More (the rules in full, the why, measurements): docs/scaling.md, "Admission in full".
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from infscaler.runtime.queueing import capacity_rps, drain_response_ms, fifo_wait_ms
from infscaler.runtime.serving.queues import ahead_at

#: back-off suggested when the byte budget is exhausted, seconds
BYTES_RETRY_S = 0.5
#: what a byte of JSON can take in memory once decoded, at most (measured: docs/scaling.md,
#: "Admission in full")
JSON_DECODE_FACTOR = 20
#: bounds of any suggested back-off, seconds
MIN_RETRY_S, MAX_RETRY_S = 0.05, 30.0
#: back-off suggested to a client at its share of ``max_pending``, seconds (its own
#: requests must finish first; nothing says how long they take)
PENDING_RETRY_S = 1.0


#: The scaler's ``shed`` queue bound (and the route's refusal on it) is set only while
#: the offered load is at least this fraction of the capacity (when it is known): below
#: it a queue drains by itself (docs/scaling.md, "decide, step by step").
SHED_MIN_LOAD = 0.9


@dataclass(frozen=True)
class Admission:
    """An admission decision.

    Attributes:
        admit: True to accept the request.
        reason: why it was refused ("" when admitted).
        retry_after_s: suggested back-off for a refused request, seconds (None when
            admitted).
        estimate_ms: the latency estimate it was judged on (latency bound only).
    """

    admit: bool
    reason: str = ""
    retry_after_s: float | None = None
    estimate_ms: float | None = None


def _retry(seconds: float) -> float:
    return round(min(MAX_RETRY_S, max(MIN_RETRY_S, seconds)), 3)


def admit_bytes(
    request_bytes: int,
    inflight_bytes: int,
    budget_bytes: int | None,
    *,
    peer_inflight_bytes: int = 0,
    peer_budget_bytes: int | None = None,
) -> Admission:
    """Accept a request of ``request_bytes`` while ``inflight_bytes`` are held, under a
    budget of ``budget_bytes`` (None: no budget), and while its client (peer uid) holds
    ``peer_inflight_bytes`` of its own budget ``peer_budget_bytes`` (None: no per-peer
    budget, as for the service's own user and root).

    A request larger than a whole budget is admitted when nothing else is in flight
    against it (else it could never run; the body limit, ``--max-body-mb``, bounds it
    then).

    Raises:
        ValueError: a negative size.
    """
    if request_bytes < 0 or inflight_bytes < 0 or peer_inflight_bytes < 0:
        raise ValueError("byte counts must be >= 0")
    if (
        peer_budget_bytes is not None
        and peer_inflight_bytes + request_bytes > peer_budget_bytes
        and peer_inflight_bytes > 0
    ):
        return Admission(
            False,
            f"your requests hold {peer_inflight_bytes / 1e6:.1f} MB in flight; this one "
            f"({request_bytes / 1e6:.1f} MB) would pass the budget of one user, "
            f"{peer_budget_bytes / 1e6:.0f} MB (--max-inflight-mb-per-uid)",
            _retry(BYTES_RETRY_S),
        )
    if budget_bytes is None:
        return Admission(True)
    if inflight_bytes + request_bytes <= budget_bytes or inflight_bytes == 0:
        return Admission(True)
    return Admission(
        False,
        f"{inflight_bytes / 1e6:.1f} MB of requests are in flight; this one "
        f"({request_bytes / 1e6:.1f} MB) would pass the budget of "
        f"{budget_bytes / 1e6:.0f} MB (--max-inflight-mb)",
        _retry(BYTES_RETRY_S),
    )


def request_reservation(declared: int | None, limit: int, json_bytes: int | None) -> int:
    """Bytes an inference request reserves from the in-flight budget before its body is
    read: twice its binary part (the body, then its decoded tensors) and
    :data:`JSON_DECODE_FACTOR` times its JSON part (the body, then the Python objects
    ``json.loads`` makes of it).

    Args:
        declared: its ``Content-Length`` (None: chunked; ``limit`` is assumed).
        limit: the body limit, bytes.
        json_bytes: the JSON part's length (``Inference-Header-Content-Length``); None:
            the whole body is JSON.
    """
    size = limit if declared is None else min(declared, limit)
    json_part = size if json_bytes is None else min(json_bytes, size)
    return 2 * (size - json_part) + JSON_DECODE_FACTOR * json_part


def refusal_hold_s(
    retry_after_s: float | None, left_ms: float, late_ms: float | None = None
) -> float:
    """How long to hold a latency or shedding refusal before answering it, s: until the
    request could be admitted (``retry_after_s``: :func:`gate_wait_ms`, the queue ahead
    drained and the refusals held before it admitted), at least the shortest back-off
    (:data:`MIN_RETRY_S`) while its bound leaves that much, at most the later of what
    was left of its bound (``left_ms``) and ``late_ms``, the latency it would have had
    admitted now (its estimate, ms; None: ``left_ms`` only): a client never waits longer
    for a refusal than it would have for a late answer. 0 when nothing is known.

    Raises:
        ValueError: ``left_ms`` negative or not finite.
    """
    if not (math.isfinite(left_ms) and left_ms >= 0):
        raise ValueError(f"left_ms must be a finite number >= 0, got {left_ms}")
    if retry_after_s is None or not math.isfinite(retry_after_s):
        return 0.0
    left = left_ms / 1e3
    late = left if late_ms is None or not math.isfinite(late_ms) else max(left, late_ms / 1e3)
    return round(max(0.0, min(max(float(retry_after_s), min(MIN_RETRY_S, left)), late)), 3)


def gate_wait_ms(drain_ms: float, held: int, interval_ms: float | None) -> float:
    """How long a refused request waits at the gate before it could be admitted, ms:
    ``drain_ms`` (until the queue ahead drained enough for it) plus one bottleneck
    ``interval_ms`` per refusal already held (``held``, the refused requests queued at
    the gate ahead of it, each admitted as one request leaves; why: docs/scaling.md,
    "Admission in full"). Negative inputs count as 0; ``interval_ms`` None: the held are
    not counted."""
    per = 0.0 if interval_ms is None or not math.isfinite(interval_ms) else interval_ms
    return max(0.0, drain_ms) + max(0, held) * max(0.0, per)


def default_estimates(slo_ms: float) -> tuple[float, float]:
    """``(service_ms, interval_ms)`` to judge on before anything was measured: a
    request takes half the SLO, and the pipeline runs one request at a time (so one
    request ahead is admitted, two are not)."""
    return slo_ms / 2, slo_ms / 2


def estimate_ms(
    ahead: int,
    service_ms: float,
    interval_ms: float,
    remaining_ms: Sequence[float] | None = None,
    units: Sequence[tuple[float, int]] | None = None,
) -> float:
    """Expected latency of a request arriving behind ``ahead`` admitted requests of its
    pipeline (ms).

    Args:
        ahead: requests of the pipeline admitted and not answered.
        service_ms: one request's end-to-end compute time ``S``, ms.
        interval_ms: the bottleneck interval, ms (used without ``units``).
        remaining_ms: ms each of the most recently admitted requests has left until
            its own estimate, most recent first (at least ``min(ahead, max c_u)`` of
            them; negative: overdue, counted as 0).
        units: ``(S_u ms per request, c_u instances)`` of every unit, in pipeline order.

    Returns:
        ``max(S, max_u (remaining_ms[c_u - 1] + S_u))`` over the units with at least
        ``c_u`` requests ahead (see the module docstring) when ``remaining_ms`` and
        ``units`` are given, else ``S + ahead * interval_ms``.
    """
    if remaining_ms is None or not units:
        return service_ms + fifo_wait_ms(ahead, 1, interval_ms)
    est = service_ms
    known = min(max(0, ahead), len(remaining_ms))
    for unit_ms, instances in units:
        c = max(1, int(instances))
        if c <= known:
            est = max(est, max(0.0, float(remaining_ms[c - 1])) + float(unit_ms))
    return est


def drain_ms(ahead: int, service_ms: float, units: Sequence[tuple[float, int]]) -> float:
    """Expected latency of a request arriving behind ``ahead`` admitted requests when
    every one of them is assumed queued at each unit (the drain time), ms::

        drain_ms = S + max_u floor(ahead / c_u) x S_u

    A unit of ``c_u`` instances (FIFO, InferLine's pipeline model, Crankshaw et al.,
    SoCC'20 §4) starts the new request once ``ahead - c_u + 1`` of those ahead left it,
    after ``floor(ahead / c_u)`` service times at most. The queueing model's
    :func:`~infscaler.runtime.queueing.drain_response_ms`.

    Args:
        ahead: requests of the pipeline admitted and not answered.
        service_ms: one request's end-to-end compute time ``S``, ms.
        units: ``(S_u ms per request, c_u instances)`` of every unit.
    """
    return drain_response_ms(ahead, service_ms, units)


def starts_at_once(ahead: int, units: Sequence[tuple[float, int]] | None) -> bool:
    """Whether a request behind ``ahead`` admitted requests waits for no instance: fewer
    are ahead than any unit has instances (``units``: ``(ms, instances)`` per unit; None:
    not known, False unless nothing is ahead). Refusing such a request cannot bring it
    within the SLO (docs/scaling.md, "Admission in full")."""
    if ahead <= 0:
        return True
    return bool(units) and ahead < min(max(1, int(c)) for _, c in units)  # type: ignore[union-attr]


def admit_latency(
    ahead: int,
    service_ms: float | None,
    interval_ms: float | None,
    slo_ms: float | None,
    what: str = "SLO",
    remaining_ms: Sequence[float] | None = None,
    units: Sequence[tuple[float, int]] | None = None,
    lenience: float = 1.0,
    overloaded: bool = False,
) -> Admission:
    """Accept a request only if :func:`estimate_ms` x ``lenience`` fits in ``slo_ms``,
    or if nothing is ahead of it, or (``what`` "SLO") it waits for no instance
    (:func:`starts_at_once`): it starts at once, and refusing it would not make it
    faster. Against a request's own timeout it is refused still: it would expire half
    computed.

    Args:
        ahead: requests of the same pipeline admitted and not answered.
        service_ms: measured end-to-end compute ms of one request (None: not measured:
            :func:`default_estimates` is used).
        interval_ms: measured bottleneck interval ms (None: as ``service_ms``).
        slo_ms: the bound in ms: the pipeline's SLO, or the request's timeout (None:
            no latency bound, always admitted).
        what: names the bound in the reason ("SLO", "request's timeout").
        remaining_ms / units: the requests ahead's progress and the units' measured
            ms and instances (:func:`estimate_ms`); used only once ``service_ms`` is
            measured. ``units`` without ``remaining_ms``, or in overload: the drain
            time :func:`drain_ms`; neither: ``S + ahead * interval``.
        lenience: in (0, 1]: the estimate is scaled by it for the decision only (the
            returned ``estimate_ms`` is the estimate itself): below capacity the front
            end passes a low quantile of its latency / estimate ratios over their
            median (:meth:`infscaler.runtime.serving.route.Route.lenience`), so only a request
            likely late is refused; 1 in overload.
        overloaded: the offered load is at the pipeline's capacity or past it
            (:meth:`infscaler.runtime.serving.route.Route.overloaded`): judge on the drain-time
            estimate (:func:`drain_ms` with ``units``, else ``S + ahead * interval_ms``)
            even when ``remaining_ms`` is given (why: docs/scaling.md, "Admission in
            full").

    Raises:
        ValueError: ``slo_ms`` not a positive finite number, or a negative estimate.
    """
    if slo_ms is None:
        return Admission(True)
    if not (math.isfinite(slo_ms) and slo_ms > 0):
        raise ValueError(f"slo_ms must be a positive number, got {slo_ms}")
    d_service, d_interval = default_estimates(slo_ms)
    service = d_service if service_ms is None else float(service_ms)
    interval = (
        (d_interval if service_ms is None else service) if interval_ms is None else interval_ms
    )
    if service < 0 or interval < 0 or not (math.isfinite(service) and math.isfinite(interval)):
        raise ValueError(f"estimates must be finite and >= 0, got {service}, {interval}")
    tracked = service_ms is not None and remaining_ms is not None and bool(units) and not overloaded
    if tracked:
        est = estimate_ms(ahead, service, interval, remaining_ms, units)
        why = f"{ahead} requests ahead, the pipeline's units busy with them"
    elif service_ms is not None and units:
        est = drain_ms(ahead, service, units)
        b_ms, b_k = max(units, key=lambda u: u[0] / max(1, int(u[1])))
        why = f"{ahead} requests ahead, {b_ms:.1f} ms each on {max(1, int(b_k))} instance(s)"
    else:
        est = estimate_ms(ahead, service, interval)
        why = f"{ahead} requests ahead, {interval:.1f} ms each"
    # nothing ahead: it runs at once (and an idle pipeline must keep measuring)
    if not 0 < lenience <= 1:
        raise ValueError(f"lenience must be in (0, 1], got {lenience}")
    if est * lenience <= slo_ms or ahead <= 0 or (what == "SLO" and starts_at_once(ahead, units)):
        return Admission(True, estimate_ms=est)
    # admitted again once enough of the queue ahead drained: (est - slo) ms from now
    return Admission(
        False,
        f"it would take about {est:.0f} ms ({why}), past what is left of its {what} "
        f"({slo_ms:.0f} ms)",
        _retry((est - slo_ms) / 1e3),
        est,
    )


class Refusal(StrEnum):
    """Why :func:`admit_request` refused a request (the front end's counters and the
    pipeline's rejection statistics key on it)."""

    BAD_TIMEOUT = "bad_timeout"  # 400: timeout_s not a positive finite number
    FAILED = "failed"  # the front end died
    NOT_ACCEPTING = "not_accepting"  # the pipeline is being removed, or the service drains
    UNAVAILABLE = "unavailable"  # a unit has no live instance (its restart is pending)
    OVERLOADED = "overloaded"  # max_pending requests in flight (or all but the operator's)
    UID_QUOTA = "uid_quota"  # the client's uid holds pending_per_uid requests
    SHED = "shed"  # the pipeline's queue limit (the device is at its cap)
    SLO = "slo"  # the latency bound: the pipeline's SLO
    DEADLINE = "deadline"  # the latency bound: the request's own timeout
    QUEUE_FULL = "queue_full"  # the queue policy's max_queue_size (the pipeline's queue)
    PRIORITY = "priority"  # a higher-level pipeline is at risk (priority_admission)


def admit_pending(
    uid: int | None,
    pending: int,
    uid_pending: int,
    max_pending: int,
    pending_per_uid: int | None,
    operator_pending: int = 0,
) -> tuple[Refusal, str] | None:
    """Whether one more request may be pending (admitted and not answered) in the front
    end: None to admit it, else the refusal and why (the answer is 503).

    Args:
        uid: the client's uid; None for the service's own user, root and in-process
            callers (the operator), held to ``max_pending`` only.
        pending: requests pending now, all clients and pipelines.
        uid_pending: of them, those of ``uid``.
        max_pending: the front end's cap on pending requests.
        pending_per_uid: the most one uid may have pending (None: no per-uid cap).
        operator_pending: of ``max_pending``, how many only the operator may use.

    The operator may use all ``max_pending``; the other uids together
    ``max_pending - operator_pending`` (at least 1), and each at most
    ``pending_per_uid`` (as :func:`~infscaler.base.quotas.admit_connection` shares
    connections).
    """
    if pending >= max_pending:
        why = f"{pending} requests are in flight (max_pending = {max_pending}): try again later"
        return Refusal.OVERLOADED, why
    if uid is None:
        return None
    shared = max(1, max_pending - operator_pending)
    if pending >= shared:
        return Refusal.OVERLOADED, (
            f"{pending} requests are in flight (the last {max_pending - shared} of "
            f"max_pending = {max_pending} are kept for the operator): try again later"
        )
    if pending_per_uid is not None and uid_pending >= pending_per_uid:
        return Refusal.UID_QUOTA, (
            f"too many requests pending from your uid ({uid_pending} admitted and not "
            f"answered, at most {pending_per_uid} per user, --max-pending-per-uid): wait for "
            "some to finish, or retry after Retry-After seconds"
        )
    return None


@dataclass(frozen=True)
class ArrivalSnapshot:
    """What the front end knows when a request arrives (plain values; no I/O, no locks).

    Attributes:
        pipeline: the pipeline's name (for the messages).
        timeout_s: the request's timeout as given, s (None: ``default_timeout_s``);
            anything but a positive finite number is refused (400); longer than
            ``default_timeout_s``: that.
        default_timeout_s: the pipeline's ``request_timeout_s``, s (the longest any of
            its requests may take).
        spent_ms: ms since the request arrived (reading and decoding its body).
        failure: why the front end died (None: it runs).
        accepting: False while the pipeline is being removed or the service drains.
        unavailable_reason: set while a unit has no live instance;
            ``unavailable_retry_s``: when it is expected back, s.
        pending: requests in flight in the front end (all pipelines); ``max_pending``:
            the most it admits.
        uid: the client's uid (None: the service's own user, root or an in-process
            caller); ``uid_pending``: the requests it has pending; ``pending_per_uid``
            (None: none) and ``operator_pending``: :func:`admit_pending`'s caps.
        ahead: requests of this pipeline admitted and not answered.
        queue_limit: the scaler's bound on ``ahead`` (None: none), with ``shed_reason``.
        slo_ms: the pipeline's SLO, ms (None: none).
        service_ms / interval_ms: measured end-to-end compute ms of one request and the
            bottleneck interval ms (:meth:`~infscaler.runtime.serving.route.Route.estimates`;
            None before a measurement).
        remaining_ms / units: ms the most recently admitted requests have left until
            their estimates (most recent first) and ``(ms, instances)`` per unit
            (:meth:`~infscaler.runtime.serving.route.Route.progress`; None: judge on
            ``ahead x interval_ms``), see :func:`estimate_ms`.
        lenience: what the latency decision scales the estimate by, in (0, 1]
            (:meth:`~infscaler.runtime.serving.route.Route.lenience`; 1: refuse at the estimate).
        overloaded: the offered load is at the pipeline's capacity
            (:meth:`~infscaler.runtime.serving.route.Route.overloaded`): the latency decision
            uses the drain-time estimate (:func:`admit_latency`).
        level: the request's priority level (1 highest; never above its pipeline's:
            :func:`~infscaler.runtime.serving.queues.request_level`).
        queued: ``(level, requests)`` queued (admitted, not started) in this pipeline
            per level; the requests queued at lower levels than ``level`` are not
            ahead of it.
        max_queue_size: the queue policy's bound on the pipeline's queued requests, all
            levels together (0: none).
        held: this pipeline's latency and shedding refusals held now, not answered yet
            (the requests queued at the gate: :func:`gate_wait_ms`).
    """

    pipeline: str
    timeout_s: Any = None
    default_timeout_s: float = 30.0
    spent_ms: float = 0.0
    failure: str | None = None
    accepting: bool = True
    unavailable_reason: str | None = None
    unavailable_retry_s: float = 1.0
    pending: int = 0
    max_pending: int = 1024
    uid: int | None = None
    uid_pending: int = 0
    pending_per_uid: int | None = None
    operator_pending: int = 0
    ahead: int = 0
    queue_limit: int | None = None
    shed_reason: str = ""
    slo_ms: float | None = None
    service_ms: float | None = None
    interval_ms: float | None = None
    remaining_ms: tuple[float, ...] | None = None
    units: tuple[tuple[float, int], ...] | None = None
    lenience: float = 1.0
    overloaded: bool = False
    level: int = 1
    queued: tuple[tuple[int, int], ...] = ()
    max_queue_size: int = 0
    held: int = 0


@dataclass(frozen=True)
class ArrivalDecision:
    """:func:`admit_request`'s answer.

    Attributes:
        admit: True to accept the request.
        timeout_s: its timeout, s (the request's, at most the pipeline's; the
            deadline is arrival + this).
        refusal: why it was refused (None when admitted).
        status: the HTTP status of a refusal (400 or 503; 0 when admitted).
        reason: the refusal's message ("" when admitted); ``hint``: what to do.
        retry_after_s: when a refused request may be retried, s (None: not known).
        estimate_ms: the latency estimate it was judged on (None without a bound).
        hold_s: how long the server holds the refusal before answering it, s
            (:func:`refusal_hold_s`; 0: answer at once).
    """

    admit: bool
    timeout_s: float | None = None
    refusal: Refusal | None = None
    status: int = 0
    reason: str = ""
    hint: str | None = None
    retry_after_s: float | None = None
    estimate_ms: float | None = None
    hold_s: float = 0.0


def _refuse(
    refusal: Refusal,
    reason: str,
    *,
    status: int = 503,
    hint: str | None = None,
    retry_after_s: float | None = None,
    timeout_s: float | None = None,
    estimate_ms: float | None = None,
    hold_s: float = 0.0,
) -> ArrivalDecision:
    return ArrivalDecision(
        False, timeout_s, refusal, status, reason, hint, retry_after_s, estimate_ms, hold_s
    )


def admit_request(s: ArrivalSnapshot) -> ArrivalDecision:
    """Admit or refuse a request arriving at the front end (pure; see the module
    docstring for the order of the checks).

    The request's timeout is its own when shorter than its pipeline's
    ``request_timeout_s``, else the pipeline's: a client may ask for less time, never more.
    The latency bound is the SLO; once the service time is measured, also the request's
    own timeout when that is tighter (a request admitted to a FIFO queue it cannot cross
    in time would be computed in part, then dropped). The bound is what is left of it
    after ``spent_ms``; :func:`admit_latency` judges ``ahead`` requests against it.

    Returns:
        An :class:`ArrivalDecision`; refusals carry the status (400 for a bad timeout,
        else 503), the message, a hint and ``retry_after_s`` where known; a latency or
        load-shedding refusal also ``hold_s`` (:func:`refusal_hold_s`; shedding: until
        the requests over the limit left, one bottleneck interval each, at most the
        SLO, else the request's timeout).
    """
    t = s.timeout_s
    if t is not None and not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
        return _refuse(
            Refusal.BAD_TIMEOUT,
            f"timeout must be a positive finite number of seconds, got {t!r}",
            status=400,
        )
    timeout_s = s.default_timeout_s if t is None else min(float(t), s.default_timeout_s)
    if s.failure is not None:
        return _refuse(Refusal.FAILED, f"the front end failed: {s.failure}")
    if not s.accepting:
        return _refuse(
            Refusal.NOT_ACCEPTING, f"pipeline {s.pipeline} is not accepting requests now"
        )
    if s.unavailable_reason is not None:
        return _refuse(
            Refusal.UNAVAILABLE, s.unavailable_reason, retry_after_s=s.unavailable_retry_s
        )
    pend = admit_pending(
        s.uid, s.pending, s.uid_pending, s.max_pending, s.pending_per_uid, s.operator_pending
    )
    if pend is not None:
        refusal, why = pend
        mine = refusal is Refusal.UID_QUOTA
        return _refuse(
            refusal,
            why,
            hint=f"each client user may have {s.pending_per_uid} requests queued or running "
            "at once; send fewer at a time"
            if mine
            else "the service is overloaded; slow down or add instances",
            # max_pending for all: nothing says when; a share: its holders finish first
            retry_after_s=None if s.pending >= s.max_pending else PENDING_RETRY_S,
        )
    queued = dict(s.queued)
    waiting = sum(queued.values())
    if s.max_queue_size and waiting >= s.max_queue_size:
        return _refuse(
            Refusal.QUEUE_FULL,
            f"pipeline {s.pipeline}: queue full (max_queue_size {s.max_queue_size}): "
            f"{waiting} requests wait",
            hint="retry later, slow down, or raise queue_policy.max_queue_size",
            retry_after_s=MIN_RETRY_S,
        )
    if s.queue_limit is not None and s.ahead >= s.queue_limit:
        # admitted once ahead - limit + 1 requests left, one bottleneck interval each
        over = s.ahead - s.queue_limit + 1
        retry = wait_s = None
        if s.interval_ms is not None:
            retry = _retry(over * s.interval_ms / 1e3)
            wait_s = gate_wait_ms(over * s.interval_ms, s.held, s.interval_ms) / 1e3
        bound_ms = s.slo_ms if s.slo_ms is not None else timeout_s * 1e3
        return _refuse(
            Refusal.SHED,
            f"pipeline {s.pipeline} sheds load: {s.ahead} requests queued (limit "
            f"{s.queue_limit}); {s.shed_reason}",
            hint="the device is at its resource cap; retry later or slow down",
            retry_after_s=retry,
            hold_s=refusal_hold_s(wait_s, max(0.0, bound_ms - s.spent_ms)),
        )
    bound_ms, what = s.slo_ms, "SLO"
    if s.service_ms is not None and (bound_ms is None or timeout_s * 1e3 < bound_ms):
        bound_ms, what = timeout_s * 1e3, "request's timeout"
    if bound_ms is None:
        return ArrivalDecision(True, timeout_s)
    left_ms = max(1e-3, bound_ms - s.spent_ms)
    ahead = ahead_at(s.level, s.ahead, queued)
    # it passes lower levels: the tracked estimate follows the latest admitted, not these
    remaining = s.remaining_ms if ahead == s.ahead else None
    verdict = admit_latency(
        ahead, s.service_ms, s.interval_ms, left_ms, what, remaining, s.units,
        s.lenience, s.overloaded,
    )  # fmt: skip
    if verdict.admit:
        return ArrivalDecision(True, timeout_s, estimate_ms=verdict.estimate_ms)
    return _refuse(
        Refusal.SLO if what == "SLO" else Refusal.DEADLINE,
        f"pipeline {s.pipeline} refuses the request at arrival: {verdict.reason}",
        hint="the pipeline is at its capacity for this latency; retry after Retry-After "
        "seconds, slow down, allow more time, or add instances",
        retry_after_s=verdict.retry_after_s,
        timeout_s=timeout_s,
        estimate_ms=verdict.estimate_ms,
        hold_s=refusal_hold_s(
            _latency_wait_s(s, verdict, left_ms),
            left_ms,
            None
            if verdict.estimate_ms is None
            else min(verdict.estimate_ms, max(0.0, timeout_s * 1e3 - s.spent_ms)),
        ),
    )


def _latency_wait_s(s: ArrivalSnapshot, verdict: Admission, left_ms: float) -> float | None:
    """:func:`gate_wait_ms` of a latency refusal, s: until its estimate, scaled by the
    lenience, fits ``left_ms`` (the estimate falls as the queue ahead drains), one
    bottleneck interval more per refusal held ahead of it (None: no estimate)."""
    est = verdict.estimate_ms
    if est is None or not math.isfinite(est):
        return None
    interval = s.interval_ms
    if s.units:  # the bottleneck's interval: 1000 / the pipeline's capacity
        ms, c = zip(*s.units, strict=True)
        interval = 1e3 / capacity_rps(ms, [max(1, int(n)) for n in c])
    elif interval is None:
        interval = s.service_ms
    return gate_wait_ms(est - left_ms / s.lenience, s.held, interval) / 1e3


class ByteBudget:
    """The service's budget of request bytes in flight, and each client's share of it
    (thread-safe; the state the pure :func:`admit_bytes` decides on).

    Args:
        budget_bytes: bytes held at once (None: unbounded).
        peer_budget_bytes: bytes one peer key (a client uid) may hold at once (None:
            unbounded); keys passed as None (the service's own user, root, in-process
            callers) are held to the service-wide budget only.
    """

    def __init__(self, budget_bytes: int | None, peer_budget_bytes: int | None = None) -> None:
        for what, v in (("in-flight", budget_bytes), ("per-peer in-flight", peer_budget_bytes)):
            if v is not None and v <= 0:
                raise ValueError(f"the {what} budget must be > 0 bytes, got {v}")
        self.budget_bytes = budget_bytes
        self.peer_budget_bytes = peer_budget_bytes
        self.inflight_bytes = 0
        self.peak_bytes = 0
        self.refused = 0
        self.refused_peer = 0
        self._by_peer: dict[Any, int] = {}
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, peer: Any = None) -> Admission:
        """Reserve ``nbytes`` for ``peer`` (None: not limited per peer) if
        :func:`admit_bytes` admits them (then :meth:`release` them, with the same
        ``peer``, once the request is answered)."""
        with self._lock:
            held = 0 if peer is None else self._by_peer.get(peer, 0)
            verdict = admit_bytes(
                nbytes,
                self.inflight_bytes,
                self.budget_bytes,
                peer_inflight_bytes=held,
                peer_budget_bytes=None if peer is None else self.peer_budget_bytes,
            )
            if verdict.admit:
                self.inflight_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.inflight_bytes)
                if peer is not None:
                    self._by_peer[peer] = held + nbytes
            else:
                self.refused += 1
                if "one user" in verdict.reason:
                    self.refused_peer += 1
            return verdict

    def charge(self, nbytes: int, peer: Any = None) -> None:
        """Count ``nbytes`` as held by ``peer`` (None: service-wide only) whatever the
        budget says (bytes the service holds already, such as a response its client has
        not read: they make the next :meth:`reserve` refuse); :meth:`release` them as
        reserved ones.

        Raises:
            ValueError: a negative size.
        """
        if nbytes < 0:
            raise ValueError("byte counts must be >= 0")
        with self._lock:
            self.inflight_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.inflight_bytes)
            if peer is not None:
                self._by_peer[peer] = self._by_peer.get(peer, 0) + nbytes

    def release(self, nbytes: int, peer: Any = None) -> None:
        with self._lock:
            self.inflight_bytes = max(0, self.inflight_bytes - nbytes)
            if peer is not None:
                left = self._by_peer.get(peer, 0) - nbytes
                if left > 0:
                    self._by_peer[peer] = left
                else:
                    self._by_peer.pop(peer, None)

    def stats(self) -> dict[str, int | None]:
        with self._lock:
            return {
                "budget_bytes": self.budget_bytes,
                "inflight_bytes": self.inflight_bytes,
                "peak_bytes": self.peak_bytes,
                "refused": self.refused,
                "peer_budget_bytes": self.peer_budget_bytes,
                "refused_per_peer": self.refused_peer,
                "peers_holding": len(self._by_peer),
            }
