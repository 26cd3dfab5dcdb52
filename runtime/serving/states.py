"""The state machines of the request path: a request's phase in the front end and an
instance's state in the supervisor, each an enum with one transition table, checked in
one place (:func:`advance`).

Every change of a request's phase (``runtime/serving/frontend.py``: ``_Pending.phase``) and of
:attr:`~infscaler.runtime.processes.handles.InstanceHandle.state` goes through
:func:`advance` (the ``move`` method of each); a change the table does not allow raises
:class:`IllegalTransition`, an internal error (HTTP 500) naming the thing, both states
and what was allowed, instead of silently putting a request or an instance in a state
nothing handles. The enums are ``StrEnum``: they compare equal to, and format as, their
values (``"ready"``), which are what the status JSON and the metrics labels show.

More (details, why it is so, history, figures): docs/serving.md, "`runtime/serving/states.py`".
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from infscaler.base.errors import InfScalerError

__all__ = [
    "INSTANCE_TRANSITIONS",
    "REQUEST_TRANSITIONS",
    "IllegalTransition",
    "InstanceState",
    "RequestPhase",
    "advance",
]


class IllegalTransition(InfScalerError):
    """A state change the transition table does not allow: a bug in the runtime, never
    the client's fault (HTTP 500). The message names the thing, both states and the
    allowed next states."""

    status = 500


class RequestPhase(StrEnum):
    """Where a request is in the front end (see the module docstring)."""

    QUEUED = "queued"
    RUNNING = "running"
    ITEMS = "items"
    POST = "post"
    DONE = "done"


class InstanceState(StrEnum):
    """What an instance process is doing, as the supervisor sees it (module docstring)."""

    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    EXITED = "exited"
    FAILED = "failed"


_P, _I = RequestPhase, InstanceState

#: The one transition table of request phases: phase -> the phases it may change to.
REQUEST_TRANSITIONS: Mapping[RequestPhase, frozenset[RequestPhase]] = {
    _P.QUEUED: frozenset({_P.RUNNING, _P.DONE}),
    _P.RUNNING: frozenset({_P.ITEMS, _P.DONE}),
    _P.ITEMS: frozenset({_P.POST, _P.DONE}),
    _P.POST: frozenset({_P.DONE}),
    _P.DONE: frozenset(),
}

#: The one transition table of instance states: state -> the states it may change to.
INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    _I.STARTING: frozenset({_I.READY, _I.STOPPING, _I.FAILED}),
    _I.READY: frozenset({_I.STOPPING, _I.EXITED}),
    _I.STOPPING: frozenset({_I.EXITED}),
    _I.FAILED: frozenset({_I.EXITED}),
    _I.EXITED: frozenset(),
}

_S = TypeVar("_S", RequestPhase, InstanceState)


def advance(table: Mapping[_S, frozenset[_S]], old: _S, new: _S, what: str) -> _S:
    """The state after ``old`` -> ``new`` under ``table`` (pure; the one check of every
    phase and state change).

    Args:
        table: :data:`REQUEST_TRANSITIONS` or :data:`INSTANCE_TRANSITIONS`.
        old / new: the current and the next state (members of the table's enum).
        what: names the thing in the error ("request 12", "instance 3 of det_0").

    Returns:
        ``new``.

    Raises:
        IllegalTransition: ``new`` is not in ``table[old]`` (a state staying the same
            is a change too: the caller checks first when that is expected).
    """
    allowed = table.get(old)
    if allowed is None or new not in allowed:
        nxt = ", ".join(sorted(allowed)) if allowed else "none: it is final"
        raise IllegalTransition(
            f"internal error: {what} cannot go from {old!s} to {new!s} (allowed from "
            f"{old!s}: {nxt})",
            hint="a bug in the runtime's bookkeeping; please report it with the log",
        )
    return new
