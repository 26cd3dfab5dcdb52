"""Reclaim: what the manager does with the slots of an instance whose process died
(InfScaler §IV-B, Fig. 4; protocol: :mod:`infscaler.shm.protocol`). Off the hot path:
:class:`ReclaimMixin`, the part of the manager behind
:meth:`~infscaler.shm.manager.TensorSharingManager.instance_died`, runs in the manager
thread under its lock; every lease move goes through :func:`infscaler.shm.lease.advance`.

More (details, why it is so, history, figures): docs/architecture.md, "`shm/reclaim.py`".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from infscaler.ebpf.token import NO_SLAB, Token, TokenKind
from infscaler.shm.lease import InstanceEvent, InstanceState, LeaseRecord, LeaseRole, allowed
from infscaler.shm.protocol import CONTROL_HOP, NO_REQUEST, SharingError
from infscaler.shm.slab import SlotRef

__all__ = ["Death", "ReclaimMixin", "ReclaimReport"]

_RETRIES_KEPT = 65_536


@dataclass
class ReclaimReport:
    """What :meth:`TensorSharingManager.instance_died` did with a dead instance's slots;
    read it once :attr:`complete` (:meth:`wait`).

    Attributes:
        instance, hop: the dead instance and its hop.
        retried: request ids whose unacknowledged DATA was re-routed, slot intact.
        held: request ids whose DATA waits for a live instance of the hop (failed after
            ``hold_timeout_s``, then in ``failed`` too).
        failed: ``(request, reason)`` of requests that cannot continue.
        freed: slots returned to the pool (``SlotRef.request``: ``NO_REQUEST`` for an
            idle out-token).
        handed_over: slots it had handed over; they stay with their consumer.
        pending: quarantined slots not settled yet; complete: all accounted for.
    """

    instance: int
    hop: int
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
class Death:
    """One reported death, from :meth:`~ReclaimMixin.instance_died` until its report is complete."""

    instance: int
    hop: int
    report: ReclaimReport
    returned: list[Token]
    suspects: dict[tuple[int, int], SlotRef] = field(default_factory=dict)
    awaiting: set[int] = field(default_factory=set)
    sync_nonce: int | None = None


class ReclaimMixin:
    """The reclaim half of :class:`~infscaler.shm.manager.TensorSharingManager` (it
    inherits this class): :meth:`instance_died`, :meth:`report`, and the barrier, sync
    echo and settling handlers the module docstring describes. It uses the manager's
    lease table (``_slots``, ``_instances``), channel, pool, counters and helpers; it is
    not usable on its own.
    """

    def instance_died(self, instance: int, *, timeout: float = 10.0) -> ReclaimReport:
        """Reclaim what instance ``instance`` held once its process exited (also how a
        cleanly exited instance is deregistered): DATA re-routed or held, acknowledged
        inputs and unused out-slots freed, possibly handed-over slots quarantined until
        every live instance answers a sync marker.

        Returns:
            the :class:`ReclaimReport`, complete unless ``timeout`` s passed first (it
            then completes in place: :meth:`ReclaimReport.wait`).

        Raises:
            SharingError: the manager is not running, or the instance is unknown or
                already reported dead.
            ChannelError: the channel is closed.
        """
        if not self.running:
            raise SharingError("the tensor sharing manager is not running", hint="call start()")
        with self._lock:
            inst = self._instances.get(instance)
            state = InstanceState.UNKNOWN if inst is None else inst.state
            if inst is None or not allowed(state, InstanceEvent.DIE):
                raise SharingError(f"instance {instance} is {state}, not live")
            inst.move(InstanceEvent.DIE, instance)
            returned = self._ch.remove_instance(instance)
            report = ReclaimReport(instance, inst.hop)
            self._reports[instance] = report
            nonce = self._nonce()
            self._barriers[nonce] = Death(instance, inst.hop, report, returned)
            self._c["deaths"] += 1
            self._ch.route(self._barrier_token(nonce))
        report.wait(timeout)
        return report

    def report(self, instance: int) -> ReclaimReport | None:
        """The latest :class:`ReclaimReport` of ``instance`` (None if it never died)."""
        with self._lock:
            return self._reports.get(instance)

    def _settle_handed_over(self, key: tuple[int, int], st: LeaseRecord) -> None:
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

    def _reclaim(self, d: Death) -> None:
        """Step 2 of the reclaim (module docstring): everything ``d.instance`` sent
        before dying has been applied."""
        report = d.report
        x = d.instance
        self._instances[x].move(InstanceEvent.RECLAIM, x)
        returned_requests = set()
        for data in d.returned:
            returned_requests.add(data.request)
            key = (data.slab, data.slot)
            st = self._slots.get(key)
            if st is None or st.role is LeaseRole.HELD or not self._geometry_ok(data):
                self._fail(
                    data.request, "the slot of its unacknowledged DATA is not leased", report
                )
                continue
            if st.role is LeaseRole.READER and st.owner != x:
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
            if self._hop_live(data.hop) and self._route_parked(key, st):
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
            if st.role is LeaseRole.READER or (
                st.role is LeaseRole.WRITER
                and st.request != NO_REQUEST
                and st.request in returned_requests
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
            marker = Token(TokenKind.BUSY, CONTROL_HOP, NO_SLAB, 0, 0, 0, 0, d.sync_nonce)
            for i, inst in self._instances.items():
                if inst.state is InstanceState.DYING:  # its barrier (later) hands back its DATA
                    d.awaiting.add(i)
                elif inst.state is InstanceState.LIVE and self._send(i, marker):
                    d.awaiting.add(i)
                    self._c["syncs_sent"] += 1
        self._maybe_complete(d)

    def _maybe_complete(self, d: Death) -> None:
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
