"""The front end: where requests enter and leave the token pipeline (InfScaler §IV-B).

It is the instance of stage 0 (id ``FRONTEND_INSTANCE``) in the service process. A
request's input tensors are written once into a pool slot and a DATA token goes to an
instance of the pipeline's first unit; from there instances hand tokens to each other
directly. Tokens come back here at the end, for a fan-in (the front end gathers a
request's items and calls the fan-in function, then hands the result on), and with an
``__error__`` when a unit failed.

One thread owns the :class:`~infscaler.shm.manager.InstanceClient` (it is single-
threaded); other threads talk to it through a command queue and a wake-up pipe, and
get :class:`concurrent.futures.Future` results. The thread sleeps in ``poll(2)`` on
its control socket and the pipe: event driven.

Request ids: ``seq << 16 | item`` (item 0 for the request itself, ``i + 1`` for item
``i`` of a fan-out); duplicates (a unit retried after a crash re-emits) are dropped here.
Decisions live apart from this loop: admission and the admitted requests in
:mod:`~infscaler.runtime.serving.intake` (and ``arrivals``), the backlog pass's in
:mod:`~infscaler.runtime.serving.backlog`. More: docs/serving.md, "`runtime/serving/frontend.py`".
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import math
import os
import select
import time
from typing import Any

import numpy as np

from infscaler.base.threads import NamedThread
from infscaler.ebpf.channel import Endpoint
from infscaler.ebpf.errors import ChannelClosed
from infscaler.runtime.serving.admission import ArrivalDecision
from infscaler.runtime.serving.arrivals import EMPTY_TRACE, first_slot
from infscaler.runtime.serving.backlog import (
    Step,
    backlog_step,
    expiry_error,
    over_admission,
    queue_due,
    queue_timeout_error,
)
from infscaler.runtime.serving.intake import Intake
from infscaler.runtime.serving.lentslot import LentSlot
from infscaler.runtime.serving.pipeline import (
    ERROR,
    FANOUT,
    FRONTEND_INSTANCE,
    TRACE,
    error_status,
)
from infscaler.runtime.serving.queues import PriorityBacklog, queue_timeout_s, request_level
from infscaler.runtime.serving.requests import PendingRequest, RequestError
from infscaler.runtime.serving.route import Result, Route, merge_traces
from infscaler.runtime.serving.runners import ITEM_BITS, ITEM_MASK, StageError, check_outputs
from infscaler.runtime.serving.states import RequestPhase
from infscaler.shm import BackPressureError, RequestFailed
from infscaler.shm.client import InstanceClient
from infscaler.shm.deadlines import DeadlineTable
from infscaler.shm.slab import PoolError
from infscaler.shm.slabmap import SlabMap
from infscaler.shm.tensors import SlotFormatError, allocate_tensors, tensors_nbytes

__all__ = ["FrontEnd", "LentSlot", "RequestError"]

log = logging.getLogger("infscaler.frontend")

#: the longest the front end waits for the manager's answer (GRANT / BUSY) to a fault, s
_HANDOVER_TIMEOUT_S = 0.1
#: the front end dies when this many loop turns failed within _ERROR_WINDOW_S seconds
_MAX_ERRORS, _ERROR_WINDOW_S = 50, 5.0


class FrontEnd:
    """Stage 0 of every pipeline (see the module docstring).

    Args:
        manager: the running :class:`~infscaler.shm.manager.TensorSharingManager`.
        service_id: the pool's service id.
        max_pending: requests admitted at once; beyond it :meth:`submit` refuses (503).
        pending_per_uid: requests one client uid (not the operator) may have admitted at
            once (None: no per-uid cap); ``operator_pending``: of ``max_pending``, how
            many only the operator may use
            (:func:`~infscaler.runtime.serving.admission.admit_pending`).
        max_out_tokens: result slots kept for reuse as input slots.
        pool: the service's :class:`~infscaler.shm.pool.TensorPool` (same process), for
            admission: a new request enters the pipeline only while the slots in use
            stay under ``admit_fraction`` of the cap, so the stages downstream always
            find room for their outputs (a front end that filled the pool with inputs
            would deadlock the pipeline); it waits in the backlog meanwhile.
        on_death: called (from the dying thread) with the reason when the front end
            thread fails (see the module docstring).
    """

    def __init__(
        self,
        manager: Any,
        service_id: str,
        *,
        max_pending: int = 1024,
        pending_per_uid: int | None = None,
        operator_pending: int = 0,
        max_out_tokens: int = 4,
        pool: Any = None,
        admit_fraction: float = 0.5,
        on_death: Any = None,
    ) -> None:
        self.manager = manager
        self.counters: collections.Counter[str] = collections.Counter()
        #: the admitted requests and their counts (:class:`~infscaler.runtime.serving.intake.Intake`)
        self.intake = Intake(
            max_pending=max_pending,
            pending_per_uid=pending_per_uid,
            operator_pending=operator_pending,
            counters=self.counters,
        )
        self._lock, self._pending = self.intake.lock, self.intake.pending
        self.pool = pool
        self.admit_bytes = None if pool is None else int(pool.cap_bytes * admit_fraction)
        sock = manager.add_instance(0, FRONTEND_INSTANCE)
        self._endpoint = Endpoint(sock, FRONTEND_INSTANCE)
        self._slabs = SlabMap(service_id)
        self.client = InstanceClient(
            self._endpoint, self._slabs, FRONTEND_INSTANCE, 0, max_out_tokens=max_out_tokens
        )
        self._backlog: PriorityBacklog[PendingRequest] = PriorityBacklog()
        self._commands: collections.deque[tuple] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._woken = False  # a wake-up was written and the loop has not begun its turn
        #: slots the pool freed (its listener counts them), whether the backlog waits for
        #: one (the next free then wakes the loop) and its nearest queue timeout
        self._freed, self._pool_armed, self._queue_due = 0, False, math.inf
        self._nearest = math.inf  # the nearest deadline of a pending request (_expire)
        if getattr(pool, "free_listeners", None) is not None:
            pool.free_listeners.append(self._on_pool_free)
        self._closing = False
        #: lends that found no idle out-token, for as many spare slots (_hand_over)
        self._lend_misses = 0
        #: answers of the token being received, set after its slot is done (_receive_all)
        self._answers: list[tuple[concurrent.futures.Future, Result]] | None = None
        #: why the front end thread died (None while it runs)
        self.failure: str | None = None
        self.on_death = on_death
        self._errors: collections.deque[float] = collections.deque(maxlen=_MAX_ERRORS)
        self.deadlines: Any = None
        try:
            self.deadlines = DeadlineTable(service_id, create=True)
        except OSError as exc:  # instances then compute every request (the old behaviour)
            log.warning("no deadline table (expired requests are computed): %s", exc)
        manager.request_dead = None if self.deadlines is None else self._request_dead
        self._thread = NamedThread(target=self._run_guarded, name="isc-frontend", daemon=True)
        self._thread.start()

    # -- API (any thread) --------------------------------------------------------------------
    def submit(
        self,
        route: Route,
        inputs: dict[str, np.ndarray],
        timeout_s: float | None = None,
        arrived_s: float | None = None,
        *,
        priority: int | None = None,
        queue_timeout_us: int | None = None,
        uid: int | None = None,
        slot: LentSlot | None = None,
    ) -> concurrent.futures.Future:
        """Queue a request; returns a future of :class:`~infscaler.runtime.serving.route.Result` (or :class:`RequestError`).

        ``inputs`` must already be validated against the pipeline's input specs.
        ``timeout_s``: the request's deadline from now, seconds (None, or longer than
        the pipeline's ``request_timeout_s``: that). ``arrived_s``: when the request
        reached the service (``time.monotonic()`` seconds; the server takes it before
        reading the body):
        the deadline and the latency budget count from there (default: now).
        Cancelling the returned future drops the request (frees its slots; nothing more
        is computed for it). ``priority``: its level (1 highest; None or 0: the
        pipeline's ``priority``, and never higher than that); ``queue_timeout_us``:
        Triton's ``timeout`` parameter, µs, honoured with the queue policy's
        ``allow_timeout_override`` (:mod:`~infscaler.runtime.serving.queues`). ``uid``: the
        client's uid, counted against ``pending_per_uid`` (None: the service's own
        user, root or an in-process caller, held to ``max_pending`` only). ``slot``: the
        first slot from :meth:`lend_first_slot` that ``inputs`` are views of (written in
        full): handed over as it is; it is released whenever the request ends before
        that, a refusal here included.

        Raises:
            RequestError: (400) ``timeout_s`` not a positive finite number, ``priority``
                out of range; (413) its inputs take more than :attr:`max_input_bytes`
                (refused before anything is queued); (503) the
                front end failed, the pipeline is not accepting requests (being
                removed, or the service drains), ``max_pending`` requests are in
                flight (or the uid's share of them), the pipeline's queue is full
                (``max_queue_size``), the pipeline
                sheds load, or (with an SLO) the request could not
                finish within it (``retry_after_s`` set).
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        config = route.pipeline.config
        try:
            first, slot_bytes = first_slot(route, inputs, self.max_input_bytes)
            try:
                level = request_level(priority, config.priority)
            except ValueError as exc:
                raise RequestError(str(exc), 400, "give priority 1 (highest) or more") from None
            policy = config.queue_policy
            queue_s = queue_timeout_s(
                policy.default_timeout_ms,
                policy.allow_timeout_override,
                queue_timeout_us,
                config.request_timeout_s,
            )
            p = self.intake.admit(
                route,
                first,
                slot_bytes,
                fut,
                timeout_s=timeout_s,
                arrived_s=arrived_s,
                level=level,
                uid=uid,
                queue_s=queue_s,
                order=self._backlog.next_order,
                front=(self.failure, self._closing),
                deadlines=self.deadlines,
            )
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if slot is not None:
            p.slot = slot
            if p.phase is RequestPhase.DONE:  # ended meanwhile (another thread): not sent
                slot.release()
        seq = p.seq
        route.stats.arrival()
        fut.add_done_callback(lambda f, seq=seq: self._on_future_done(f, seq))
        self._command(("submit", p))
        if self.failure is not None:  # it died meanwhile: nothing will serve this one
            self._complete_error(
                p, RequestError(f"the front end failed: {self.failure}", code="failed")
            )
        return fut

    def precheck(self, route: Route, uid: int | None = None) -> ArrivalDecision:
        """:func:`~infscaler.runtime.serving.admission.admit_request` for a request whose
        body is not read yet (counts nothing, queues nothing): the pipeline's own timeout
        and priority, the most lenient a request may ask for, so what this refuses
        :meth:`submit` would refuse too. A refusal is counted as :meth:`submit`'s are
        (:meth:`Intake.precheck <infscaler.runtime.serving.intake.Intake.precheck>`)."""
        return self.intake.precheck(route, uid, (self.failure, self._closing))

    def lend_first_slot(
        self, route: Route, inputs: dict[str, tuple[tuple[int, ...], np.dtype]]
    ) -> LentSlot | None:
        """Any thread: a first slot for a request of ``route`` whose ``inputs`` (name ->
        ``(shape, dtype)``, the request's binary inputs) are known before their bytes
        are read: an idle out-token of the front end laid out as :meth:`submit` would
        write them (the pipeline's front inputs, then the empty trace). None (read the
        bytes elsewhere) when the names are not exactly the front inputs, the layout is
        refused, it is over :attr:`max_input_bytes`, or no out-token is large enough.
        The caller writes every byte of :attr:`LentSlot.views` and passes it to
        :meth:`submit`, or calls :meth:`LentSlot.release`.
        """
        front = route.pipeline.front_inputs
        if len(inputs) != len(front) or any(n not in inputs for n in front):
            return None
        specs, nbytes = first_slot(route, inputs, None)
        limit = self.max_input_bytes
        if nbytes is None or (limit is not None and nbytes > limit) or self.failure is not None:
            return None
        lent = self.client.lend(nbytes)
        if lent is None:  # the next request read as before faults a new slot, a spare
            self._lend_misses = min(self._lend_misses + 1, self.client.max_out_tokens)
            return None
        token, view = lent
        try:
            arrays = allocate_tensors(view, specs)
            np.copyto(arrays[TRACE], EMPTY_TRACE)
            views = {n: memoryview(arrays[n].reshape(-1).view(np.uint8)) for n in front}
        except BaseException:
            self.client.give_back(token)
            raise
        return LentSlot(self.client, token, nbytes, views)

    @property
    def max_pending(self) -> int:
        """Requests admitted at once (the constructor's ``max_pending``)."""
        return self.intake.max_pending

    @property
    def pending_per_uid(self) -> int | None:
        """Requests one client uid may have admitted at once (None: no cap)."""
        return self.intake.pending_per_uid

    @property
    def operator_pending(self) -> int:
        """Of :attr:`max_pending`, how many only the operator may use."""
        return self.intake.operator_pending

    @property
    def max_input_bytes(self) -> int | None:
        """The most bytes a request's first slot may take (its input tensors as
        :func:`~infscaler.shm.tensors.tensors_nbytes` lays them out): the pool's largest
        slot, or its cap when that is smaller (None without a pool). A larger request
        could never be granted a slot."""
        if self.pool is None:
            return None
        return min(self.pool.size_classes[-1], self.pool.cap_bytes)

    def _on_future_done(self, fut: concurrent.futures.Future, seq: int) -> None:
        if fut.cancelled():  # the caller gave up (client disconnect): drop the request
            self._command(("cancel", seq))

    def alive(self) -> bool:
        """The front end thread runs and has not failed."""
        return self.failure is None and self._thread.is_alive()

    def _request_dead(self, request: int) -> bool:
        table = self.deadlines
        return table is not None and table.dead(request)

    def fail_request(self, request: int, reason: str) -> None:
        """The manager failed ``request`` (any thread)."""
        self._command(("fail", request >> ITEM_BITS, reason))

    def pending(self, route: Route | None = None) -> int:
        with self._lock:
            return sum(1 for p in self._pending.values() if route is None or p.route is route)

    def pending_by_uid(self) -> dict[int, int]:
        """Requests pending per client uid (a copy; the operator's are not counted)."""
        with self._lock:
            return dict(self.intake.by_uid)

    def queues(self, route: Route) -> tuple[dict[int, int], dict[str, int]]:
        """``route``'s requests queued per priority level and its refusals by reason
        (copies, read under the lock; see :class:`~infscaler.runtime.serving.route.Route`)."""
        with self._lock:
            return dict(sorted(route.queued.items())), dict(route.refusals)

    def drain(self, timeout: float, route: Route | None = None) -> bool:
        """Wait until no request (of ``route``) is in flight; True if none is left."""
        deadline = time.monotonic() + timeout
        while self.pending(route):
            if time.monotonic() >= deadline or self.failure is not None:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        """Fail what is left (503), stop the thread."""
        self._closing = True
        self._command(("close",))
        self._thread.join(5.0)
        self._fail_all(RequestError("the service is stopping", code="stopping"))
        with contextlib.suppress(Exception):
            if self.deadlines is not None:
                self.deadlines.close()
        with contextlib.suppress(Exception):
            self.pool.free_listeners.remove(self._on_pool_free)
        with contextlib.suppress(Exception):
            self._endpoint.close()
        with contextlib.suppress(Exception):
            self._slabs.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            pending, uids = len(self._pending), len(self.intake.by_uid)
            most = max(self.intake.by_uid.values(), default=0)
        return {
            "pending": pending,
            "pending_uids": uids,  # client uids with requests pending
            "pending_uid_max": most,  # the most one of them has pending
            "backlog": len(self._backlog),
            **self.counters,
            "client": self.client.stats(),
        }

    # -- the thread ------------------------------------------------------------------------
    def _command(self, cmd: tuple) -> None:
        self._commands.append(cmd)
        self.wake()

    def wake(self) -> None:
        """Wake the loop (any thread): call it when a pipeline's window
        (``Route.max_inflight``) grows, so requests waiting for it start at once. One
        write to the wake-up pipe per loop turn: while a wake-up is on its way (the loop
        has not begun the turn it starts), what changed before this call is seen by
        that turn, so no second write is needed."""
        if self._woken:
            return
        self._woken = True
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _on_pool_free(self) -> None:
        """The pool freed a slot (the freeing thread, under the pool's lock)."""
        self._freed += 1
        if self._pool_armed:
            self._pool_armed = False
            self.wake()

    def _run_guarded(self) -> None:
        """The thread: :meth:`_run`, and if it ends for any reason but :meth:`close`,
        the front end is dead (module docstring)."""
        reason: str | None
        try:
            reason = self._run()
        except BaseException as exc:  # noqa: BLE001 - recorded, then everything fails fast
            log.critical("front end thread failed", exc_info=True)
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None or self._closing:
            return
        self._die(reason)

    def _die(self, reason: str) -> None:
        self.failure = reason
        self.counters["deaths"] += 1
        log.critical("the front end died (%s): failing every request in flight", reason)
        self._fail_all(RequestError(f"the front end failed: {reason}", code="failed"))
        if self.on_death is not None:
            try:
                self.on_death(reason)
            except Exception:  # noqa: BLE001 - nothing more to do from a dead thread
                log.exception("front end: on_death callback failed")

    def _fail_all(self, exc: RequestError) -> None:
        with self._lock:
            left = list(self._pending.values())
        for p in left:
            self._complete_error(p, exc)

    def _run(self) -> str | None:
        """The loop; returns None on close, else why it ended."""
        poller = select.poll()
        poller.register(self._endpoint.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        mark = self._freed
        while True:
            try:
                try:
                    events = poller.poll(self._timeout_ms(mark))
                except InterruptedError:
                    continue
                self._woken = False  # before the commands: a later wake() writes again
                if any(fd == self._wake_r for fd, _ in events):  # drain the wake-ups
                    with contextlib.suppress(BlockingIOError, OSError):
                        while len(os.read(self._wake_r, 4096)) == 4096:
                            pass
                mark = self._freed  # a free after this is seen by _timeout_ms
                self.counters["loop_turns"] += 1
                if not self._do_commands():
                    return None
                # one send per turn at most for the control tokens (receipts, keeps,
                # frees): they leave with the turn's first DATA / FAULT, else at its end
                with self.client.batched():
                    self._receive()
                    self._expire()  # before the backlog: what it frees starts this turn
                    self._start_backlog()
            except ChannelClosed:
                log.info("front end: control channel closed")
                return None if self._closing else "the control channel closed"
            except Exception:  # noqa: BLE001 - the front end must survive any one request
                log.exception("front end: unexpected error (the request involved is failed)")
                self.counters["internal_errors"] += 1
                now = time.monotonic()
                self._errors.append(now)
                if len(self._errors) == _MAX_ERRORS and now - self._errors[0] < _ERROR_WINDOW_S:
                    return (
                        f"{_MAX_ERRORS} internal errors within {_ERROR_WINDOW_S:g} s "
                        "(see the log for their tracebacks)"
                    )

    def _timeout_ms(self, mark: int) -> int:
        """How long the loop may sleep in ``poll(2)``, ms: 0 with tokens already
        buffered or a slot freed since the backlog last waited for one (``mark``: the
        free count then), else until the nearest deadline or queue timeout (at most
        1 s). Everything else that lets work go on wakes it: a token (results free a
        pipeline's window), a command, :meth:`wake`, the pool's next free."""
        if self._endpoint.pending() or self.client.queued():
            return 0
        if self._pool_armed and self._freed != mark:
            return 0
        nearest = min(self._nearest, self._queue_due) if self._backlog else self._nearest
        left_ms = (nearest - time.monotonic()) * 1000
        if not math.isfinite(left_ms):
            return 1000
        return max(1, min(1000, int(left_ms) + 1))

    def _do_commands(self) -> bool:
        while self._commands:
            cmd = self._commands.popleft()
            if cmd[0] == "submit":
                p = cmd[1]
                self._backlog.push(p, p.level, p.delayed, p.order)
                self._nearest = min(self._nearest, p.deadline)
            elif cmd[0] == "fail":
                with self._lock:
                    p = self._pending.get(cmd[1])
                if p is not None:
                    self._complete_error(
                        p, RequestError(f"request failed: {cmd[2]}", 503, code="instance_failed")
                    )
            elif cmd[0] == "cancel":
                with self._lock:
                    p = self._pending.get(cmd[1])
                if p is not None:
                    self.counters["cancelled"] += 1
                    self._complete_error(p, RequestError("the client cancelled the request", 499))
            elif cmd[0] == "close":
                return False
        return True

    # -- sending -----------------------------------------------------------------------------
    def _start_backlog(self) -> None:
        """Start queued requests in priority order (the highest level first, oldest
        first within a level, the ``DELAY``-ed ones last in their level:
        :mod:`~infscaler.runtime.serving.queues`) while their pipeline's window has room
        (``Route.max_inflight`` requests in the pipeline at once) and the pool is below
        the admission threshold. A request that must wait keeps its place; requests of
        other pipelines behind it may start. A request whose queue timeout passed is
        refused (``REJECT``, 503) or moved behind its level (``DELAY``)."""
        self._pool_armed, self._queue_due = False, math.inf
        if not self._backlog:
            return
        with self._lock:  # requests inside each pipeline, by id(route) (a copy)
            running = dict(self.intake.running)
        total = sum(running.values())
        waiting: list[tuple[tuple[int, int, int], PendingRequest]] = []
        pool_full = False
        now = time.monotonic()
        while self._backlog:
            key, p = self._backlog.pop()
            route = p.route
            window_full = running.get(id(route), 0) >= route.max_inflight
            step = backlog_step(p, now, window_full=window_full, pool_full=pool_full)
            if step is Step.DROP:
                continue
            if step is Step.EXPIRE:  # never started: dropped here, nothing was computed
                self._expire_request(p, "expired_queued")
                continue
            if step is Step.QUEUE_TIMEOUT:
                self._queue_timeout(p)
                continue
            if step is Step.WAIT:
                if not pool_full and "window" not in p.waits:
                    p.waits.add("window")
                    self.counters["window_waits"] += 1
                waiting.append((key, p))
                continue
            tensors = p.inputs
            assert tensors is not None
            if (
                self.admit_bytes is not None
                and total > 0
                and over_admission(
                    self.pool.in_use_bytes(),
                    p.slot_bytes or tensors_nbytes(tensors),
                    self.admit_bytes,
                    total,
                )
            ):
                self._note_wait(p, "admission_waits")
                waiting.append((key, p))
                pool_full = True  # requests in the pipelines must free slots first
                continue
            try:
                slot = p.slot
                if slot is not None and slot.take():
                    p.slot = None
                    self.client.hand_over_lent(
                        slot.token, route.stage_ids[0], p.seq << ITEM_BITS, slot.used
                    )
                else:
                    self._hand_over(tensors, route.stage_ids[0], p.seq << ITEM_BITS)
            except BackPressureError:
                self._note_wait(p, "backpressure")
                waiting.append((key, p))
                pool_full = True  # the pool is at its cap: results must come back first
                continue
            except Exception as exc:  # noqa: BLE001 - this request fails alone
                self._complete_error(p, RequestError(f"cannot start the request: {exc}", 500))
                continue
            p.inputs = None
            self.intake.start(p)
            running[id(route)] = running.get(id(route), 0) + 1
            total += 1
        self._backlog.extend(waiting)
        self._pool_armed = pool_full  # then the pool's next free wakes the loop
        self._queue_due = queue_due(waiting)

    def _queue_timeout(self, p: PendingRequest) -> None:
        """``p``'s queue timeout passed while it waited: ``REJECT`` fails it (503),
        ``DELAY`` queues it again behind every request of its level (Triton's
        ``ModelQueuePolicy.timeout_action``)."""
        route = p.route
        policy = route.pipeline.config.queue_policy
        if policy.timeout_action == "DELAY":
            p.delayed = True
            self.counters["queue_delayed"] += 1
            self._backlog.push(p, p.level, True)
            return
        self.counters["queue_timeout"] += 1
        with self._lock:
            route.refusals["queue_timeout"] += 1
        waited_ms = (time.monotonic_ns() - p.t_submit_ns) / 1e6
        self._complete_error(p, queue_timeout_error(p, waited_ms))

    def _note_wait(self, p: PendingRequest, counter: str) -> None:
        if p.busy_since is None:
            p.busy_since = time.monotonic()
            self.counters[counter] += 1

    def _hand_over(
        self, tensors: dict[str, np.ndarray], stage: int, request: int, retry: bool = False
    ) -> None:
        """Write ``tensors`` into a slot and hand it to ``stage``. At the pool's cap the
        manager's first BUSY raises :class:`BackPressureError` at once (no back-off
        polling in this thread): a new request waits in the backlog for the pool's next
        free (:meth:`_on_pool_free`); ``_HANDOVER_TIMEOUT_S`` bounds the wait for the
        manager's answer. ``retry`` (after a fan-in, where nothing waits in a backlog):
        BUSY is retried with back-off for up to 20 ms. After lends that found no idle
        out-token, a new slot is faulted first (``spare``: the pool grows by the slots
        the readers lack, at most ``max_out_tokens`` at once)."""
        if retry:
            self.client.send_tensors(tensors, stage, request, timeout=0.02)
            return
        # after a lend found no idle out-token: a new slot, so that the out-tokens this
        # would take stay idle for the next request's reader (lend_first_slot)
        spare = self._lend_misses > 0
        self.client.send_tensors(
            tensors, stage, request, timeout=_HANDOVER_TIMEOUT_S, retry_busy=False, spare=spare
        )
        if spare:
            self._lend_misses = max(0, self._lend_misses - 1)

    # -- receiving ---------------------------------------------------------------------------
    def _receive(self) -> None:
        """Take the tokens that came back (results, items, errors) and answer their
        requests; their receipts and frees (or keeps) leave in one send, at the end of
        the loop's turn or with its first DATA / FAULT (the next request's handover
        carries them: :meth:`~infscaler.shm.client.InstanceClient.batched`)."""
        with self.client.batched():
            self._receive_all()

    def _receive_all(self) -> None:
        self.client.poll(0)
        while True:
            try:
                tok, tensors = self.client.recv_input(0)
            except TimeoutError:
                return
            except RequestFailed as exc:
                with self._lock:
                    p = self._pending.get(exc.request >> ITEM_BITS)
                if p is not None:
                    self._complete_error(
                        p, RequestError(f"request {exc.request} failed in the token pipeline")
                    )
                continue
            except (SlotFormatError, PoolError) as exc:
                bad = getattr(exc, "token", None)
                if bad is not None:
                    with self._lock:
                        p = self._pending.get(bad.request >> ITEM_BITS)
                    if p is not None:
                        self._complete_error(p, RequestError(f"unreadable result slot: {exc}", 500))
                    self.client.done(bad, keep=False)
                continue
            answers: list[tuple[concurrent.futures.Future, Result]] = []
            self._answers = answers
            try:
                self._on_token(tok, tensors)
            finally:
                self._answers = None
                del tensors
                # keep result slots for the next inputs (None: while the client holds
                # fewer than max_out_tokens) only while the pool has room
                keep = (
                    None
                    if self.admit_bytes is None or self.pool.in_use_bytes() < self.admit_bytes // 2
                    else False
                )
                self.client.done(tok, keep=keep)
                # answered once the slot is kept: a client's next request, sent as soon as
                # it reads this answer, finds it idle to read its inputs into
                for fut, result in answers:
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        fut.set_result(result)

    def _on_token(self, tok: Any, tensors: dict[str, np.ndarray]) -> None:
        seq, item = tok.request >> ITEM_BITS, tok.request & ITEM_MASK
        with self._lock:
            p = self._pending.get(seq)
        if p is None or p.phase is RequestPhase.DONE:
            self.counters["stale_results"] += 1
            log.debug(
                "stale token request %d (seq %d item %d): %s",
                tok.request,
                seq,
                item,
                "unknown" if p is None else p.phase,
            )
            return
        route = p.route
        if ERROR in tensors:
            if TRACE in tensors:
                p.traces.append(np.array(tensors[TRACE]))
            status, message = error_status(tensors[ERROR])
            self._complete_error(p, RequestError(message, status))
            return
        fi = route.pipeline.fan_in_index
        if fi is not None and p.phase in (RequestPhase.RUNNING, RequestPhase.ITEMS):
            self._on_item(p, item, tensors, fi)
            return
        if p.phase not in (RequestPhase.RUNNING, RequestPhase.POST):
            self.counters["stale_results"] += 1
            return
        if TRACE in tensors:
            p.traces.append(np.array(tensors[TRACE]))
        outputs = {n: np.array(tensors[n]) for n in route.pipeline.output_names}
        self._complete(p, outputs)

    def _on_item(
        self, p: PendingRequest, item: int, tensors: dict[str, np.ndarray], fi: int
    ) -> None:
        route = p.route
        unit = route.pipeline.units[fi]
        fan = tensors.get(FANOUT)
        if fan is None or fan.shape != (2,):
            self._complete_error(p, RequestError("a fan-out item lost its __fanout__ tag", 500))
            return
        index, count = int(fan[0]), int(fan[1])
        if p.phase is not RequestPhase.ITEMS:  # the first item back
            p.move(RequestPhase.ITEMS)
        if p.carry is None:
            p.carry = {k: np.array(tensors[k]) for k in unit.carry if k in tensors}
        if count > 0:
            if item != index + 1 or index in p.items or (p.count not in (None, count)):
                self.counters["duplicate_items"] += 1
                return
            p.count = count
            p.items[index] = {k: np.array(tensors[k]) for k in unit.inputs}
            if TRACE in tensors:
                p.traces.append(np.array(tensors[TRACE]))
            if len(p.items) < count:
                return
        else:
            p.count = 0
            if TRACE in tensors:
                p.traces.append(np.array(tensors[TRACE]))
        # every item is here: run the fan-in
        start = time.monotonic_ns()
        try:
            result = route.fan_in_fn()([p.items[i] for i in range(p.count)], **unit.params)
            result = check_outputs(unit, result)
        except StageError as exc:
            status = getattr(exc, "status", 500)
            self._complete_error(p, RequestError(f"stage {unit.name}: {exc}", status))
            return
        except Exception as exc:  # noqa: BLE001 - the request fails alone
            self._complete_error(
                p, RequestError(f"stage {unit.name}: {type(exc).__name__}: {exc}", 500)
            )
            return
        end = time.monotonic_ns()
        p.items.clear()
        trace = np.array([[fi, FRONTEND_INSTANCE, start, end]], dtype=np.int64)
        p.traces.append(trace)
        out = {**(p.carry or {}), **result}
        nxt = fi + 1
        if nxt >= len(route.pipeline.units):
            self._complete(p, {n: out[n] for n in route.pipeline.output_names})
            return
        out[TRACE] = trace
        p.move(RequestPhase.POST)
        try:
            self._hand_over(out, route.stage_ids[nxt], p.seq << ITEM_BITS, retry=True)
        except Exception as exc:  # noqa: BLE001 - includes back-pressure past the wait
            self._complete_error(p, RequestError(f"cannot continue after the fan-in: {exc}"))

    # -- completion --------------------------------------------------------------------------
    def _expire(self) -> None:
        """Fail the requests past their deadline; note the nearest deadline left (the
        loop sleeps until it). A pass over the pending requests only once the nearest
        deadline noted is due: every request's "submit" command lowers it to its own
        (:meth:`_do_commands`, before this in the same turn), and an answered request
        leaves it early at worst (one pass more)."""
        now, late, nearest = time.monotonic(), [], math.inf
        if now < self._nearest:
            return
        with self._lock:
            for p in self._pending.values():
                if p.deadline <= now:
                    late.append(p)
                elif p.deadline < nearest:
                    nearest = p.deadline
        self._nearest = nearest
        for p in late:
            self._expire_request(p, "expired")

    def _expire_request(self, p: PendingRequest, counter: str) -> None:
        """Fail ``p``, past its deadline, with 503 (counted under ``counter``), and tell
        its route's admission how long it had been waiting (:meth:`Route.record_expiry`)."""
        self.counters[counter] += 1
        elapsed_ms = (time.monotonic_ns() - p.t_submit_ns) / 1e6
        p.route.record_expiry(p.estimate_ms, elapsed_ms, p.estimate_factor)
        self._complete_error(p, expiry_error(p))

    def _finish(self, p: PendingRequest) -> bool:
        """``p`` is answered: it leaves the pending requests, its queue, its route's
        admitted count and its uid's count (the one place every request ends: results,
        errors, expiry, cancellation, close). False when it had already ended."""
        if not self.intake.finish(p):
            return False
        p.move(RequestPhase.DONE)
        return True

    def _complete(self, p: PendingRequest, outputs: dict[str, np.ndarray]) -> None:
        if not self._finish(p):
            return
        if self.deadlines is not None:
            self.deadlines.cancel(p.seq)
        latency_ms = (time.monotonic_ns() - p.t_submit_ns) / 1e6
        trace = merge_traces(p.traces)  # items repeat rows: each counted once
        p.route.stats.record_success(latency_ms, trace, p.t_submit_ns)
        p.route.record_estimate(p.estimate_ms, latency_ms, p.estimate_factor)
        p.route.record_compute(trace)
        self.counters["completed"] += 1
        result = Result(outputs, trace, latency_ms, p.count)
        if self._answers is not None:  # in _receive_all: set once its slot is done
            self._answers.append((p.future, result))
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            p.future.set_result(result)

    def _complete_error(self, p: PendingRequest, exc: RequestError) -> None:
        if not self._finish(p):
            return
        if self.deadlines is not None:  # drop what is left of it in every queue
            self.deadlines.cancel(p.seq)
        p.inputs = None
        if p.slot is not None:  # never handed over: back to the out-tokens
            p.slot.release()
        p.route.stats.record_failure(exc.status)
        self.counters["failed"] += 1
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            p.future.set_exception(exc)
