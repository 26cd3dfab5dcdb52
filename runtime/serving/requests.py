"""What the front end keeps of a request (:class:`PendingRequest`) and how a request
fails (:class:`RequestError`, with the HTTP status to answer with)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from infscaler.base.errors import InfScalerError
from infscaler.runtime.serving.states import REQUEST_TRANSITIONS, RequestPhase, advance

if TYPE_CHECKING:
    from infscaler.runtime.serving.route import Route

__all__ = ["PendingRequest", "RequestError"]


class RequestError(InfScalerError):
    """A request failed; ``status`` is the HTTP status to answer with (400: a bad
    argument such as a non-finite timeout; 500: a unit failed on it; 503: the service
    could not run it now). ``retry_after_s``: when a refused request may be retried,
    seconds (None: not known); the server's error middleware sends it as a
    ``Retry-After`` header (RFC 9110 §10.2.3). ``code``: a short stable reason code
    (``slo``, ``queue_full``, ``bytes_in_flight``, ...; docs/api.md lists them), which
    the API sends beside the message (HTTP: the error JSON's ``code``; gRPC: the
    ``infscaler-code`` trailing metadata) so that clients count refusals by it, never
    by the message's text; None: no code. ``hold_s``: how long the server waits before
    answering the refusal, s (0: at once;
    :func:`~infscaler.runtime.serving.admission.refusal_hold_s`)."""

    def __init__(
        self,
        message: str,
        status: int = 503,
        hint: str | None = None,
        *,
        retry_after_s: float | None = None,
        code: str | None = None,
        hold_s: float = 0.0,
    ) -> None:
        super().__init__(message, hint)
        self.status = status
        #: the refusal's reason code (None: none)
        self.code = code
        #: seconds a client should wait before retrying (HTTP ``Retry-After``), or None
        self.retry_after_s = retry_after_s
        #: seconds the server holds this refusal before answering it
        self.hold_s = hold_s


@dataclass
class PendingRequest:
    """A request the front end admitted and has not answered: where it is
    (:attr:`phase`), what it waits for, and what admission expected of it."""

    seq: int
    route: Route
    inputs: dict[str, np.ndarray] | None  # what goes into its first slot, until it is sent
    future: concurrent.futures.Future
    deadline: float
    t_submit_ns: int
    phase: RequestPhase = RequestPhase.QUEUED
    count: int | None = None
    items: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    carry: dict[str, np.ndarray] | None = None
    traces: list[np.ndarray] = field(default_factory=list)
    busy_since: float | None = None
    waits: set[str] = field(default_factory=set)
    estimate_ms: float | None = None  # what the SLO admission expected (ms)
    estimate_factor: float | None = None  # the correction it was made with (Route.factor)
    level: int = 1  # its priority level (1 highest)
    order: int = 0  # its arrival order in the backlog
    queue_deadline: float | None = None  # when its queue timeout passes (monotonic s)
    delayed: bool = False  # its queue timeout passed with timeout_action DELAY
    uid: int | None = None
    slot_bytes: int | None = None  # its first slot's size (tensors_nbytes; None: unknown)
    slot: Any = None  # its lent first slot (frontend.LentSlot) until it is handed over

    def move(self, to: RequestPhase) -> None:
        """Change :attr:`phase` to ``to`` (checked against the one table:
        :func:`~infscaler.runtime.serving.states.advance`).

        Raises:
            IllegalTransition: the table does not allow it (a bug; HTTP 500).
        """
        if to in REQUEST_TRANSITIONS.get(self.phase, ()):  # allowed: no error text to build
            self.phase = to
            return
        self.phase = advance(REQUEST_TRANSITIONS, self.phase, to, f"request {self.seq}")
