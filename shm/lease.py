"""The manager's lease table: the states of a slot in use and of a registered instance,
and the ONE table of legal moves between them (InfScaler §IV-B, Fig. 4). Every token the
:class:`~infscaler.shm.manager.TensorSharingManager` applies changes a
:class:`LeaseRecord` or :class:`InstanceRecord` only through :func:`advance`; a refused
move is a manager bug (inconsistent tokens are rejected before any move).

More (details, why it is so, history, figures): docs/architecture.md, "`shm/lease.py`".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from infscaler.base.errors import InfScalerError
from infscaler.ebpf.token import Token
from infscaler.shm.protocol import NO_REQUEST
from infscaler.shm.slab import SlotRef

if TYPE_CHECKING:  # for annotations only: reclaim imports this module
    from infscaler.shm.reclaim import Death, ReclaimReport

__all__ = [
    "INSTANCE_MOVES",
    "LEASE_MOVES",
    "InstanceEvent",
    "InstanceRecord",
    "InstanceState",
    "LeaseEvent",
    "LeaseRecord",
    "LeaseRole",
    "LeaseTransitionError",
    "advance",
    "allowed",
]


class _StrEnum(str, enum.Enum):
    """A ``str`` enum that formats as its value (``enum.StrEnum`` is Python 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class LeaseRole(_StrEnum):
    """The role of a slot in the manager's lease table (module docstring)."""

    FREE = "free"
    WRITER = "writer"
    READER = "reader"
    HELD = "held"
    TRANSIT = "transit"


class LeaseEvent(_StrEnum):
    """What moves a lease (module docstring: the moves)."""

    GRANT = "grant"
    RECEIPT = "receipt"
    KEEP = "keep"
    FREE = "free"
    TAKE = "take"
    ROUTE = "route"
    RELEASE = "release"


class InstanceState(_StrEnum):
    """The state of an instance id in the manager's membership table."""

    UNKNOWN = "unknown"
    LIVE = "live"
    DYING = "dying"
    DEAD = "dead"


class InstanceEvent(_StrEnum):
    """What moves an instance's state."""

    ADD = "add"
    DIE = "die"
    RECLAIM = "reclaim"


_W, _R, _H, _T, _F = (
    LeaseRole.WRITER,
    LeaseRole.READER,
    LeaseRole.HELD,
    LeaseRole.TRANSIT,
    LeaseRole.FREE,
)

#: The lease table's legal moves: ``(role, event) -> new role``. The only place they are
#: listed; :func:`advance` checks every move against it.
LEASE_MOVES: dict[tuple[LeaseRole, LeaseEvent], LeaseRole] = {
    (_F, LeaseEvent.GRANT): _W,
    (_W, LeaseEvent.RECEIPT): _R,
    (_T, LeaseEvent.RECEIPT): _R,
    (_R, LeaseEvent.KEEP): _W,
    (_W, LeaseEvent.FREE): _F,
    (_R, LeaseEvent.FREE): _F,
    (_W, LeaseEvent.TAKE): _H,
    (_R, LeaseEvent.TAKE): _H,
    (_T, LeaseEvent.TAKE): _H,
    (_H, LeaseEvent.ROUTE): _T,
    (_W, LeaseEvent.RELEASE): _F,
    (_R, LeaseEvent.RELEASE): _F,
    (_H, LeaseEvent.RELEASE): _F,
}

#: The membership table's legal moves: ``(state, event) -> new state``.
INSTANCE_MOVES: dict[tuple[InstanceState, InstanceEvent], InstanceState] = {
    (InstanceState.UNKNOWN, InstanceEvent.ADD): InstanceState.LIVE,
    (InstanceState.DEAD, InstanceEvent.ADD): InstanceState.LIVE,
    (InstanceState.LIVE, InstanceEvent.DIE): InstanceState.DYING,
    (InstanceState.DYING, InstanceEvent.RECLAIM): InstanceState.DEAD,
}


class LeaseTransitionError(InfScalerError):
    """A move the transition table does not list: a bug in the tensor sharing manager
    (tokens that are inconsistent with the lease table are rejected before any move).

    Attributes:
        state: the state the move started from. event: the event.
    """

    def __init__(self, state: enum.Enum, event: enum.Enum, what: str = "") -> None:
        where = f" ({what})" if what else ""
        legal = sorted(
            str(e) for table in (LEASE_MOVES, INSTANCE_MOVES) for (s, e) in table if s is state
        )
        super().__init__(
            f"internal error: illegal {type(state).__name__} move {event} from {state}{where}",
            hint=f"legal from {state}: {', '.join(legal) or 'none'}; this is a tensor "
            "sharing manager bug, please report it with the log",
        )
        self.state = state
        self.event = event


_S = TypeVar("_S", LeaseRole, InstanceState)


def allowed(state: LeaseRole | InstanceState, event: LeaseEvent | InstanceEvent) -> bool:
    """True if the table lists a move for ``event`` from ``state`` (pure)."""
    table = LEASE_MOVES if isinstance(state, LeaseRole) else INSTANCE_MOVES
    return (state, event) in table  # type: ignore[operator]


def advance(state: _S, event: LeaseEvent | InstanceEvent, what: str = "") -> _S:
    """The state after ``event`` (a :class:`LeaseEvent` or :class:`InstanceEvent`) from
    ``state`` (pure: the caller stores it); ``what`` names the slot / instance in errors.

    Raises:
        LeaseTransitionError: the move is not in :data:`LEASE_MOVES` /
            :data:`INSTANCE_MOVES` (a manager bug).
    """
    table = LEASE_MOVES if isinstance(state, LeaseRole) else INSTANCE_MOVES
    try:
        return table[(state, event)]  # type: ignore[index,return-value]
    except KeyError:
        raise LeaseTransitionError(state, event, what) from None


@dataclass
class LeaseRecord:
    """The manager's lease record of one slot in use (never :attr:`LeaseRole.FREE`: a
    freed slot's record leaves the table)."""

    ref: SlotRef
    owner: int
    role: LeaseRole
    request: int = NO_REQUEST
    data: Token | None = None  # HELD / TRANSIT: the DATA token to (re-)route
    deadline: float = 0.0  # HELD: fail after
    retry_at: float = 0.0  # HELD: route again from (when the hop has a live instance)
    report: ReclaimReport | None = None  # HELD / TRANSIT from a death: where failures go
    suspect_of: Death | None = None  # quarantined: the death that must settle it

    def move(self, event: LeaseEvent) -> LeaseRole:
        """Apply ``event`` to :attr:`role` through :func:`advance`; returns the new role.

        Raises:
            LeaseTransitionError: an illegal move (the record is left unchanged).
        """
        self.role = advance(self.role, event, f"slab {self.ref.slab} slot {self.ref.slot}")
        return self.role


@dataclass
class InstanceRecord:
    """The manager's record of one registered instance."""

    hop: int
    state: InstanceState = InstanceState.LIVE

    def move(self, event: InstanceEvent, instance: int) -> InstanceState:
        """Apply ``event`` to :attr:`state` through :func:`advance`.

        Raises:
            LeaseTransitionError: an illegal move (the record is left unchanged).
        """
        self.state = advance(self.state, event, f"instance {instance}")
        return self.state
