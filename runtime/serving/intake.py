"""The requests the front end admitted and has not answered, and admission at arrival.

:class:`Intake` keeps, under one lock, the admitted requests by sequence number, their
count per client uid and the pipelines with requests in flight. :meth:`Intake.admit`
decides an arrival (:func:`~infscaler.runtime.serving.arrivals.arrival_snapshot`, then
:func:`~infscaler.runtime.serving.arrivals.admit_arrival`) and either registers the
request or counts the refusal and raises it; :meth:`Intake.finish` is the one place a
request leaves. It does no I/O and never blocks beyond its lock: the front end's loop
(:mod:`~infscaler.runtime.serving.frontend`) and the API threads share it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from infscaler.runtime.serving.admission import ArrivalDecision
from infscaler.runtime.serving.arrivals import (
    FrontCounts,
    HeldRefusals,
    admit_arrival,
    arrival_snapshot,
    count_refusal,
    refusal_error,
)
from infscaler.runtime.serving.backlog import IN_PIPELINE, unqueue
from infscaler.runtime.serving.queues import request_level
from infscaler.runtime.serving.requests import PendingRequest
from infscaler.runtime.serving.route import Route
from infscaler.runtime.serving.runners import ITEM_BITS
from infscaler.runtime.serving.states import RequestPhase

__all__ = ["Intake"]

#: sequence numbers wrap below this (a request id is ``seq << ITEM_BITS | item``, 64 bits)
_SEQ_MOD = (1 << (64 - ITEM_BITS)) - 1


class Intake:
    """Admitted requests and their counts (see the module docstring).

    Args:
        max_pending / pending_per_uid / operator_pending: as
            :class:`~infscaler.runtime.serving.frontend.FrontEnd` takes them
            (:func:`~infscaler.runtime.serving.admission.admit_pending`).
        counters: the front end's counters, where refusals are counted.

    Attributes:
        lock: guards everything here and the routes' admission counts (``admitted``,
            ``queued``, ``refusals``, ``dues``).
        pending: admitted requests by sequence number.
        by_uid: requests pending per client uid (the operator's are not counted).
        live: the routes with requests admitted, by ``id`` (pruned at arrivals once
            they have none): admission across pipelines reads their load.
        running: requests inside their pipeline (phases ``running``, ``items``,
            ``post``) per route, by ``id``; a route with none has no entry.
        held: the latency and shedding refusals held and not answered yet, per route
            (:class:`~infscaler.runtime.serving.arrivals.HeldRefusals`): admission holds
            the next one an interval longer per held one.
    """

    def __init__(
        self,
        *,
        max_pending: int,
        pending_per_uid: int | None,
        operator_pending: int,
        counters: collections.Counter,
    ) -> None:
        self.max_pending = max_pending
        self.pending_per_uid = pending_per_uid
        self.operator_pending = operator_pending
        self.counters = counters
        self.lock = threading.Lock()
        self.pending: dict[int, PendingRequest] = {}
        self.by_uid: collections.Counter[int] = collections.Counter()
        self.live: dict[int, Route] = {}
        self.held = HeldRefusals()
        self.running: dict[int, int] = {}
        self._seq = itertools.count(1)

    def admit(
        self,
        route: Route,
        first: dict[str, np.ndarray],
        slot_bytes: int | None,
        fut: concurrent.futures.Future,
        *,
        timeout_s: float | None,
        arrived_s: float | None,
        level: int,
        uid: int | None,
        queue_s: float | None,
        order: Callable[[], int],
        front: tuple[str | None, bool],
        deadlines: Any = None,
    ) -> PendingRequest:
        """Decide an arrival now and register it (its route's counts, its deadline in
        ``deadlines``, the :class:`~infscaler.shm.deadlines.DeadlineTable` or None), or
        count its refusal. ``first``: its first slot's tensors, ``slot_bytes`` their size
        (None: unknown); ``arrived_s``: when it
        reached the service (monotonic s; None: now); ``queue_s``: its queue timeout, s
        (None: none); ``order``: its backlog arrival order, called once admitted;
        ``front``: the front end's ``(failure, closing)``.

        Raises:
            RequestError: the refusal (:func:`~infscaler.runtime.serving.arrivals.refusal_error`).
        """
        with self.lock:
            now = time.monotonic()
            arrived = now if arrived_s is None else min(float(arrived_s), now)
            overloaded = route.overloaded(now)
            decision = self._judge(route, timeout_s, now, arrived, overloaded, level, uid, front)
            if not decision.admit:
                raise refusal_error(decision)
            assert decision.timeout_s is not None
            seq = next(self._seq) % _SEQ_MOD or 1  # never 0 / NO_REQUEST
            deadline = arrived + decision.timeout_s
            p = PendingRequest(
                seq, route, first, fut, deadline, time.monotonic_ns(), level=level, uid=uid
            )
            p.slot_bytes = slot_bytes
            p.order = order()
            if queue_s is not None:
                p.queue_deadline = arrived + queue_s
            route.queued[level] += 1
            if route.measured:
                p.estimate_ms = decision.estimate_ms
                p.estimate_factor = route.factor(overloaded)
            if decision.estimate_ms is not None:
                route.dues[seq] = now + decision.estimate_ms / 1e3
            self.pending[seq] = p
            if uid is not None:
                self.by_uid[uid] += 1
            route.admitted += 1
            self.live[id(route)] = route
            if deadlines is not None:
                deadlines.set(seq, deadline)
        return p

    def precheck(
        self, route: Route, uid: int | None, front: tuple[str | None, bool]
    ) -> ArrivalDecision:
        """The admission decision for a request whose body is not read yet (the pipeline's own
        timeout and priority; counts nothing but a refusal, queues nothing)."""
        with self.lock:
            now = time.monotonic()
            overloaded = route.overloaded(now)
            level = request_level(None, route.pipeline.config.priority)
            return self._judge(route, None, now, now, overloaded, level, uid, front)

    def _judge(
        self,
        route: Route,
        timeout_s: float | None,
        now: float,
        arrived: float,
        overloaded: bool,
        level: int,
        uid: int | None,
        front: tuple[str | None, bool],
    ) -> ArrivalDecision:
        """:func:`~infscaler.runtime.serving.arrivals.admit_arrival` on the
        :func:`~infscaler.runtime.serving.arrivals.arrival_snapshot` of these counts and the
        front end's ``(failure, closing)``, over the pipelines with requests in flight; a
        refusal is counted and held (call under the lock)."""
        for key in [k for k, r in self.live.items() if r.admitted <= 0]:
            del self.live[key]
        snap = arrival_snapshot(
            route,
            FrontCounts(
                failure=front[0],
                closing=front[1],
                pending=len(self.pending),
                max_pending=self.max_pending,
                uid_pending=0 if uid is None else self.by_uid[uid],
                pending_per_uid=self.pending_per_uid,
                operator_pending=self.operator_pending,
            ),
            timeout_s=timeout_s,
            now=now,
            arrived=arrived,
            overloaded=overloaded,
            level=level,
            uid=uid,
            held=self.held.count(id(route), now),
        )
        decision = admit_arrival(snap, route, self.live.values())
        if not decision.admit:
            count_refusal(route, self.counters, decision)
            self.held.add(id(route), now, decision.hold_s)
        return decision

    def start(self, p: PendingRequest) -> None:
        """``p`` leaves its queue and enters its pipeline (phase ``running``)."""
        with self.lock:
            unqueue(p)
            p.move(RequestPhase.RUNNING)
            key = id(p.route)
            self.running[key] = self.running.get(key, 0) + 1

    def finish(self, p: PendingRequest) -> bool:
        """``p`` leaves the pending requests, its queue or its pipeline, its route's
        admitted count and its uid's count (call before its phase becomes ``done``).
        False when it had already left."""
        with self.lock:
            if self.pending.pop(p.seq, None) is None:
                return False
            unqueue(p)
            if p.phase in IN_PIPELINE:
                key = id(p.route)
                left = self.running.get(key, 0) - 1
                if left > 0:
                    self.running[key] = left
                else:
                    self.running.pop(key, None)
            p.route.admitted -= 1
            p.route.dues.pop(p.seq, None)
            if p.uid is not None:
                self.by_uid[p.uid] -= 1
                if self.by_uid[p.uid] <= 0:
                    self.by_uid.pop(p.uid, None)
        return True
