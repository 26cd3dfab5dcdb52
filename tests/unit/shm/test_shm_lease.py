"""The lease table's transition tables (infscaler.shm.lease), as pure functions: every
legal move, every illegal one, and the records that go through them. No processes."""

from __future__ import annotations

import itertools
import json

import pytest

from infscaler.shm.lease import (
    INSTANCE_MOVES,
    LEASE_MOVES,
    InstanceEvent,
    InstanceRecord,
    InstanceState,
    LeaseEvent,
    LeaseRecord,
    LeaseRole,
    LeaseTransitionError,
    advance,
    allowed,
)
from infscaler.shm.slab import SlotRef

W, R, H, T, F = (
    LeaseRole.WRITER,
    LeaseRole.READER,
    LeaseRole.HELD,
    LeaseRole.TRANSIT,
    LeaseRole.FREE,
)

# the protocol's moves, written out independently of the table (module docstring)
LEGAL_LEASE = {
    (F, LeaseEvent.GRANT): W,
    (W, LeaseEvent.RECEIPT): R,
    (T, LeaseEvent.RECEIPT): R,
    (R, LeaseEvent.KEEP): W,
    (W, LeaseEvent.FREE): F,
    (R, LeaseEvent.FREE): F,
    (W, LeaseEvent.TAKE): H,
    (R, LeaseEvent.TAKE): H,
    (T, LeaseEvent.TAKE): H,
    (H, LeaseEvent.ROUTE): T,
    (W, LeaseEvent.RELEASE): F,
    (R, LeaseEvent.RELEASE): F,
    (H, LeaseEvent.RELEASE): F,
}
LEGAL_INSTANCE = {
    (InstanceState.UNKNOWN, InstanceEvent.ADD): InstanceState.LIVE,
    (InstanceState.DEAD, InstanceEvent.ADD): InstanceState.LIVE,
    (InstanceState.LIVE, InstanceEvent.DIE): InstanceState.DYING,
    (InstanceState.DYING, InstanceEvent.RECLAIM): InstanceState.DEAD,
}


def test_tables_are_the_protocols_moves():
    assert LEASE_MOVES == LEGAL_LEASE
    assert INSTANCE_MOVES == LEGAL_INSTANCE


@pytest.mark.parametrize(("move", "to"), sorted(LEGAL_LEASE.items()))
def test_legal_lease_moves(move, to):
    state, event = move
    assert allowed(state, event)
    assert advance(state, event) is to


ILLEGAL_LEASE = sorted(set(itertools.product(LeaseRole, LeaseEvent)) - set(LEGAL_LEASE))


@pytest.mark.parametrize(("state", "event"), ILLEGAL_LEASE)
def test_illegal_lease_moves_raise(state, event):
    assert not allowed(state, event)
    with pytest.raises(LeaseTransitionError) as info:
        advance(state, event, "slab 1 slot 2")
    msg = str(info.value)
    assert "internal error" in msg and f"move {event.value} from {state.value}" in msg
    assert "slab 1 slot 2" in msg
    assert info.value.state is state and info.value.event is event


def test_illegal_moves_cover_the_protocol_errors():
    # the moves a bad token would ask for, all refused by the table
    assert not allowed(H, LeaseEvent.RECEIPT)  # a receipt for DATA the manager holds
    assert not allowed(W, LeaseEvent.KEEP)  # keep of a slot it does not read
    assert not allowed(H, LeaseEvent.FREE)  # an instance freeing the manager's slot
    assert not allowed(T, LeaseEvent.FREE)
    assert not allowed(F, LeaseEvent.FREE)  # double free
    assert not allowed(R, LeaseEvent.GRANT)  # granting a slot in use
    assert not allowed(T, LeaseEvent.RELEASE)  # freeing DATA on its way to a consumer


@pytest.mark.parametrize(("move", "to"), sorted(LEGAL_INSTANCE.items()))
def test_legal_instance_moves(move, to):
    assert allowed(*move)
    assert advance(*move) is to


ILLEGAL_INSTANCE = sorted(
    set(itertools.product(InstanceState, InstanceEvent)) - set(LEGAL_INSTANCE)
)


@pytest.mark.parametrize(("state", "event"), ILLEGAL_INSTANCE)
def test_illegal_instance_moves_raise(state, event):
    assert not allowed(state, event)
    with pytest.raises(LeaseTransitionError, match=f"InstanceState move {event.value}"):
        advance(state, event, "instance 7")


def test_error_hint_lists_the_legal_moves():
    with pytest.raises(LeaseTransitionError) as info:
        advance(R, LeaseEvent.ROUTE)
    assert info.value.hint is not None
    for event in ("free", "keep", "release", "take"):
        assert event in info.value.hint


def test_lease_record_moves_and_refuses_without_change():
    rec = LeaseRecord(SlotRef(0, 3, 4096, 8192), owner=5, role=F)
    assert rec.move(LeaseEvent.GRANT) is W
    assert rec.move(LeaseEvent.RECEIPT) is R
    with pytest.raises(LeaseTransitionError, match="slab 0 slot 3"):
        rec.move(LeaseEvent.ROUTE)
    assert rec.role is R  # unchanged by the refused move
    assert rec.move(LeaseEvent.KEEP) is W


def test_instance_record_lifecycle():
    rec = InstanceRecord(hop=2, state=InstanceState.UNKNOWN)
    for event, to in (
        (InstanceEvent.ADD, InstanceState.LIVE),
        (InstanceEvent.DIE, InstanceState.DYING),
        (InstanceEvent.RECLAIM, InstanceState.DEAD),
        (InstanceEvent.ADD, InstanceState.LIVE),  # an id is reused once dead
    ):
        assert rec.move(event, 9) is to
    with pytest.raises(LeaseTransitionError, match="instance 9"):
        rec.move(InstanceEvent.RECLAIM, 9)  # live, not dying
    assert rec.state is InstanceState.LIVE


def test_states_are_strings_on_the_wire():
    # stats() is served as JSON: the values, not the member names
    assert json.dumps({"state": InstanceState.DYING, "role": T}) == (
        '{"state": "dying", "role": "transit"}'
    )
    assert f"{InstanceState.LIVE}" == "live" and str(LeaseRole.HELD) == "held"
