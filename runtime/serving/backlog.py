"""The front end's backlog pass, as decisions: what becomes of a queued request.

:func:`backlog_step` decides, for the request the backlog hands out next, whether it is
dropped (answered already), expired, timed out in the queue, kept waiting for its
pipeline's window or for the pool, or started; :func:`over_admission` is the pool's
admission threshold. The front end's loop (:meth:`FrontEnd._start_backlog
<infscaler.runtime.serving.frontend.FrontEnd._start_backlog>`) acts on them. The errors a
queued request fails with are built here (:func:`queue_timeout_error`,
:func:`expiry_error`); :func:`unqueue` keeps a route's queued counts. Pure: no I/O, no
locks (the callers hold the front end's where it says so). Queue order and Triton's
queue policy: :mod:`~infscaler.runtime.serving.queues`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

from infscaler.runtime.serving.requests import PendingRequest, RequestError
from infscaler.runtime.serving.states import RequestPhase

__all__ = [
    "IN_PIPELINE",
    "Step",
    "backlog_step",
    "expiry_error",
    "over_admission",
    "queue_due",
    "queue_timeout_error",
    "unqueue",
]

#: the phases of a request inside its pipeline (counted against ``Route.max_inflight``)
IN_PIPELINE = (RequestPhase.RUNNING, RequestPhase.ITEMS, RequestPhase.POST)


class Step(enum.Enum):
    """What :func:`backlog_step` decided for a queued request."""

    DROP = "drop"  # answered already (cancelled, failed): forget it
    EXPIRE = "expire"  # its deadline passed before it started: 503, nothing computed
    QUEUE_TIMEOUT = "queue_timeout"  # its queue timeout passed (REJECT or DELAY)
    WAIT = "wait"  # its pipeline's window is full, or the pool is: keep its place
    TRY = "try"  # it may start, if the pool's admission threshold allows


def backlog_step(p: PendingRequest, now: float, *, window_full: bool, pool_full: bool) -> Step:
    """The fate of queued request ``p`` at ``now`` (monotonic s): ``window_full``, its
    pipeline has ``Route.max_inflight`` requests in it; ``pool_full``, a request ahead
    of it in this pass found the pool at its threshold (nothing more starts this pass)."""
    if p.phase is RequestPhase.DONE:
        return Step.DROP
    if p.deadline <= now:
        return Step.EXPIRE
    if not p.delayed and p.queue_deadline is not None and p.queue_deadline <= now:
        return Step.QUEUE_TIMEOUT
    if pool_full or window_full:
        return Step.WAIT
    return Step.TRY


def over_admission(
    in_use_bytes: int, slot_bytes: int, admit_bytes: int | None, running: int
) -> bool:
    """Whether starting a request whose first slot takes ``slot_bytes`` would take the
    pool's bytes in use (``in_use_bytes``) past ``admit_bytes`` (None: no threshold).
    With no request in any pipeline (``running`` 0) it never is: one request always
    starts, else nothing would ever free a slot."""
    return admit_bytes is not None and running > 0 and in_use_bytes + slot_bytes > admit_bytes


def queue_due(waiting: Iterable[tuple[object, PendingRequest]]) -> float:
    """The nearest queue timeout of the requests left ``waiting`` (monotonic s; inf:
    none), the ``DELAY``-ed ones (already past theirs) not counted."""
    return min(
        (p.queue_deadline for _, p in waiting if p.queue_deadline and not p.delayed),
        default=math.inf,
    )


def unqueue(p: PendingRequest) -> None:
    """``p`` leaves its route's queued count (call under the front end's lock, before its
    phase changes; nothing when it is not queued)."""
    if p.phase is RequestPhase.QUEUED:
        left = p.route.queued[p.level] - 1
        if left > 0:
            p.route.queued[p.level] = left
        else:
            p.route.queued.pop(p.level, None)


def queue_timeout_error(p: PendingRequest, waited_ms: float) -> RequestError:
    """The 503 of a request whose queue timeout passed with ``timeout_action`` REJECT,
    after waiting ``waited_ms`` ms (Triton's ``ModelQueuePolicy``)."""
    return RequestError(
        f"pipeline {p.route.pipeline.name}: queue timeout: not started within its "
        f"queue timeout (waited {waited_ms:.0f} ms at priority {p.level}; "
        "timeout_action REJECT)",
        503,
        "retry later, give the request a higher priority, or raise queue_policy.default_timeout_ms",
        retry_after_s=0.05,
        code="queue_timeout",
    )


def expiry_error(p: PendingRequest) -> RequestError:
    """The 503 of a request past its deadline: code ``pool_full`` when it never started
    because the tensor pool stayed at its threshold, else ``timeout``."""
    pool = p.phase is RequestPhase.QUEUED and p.busy_since is not None
    if pool:
        why = "the tensor pool stayed at its memory cap"
    else:
        why = f"no result within its timeout ({p.deadline - p.t_submit_ns / 1e9:.3g} s)"
    return RequestError(f"request timed out: {why}", 503, code="pool_full" if pool else "timeout")
