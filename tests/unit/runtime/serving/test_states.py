"""The request-phase and instance-state tables (infscaler.runtime.serving.states) as pure
functions: the paths the runtime takes are allowed, everything else is an internal
error, and the front end and the supervisor change states only through the check."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from infscaler.runtime.processes.handles import InstanceHandle
from infscaler.runtime.serving.requests import PendingRequest
from infscaler.runtime.serving.states import (
    INSTANCE_TRANSITIONS,
    REQUEST_TRANSITIONS,
    IllegalTransition,
    InstanceState,
    RequestPhase,
    advance,
)

P, S = RequestPhase, InstanceState
#: the repository root (found upwards, so the test may live in tests/ or tests/unit/)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNTIME = ROOT / "runtime"


def walk(table, states, what="x"):
    """Apply ``states`` in turn from the first; returns the last."""
    cur = states[0]
    for nxt in states[1:]:
        cur = advance(table, cur, nxt, what)
    return cur


@pytest.mark.parametrize(
    "path",
    [
        [P.QUEUED, P.RUNNING, P.DONE],  # a plain request
        [P.QUEUED, P.RUNNING, P.ITEMS, P.POST, P.DONE],  # fan-out, fan-in, units after it
        [P.QUEUED, P.RUNNING, P.ITEMS, P.DONE],  # fan-in is the last unit
        [P.QUEUED, P.DONE],  # expired / cancelled in the backlog
        [P.QUEUED, P.RUNNING, P.ITEMS, P.POST, P.DONE],
    ],
)
def test_request_paths_the_front_end_takes_are_allowed(path) -> None:
    assert walk(REQUEST_TRANSITIONS, path) is P.DONE


@pytest.mark.parametrize(
    "old, new",
    [
        (P.RUNNING, P.QUEUED),  # back into the backlog: its slot is already in the pipeline
        (P.QUEUED, P.ITEMS),  # items of a request never started
        (P.QUEUED, P.POST),
        (P.POST, P.ITEMS),
        (P.RUNNING, P.POST),  # post only after the fan-in ran here
        (P.DONE, P.RUNNING),  # answered is final
        (P.DONE, P.DONE),  # answered twice
        (P.ITEMS, P.ITEMS),  # a same-state "change" is refused (the caller checks first)
    ],
)
def test_illegal_request_transitions_are_internal_errors(old, new) -> None:
    with pytest.raises(IllegalTransition) as e:
        advance(REQUEST_TRANSITIONS, old, new, "request 7")
    msg = str(e.value)
    assert "request 7" in msg and f"from {old.value} to {new.value}" in msg
    assert e.value.status == 500


def test_the_request_table_is_exactly_the_hand_listed_edges() -> None:
    legal = {
        (P.QUEUED, P.RUNNING),
        (P.QUEUED, P.DONE),
        (P.RUNNING, P.ITEMS),
        (P.RUNNING, P.DONE),
        (P.ITEMS, P.POST),
        (P.ITEMS, P.DONE),
        (P.POST, P.DONE),
    }
    assert set(REQUEST_TRANSITIONS) == set(P)
    for old, new in itertools.product(P, P):
        if (old, new) in legal:
            assert advance(REQUEST_TRANSITIONS, old, new, "r") is new
        else:
            with pytest.raises(IllegalTransition):
                advance(REQUEST_TRANSITIONS, old, new, "r")


def test_done_names_itself_final() -> None:
    with pytest.raises(IllegalTransition, match="none: it is final"):
        advance(REQUEST_TRANSITIONS, P.DONE, P.QUEUED, "request 1")


@pytest.mark.parametrize(
    "path",
    [
        [S.STARTING, S.READY, S.STOPPING, S.EXITED],  # deployed, later scaled in
        [S.STARTING, S.READY, S.EXITED],  # died while serving: restarted
        [S.STARTING, S.FAILED, S.EXITED],  # died while loading, then stop_all
        [S.STARTING, S.STOPPING, S.EXITED],  # stopped while loading
    ],
)
def test_instance_paths_the_supervisor_takes_are_allowed(path) -> None:
    assert walk(INSTANCE_TRANSITIONS, path) is S.EXITED


def test_the_instance_table_is_exactly_the_hand_listed_edges() -> None:
    legal = {
        (S.STARTING, S.READY),
        (S.STARTING, S.STOPPING),
        (S.STARTING, S.FAILED),
        (S.READY, S.STOPPING),
        (S.READY, S.EXITED),
        (S.STOPPING, S.EXITED),
        (S.FAILED, S.EXITED),
    }
    assert set(INSTANCE_TRANSITIONS) == set(S)
    for old, new in itertools.product(S, S):
        if (old, new) in legal:
            assert advance(INSTANCE_TRANSITIONS, old, new, "i") is new
        else:
            with pytest.raises(IllegalTransition) as e:
                advance(INSTANCE_TRANSITIONS, old, new, "instance 3 of det_0")
            assert "instance 3 of det_0" in str(e.value)


def test_states_read_as_their_strings() -> None:
    """The status JSON, the metrics labels and callers comparing with strings see the
    same values as before the enums."""
    assert S.READY == "ready" and f"{S.STOPPING}" == "stopping" and str(P.POST) == "post"
    assert S.STARTING in ("starting", "ready")


def test_pending_and_handle_move_through_the_table() -> None:
    p = PendingRequest(5, None, None, None, 0.0, 0)  # type: ignore[arg-type]
    assert p.phase is P.QUEUED
    p.move(P.RUNNING)
    with pytest.raises(IllegalTransition, match="request 5 cannot go from running to queued"):
        p.move(P.QUEUED)
    assert p.phase is P.RUNNING  # a refused change leaves the phase as it was

    h = InstanceHandle(3, ("p", 0), SimpleNamespace(name="det"), 1, 0, [0], None, -1, -1)  # type: ignore[arg-type]
    assert h.state is S.STARTING
    h.move(S.READY)
    with pytest.raises(IllegalTransition, match="instance 3 of det cannot go from ready to failed"):
        h.move(S.FAILED)


@pytest.mark.parametrize(
    "name, attr",
    [
        ("serving/frontend.py", "phase"),
        ("processes/supervisor.py", "state"),
        ("processes/handles.py", "state"),
    ],
)
def test_states_change_only_in_move(name: str, attr: str) -> None:
    """No ``x.phase = ...`` / ``x.state = ...`` outside the ``move`` method."""
    tree = ast.parse((RUNTIME / name).read_text())
    outside = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name == "move":
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            outside += [
                f"{fn.name}:{node.lineno}"
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr == attr
            ]
    assert outside == [], f"{attr} assigned outside move(): {outside}"
