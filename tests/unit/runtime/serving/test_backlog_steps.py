"""The backlog pass's decisions (runtime/serving/backlog.py), without a front end."""

from __future__ import annotations

import collections
import concurrent.futures
import math
from types import SimpleNamespace

import numpy as np
import pytest

from infscaler.runtime.serving.admission import ArrivalDecision, Refusal
from infscaler.runtime.serving.arrivals import first_slot, refusal_error
from infscaler.runtime.serving.backlog import (
    Step,
    backlog_step,
    expiry_error,
    over_admission,
    queue_due,
    queue_timeout_error,
    unqueue,
)
from infscaler.runtime.serving.intake import Intake
from infscaler.runtime.serving.pipeline import TRACE
from infscaler.runtime.serving.requests import PendingRequest, RequestError
from infscaler.runtime.serving.states import RequestPhase


def _route(name: str = "p") -> SimpleNamespace:
    return SimpleNamespace(
        pipeline=SimpleNamespace(name=name, front_inputs=("x",)), queued=collections.Counter()
    )


def _request(route=None, *, deadline: float = 10.0, level: int = 1, **kw) -> PendingRequest:
    p = PendingRequest(
        1, route or _route(), {}, concurrent.futures.Future(), deadline, 0, level=level
    )
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_step_order_done_then_deadline_then_queue_timeout_then_room() -> None:
    done = _request(deadline=0.0, phase=RequestPhase.DONE)
    assert backlog_step(done, 5.0, window_full=False, pool_full=False) is Step.DROP
    late = _request(deadline=5.0, queue_deadline=1.0)
    assert backlog_step(late, 5.0, window_full=True, pool_full=True) is Step.EXPIRE
    q = _request(queue_deadline=4.0)
    assert backlog_step(q, 5.0, window_full=True, pool_full=False) is Step.QUEUE_TIMEOUT
    delayed = _request(queue_deadline=4.0, delayed=True)
    assert backlog_step(delayed, 5.0, window_full=True, pool_full=False) is Step.WAIT
    fresh = _request(queue_deadline=6.0)
    assert backlog_step(fresh, 5.0, window_full=False, pool_full=True) is Step.WAIT
    assert backlog_step(fresh, 5.0, window_full=False, pool_full=False) is Step.TRY


def test_over_admission_lets_one_request_start_on_an_idle_pipeline() -> None:
    assert over_admission(90, 20, 100, running=1)
    assert not over_admission(80, 20, 100, running=1)
    assert not over_admission(90, 20, 100, running=0)
    assert not over_admission(90, 20, None, running=3)


def test_queue_due() -> None:
    waiting = [((1, 0, 0), _request(queue_deadline=3.0)), ((1, 0, 1), _request())]
    waiting.append(((1, 1, 2), _request(queue_deadline=1.0, delayed=True)))
    assert queue_due(waiting) == 3.0
    assert queue_due([]) == math.inf


def test_unqueue_counts_down_and_forgets_an_empty_level() -> None:
    route = _route()
    route.queued.update({1: 2, 3: 1})
    unqueue(_request(route, level=1))
    unqueue(_request(route, level=3))
    unqueue(_request(route, level=1, phase=RequestPhase.RUNNING))  # not queued: no change
    assert dict(route.queued) == {1: 1}


def test_errors_carry_their_codes() -> None:
    q = queue_timeout_error(_request(_route("det"), level=2), 51.4)
    assert (q.status, q.code, q.retry_after_s) == (503, "queue_timeout", 0.05)
    assert "det" in str(q) and "51 ms at priority 2" in str(q)
    pool = expiry_error(_request(busy_since=1.0))
    assert (pool.status, pool.code) == (503, "pool_full")
    late = expiry_error(_request(phase=RequestPhase.RUNNING, busy_since=1.0, deadline=2.0))
    assert late.code == "timeout" and "(2 s)" in str(late)


def test_refusal_error_and_first_slot() -> None:
    d = ArrivalDecision(
        False,
        refusal=Refusal.QUEUE_FULL,
        status=503,
        reason="full",
        hint="retry",
        retry_after_s=0.5,
        hold_s=0.1,
    )
    e = refusal_error(d)
    assert (e.status, e.code, e.retry_after_s, e.hold_s) == (503, "queue_full", 0.5, 0.1)
    route = _route()
    x = np.zeros((4, 4), np.float32)
    first, nbytes = first_slot(route, {"x": x, "other": x}, None)
    assert set(first) == {"x", TRACE} and nbytes is not None and nbytes >= x.nbytes
    with pytest.raises(RequestError) as info:
        first_slot(route, {"x": x}, nbytes - 1)
    assert (info.value.status, info.value.code) == (413, "too_large")


def test_intake_counts_requests_inside_their_pipeline() -> None:
    intake = Intake(
        max_pending=8, pending_per_uid=None, operator_pending=0, counters=collections.Counter()
    )
    a, b = _route("a"), _route("b")
    for r in (a, b):
        r.admitted, r.dues = 0, {}
    reqs = []
    for seq, route in enumerate((a, a, b), start=1):
        p = _request(route)
        p.seq = seq
        route.queued[1] += 1
        route.admitted += 1
        intake.pending[seq] = p
        reqs.append(p)
    intake.start(reqs[0])
    intake.start(reqs[2])
    assert intake.running == {id(a): 1, id(b): 1}
    assert reqs[0].phase is RequestPhase.RUNNING and dict(a.queued) == {1: 1}
    assert intake.finish(reqs[1])  # never started: the running counts stay
    assert intake.running == {id(a): 1, id(b): 1} and not a.queued
    assert intake.finish(reqs[0]) and intake.finish(reqs[2])
    assert intake.running == {} and not intake.pending
    assert not intake.finish(reqs[0])  # once only
    assert (a.admitted, b.admitted) == (0, 0)
