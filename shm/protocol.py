"""The tensor sharing protocol: the tokens a :class:`~infscaler.shm.manager.TensorSharingManager`
(service process) and each :class:`~infscaler.shm.client.InstanceClient` (instance
process) exchange on the control channel, so that slot leases hold end to end
(InfScaler §IV-B, Fig. 4: token faults, the OutToken queue, lazy allocation).

Role in the request path: the contract between the two sides of tensor sharing. The
front end and every instance hold an :class:`~infscaler.shm.client.InstanceClient`
(:mod:`infscaler.shm.client`); the service runs one manager (:mod:`infscaler.shm.manager`,
its reclaim of dead instances in :mod:`infscaler.shm.reclaim`, its lease table's legal
moves in :mod:`infscaler.shm.lease`). This module holds what both sides share: the
reserved ids below and the errors a client raises.

The problem this protocol solves
================================

With the eBPF channel a DATA handover from producer to consumer is redirected in the
kernel and never reaches the manager, so the pool's lease table would still name the
producer; if that producer died, reclaiming its slots would free one the consumer is
still reading. The lease has to move, and the manager has to be able to tell, when an
instance dies, which of its slots it had handed over.

The protocol (token layout unchanged; conventions on existing kinds)
====================================================================

``I`` an instance, ``M`` the manager. ``CONTROL_HOP`` = 0xFFFF (no real hop: hops
are below 64), ``NO_REQUEST`` = 2**64-1 (no real request id), ``MANAGER_INSTANCE`` =
0xFFFF (the pool owner of slots the manager holds itself).

======  =========================  ================================================
dir.    token                      meaning
======  =========================  ================================================
I->M    FAULT(hop, length=n,       OutToken queue has no slot >= n bytes: lease one
        request=r)                 (:meth:`TensorPool.fault`)
M->I    GRANT(slot, length=cap,    the slot is leased to I as a *writer*, for r
        request=r)
M->I    BUSY(hop, request=r)       at the cap: back off, fault again (back-pressure)
M->I    ERROR(request=r)           the fault is refused (larger than any slot)
I->I    DATA(hop, slot,            the handover (routed by the channel, in-kernel on
        length=used, request=r)    eBPF); acknowledges I's in-flight input r
I->M    GRANT(slot, request=r)     **receipt**: "I received this DATA slot". Sent by
        (a GRANT *from* an         the consumer as soon as it reads the DATA from its
        instance)                  socket, before it touches the slot. The lease moves
                                   producer -> consumer (a *reader*)
I->M    FREE(slot, request=r)      the slot goes back to the pool (the consumer's FREE
                                   names the slot it received); acknowledges r
I->M    FREE(hop=CONTROL_HOP,      **keep**: the consumer is done with its input and
        slot, request=r)           keeps the slot as an out-token (reader -> writer,
                                   no request); acknowledges r like a FREE
M->I    BUSY(hop=CONTROL_HOP,      **sync marker** (see reclaim, step 3)
        request=nonce)
I->M    BUSY(hop=CONTROL_HOP,      **sync echo**: every DATA queued before the marker
        request=nonce)             has been read and receipted
M->I    DATA(...)                  re-routed DATA (retry of a dead instance's input,
                                   or DATA the manager held)
M->I    ERROR(slot?, request=r)    the manager failed request r (held too long, a slot
                                   it could not account for, too many retries)
M->M    DATA(hop=BARRIER_HOP,      **barrier**: routed through the channel to the
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

Limits: the manager trusts a token's ``instance`` field (neither channel stamps the
sender on tokens for the manager), so an instance can impersonate another, and a
receipt for a writer slot that was never handed to its sender cannot be told from a
real one; what is refused is any token inconsistent with the lease table (stale,
double, replayed, or someone else's slot). A quarantined slot stays quarantined until every live instance has
echoed: an instance that never reads its socket delays that (never the other way
round). Hop 63 (``BARRIER_HOP``) and instance id 0xFFFF are reserved.
"""

from __future__ import annotations

from infscaler.base.errors import InfScalerError
from infscaler.ebpf.channel import MAX_HOPS
from infscaler.ebpf.token import Token

__all__ = [
    "BARRIER_HOP",
    "CONTROL_HOP",
    "MANAGER_INSTANCE",
    "NO_REQUEST",
    "BackPressureError",
    "RequestFailed",
    "SharingError",
]

#: ``hop`` value of control tokens (keep, sync marker, sync echo): no real hop.
CONTROL_HOP = 0xFFFF
#: The hop the manager's barrier tokens are routed to; never has a live instance.
BARRIER_HOP = MAX_HOPS - 1
#: Pool owner of the slots the manager holds itself (held / re-routed DATA).
MANAGER_INSTANCE = 0xFFFF
#: A request id no request uses: the ``request`` of frees that acknowledge nothing.
NO_REQUEST = (1 << 64) - 1


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
