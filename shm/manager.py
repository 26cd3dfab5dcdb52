"""The tensor sharing manager (service process): pool + control path, with leases that
hold end to end (InfScaler §IV-B, Fig. 4: token faults, lazy allocation, back-pressure).

One :class:`TensorSharingManager` thread per service serves the manager socket: FAULT
(GRANT from the :class:`~infscaler.shm.pool.TensorPool`, or BUSY at the cap), receipts,
frees and keeps, DATA with nowhere to go, and the reclaim of dead instances
(:mod:`infscaler.shm.reclaim`). Protocol: :mod:`infscaler.shm.protocol`; lease roles and
instance states: :mod:`infscaler.shm.lease`; the instance side:
:mod:`infscaler.shm.client`.

Invariants: (1) a slot is never granted again or freed while a live instance may use it;
(2) every slot a dead instance held is reclaimed and each affected request retried or
failed and reported, never lost; (3) a producer dying after a handover does not take the
slot from its consumer. More: docs/architecture.md, "Tensor sharing and the control path".
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from infscaler.base.threads import NamedThread
from infscaler.ebpf.channel import MAX_BATCH, MAX_HOPS, Channel
from infscaler.ebpf.errors import ChannelClosed, ChannelError
from infscaler.ebpf.token import NO_SLAB, TOKEN_SIZE, Token, TokenError, TokenKind
from infscaler.shm.lease import (
    InstanceEvent,
    InstanceRecord,
    InstanceState,
    LeaseEvent,
    LeaseRecord,
    LeaseRole,
    advance,
    allowed,
)
from infscaler.shm.pool import TensorPool
from infscaler.shm.protocol import (
    BARRIER_HOP,
    CONTROL_HOP,
    MANAGER_INSTANCE,
    NO_REQUEST,
    SharingError,
)
from infscaler.shm.reclaim import Death, ReclaimMixin, ReclaimReport
from infscaler.shm.slab import PoolError

__all__ = ["ReclaimReport", "TensorSharingManager"]

log = logging.getLogger("infscaler.shm")

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


class TensorSharingManager(ReclaimMixin):
    """The tensor sharing manager of one service (InfScaler §IV-B, Fig. 4). While it
    runs, change the pool only through it; it calls :meth:`TensorPool.release_idle`.

    Args:
        pool: the service's :class:`TensorPool`.
        channel: the control channel (:func:`~infscaler.ebpf.channel.open_channel`).
        hops: the pipeline's hops (others refused); None: any hop 0..62.
        hold_timeout_s: seconds DATA may wait for a live instance of its hop before its
            request fails (ERROR to its producer, slot freed).
        retry_interval_s: seconds between attempts to route held DATA.
        max_retries: re-routes after instance deaths before a request fails.
        on_failure: ``on_failure(request, reason)``, called in the manager thread outside
            its lock for every failed request.

    Raises:
        SharingError: a hop outside 0..62, or bad timing arguments.
    """

    def __init__(
        self,
        pool: TensorPool,
        channel: Channel,
        *,
        hops: Iterable[int] | None = None,
        hold_timeout_s: float = 30.0,
        retry_interval_s: float = 0.1,
        max_retries: int = 3,
        on_failure: Callable[[int, str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._ch = channel
        self._hops: frozenset[int] | None = None
        if hops is not None:
            self._hops = frozenset(int(s) for s in hops)
            bad = sorted(s for s in self._hops if not 0 <= s < BARRIER_HOP)
            if bad:
                raise SharingError(
                    f"hops {bad} outside 0..{BARRIER_HOP - 1}",
                    hint=f"hop {BARRIER_HOP} is reserved for the manager's barrier",
                )
        if hold_timeout_s <= 0 or retry_interval_s <= 0 or max_retries < 0:
            raise SharingError("hold_timeout_s and retry_interval_s must be > 0, max_retries >= 0")
        self.hold_timeout_s = float(hold_timeout_s)
        self.retry_interval_s = float(retry_interval_s)
        self.max_retries = int(max_retries)
        self._on_failure = on_failure
        self._lock = threading.RLock()
        self._instances: dict[int, InstanceRecord] = {}
        self._slots: dict[tuple[int, int], LeaseRecord] = {}
        self._held: dict[tuple[int, int], LeaseRecord] = {}
        self._hold_limits: dict[int, tuple[float, str]] = {}
        self._barriers: dict[int, Death | None] = {}
        self._syncs: dict[int, Death] = {}
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
        """Start the manager thread (idempotent); registers the reserved barrier hop
        (instance ``MANAGER_INSTANCE`` added and removed at once).

        Raises:
            ChannelError: the channel is closed, or instance id 0xFFFF is taken.
        """
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            if BARRIER_HOP not in self._ch.stats()["stages"]:
                self._ch.add_instance(BARRIER_HOP, MANAGER_INSTANCE).close()
                self._ch.remove_instance(MANAGER_INSTANCE)
            self._stopping = False
            self._thread = NamedThread(target=self._run, name="isc-shm-manager", daemon=True)
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
    def add_instance(self, hop: int, instance: int, *, live: bool = True) -> socket.socket:
        """Register an instance of ``hop`` with the channel and the manager; held DATA
        for ``hop`` is routed at once. With ``live`` False nothing is routed to it until
        :meth:`set_live` (a still-loading instance would hold tokens for seconds).

        Returns:
            the instance-side socket (:meth:`Channel.add_instance`).

        Raises:
            SharingError: a hop not in ``hops`` or the reserved one, instance id 0xFFFF,
                an instance already live or still being reclaimed.
            ChannelError: the channel refused (full hop, closed channel).
        """
        if self._hops is not None and hop not in self._hops:
            raise SharingError(f"hop {hop} is not a hop of this pipeline {sorted(self._hops)}")
        if hop == BARRIER_HOP or not 0 <= hop < MAX_HOPS:
            raise SharingError(f"hop {hop} is reserved or outside 0..{BARRIER_HOP - 1}")
        if instance == MANAGER_INSTANCE:
            raise SharingError(f"instance id {MANAGER_INSTANCE} is reserved for the manager")
        with self._lock:
            old = self._instances.get(instance)
            if old is not None and not allowed(old.state, InstanceEvent.ADD):
                raise SharingError(f"instance {instance} is already registered ({old.state})")
            rec = InstanceRecord(hop, InstanceState.UNKNOWN)
            rec.move(InstanceEvent.ADD, instance)
            sock = self._ch.add_instance(hop, instance, live=live)
            self._instances[instance] = rec
            if live:
                self._route_held(hop)
        return sock

    def set_live(self, instance: int) -> None:
        """Route DATA to an instance added with ``live=False`` (it is ready), and the
        DATA held for its hop at once. A no-op for an instance already live; ignored
        for one that is not registered any more (it died while loading).
        """
        with self._lock:
            inst = self._instances.get(instance)
            if inst is None or inst.state is InstanceState.DEAD:
                return
            try:
                self._ch.set_live(instance)
            except ChannelError:
                return  # removed meanwhile
            self._route_held(inst.hop)

    def set_hold_limit(self, hop: int, seconds: float | None, reason: str = "") -> None:
        """Bound how long DATA held for ``hop`` waits, from now on: at most ``seconds``
        (0: fail it at once) instead of ``hold_timeout_s``; None lifts the bound. The
        supervisor sets it while a unit with no live instance waits for its restart
        backoff, so its requests get a prompt 503 with ``reason`` rather than waiting
        for the hold timeout."""
        with self._lock:
            if seconds is None:
                self._hold_limits.pop(hop, None)
                return
            seconds = max(0.0, float(seconds))
            self._hold_limits[hop] = (seconds, reason)
            deadline = time.monotonic() + seconds
            for st in self._held.values():
                if st.data is not None and st.data.hop == hop:
                    st.deadline = min(st.deadline, deadline)
            wake = self._barrier_token(self._nonce())
        with contextlib.suppress(ChannelError, OSError):  # wake the thread: deadlines moved
            self._ch.route(wake)

    def _hold_s(self, hop: int) -> float:
        limit = self._hold_limits.get(hop)
        return self.hold_timeout_s if limit is None else min(self.hold_timeout_s, limit[0])

    def _route_held(self, hop: int) -> None:
        for key, st in list(self._held.items()):
            if st.data is not None and st.data.hop == hop:
                self._route_parked(key, st)

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
        ``unknown_sync``, ``malformed``; ``unknown_stage``: a hop not of this pipeline, the
        key keeps the old name); gauges ``slots_held`` (HELD), ``slots_in_transit``,
        ``slots_quarantined``, ``slots_tracked``; ``instances``: id -> {``stage`` (its
        hop; the key keeps the old name), ``state`` (live / dying / dead), ``slots``}.
        """
        with self._lock:
            per_owner = collections.Counter(st.owner for st in self._slots.values())
            mgr = {
                **self._c,
                "rejected": sum(self._rejections.values()),
                "rejections": dict(self._rejections),
                "slots_held": len(self._held),
                "slots_in_transit": sum(
                    1 for s in self._slots.values() if s.role is LeaseRole.TRANSIT
                ),
                "slots_quarantined": sum(1 for s in self._slots.values() if s.suspect_of),
                "slots_tracked": len(self._slots),
                "instances": {
                    i: {"stage": v.hop, "state": v.state.value, "slots": per_owner.get(i, 0)}
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
                if st.data is not None and self._hop_live(st.data.hop):
                    due = min(due, st.retry_at)
            return min(_MAX_SLEEP_S, max(0.0, due - now))

    def _handle(self, tok: Token) -> None:
        self._c["tokens"] += 1
        kind = tok.kind
        if kind == _DATA:
            if tok.hop == BARRIER_HOP and tok.slab == NO_SLAB:
                self._on_barrier(tok.request)
            else:
                self._on_data(tok)
        elif kind == _FAULT:
            self._on_fault(tok)
        elif kind == _GRANT:
            self._on_receipt(tok)
        elif kind == _FREE:
            if tok.hop == CONTROL_HOP:
                self._on_keep(tok)
            else:
                self._on_free(tok)
        elif kind == _BUSY and tok.hop == CONTROL_HOP:
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
        return Token(_DATA, BARRIER_HOP, NO_SLAB, MANAGER_INSTANCE, 0, 0, 0, nonce)

    def _reject(self, reason: str) -> None:
        self._rejections[reason] = self._rejections.get(reason, 0) + 1

    def _hop_live(self, hop: int) -> bool:
        return any(i.hop == hop and i.state is InstanceState.LIVE for i in self._instances.values())

    def _sender(self, tok: Token) -> InstanceRecord | None:
        """The sending instance, or None (counted) if unknown or dead. A dying one is
        fine: its tokens were sent before it died (they all arrive before its barrier)."""
        inst = self._instances.get(tok.instance)
        if inst is None:
            self._reject("unknown_instance")
        elif inst.state is InstanceState.DEAD:
            self._reject("dead_instance")
            inst = None
        return inst

    def _send(self, instance: int, tok: Token) -> bool:
        inst = self._instances.get(instance)
        if inst is None or inst.state is not InstanceState.LIVE:
            self._c["dead_letters"] += 1
            return False
        try:
            self._ch.manager_send(instance, tok)
        except (ChannelError, OSError, TimeoutError):
            self._c["dead_letters"] += 1
            return False
        return True

    def _send_error(self, instance: int, tok: Token) -> None:
        err = Token(_ERROR, tok.hop, tok.slab, instance, tok.slot, tok.offset, 0, tok.request)
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

    def _lookup(self, tok: Token, missing: str) -> LeaseRecord | None:
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

    def _free_slot(
        self, key: tuple[int, int], st: LeaseRecord, event: LeaseEvent = LeaseEvent.RELEASE
    ) -> None:
        """The slot goes back to the pool: the instance's FREE, or the manager's RELEASE."""
        new_role = advance(st.role, event, f"slab {key[0]} slot {key[1]}")
        self._pool.free(key[0], key[1], owner=st.owner)
        st.role = new_role
        del self._slots[key]
        self._held.pop(key, None)
        if st.suspect_of is not None:
            st.suspect_of.suspects.pop(key, None)
            st.suspect_of = None

    def _take(self, key: tuple[int, int], st: LeaseRecord, data: Token) -> None:
        """The manager takes the lease of a slot whose DATA it has (HELD)."""
        st.move(LeaseEvent.TAKE)  # checked before anything changes
        if st.owner != MANAGER_INSTANCE:
            self._pool.transfer(
                key[0], key[1], MANAGER_INSTANCE, from_owner=st.owner, request=data.request
            )
            st.owner = MANAGER_INSTANCE
        st.request = data.request
        st.data = data
        now = time.monotonic()
        st.deadline = now + self._hold_s(data.hop)
        st.retry_at = now
        self._held[key] = st
        self._c["held"] += 1
        self._settle_handed_over(key, st)

    def _route_parked(self, key: tuple[int, int], st: LeaseRecord) -> bool:
        """Route a HELD slot's DATA by the channel's policy (-> TRANSIT)."""
        assert st.data is not None
        try:
            self._ch.route(st.data)
        except (ChannelError, OSError, TimeoutError):
            st.retry_at = time.monotonic() + self.retry_interval_s
            return False
        st.move(LeaseEvent.ROUTE)
        self._held.pop(key, None)
        self._c["routed"] += 1
        return True

    # -- token handlers --------------------------------------------------------------------
    def _on_fault(self, tok: Token) -> None:
        inst = self._instances.get(tok.instance)
        if inst is not None and inst.state is InstanceState.DYING:
            self._c["dead_letters"] += 1  # sent just before it died: no one to answer
            return
        if self._sender(tok) is None:
            return
        if self._hops is not None and tok.hop not in self._hops:
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
            self._send_error(tok.instance, Token(_ERROR, tok.hop, NO_SLAB, 0, 0, 0, 0, tok.request))
            return
        if ref is None:
            self._c["busy"] += 1
            self._send(
                tok.instance, Token(_BUSY, tok.hop, NO_SLAB, tok.instance, 0, 0, 0, tok.request)
            )
            return
        st = LeaseRecord(ref, tok.instance, LeaseRole.FREE, tok.request)
        st.move(LeaseEvent.GRANT)
        self._slots[(ref.slab, ref.slot)] = st
        self._c["grants"] += 1
        # if the send fails the instance is gone: its reclaim frees the slot
        self._send(tok.instance, ref.to_token(_GRANT, tok.hop, tok.instance, request=tok.request))

    def _on_free(self, tok: Token) -> None:
        if self._sender(tok) is None:
            return
        st = self._lookup(tok, "double_free")
        if st is None:
            return
        if st.owner != tok.instance or not allowed(st.role, LeaseEvent.FREE):
            self._reject("wrong_owner")
            return
        self._free_slot((tok.slab, tok.slot), st, LeaseEvent.FREE)
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
        if not allowed(st.role, LeaseEvent.KEEP):
            self._reject("not_reader")
            return
        st.move(LeaseEvent.KEEP)
        self._pool.transfer(
            tok.slab, tok.slot, tok.instance, from_owner=tok.instance, request=NO_REQUEST
        )
        st.request = NO_REQUEST
        self._c["keeps"] += 1

    def _on_receipt(self, tok: Token) -> None:
        if self._sender(tok) is None:
            return
        key = (tok.slab, tok.slot)
        st = self._lookup(tok, "stale_receipt")
        if st is None:
            self._send_error(tok.instance, tok)
            return
        if st.role is LeaseRole.READER:
            if st.owner == tok.instance and st.request == tok.request:
                return  # a repeated receipt: nothing to do
            self._reject("receipt_conflict")
            self._send_error(tok.instance, tok)
            return
        if st.role is LeaseRole.HELD:
            self._reject("not_routed")
            self._send_error(tok.instance, tok)
            return
        if st.request != NO_REQUEST and st.request != tok.request:
            self._reject("request_mismatch")
            self._send_error(tok.instance, tok)
            return
        st.move(LeaseEvent.RECEIPT)  # checked before anything changes
        if st.owner != tok.instance:
            self._pool.transfer(
                tok.slab, tok.slot, tok.instance, from_owner=st.owner, request=tok.request
            )
        st.owner, st.request = tok.instance, tok.request
        st.data, st.report = None, None
        self._held.pop(key, None)
        self._c["receipts"] += 1
        self._settle_handed_over(key, st)

    def _on_data(self, tok: Token) -> None:
        """DATA the channel could not deliver (no live instance, duplicate in flight,
        unknown hop, ...): the manager takes the slot and holds the DATA."""
        self._c["data_at_manager"] += 1
        key = (tok.slab, tok.slot)
        st = self._slots.get(key)
        if (
            st is None
            or st.role in (LeaseRole.READER, LeaseRole.HELD)
            or (st.role is LeaseRole.WRITER and st.owner != tok.instance)
            or not self._geometry_ok(tok)
        ):
            # names no slot in transit: refuse, and tell its sender the request failed
            self._reject("bad_data")
            self._fail(tok.request, "DATA names a slot that is not in transit")
            self._send_error(tok.instance, tok)
            return
        self._take(key, st, tok)
        if (self._hops is not None and tok.hop not in self._hops) or tok.hop >= BARRIER_HOP:
            self._reject("unknown_stage")
            self._fail_parked(key, st, f"hop {tok.hop} is not a hop of this pipeline")
            return
        if self._hop_live(tok.hop):  # bounced for another reason: retry shortly
            st.retry_at = time.monotonic() + self.retry_interval_s

    def _fail_parked(self, key: tuple[int, int], st: LeaseRecord, reason: str) -> None:
        data = st.data
        assert data is not None
        report = st.report
        self._free_slot(key, st)
        self._fail(data.request, reason, report)
        self._send_error(data.instance, data)

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
                hop = st.data.hop if st.data is not None else -1
                limit = self._hold_limits.get(hop)
                self._fail_parked(
                    key,
                    st,
                    limit[1]
                    if limit is not None and limit[1]
                    else f"no live instance of hop {hop} took it within {self.hold_timeout_s} s",
                )
            elif now >= st.retry_at and st.data is not None and self._hop_live(st.data.hop):
                self._route_parked(key, st)
        if now >= self._next_idle_check:
            self._pool.release_idle()
            self._next_idle_check = now + max(
                0.5, min(_MAX_SLEEP_S * 5, self._pool.idle_release_s / 2)
            )
