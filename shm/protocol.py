"""The tensor sharing protocol between the :class:`~infscaler.shm.manager.TensorSharingManager`
(service) and each :class:`~infscaler.shm.client.InstanceClient` (instance, front end) on
the control channel, so that slot leases hold end to end (InfScaler §IV-B, Fig. 4): the
reserved ids both sides share and the errors a client raises.

More (details, why it is so, history, figures): docs/architecture.md, "`shm/protocol.py`".
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
    """:meth:`InstanceClient.acquire` got no GRANT before its timeout (or a BUSY, asked
    not to retry it): only BUSY answers
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
