"""The tensor sharing manager: pool + control path, with leases that hold end to end
(InfScaler §IV-B, Fig. 4: token faults, the OutToken queue, lazy allocation).

Two halves:

- :class:`TensorSharingManager` (service process): one thread blocked on the channel's
  manager socket (event-driven: it sleeps in ``poll(2)`` until a token arrives or a
  timer of its own is due). It answers token faults from the :class:`TensorPool`
  (GRANT, or BUSY at the memory cap), takes frees, keeps the lease table true across
  in-kernel handovers, holds DATA that has nowhere to go, and reclaims what a dead
  instance held (:meth:`TensorSharingManager.instance_died`).
- :class:`InstanceClient` (instance process): the paper's producer / consumer side: an
  OutToken queue of slots it may write, token faults when it is empty, the handover,
  zero-copy input reads, and the small replies the protocol below needs.

The problem this module solves
==============================

With the eBPF channel a DATA handover from producer to consumer is redirected in the
kernel and never reaches the manager, so the pool's lease table would still name the
producer; if that producer died, reclaiming its slots would free one the consumer is
still reading. The lease has to move, and the manager has to be able to tell, when an
instance dies, which of its slots it had handed over.

The protocol (token layout unchanged; conventions on existing kinds)
====================================================================

``I`` an instance, ``M`` the manager. ``CONTROL_STAGE`` = 0xFFFF (no real stage: stages
are below 64), ``NO_REQUEST`` = 2**64-1 (no real request id), ``MANAGER_INSTANCE`` =
0xFFFF (the pool owner of slots the manager holds itself).

======  =========================  ================================================
dir.    token                      meaning
======  =========================  ================================================
I->M    FAULT(stage, length=n,     OutToken queue has no slot >= n bytes: lease one
        request=r)                 (:meth:`TensorPool.fault`)
M->I    GRANT(slot, length=cap,    the slot is leased to I as a *writer*, for r
        request=r)
M->I    BUSY(stage, request=r)     at the cap: back off, fault again (back-pressure)
M->I    ERROR(request=r)           the fault is refused (larger than any slot)
I->I    DATA(stage, slot,          the handover (routed by the channel, in-kernel on
        length=used, request=r)    eBPF); acknowledges I's in-flight input r
I->M    GRANT(slot, request=r)     **receipt**: "I received this DATA slot". Sent by
        (a GRANT *from* an         the consumer as soon as it reads the DATA from its
        instance)                  socket, before it touches the slot. The lease moves
                                   producer -> consumer (a *reader*)
I->M    FREE(slot, request=r)      the slot goes back to the pool (the consumer's FREE
                                   names the slot it received); acknowledges r
I->M    FREE(stage=CONTROL_STAGE,  **keep**: the consumer is done with its input and
        slot, request=r)           keeps the slot as an out-token (reader -> writer,
                                   no request); acknowledges r like a FREE
M->I    BUSY(stage=CONTROL_STAGE,  **sync marker** (see reclaim, step 3)
        request=nonce)
I->M    BUSY(stage=CONTROL_STAGE,  **sync echo**: every DATA queued before the marker
        request=nonce)             has been read and receipted
M->I    DATA(...)                  re-routed DATA (retry of a dead instance's input,
                                   or DATA the manager held)
M->I    ERROR(slot?, request=r)    the manager failed request r (held too long, a slot
                                   it could not account for, too many retries)
M->M    DATA(stage=BARRIER_STAGE,  **barrier**: routed through the channel to the
        slab=NO_SLAB, request=n)   manager's own inbox behind everything sent before
======  =========================  ================================================

Rules an instance follows (:class:`InstanceClient` implements 1, 2 and 4's ordering
when used as documented, and refuses a handover that breaks 1):

1. A slot acquired for request ``r`` is handed over with request ``r`` only.
2. The receipt of a DATA is sent before the instance reads the slot, before its sync
   echo and before any DATA / FREE / keep with that request.
3. After the handover the producer never touches the slot again; a consumer never
   writes the slot it reads (unless it kept it, after acknowledging).
4. Hand over the output of ``r`` before calling ``done`` on the input of ``r`` (the
   handover is the acknowledgement that lets a crash retry exactly the unfinished).

Lease states of a slot in use (the manager's table mirrors the pool's owners)::

    WRITER(I, r | none)   granted to I (fault) or kept by I (keep): I may write it, or has
                          handed it over and its consumer has not receipted it yet
    READER(I, r)          I received it (receipt): I reads it until FREE / keep
    HELD(M)               DATA the manager holds: undeliverable, or waiting for a live
                          instance of its stage (timeout -> ERROR, slot freed)
    TRANSIT(M)            DATA the manager re-routed; the next receipt makes it READER

Reclaim (:meth:`TensorSharingManager.instance_died`, for an instance ``X`` whose
process has exited):

1. ``channel.remove_instance(X)`` returns the DATA delivered to ``X`` and not
   acknowledged, and stops routing to it. Then a **barrier** token is routed through the
   channel to the manager's inbox: it arrives behind every token ``X`` sent before it
   died (eBPF: sends are redirected synchronously, so ``X``'s tokens already sit in the
   inbox; user space: the router is one FIFO thread and drops what it had not read from
   ``X``, atomically per record). Everything ``X`` sent before dying is applied first.
2. At the barrier: each returned DATA slot is taken by the manager and re-routed to a
   live instance of its stage, slot intact (**retried**), or held if there is none.
   ``X``'s READER slots not among them had been acknowledged (``X`` handed its output
   over): **freed**. ``X``'s WRITER slots leased for a request ``r`` whose input is
   among the returned ones were provably never handed over (a handover with request
   ``r`` would have acknowledged that input): **freed**. Every other WRITER slot may
   have been handed over (its receipt not yet sent): **quarantined**, never granted.
3. To settle the quarantined slots, a **sync marker** goes to every live instance,
   behind any DATA already queued for it. An instance answers with an echo after it
   has receipted everything it read before the marker (rule 2); an instance whose own
   death is being reported owes one too, paid by its barrier (which returns its DATA). A receipt for a
   quarantined slot (or the slot turning up as DATA anywhere) means it was handed
   over: it is the consumer's now (**handed_over**; a producer's death never takes a
   slot from its consumer). Once every instance has echoed (or died, which returns its
   DATA), the slots still quarantined were never handed over: **freed**, and a request
   recorded with one is **failed**.

Invariants this gives (tested on both channels in ``tests/test_shm_manager.py``):
(1) a slot is never granted again or freed while a live instance may read or write it;
(2) every slot a dead instance held is reclaimed, and each affected request is retried
or failed and reported (:class:`ReclaimReport`), never lost silently; (3) a producer
that dies after a handover does not take the slot from its consumer.

Limits: the manager trusts a token's ``instance`` field (neither channel stamps the
sender on tokens for the manager), so an instance can impersonate another, and a
receipt for a writer slot that was never handed to its sender cannot be told from a
real one; what is refused is any token inconsistent with the lease table (stale,
double, replayed, or someone else's slot). A quarantined slot stays quarantined until every live instance has
echoed: an instance that never reads its socket delays that (never the other way
round). Stage 63 (``BARRIER_STAGE``) and instance id 0xFFFF are reserved.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infscaler.base.errors import InfScalerError
from infscaler.ebpf.channel import MAX_BATCH, MAX_STAGES, Channel, Endpoint
from infscaler.ebpf.errors import ChannelClosed, ChannelError
from infscaler.shm.pool import PoolError, SlabMap, SlotRef, TensorPool
from infscaler.shm.tensors import SlotFormatError, read_tensors, tensors_nbytes, write_tensors
from infscaler.shm.token import NO_SLAB, TOKEN_SIZE, Token, TokenError, TokenKind

__all__ = [
    "BARRIER_STAGE",
    "CONTROL_STAGE",
    "MANAGER_INSTANCE",
    "NO_REQUEST",
    "BackPressureError",
    "InstanceClient",
    "ReclaimReport",
    "RequestFailed",
    "SharingError",
    "TensorSharingManager",
]

log = logging.getLogger("infscaler.shm")

#: ``stage`` value of control tokens (keep, sync marker, sync echo): no real stage.
CONTROL_STAGE = 0xFFFF
#: The stage the manager's barrier tokens are routed to; never has a live instance.
BARRIER_STAGE = MAX_STAGES - 1
#: Pool owner of the slots the manager holds itself (held / re-routed DATA).
MANAGER_INSTANCE = 0xFFFF
#: A request id no request uses: the ``request`` of frees that acknowledge nothing.
NO_REQUEST = (1 << 64) - 1

_WRITER, _READER, _HELD, _TRANSIT = "writer", "reader", "held", "transit"
_LIVE, _DYING, _DEAD = "live", "dying", "dead"
_DATA, _FAULT, _GRANT, _FREE, _BUSY, _ERROR = (
    TokenKind.DATA,
    TokenKind.FAULT,
    TokenKind.GRANT,
    TokenKind.FREE,
    TokenKind.BUSY,
    TokenKind.ERROR,
)
_MAX_SLEEP_S = 1.0  # the manager thread's longest sleep without a token (housekeeping)
_FAILURES_KEPT = 10_000
_RETRIES_KEPT = 65_536


class SharingError(InfScalerError):
    """The tensor sharing protocol refused an operation: a slot this instance does not
    hold, a request that does not match its slot, an unknown or dead instance, a manager
    that is not running, or a fault the manager refused."""


class BackPressureError(SharingError, TimeoutError):
    """:meth:`InstanceClient.acquire` got no GRANT before its timeout: only BUSY answers
    (the pool is at its memory cap: the pipeline downstream is not returning slots), or
    no answer at all (the manager is not running). The message says which."""


class RequestFailed(SharingError):
    """The manager failed a request (ERROR token), raised by
    :meth:`InstanceClient.recv_input`.

    Attributes:
        request: the request id. token: the ERROR token (its slab / slot name the slot
            it concerned, or ``NO_SLAB``).
    """

    def __init__(self, token: Token) -> None:
        super().__init__(f"the manager failed request {token.request}")
        self.request = token.request
        self.token = token


@dataclass
class ReclaimReport:
    """What :meth:`TensorSharingManager.instance_died` did with a dead instance's slots.

    The manager fills it in its own thread; read it once :attr:`complete` is true
    (:meth:`wait`). Until then :attr:`pending` lists the quarantined slots.

    Attributes:
        instance: the dead instance id. stage: its stage.
        retried: request ids whose unacknowledged input DATA was re-routed to a live
            instance of the same stage, slot intact.
        held: request ids whose DATA waits for a live instance of its stage (re-routed
            when one is added, or failed after ``hold_timeout_s``: then listed in
            ``failed`` too).
        failed: ``(request, reason)`` for requests that cannot continue.
        freed: slots returned to the pool (``SlotRef.request``: the request recorded
            with the lease, ``NO_REQUEST`` for an idle out-token).
        handed_over: slots the instance had handed over before dying; they stay with
            their consumer.
        pending: quarantined slots not settled yet (never granted meanwhile).
        complete: every slot the instance held is accounted for.
    """

    instance: int
    stage: int
    retried: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    freed: list[SlotRef] = field(default_factory=list)
    handed_over: list[SlotRef] = field(default_factory=list)
    pending: list[SlotRef] = field(default_factory=list)
    complete: bool = False
    _done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the report is complete, at most ``timeout`` seconds (None: no
        limit). Returns :attr:`complete`."""
        self._done.wait(timeout)
        return self.complete


@dataclass
class _Slot:
    """The manager's lease record of one slot in use."""

    ref: SlotRef
    owner: int
    role: str
    request: int = NO_REQUEST
    data: Token | None = None  # HELD / TRANSIT: the DATA token to (re-)route
    deadline: float = 0.0  # HELD: fail after
    retry_at: float = 0.0  # HELD: route again from (when the stage has a live instance)
    report: ReclaimReport | None = None  # HELD / TRANSIT from a death: where failures go
    suspect_of: _Death | None = None  # quarantined: the death that must settle it


@dataclass
class _Instance:
    stage: int
    state: str = _LIVE


@dataclass
class _Death:
    instance: int
    stage: int
    report: ReclaimReport
    returned: list[Token]
    suspects: dict[tuple[int, int], SlotRef] = field(default_factory=dict)
    awaiting: set[int] = field(default_factory=set)
    sync_nonce: int | None = None


class TensorSharingManager:
    """The tensor sharing manager of one service (InfScaler §IV-B, Fig. 4).

    Serves the channel's manager socket in one thread (:meth:`start`): token faults
    (lazy allocation under the pool's cap; BUSY is back-pressure), receipts, frees and
    keeps, DATA with nowhere to go, and the reclaim of dead instances. The protocol is
    in the module docstring. While it runs, change the pool only through it (reading
    :meth:`TensorPool.stats` is fine); it calls :meth:`TensorPool.release_idle` itself.

    Args:
        pool: the service's :class:`TensorPool`.
        channel: the control channel (:func:`~infscaler.ebpf.channel.open_channel`).
        stages: the stages of the deployed pipeline; FAULT / DATA / instances for other
            stages are refused. None: any stage 0..62.
        hold_timeout_s: seconds DATA may wait for a live instance of its stage before
            its request is failed (ERROR to its producer, slot freed).
        retry_interval_s: seconds between attempts to route held DATA while its stage
            has live instances (DATA bounced for another reason, e.g. a duplicate).
        max_retries: times a request may be re-routed after instance deaths before it is
            failed (a request that kills every instance it reaches).
        on_failure: called as ``on_failure(request, reason)`` in the manager thread,
            outside its lock, for every failed request (e.g. the front end answering
            the client with an error).

    Raises:
        SharingError: a stage outside 0..62, or bad timing arguments.
    """

    def __init__(
        self,
        pool: TensorPool,
        channel: Channel,
        *,
        stages: Iterable[int] | None = None,
        hold_timeout_s: float = 30.0,
        retry_interval_s: float = 0.1,
        max_retries: int = 3,
        on_failure: Callable[[int, str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._ch = channel
        self._stages: frozenset[int] | None = None
        if stages is not None:
            self._stages = frozenset(int(s) for s in stages)
            bad = sorted(s for s in self._stages if not 0 <= s < BARRIER_STAGE)
            if bad:
                raise SharingError(
                    f"stages {bad} outside 0..{BARRIER_STAGE - 1}",
                    hint=f"stage {BARRIER_STAGE} is reserved for the manager's barrier",
                )
        if hold_timeout_s <= 0 or retry_interval_s <= 0 or max_retries < 0:
            raise SharingError("hold_timeout_s and retry_interval_s must be > 0, max_retries >= 0")
        self.hold_timeout_s = float(hold_timeout_s)
        self.retry_interval_s = float(retry_interval_s)
        self.max_retries = int(max_retries)
        self._on_failure = on_failure
        self._lock = threading.RLock()
        self._instances: dict[int, _Instance] = {}
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._held: dict[tuple[int, int], _Slot] = {}
        self._hold_limits: dict[int, tuple[float, str]] = {}
        self._barriers: dict[int, _Death | None] = {}
        self._syncs: dict[int, _Death] = {}
        self._reports: dict[int, ReclaimReport] = {}
        self._retries: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._failures: collections.deque[tuple[int, str]] = collections.deque(
            maxlen=_FAILURES_KEPT
        )
        self._callbacks: list[tuple[int, str]] = []
        self._nonce_base = secrets.randbits(31) << 32
        self._nonce_seq = 0
        self._c = dict.fromkeys(
            (
                "tokens",
                "faults",
                "grants",
                "busy",
                "frees",
                "keeps",
                "receipts",
                "data_at_manager",
                "held",
                "routed",
                "retried",
                "failed",
                "errors_sent",
                "syncs_sent",
                "echoes",
                "barriers",
                "deaths",
                "reclaimed_slots",
                "handed_over",
                "dead_letters",
                "internal_errors",
                "dropped_dead",
            ),
            0,
        )
        #: ``request -> bool``: True when a request is past its deadline or cancelled
        #: (the front end's :class:`~infscaler.shm.deadlines.DeadlineTable`); held DATA
        #: of such a request is dropped, its slot freed, instead of being delivered
        self.request_dead: Callable[[int], bool] | None = None
        self._rejections: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._next_idle_check = 0.0

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> TensorSharingManager:
        """Start the manager thread (idempotent).

        Registers the reserved barrier stage with the channel (one instance added and
        removed at once, id ``MANAGER_INSTANCE``: it shows in the channel's stats).

        Raises:
            ChannelError: the channel is closed, or instance id 0xFFFF is taken.
        """
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            if BARRIER_STAGE not in self._ch.stats()["stages"]:
                self._ch.add_instance(BARRIER_STAGE, MANAGER_INSTANCE).close()
                self._ch.remove_instance(MANAGER_INSTANCE)
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run, name="infscaler-sharing-manager", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the manager thread (wakes it with a barrier token; waits ``timeout``
        seconds). Leaves pool and channel open (their owner closes them). Idempotent."""
        th = self._thread
        if th is None:
            return
        self._stopping = True
        with contextlib.suppress(ChannelError, OSError):
            self._ch.route(self._barrier_token(self._nonce()))
        th.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        """True while the manager thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> TensorSharingManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- membership -----------------------------------------------------------------------
    def add_instance(self, stage: int, instance: int, *, live: bool = True) -> socket.socket:
        """Register an instance of ``stage`` with the channel and the manager.

        DATA the manager holds for ``stage`` is routed at once (the new instance is
        live now). With ``live`` False the channel routes nothing to it until
        :meth:`set_live` (the supervisor calls it when the instance reports ready: a
        token routed to an instance that is still loading its model would wait for the
        load, seconds for a large model, while other instances are idle).

        Returns:
            the instance-side socket (see :meth:`Channel.add_instance`): hand it to the
            instance process, which wraps it in :class:`~infscaler.ebpf.channel.Endpoint`
            and an :class:`InstanceClient`.

        Raises:
            SharingError: a stage not in ``stages`` or the reserved one, the reserved
                instance id 0xFFFF, an instance already live, or one whose reclaim is
                still in progress.
            ChannelError: the channel refused (full stage, closed channel).
        """
        if self._stages is not None and stage not in self._stages:
            raise SharingError(
                f"stage {stage} is not a stage of this pipeline {sorted(self._stages)}"
            )
        if stage == BARRIER_STAGE or not 0 <= stage < MAX_STAGES:
            raise SharingError(f"stage {stage} is reserved or outside 0..{BARRIER_STAGE - 1}")
        if instance == MANAGER_INSTANCE:
            raise SharingError(f"instance id {MANAGER_INSTANCE} is reserved for the manager")
        with self._lock:
            old = self._instances.get(instance)
            if old is not None and old.state != _DEAD:
                raise SharingError(f"instance {instance} is already registered ({old.state})")
            sock = self._ch.add_instance(stage, instance, live=live)
            self._instances[instance] = _Instance(stage)
            if live:
                self._route_held(stage)
        return sock

    def set_live(self, instance: int) -> None:
        """Route DATA to an instance added with ``live=False`` (it is ready), and the
        DATA held for its stage at once. A no-op for an instance already live; ignored
        for one that is not registered any more (it died while loading).
        """
        with self._lock:
            inst = self._instances.get(instance)
            if inst is None or inst.state == _DEAD:
                return
            try:
                self._ch.set_live(instance)
            except ChannelError:
                return  # removed meanwhile
            self._route_held(inst.stage)

    def set_hold_limit(self, stage: int, seconds: float | None, reason: str = "") -> None:
        """Bound how long DATA held for ``stage`` waits, from now on: at most ``seconds``
        (0: fail it at once) instead of ``hold_timeout_s``; None lifts the bound. The
        supervisor sets it while a unit with no live instance waits for its restart
        backoff, so its requests get a prompt 503 with ``reason`` rather than waiting
        for the hold timeout."""
        with self._lock:
            if seconds is None:
                self._hold_limits.pop(stage, None)
                return
            seconds = max(0.0, float(seconds))
            self._hold_limits[stage] = (seconds, reason)
            deadline = time.monotonic() + seconds
            for st in self._held.values():
                if st.data is not None and st.data.stage == stage:
                    st.deadline = min(st.deadline, deadline)
            wake = self._barrier_token(self._nonce())
        with contextlib.suppress(ChannelError, OSError):  # wake the thread: deadlines moved
            self._ch.route(wake)

    def _hold_s(self, stage: int) -> float:
        limit = self._hold_limits.get(stage)
        return self.hold_timeout_s if limit is None else min(self.hold_timeout_s, limit[0])

    def _route_held(self, stage: int) -> None:
        for key, st in list(self._held.items()):
            if st.data is not None and st.data.stage == stage:
                self._route_parked(key, st)

    def instance_died(self, instance: int, *, timeout: float = 10.0) -> ReclaimReport:
        """Reclaim what a dead instance held (the supervisor saw its process exit).

        Runs the reclaim described in the module docstring: unacknowledged input DATA is
        re-routed (retried) or held, acknowledged inputs and provably unused out-slots
        are freed, possibly handed-over out-slots are quarantined until every live
        instance has answered a sync marker. Also the way to deregister an instance that
        exited cleanly (its report is then empty).

        Args:
            instance: the instance id (its process must have exited: a live one could
                still use what is reclaimed).
            timeout: seconds to wait for the report to complete (0: return at once).

        Returns:
            the :class:`ReclaimReport`, complete unless ``timeout`` passed first (then
            it completes later, in place: :meth:`ReclaimReport.wait`).

        Raises:
            SharingError: the manager is not running, or the instance is unknown or
                already reported dead.
            ChannelError: the channel is closed.
        """
        if not self.running:
            raise SharingError("the tensor sharing manager is not running", hint="call start()")
        with self._lock:
            inst = self._instances.get(instance)
            if inst is None or inst.state != _LIVE:
                state = "unknown" if inst is None else inst.state
                raise SharingError(f"instance {instance} is {state}, not live")
            inst.state = _DYING
            returned = self._ch.remove_instance(instance)
            report = ReclaimReport(instance, inst.stage)
            self._reports[instance] = report
            nonce = self._nonce()
            self._barriers[nonce] = _Death(instance, inst.stage, report, returned)
            self._c["deaths"] += 1
            self._ch.route(self._barrier_token(nonce))
        report.wait(timeout)
        return report

    def report(self, instance: int) -> ReclaimReport | None:
        """The latest :class:`ReclaimReport` of ``instance`` (None if it never died)."""
        with self._lock:
            return self._reports.get(instance)

    # -- introspection -------------------------------------------------------------------
    def failures(self) -> list[tuple[int, str]]:
        """``(request, reason)`` of failed requests, oldest first (the last 10 000)."""
        with self._lock:
            return list(self._failures)

    def stats(self) -> dict[str, Any]:
        """A snapshot: ``{"pool": TensorPool.stats(), "channel": Channel.stats(),
        "manager": {...}}``.

        ``manager`` has counters (tokens handled): ``tokens``, ``faults``, ``grants``,
        ``busy`` (faults answered BUSY), ``frees``, ``keeps``, ``receipts``,
        ``data_at_manager`` (undeliverable DATA received), ``held`` (DATA parked),
        ``routed`` (parked DATA sent on), ``retried`` (requests re-routed after a
        death), ``failed`` (requests failed), ``errors_sent``, ``syncs_sent``,
        ``echoes``, ``barriers``, ``deaths``, ``reclaimed_slots`` (freed from dead
        instances), ``handed_over`` (a dead producer's slots kept by their consumer),
        ``dead_letters`` (replies to instances already gone), ``internal_errors``
        (manager bugs: logged, must stay 0); ``rejected`` (total) and ``rejections``
        (reason -> count: ``unknown_instance``, ``dead_instance``, ``unknown_stage``,
        ``too_large``, ``above_cap``, ``pool_error``, ``unknown_slot``, ``double_free``,
        ``wrong_owner``, ``bad_offset``, ``not_reader``, ``stale_receipt``,
        ``receipt_conflict``, ``request_mismatch``, ``not_routed``, ``bad_data``,
        ``unknown_sync``, ``malformed``); gauges ``slots_held`` (HELD), ``slots_in_transit``,
        ``slots_quarantined``, ``slots_tracked``; ``instances``: id -> {``stage``,
        ``state`` (live / dying / dead), ``slots``}.
        """
        with self._lock:
            per_owner = collections.Counter(st.owner for st in self._slots.values())
            mgr = {
                **self._c,
                "rejected": sum(self._rejections.values()),
                "rejections": dict(self._rejections),
                "slots_held": len(self._held),
                "slots_in_transit": sum(1 for s in self._slots.values() if s.role == _TRANSIT),
                "slots_quarantined": sum(1 for s in self._slots.values() if s.suspect_of),
                "slots_tracked": len(self._slots),
                "instances": {
                    i: {"stage": v.stage, "state": v.state, "slots": per_owner.get(i, 0)}
                    for i, v in sorted(self._instances.items())
                },
            }
        return {"pool": self._pool.stats(), "channel": self._ch.stats(), "manager": mgr}

    def audit(self) -> list[str]:
        """Compare the manager's lease table with the pool's; returns the differences
        (empty when consistent). For tests and diagnostics."""
        problems = []
        with self._lock:
            pool_in_use = self._pool.stats()["slots_in_use"]
            if pool_in_use != len(self._slots):
                problems.append(
                    f"pool has {pool_in_use} slots in use, manager tracks {len(self._slots)}"
                )
            for (slab, slot), st in self._slots.items():
                try:
                    owner = self._pool.owner(slab, slot)
                except PoolError as exc:
                    problems.append(f"slab {slab} slot {slot}: {exc}")
                    continue
                if owner != st.owner:
                    problems.append(
                        f"slab {slab} slot {slot}: pool owner {owner}, manager {st.owner} ({st.role})"
                    )
        return problems

    # -- manager thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                data = self._ch.manager_recv_bytes(4 * MAX_BATCH, self._sleep_s())
            except (ChannelClosed, OSError):
                break
            with self._lock:
                for off in range(0, len(data), TOKEN_SIZE):
                    try:
                        tok = Token.unpack(data[off : off + TOKEN_SIZE])
                    except TokenError:
                        self._reject("malformed")
                        continue
                    try:
                        self._handle(tok)
                    except Exception:  # a manager bug must not stop the manager
                        self._c["internal_errors"] += 1
                        log.exception("tensor sharing manager: error handling %s", tok)
                try:
                    self._tick(time.monotonic())
                except Exception:
                    self._c["internal_errors"] += 1
                    log.exception("tensor sharing manager: error in housekeeping")
                callbacks, self._callbacks = self._callbacks, []
            for request, reason in callbacks:
                if self._on_failure is not None:
                    try:
                        self._on_failure(request, reason)
                    except Exception:
                        log.exception("on_failure callback raised for request %d", request)

    def _sleep_s(self) -> float:
        with self._lock:
            now = time.monotonic()
            due = self._next_idle_check
            for st in self._held.values():
                due = min(due, st.deadline)
                if st.data is not None and self._stage_live(st.data.stage):
                    due = min(due, st.retry_at)
            return min(_MAX_SLEEP_S, max(0.0, due - now))

    def _handle(self, tok: Token) -> None:
        self._c["tokens"] += 1
        kind = tok.kind
        if kind == _DATA:
            if tok.stage == BARRIER_STAGE and tok.slab == NO_SLAB:
                self._on_barrier(tok.request)
            else:
                self._on_data(tok)
        elif kind == _FAULT:
            self._on_fault(tok)
        elif kind == _GRANT:
            self._on_receipt(tok)
        elif kind == _FREE:
            if tok.stage == CONTROL_STAGE:
                self._on_keep(tok)
            else:
                self._on_free(tok)
        elif kind == _BUSY and tok.stage == CONTROL_STAGE:
            self._on_echo(tok)
        else:  # BUSY / ERROR from an instance: nothing it may send
            self._reject("malformed")

    # -- helpers -------------------------------------------------------------------------
    def _nonce(self) -> int:
        self._nonce_seq += 1
        return self._nonce_base | (self._nonce_seq & 0xFFFFFFFF)

    def _issued(self, nonce: int) -> bool:
        """A nonce this manager has handed out."""
        seq = nonce & 0xFFFFFFFF
        return nonce >> 32 == self._nonce_base >> 32 and 0 < seq <= self._nonce_seq

    @staticmethod
    def _barrier_token(nonce: int) -> Token:
        return Token(_DATA, BARRIER_STAGE, NO_SLAB, MANAGER_INSTANCE, 0, 0, 0, nonce)

    def _reject(self, reason: str) -> None:
        self._rejections[reason] = self._rejections.get(reason, 0) + 1

    def _stage_live(self, stage: int) -> bool:
        return any(i.stage == stage and i.state == _LIVE for i in self._instances.values())

    def _sender(self, tok: Token) -> _Instance | None:
        """The sending instance, or None (counted) if unknown or dead. A dying one is
        fine: its tokens were sent before it died (they all arrive before its barrier)."""
        inst = self._instances.get(tok.instance)
        if inst is None:
            self._reject("unknown_instance")
        elif inst.state == _DEAD:
            self._reject("dead_instance")
            inst = None
        return inst

    def _send(self, instance: int, tok: Token) -> bool:
        inst = self._instances.get(instance)
        if inst is None or inst.state != _LIVE:
            self._c["dead_letters"] += 1
            return False
        try:
            self._ch.manager_send(instance, tok)
        except (ChannelError, OSError, TimeoutError):
            self._c["dead_letters"] += 1
            return False
        return True

    def _send_error(self, instance: int, tok: Token) -> None:
        err = Token(_ERROR, tok.stage, tok.slab, instance, tok.slot, tok.offset, 0, tok.request)
        if self._send(instance, err):
            self._c["errors_sent"] += 1

    def _slot_known(self, tok: Token) -> bool:
        try:
            self._pool.owner(tok.slab, tok.slot)
        except PoolError:
            return False
        return True

    def _geometry_ok(self, tok: Token) -> bool:
        """Offset is the slot's and length fits (the slot is in use)."""
        try:
            self._pool.validate(tok)
        except PoolError:
            return False
        return True

    def _lookup(self, tok: Token, missing: str) -> _Slot | None:
        """The lease record a token names, or None (counted: ``missing`` if the slot
        exists but is free, ``unknown_slot`` if it does not exist, ``bad_offset`` if
        offset / length do not match it)."""
        st = self._slots.get((tok.slab, tok.slot))
        if st is None:
            self._reject(missing if self._slot_known(tok) else "unknown_slot")
            return None
        if not self._geometry_ok(tok):
            self._reject("bad_offset")
            return None
        return st

    def _fail(self, request: int, reason: str, report: ReclaimReport | None = None) -> None:
        self._c["failed"] += 1
        self._failures.append((request, reason))
        self._callbacks.append((request, reason))
        if report is not None:
            report.failed.append((request, reason))
        log.warning("request %d failed: %s", request, reason)

    def _free_slot(self, key: tuple[int, int], st: _Slot) -> None:
        self._pool.free(key[0], key[1], owner=st.owner)
        del self._slots[key]
        self._held.pop(key, None)
        if st.suspect_of is not None:
            st.suspect_of.suspects.pop(key, None)
            st.suspect_of = None

    def _take(self, key: tuple[int, int], st: _Slot, data: Token) -> None:
        """The manager takes the lease of a slot whose DATA it has (HELD)."""
        if st.owner != MANAGER_INSTANCE:
            self._pool.transfer(
                key[0], key[1], MANAGER_INSTANCE, from_owner=st.owner, request=data.request
            )
            st.owner = MANAGER_INSTANCE
        st.role = _HELD
        st.request = data.request
        st.data = data
        now = time.monotonic()
        st.deadline = now + self._hold_s(data.stage)
        st.retry_at = now
        self._held[key] = st
        self._c["held"] += 1
        self._settle_handed_over(key, st)

    def _settle_handed_over(self, key: tuple[int, int], st: _Slot) -> None:
        """A quarantined slot turned up with a consumer / as DATA: it was handed over."""
        death = st.suspect_of
        if death is None:
            return
        st.suspect_of = None
        ref = death.suspects.pop(key, st.ref)
        death.report.handed_over.append(ref)
        death.report.pending = sorted(death.suspects.values())
        self._c["handed_over"] += 1
        self._maybe_complete(death)

    def _route_parked(self, key: tuple[int, int], st: _Slot) -> bool:
        """Route a HELD slot's DATA by the channel's policy (-> TRANSIT)."""
        assert st.data is not None
        try:
            self._ch.route(st.data)
        except (ChannelError, OSError, TimeoutError):
            st.retry_at = time.monotonic() + self.retry_interval_s
            return False
        st.role = _TRANSIT
        self._held.pop(key, None)
        self._c["routed"] += 1
        return True

    # -- token handlers --------------------------------------------------------------------
    def _on_fault(self, tok: Token) -> None:
        inst = self._instances.get(tok.instance)
        if inst is not None and inst.state == _DYING:
            self._c["dead_letters"] += 1  # sent just before it died: no one to answer
            return
        if self._sender(tok) is None:
            return
        if self._stages is not None and tok.stage not in self._stages:
            self._reject("unknown_stage")
            self._send_error(tok.instance, tok)
            return
        self._c["faults"] += 1
        request = tok.request if tok.request != NO_REQUEST else None
        try:
            ref = self._pool.fault(tok.length, owner=tok.instance, request=request)
        except PoolError as exc:
            msg = exc.message
            self._reject(
                "too_large"
                if "largest slot" in msg
                else "above_cap"
                if "above the pool cap" in msg
                else "pool_error"
            )
            self._send_error(
                tok.instance, Token(_ERROR, tok.stage, NO_SLAB, 0, 0, 0, 0, tok.request)
            )
            return
        if ref is None:
            self._c["busy"] += 1
            self._send(
                tok.instance, Token(_BUSY, tok.stage, NO_SLAB, tok.instance, 0, 0, 0, tok.request)
            )
            return
        self._slots[(ref.slab, ref.slot)] = _Slot(ref, tok.instance, _WRITER, tok.request)
        self._c["grants"] += 1
        # if the send fails the instance is gone: its reclaim frees the slot
        self._send(tok.instance, ref.to_token(_GRANT, tok.stage, tok.instance, request=tok.request))

    def _on_free(self, tok: Token) -> None:
        if self._sender(tok) is None:
            return
        st = self._lookup(tok, "double_free")
        if st is None:
            return
        if st.owner != tok.instance or st.role not in (_WRITER, _READER):
            self._reject("wrong_owner")
            return
        self._free_slot((tok.slab, tok.slot), st)
        self._c["frees"] += 1

    def _on_keep(self, tok: Token) -> None:
        if self._sender(tok) is None:
            return
        st = self._lookup(tok, "double_free")
        if st is None:
            return
        if st.owner != tok.instance:
            self._reject("wrong_owner")
            return
        if st.role != _READER:
            self._reject("not_reader")
            return
        self._pool.transfer(
            tok.slab, tok.slot, tok.instance, from_owner=tok.instance, request=NO_REQUEST
        )
        st.role, st.request = _WRITER, NO_REQUEST
        self._c["keeps"] += 1

    def _on_receipt(self, tok: Token) -> None:
        if self._sender(tok) is None:
            return
        key = (tok.slab, tok.slot)
        st = self._lookup(tok, "stale_receipt")
        if st is None:
            self._send_error(tok.instance, tok)
            return
        if st.role == _READER:
            if st.owner == tok.instance and st.request == tok.request:
                return  # a repeated receipt: nothing to do
            self._reject("receipt_conflict")
            self._send_error(tok.instance, tok)
            return
        if st.role == _HELD:
            self._reject("not_routed")
            self._send_error(tok.instance, tok)
            return
        if st.request != NO_REQUEST and st.request != tok.request:
            self._reject("request_mismatch")
            self._send_error(tok.instance, tok)
            return
        if st.owner != tok.instance:
            self._pool.transfer(
                tok.slab, tok.slot, tok.instance, from_owner=st.owner, request=tok.request
            )
        st.owner, st.role, st.request = tok.instance, _READER, tok.request
        st.data, st.report = None, None
        self._held.pop(key, None)
        self._c["receipts"] += 1
        self._settle_handed_over(key, st)

    def _on_data(self, tok: Token) -> None:
        """DATA the channel could not deliver (no live instance, duplicate in flight,
        unknown stage, ...): the manager takes the slot and holds the DATA."""
        self._c["data_at_manager"] += 1
        key = (tok.slab, tok.slot)
        st = self._slots.get(key)
        if (
            st is None
            or st.role in (_READER, _HELD)
            or (st.role == _WRITER and st.owner != tok.instance)
            or not self._geometry_ok(tok)
        ):
            # names no slot in transit: refuse, and tell its sender the request failed
            self._reject("bad_data")
            self._fail(tok.request, "DATA names a slot that is not in transit")
            self._send_error(tok.instance, tok)
            return
        self._take(key, st, tok)
        if (
            self._stages is not None and tok.stage not in self._stages
        ) or tok.stage >= BARRIER_STAGE:
            self._reject("unknown_stage")
            self._fail_parked(key, st, f"stage {tok.stage} is not a stage of this pipeline")
            return
        if self._stage_live(tok.stage):  # bounced for another reason: retry shortly
            st.retry_at = time.monotonic() + self.retry_interval_s

    def _fail_parked(self, key: tuple[int, int], st: _Slot, reason: str) -> None:
        data = st.data
        assert data is not None
        report = st.report
        self._free_slot(key, st)
        self._fail(data.request, reason, report)
        self._send_error(data.instance, data)

    def _on_echo(self, tok: Token) -> None:
        self._c["echoes"] += 1
        death = self._syncs.get(tok.request)
        if death is None:
            if not self._issued(tok.request):
                self._reject("unknown_sync")
            return  # else: a late echo for a reclaim already settled by receipts
        death.awaiting.discard(tok.instance)
        self._maybe_complete(death)

    def _on_barrier(self, nonce: int) -> None:
        self._c["barriers"] += 1
        if nonce not in self._barriers:
            return  # a wake-up from stop()
        death = self._barriers.pop(nonce)
        if death is not None:
            self._reclaim(death)

    # -- reclaim -------------------------------------------------------------------------
    def _reclaim(self, d: _Death) -> None:
        """Step 2 of the reclaim (module docstring): everything ``d.instance`` sent
        before dying has been applied."""
        report = d.report
        x = d.instance
        self._instances[x].state = _DEAD
        returned_requests = set()
        for data in d.returned:
            returned_requests.add(data.request)
            key = (data.slab, data.slot)
            st = self._slots.get(key)
            if st is None or st.role == _HELD or not self._geometry_ok(data):
                self._fail(
                    data.request, "the slot of its unacknowledged DATA is not leased", report
                )
                continue
            if st.role == _READER and st.owner != x:
                self._reject("receipt_conflict")  # another instance reads it: leave it
                continue
            self._take(key, st, data)
            st.report = report
            n = self._retries.pop(data.request, 0) + 1
            self._retries[data.request] = n
            while len(self._retries) > _RETRIES_KEPT:
                self._retries.popitem(last=False)
            if n > self.max_retries:
                self._fail_parked(key, st, f"re-routed {n - 1} times after instance deaths")
                continue
            if self._stage_live(data.stage) and self._route_parked(key, st):
                report.retried.append(data.request)
                self._c["retried"] += 1
            else:
                report.held.append(data.request)
        for ref in self._pool.held_by(x):
            key = (ref.slab, ref.slot)
            st = self._slots.get(key)
            if st is None:  # not in the manager's table (a bug elsewhere): free it anyway
                self._c["internal_errors"] += 1
                self._pool.free(ref.slab, ref.slot, owner=x)
                report.freed.append(ref)
                continue
            if st.role == _READER or (
                st.role == _WRITER and st.request != NO_REQUEST and st.request in returned_requests
            ):
                report.freed.append(ref)
                self._free_slot(key, st)
                self._c["reclaimed_slots"] += 1
            else:  # a writer slot that may have been handed over
                st.suspect_of = d
                d.suspects[key] = ref
        report.pending = sorted(d.suspects.values())
        for other in list(self._syncs.values()):  # a dead instance owes no echo
            if x in other.awaiting:
                other.awaiting.discard(x)
                self._maybe_complete(other)
        if d.suspects:
            d.sync_nonce = self._nonce()
            self._syncs[d.sync_nonce] = d
            marker = Token(_BUSY, CONTROL_STAGE, NO_SLAB, 0, 0, 0, 0, d.sync_nonce)
            for i, inst in self._instances.items():
                if inst.state == _DYING:  # its barrier (later) hands back its DATA
                    d.awaiting.add(i)
                elif inst.state == _LIVE and self._send(i, marker):
                    d.awaiting.add(i)
                    self._c["syncs_sent"] += 1
        self._maybe_complete(d)

    def _maybe_complete(self, d: _Death) -> None:
        if d.report.complete:
            return
        if d.suspects and d.awaiting:
            return
        for key, ref in sorted(d.suspects.items()):  # never handed over
            st = self._slots[key]
            d.report.freed.append(ref)
            st.suspect_of = None
            self._free_slot(key, st)
            self._c["reclaimed_slots"] += 1
            if st.request != NO_REQUEST:
                self._fail(st.request, "its producer died before handing it over", d.report)
        d.suspects.clear()
        d.report.pending = []
        if d.sync_nonce is not None:
            self._syncs.pop(d.sync_nonce, None)
        d.report.complete = True
        d.report._done.set()

    # -- timers --------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        dead = self.request_dead
        for key, st in list(self._held.items()):
            if dead is not None and st.data is not None and dead(st.data.request):
                # past its deadline or cancelled (the front end answered it already):
                # the held DATA is never delivered, its slot goes back to the pool
                self._c["dropped_dead"] += 1
                self._free_slot(key, st)
                continue
            if now >= st.deadline:
                stage = st.data.stage if st.data is not None else -1
                limit = self._hold_limits.get(stage)
                self._fail_parked(
                    key,
                    st,
                    limit[1]
                    if limit is not None and limit[1]
                    else f"no live instance of stage {stage} took it within {self.hold_timeout_s} s",
                )
            elif now >= st.retry_at and st.data is not None and self._stage_live(st.data.stage):
                self._route_parked(key, st)
        if now >= self._next_idle_check:
            self._pool.release_idle()
            self._next_idle_check = now + max(
                0.5, min(_MAX_SLEEP_S * 5, self._pool.idle_release_s / 2)
            )


class InstanceClient:
    """The instance side of tensor sharing (InfScaler §IV-B, Fig. 4): OutToken queue,
    token faults, handover, zero-copy input reads; it follows the protocol in the module
    docstring (receipts, keeps, sync echoes) so the manager's leases stay true.

    One client per instance, used from one thread. Every call that reads the socket also
    answers what the protocol asks (receipts, sync echoes); an instance idle for long
    should call :meth:`poll` now and then (a pending reclaim waits for its echo).

    Args:
        endpoint: the instance's :class:`~infscaler.ebpf.channel.Endpoint`.
        slabs: a :class:`SlabMap` of the service's pool.
        instance: this instance's id (the ``instance`` field of its tokens).
        stage: this instance's stage (its FAULT tokens name it).
        max_out_tokens: input slots kept as out-tokens by :meth:`done` (the OutToken
            queue's bound; 0: always free them).
        backoff_s: first back-off after BUSY, seconds; doubled up to ``max_backoff_s``.
        send_timeout_s: bound on a blocked send, seconds.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        slabs: SlabMap,
        instance: int,
        stage: int,
        *,
        max_out_tokens: int = 2,
        backoff_s: float = 0.001,
        max_backoff_s: float = 0.05,
        send_timeout_s: float = 10.0,
    ) -> None:
        self._ep = endpoint
        self._slabs = slabs
        self.instance = instance
        self.stage = stage
        self.max_out_tokens = max(0, int(max_out_tokens))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.send_timeout_s = send_timeout_s
        self._inputs: collections.deque[Token] = collections.deque()  # received, not returned
        self._reading: dict[tuple[int, int], Token] = {}  # returned by recv_input, not done
        self._out: list[Token] = []  # OutToken queue: idle writer slots (length = capacity)
        self._acquired: dict[tuple[int, int], tuple[Token, int]] = {}  # slot -> (token, request)
        self._notices: collections.deque[Token] = collections.deque()
        self._awaiting: int | None = None  # request of the outstanding FAULT
        self._reply: Token | None = None
        self._tx: list[bytes] = []
        self.counters = dict.fromkeys(
            (
                "faults",
                "grants",
                "busy",
                "out_token_hits",
                "handovers",
                "received",
                "receipts",
                "frees",
                "keeps",
                "echoes",
                "errors",
                "stray_grants",
                "unexpected",
            ),
            0,
        )

    # -- producer side ---------------------------------------------------------------------
    def acquire(
        self, nbytes: int, request: int, timeout: float | None = 10.0
    ) -> tuple[Token, memoryview]:
        """A slot of at least ``nbytes`` bytes to write request ``request``'s output into.

        Pops the smallest fitting out-token from the OutToken queue; if none fits,
        raises a token FAULT to the manager and waits for its GRANT. A BUSY answer
        (the pool at its cap) means: back off (``backoff_s``, doubling), fault again,
        until ``timeout``. While waiting the socket is served (receipts, echoes).

        Args:
            nbytes: bytes needed (header + tensors: :func:`~infscaler.shm.tensors.tensors_nbytes`).
            request: the request id (u64, not ``NO_REQUEST``); the slot may be handed
                over with this request only.
            timeout: seconds (None: no limit).

        Returns:
            ``(slot token, writable view of the whole slot)``; the token's ``length`` is
            the slot's capacity in bytes. Write with
            :func:`~infscaler.shm.tensors.write_tensors` / ``allocate_tensors``, then
            :meth:`hand_over` (or :meth:`discard`).

        Raises:
            BackPressureError: only BUSY until ``timeout`` (no GRANT in time).
            SharingError: the manager refused the fault (ERROR: larger than any slot,
                stage unknown); ``request`` out of range.
            ChannelClosed: the instance was removed or the channel closed.
        """
        if not 0 <= request < NO_REQUEST:
            raise SharingError(f"request id {request} outside 0..2**64-2")
        tok = self._pop_out_token(nbytes)
        if tok is None:
            tok = self._fault(
                nbytes, request, None if timeout is None else time.monotonic() + timeout
            )
        self._acquired[(tok.slab, tok.slot)] = (tok, request)
        return tok, self._slabs.slot_view(tok)

    def _pop_out_token(self, nbytes: int) -> Token | None:
        fits = [t for t in self._out if t.length >= nbytes]
        if not fits:
            return None
        best = min(fits, key=lambda t: t.length)
        self._out.remove(best)
        self.counters["out_token_hits"] += 1
        return best

    def _fault(self, nbytes: int, request: int, deadline: float | None) -> Token:
        backoff = self.backoff_s
        busy = 0
        fault = Token(_FAULT, self.stage, NO_SLAB, self.instance, 0, 0, nbytes, request)

        def timed_out() -> BackPressureError:
            self._awaiting = None  # a late GRANT is given back when it arrives
            return BackPressureError(
                f"no slot of {nbytes} bytes for request {request} (instance {self.instance}) "
                f"before the timeout: {busy} BUSY answers"
                + (" (the pool is at its memory cap)" if busy else " (no answer from the manager)"),
                hint="downstream stages are not returning slots: raise cap_bytes, slow the "
                "producer, or check that the manager runs",
            )

        while True:
            self._awaiting, self._reply = request, None
            self.counters["faults"] += 1
            self._send(fault)
            while self._reply is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise timed_out()
                self._pump(left)
            reply, self._reply, self._awaiting = self._reply, None, None
            if reply.kind == _GRANT:
                self.counters["grants"] += 1
                return reply
            if reply.kind == _ERROR:
                raise SharingError(
                    f"the manager refused a fault of {nbytes} bytes for request {request}",
                    hint="larger than the largest slot, or this stage is not in the pipeline",
                )
            busy += 1  # BUSY: back-pressure
            self.counters["busy"] += 1
            self._release_unfitting(nbytes)
            end = time.monotonic() + backoff
            if deadline is not None:
                end = min(end, deadline)
            while (left := end - time.monotonic()) > 0:
                self._pump(left)
            backoff = min(backoff * 2, self.max_backoff_s)
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out()

    def _release_unfitting(self, nbytes: int) -> None:
        """At the cap, out-tokens too small to use go back to the pool."""
        keep = [t for t in self._out if t.length >= nbytes]
        for t in self._out:
            if t.length < nbytes:
                self._tx.append(self._free_frame(t, NO_REQUEST))
                self.counters["frees"] += 1
        self._out = keep
        self._flush()

    def hand_over(self, slot: Token, stage: int, request: int, length: int) -> None:
        """Hand a written slot to stage ``stage`` (DATA token; zero copy).

        Args:
            slot: the token :meth:`acquire` returned.
            stage: destination stage.
            request: the request id it was acquired for.
            length: bytes used (what ``write_tensors`` returned).

        Raises:
            SharingError: not a slot this client acquired (or already handed over), a
                request other than the acquired one, ``length`` above the capacity.
            ChannelClosed / TimeoutError: the send failed.
        """
        key = (slot.slab, slot.slot)
        entry = self._acquired.get(key)
        if entry is None:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was not acquired by this instance"
            )
        tok, acquired_for = entry
        if request != acquired_for:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was acquired for request {acquired_for}, not {request}"
            )
        if not 0 <= length <= tok.length:
            raise SharingError(f"length {length} outside the slot's capacity {tok.length}")
        del self._acquired[key]
        self._send(
            Token(_DATA, stage, tok.slab, self.instance, tok.slot, tok.offset, length, request)
        )
        self.counters["handovers"] += 1

    def send_tensors(
        self,
        tensors: Mapping[str, np.ndarray],
        stage: int,
        request: int,
        timeout: float | None = 10.0,
    ) -> int:
        """Write named tensors into a slot and hand it to stage ``stage``: :meth:`acquire`
        (OutToken queue or token fault), one copy in with
        :func:`~infscaler.shm.tensors.write_tensors`, :meth:`hand_over`. A slot that
        cannot be written is given back (:meth:`discard`).

        Returns:
            bytes handed over (header + data).

        Raises:
            BackPressureError: no slot within ``timeout`` s; SlotFormatError: a tensor
            the slot layout refuses; SharingError / ChannelClosed as :meth:`acquire`.
        """
        nbytes = tensors_nbytes(tensors)
        slot, view = self.acquire(nbytes, request, timeout=timeout)
        try:
            length = write_tensors(view, tensors)
        except BaseException:
            self.discard(slot)
            raise
        del view
        self.hand_over(slot, stage, request, length)
        return length

    def discard(self, slot: Token) -> None:
        """Give an acquired, not handed-over slot back to the pool (FREE).

        Raises:
            SharingError: not a slot this client acquired.
        """
        entry = self._acquired.pop((slot.slab, slot.slot), None)
        if entry is None:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was not acquired by this instance"
            )
        self._send_free(entry[0], NO_REQUEST)

    def release_out_tokens(self) -> int:
        """FREE every idle out-token (scale-in, shutdown). Returns how many."""
        n = len(self._out)
        for t in self._out:
            self._tx.append(self._free_frame(t, NO_REQUEST))
        self.counters["frees"] += n
        self._out = []
        self._flush()
        return n

    # -- consumer side ---------------------------------------------------------------------
    def recv_input(self, timeout: float | None = None) -> tuple[Token, dict[str, np.ndarray]]:
        """The next input: its DATA token and read-only zero-copy tensor views.

        The views point into the slot; do not use them after :meth:`done` (copy what
        must outlive it).

        Args:
            timeout: seconds to wait (None: forever).

        Raises:
            TimeoutError: nothing arrived in time.
            RequestFailed: the manager sent an ERROR for a request (held too long, ...);
                call again for the next input.
            ChannelClosed: the instance was removed or the channel closed.
            SlotFormatError: the slot does not hold a valid tensor layout (the token is
                still held: call :meth:`done` with the exception's ``token`` attribute).
            PoolError: the token does not match its slab (``token`` attribute likewise).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._notices:
                raise RequestFailed(self._notices.popleft())
            if self._inputs:
                tok = self._inputs.popleft()
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no input within {timeout} s")
            self._pump(left)
        self._reading[(tok.slab, tok.slot)] = tok
        try:
            return tok, read_tensors(self._slabs.slot_view(tok)[: tok.length])
        except (SlotFormatError, PoolError) as exc:
            exc.token = tok  # type: ignore[attr-defined] - the caller must still done() it
            raise

    def done(self, token: Token, *, keep: bool | None = None) -> None:
        """Finish with an input slot: keep it as an out-token (keep token), or FREE it.

        This acknowledges the request at this stage: if the instance dies afterwards,
        the request is not retried from this input. So call it after handing over the
        request's output (rule 4); a sink calls it once it has used the result.

        Args:
            token: the DATA token :meth:`recv_input` returned.
            keep: True keep, False free; None: keep while the OutToken queue holds fewer
                than ``max_out_tokens``.

        Raises:
            SharingError: not an input this client is reading (or already done).
        """
        key = (token.slab, token.slot)
        tok = self._reading.pop(key, None)
        if tok is None:
            raise SharingError(
                f"slab {token.slab} slot {token.slot} is not an input of this instance"
            )
        if keep is None:
            keep = len(self._out) < self.max_out_tokens
        if keep:
            capacity = len(self._slabs.slot_view(tok))
            self._send(
                Token(
                    _FREE,
                    CONTROL_STAGE,
                    tok.slab,
                    self.instance,
                    tok.slot,
                    tok.offset,
                    tok.length,
                    tok.request,
                )
            )
            self._out.append(
                Token(
                    _GRANT,
                    self.stage,
                    tok.slab,
                    self.instance,
                    tok.slot,
                    tok.offset,
                    capacity,
                    NO_REQUEST,
                )
            )
            self.counters["keeps"] += 1
        else:
            self._send_free(tok, tok.request)

    def poll(self, timeout: float | None = 0.0) -> int:
        """Serve the socket once (receipts, echoes, buffering inputs), waiting up to
        ``timeout`` seconds for something. Returns tokens handled.

        Raises:
            ChannelClosed: the instance was removed or the channel closed.
        """
        return self._pump(timeout)

    @property
    def slabs(self) -> SlabMap:
        """The :class:`SlabMap` this client maps slots through."""
        return self._slabs

    def out_tokens(self) -> list[Token]:
        """The OutToken queue (idle slots this instance may write), a copy."""
        return list(self._out)

    def stats(self) -> dict[str, Any]:
        """Counters plus ``out_tokens``, ``acquired``, ``reading`` and ``queued`` (inputs
        received and not yet returned)."""
        return {
            **self.counters,
            "out_tokens": len(self._out),
            "acquired": len(self._acquired),
            "reading": len(self._reading),
            "queued": len(self._inputs),
        }

    # -- socket ----------------------------------------------------------------------------
    def _free_frame(self, tok: Token, request: int) -> bytes:
        return Token(
            _FREE, self.stage, tok.slab, self.instance, tok.slot, tok.offset, tok.length, request
        ).pack()

    def _send_free(self, tok: Token, request: int) -> None:
        self._tx.append(self._free_frame(tok, request))
        self.counters["frees"] += 1
        self._flush()

    def _send(self, tok: Token) -> None:
        self._tx.append(tok.pack())
        self._flush()

    def _flush(self) -> None:
        if self._tx:
            data = b"".join(self._tx)
            self._tx.clear()
            self._ep.send_bytes(data, timeout=self.send_timeout_s)

    def _pump(self, timeout: float | None) -> int:
        data = self._ep.recv_bytes(MAX_BATCH, timeout)
        n = len(data) // TOKEN_SIZE
        for off in range(0, len(data), TOKEN_SIZE):
            self._dispatch(Token.unpack(data[off : off + TOKEN_SIZE]))
        self._flush()  # receipts and echoes leave before anything else happens
        return n

    def _dispatch(self, tok: Token) -> None:
        kind = tok.kind
        if kind == _DATA:
            self.counters["received"] += 1
            self.counters["receipts"] += 1
            self._tx.append(
                Token(
                    _GRANT,
                    tok.stage,
                    tok.slab,
                    self.instance,
                    tok.slot,
                    tok.offset,
                    tok.length,
                    tok.request,
                ).pack()
            )
            self._inputs.append(tok)
        elif kind == _GRANT:
            if self._awaiting == tok.request and self._reply is None:
                self._reply = tok
            else:  # the answer to a fault that timed out: give it back
                self.counters["stray_grants"] += 1
                self.counters["frees"] += 1
                self._tx.append(self._free_frame(tok, NO_REQUEST))
        elif kind == _BUSY:
            if tok.stage == CONTROL_STAGE:  # sync marker: echo after the receipts above
                self.counters["echoes"] += 1
                self._tx.append(
                    Token(_BUSY, CONTROL_STAGE, NO_SLAB, self.instance, 0, 0, 0, tok.request).pack()
                )
            elif self._awaiting == tok.request and self._reply is None:
                self._reply = tok
        elif kind == _ERROR:
            if self._awaiting == tok.request and self._reply is None and tok.slab == NO_SLAB:
                self._reply = tok
                return
            self.counters["errors"] += 1
            if tok.slab != NO_SLAB:  # drop a queued input the manager disowned
                self._inputs = collections.deque(
                    t for t in self._inputs if (t.slab, t.slot) != (tok.slab, tok.slot)
                )
            self._notices.append(tok)
        else:
            self.counters["unexpected"] += 1
