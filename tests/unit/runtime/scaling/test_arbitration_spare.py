"""Rule 4 of the arbitration (a warm spare for a higher pipeline at the cap) and the
gate of the autoscaler's loop (``needs_look``), on hand-computed snapshots; and the
adversarial case: a flooded lower pipeline holds nothing the higher one needs, and
cannot take the higher one's instances back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infscaler.runtime.queueing import p99_response_ms
from infscaler.runtime.scaling.arbitration import (
    ArbitrationConfig,
    ArbitrationState,
    PipelineView,
    arbitrate,
    needs_look,
    wants_spare,
)
from infscaler.runtime.scaling.types import ResourceCap
from tests.unit.runtime.scaling.test_arbitration import hot, idle, snap


def light(n: int = 1, offered: float = 1.0, **kw) -> PipelineView:
    # n instances at 100 ms, 1 req/s offered, P99 150 ms within its SLO of 300 ms: calm,
    # not violated; one instance's M/D/1 P99 at 1 req/s is 228 ms, so the model needs 1
    return PipelineView("hi", 1, snap(n, offered=offered, p99=150.0, slo=300.0, **kw))


def test_a_higher_pipeline_without_a_spare_takes_a_lower_ones_slack_instance() -> None:
    assert p99_response_ms(1.0, 1, 100.0) == pytest.approx(227.9, abs=0.1)
    why = wants_spare(light().snapshot)
    assert why is not None and "needs 1 instances of u0" in why and "runs 1" in why
    moves, state = arbitrate([light(), idle()], ArbitrationState())
    assert [(m.kind, m.giver, m.taker, m.give) for m in moves] == [("spare", "lo", "hi", True)]
    m = moves[0]
    assert (m.give_unit, m.give_engine, m.take_unit, m.take_engine) == (0, "cpu", 0, "cpu")
    assert m.resource == "memory"  # the cap lacks 100 MB
    assert m.gain_rps == pytest.approx(10.0)  # 10 -> 20 req/s of capacity
    for word in ("hi (priority 1)", "lacks memory 100", "lo (priority 2) has slack", "3 -> 2"):
        assert word in m.reason
    assert "warm spare" in m.reason
    assert state.loans == ()  # no loan: the instance is the taker's, nothing goes back


def test_no_spare_when_it_has_one_or_room_or_no_traffic_or_no_lower_slack() -> None:
    none = ArbitrationState()
    # rule 4 off (INFSCALER_ARBITRATION=lend-only): neither a move nor a look
    off = ArbitrationConfig(spare=False)
    assert arbitrate([light(), idle()], none, off)[0] == []
    assert not needs_look([light(), idle()], none, off)
    # already one above the model's need (2 where 1 holds 1 req/s)
    assert wants_spare(light(2).snapshot) is None
    assert arbitrate([light(2), idle()], none)[0] == []
    # room under the cap: its own scaler grows it when it needs to
    roomy = ResourceCap(memory_cap_mb=2000.0, memory_used_mb=1000.0, max_instances={"cpu": 8})
    assert arbitrate([light(cap=roomy), idle(cap=roomy)], none)[0] == []
    # no traffic measured: nothing tells it needs headroom
    assert arbitrate([light(offered=0.0), idle()], none)[0] == []
    # an equal pipeline never gives a spare; nor a lower one at its minimum, violating,
    # or whose P99 is over 0.8 x its SLO
    assert arbitrate([light(), idle(priority=1)], none)[0] == []
    assert arbitrate([light(), idle(n=1)], none)[0] == []
    assert arbitrate([light(), replace(idle(), violated=True)], none)[0] == []
    busy = PipelineView("lo", 2, snap(3, offered=5.0, p99=450.0, slo=500.0))
    assert arbitrate([light(), busy], none)[0] == []
    # nor one whose load after the give would be above 0.6 x its capacity: 13 on 20
    loaded = PipelineView("lo", 2, snap(3, offered=13.0, p99=120.0, slo=5000.0))
    assert arbitrate([light(), loaded], none)[0] == []


def test_a_lend_comes_before_a_spare() -> None:
    """A pipeline blocked at the cap is served first (rule 2), whatever spare another
    would take."""
    top = PipelineView("top", 1, snap(1, offered=1.0, p99=150.0, slo=300.0))
    moves, state = arbitrate([top, hot(priority=2), idle(priority=3)], ArbitrationState())
    assert [(m.kind, m.giver, m.taker) for m in moves] == [("lend", "lo", "hi")]
    assert len(state.loans) == 1


def test_a_flooded_lower_pipeline_cannot_hold_what_the_higher_one_needs() -> None:
    """Adversarial: the lower pipeline is flooded (violating, blocked at the cap, P99 4x
    its SLO) while the higher one is pressed ahead of a counted violation (8 req/s on one
    100-ms instance: M/D/1 P99 1196 ms > its SLO of 300 ms). The flood gives; then it can
    neither take the instance back, nor borrow from the higher one, nor get a spare of
    it, while the higher one's pressure lasts."""
    flooded = PipelineView("lo", 2, snap(2, offered=40.0, p99=2000.0, slo=500.0), True, True)
    pressed = PipelineView("hi", 1, snap(1, offered=8.0, p99=280.0, slo=300.0))
    assert needs_look([pressed, flooded], ArbitrationState())
    moves, state = arbitrate([pressed, flooded], ArbitrationState())
    assert [(m.kind, m.giver, m.taker) for m in moves] == [("lend", "lo", "hi")]
    # after the move: hi 2 instances at 8 req/s (P99 within its SLO, but one fewer would
    # miss it), lo 1 instance still flooded and blocked
    hi2 = PipelineView("hi", 1, snap(2, offered=8.0, p99=200.0, slo=300.0, now=200.0))
    lo1 = PipelineView("lo", 2, snap(1, offered=40.0, p99=2000.0, slo=500.0, now=200.0), True, True)
    for now in (200.0, 230.0, 260.0):
        views = [
            replace(hi2, snapshot=replace(hi2.snapshot, now=now)),
            replace(lo1, snapshot=replace(lo1.snapshot, now=now)),
        ]
        moves, state = arbitrate(views, state)
        assert moves == [] and [(ln.donor, ln.taker) for ln in state.loans] == [("lo", "hi")]
    # the higher one with slack to spare still gives nothing to the flooded lower one
    # (a lower level never borrows from a higher one, nor gets its spares)
    slack_hi = PipelineView("hi", 1, snap(3, offered=1.0, p99=120.0, slo=300.0))
    assert arbitrate([slack_hi, lo1], ArbitrationState())[0] == []


def test_needs_look_is_false_when_nothing_can_move() -> None:
    assert not needs_look([light()], ArbitrationState())  # one pipeline alone
    assert needs_look([light(), idle()], ArbitrationState())  # rule 4 may act
    assert not needs_look([light(2), idle()], ArbitrationState())  # it has its spare
    # the lowest pipeline never wants a spare: nothing below it to take from
    lowest = PipelineView("lo", 2, snap(1, offered=1.0, p99=150.0, slo=300.0))
    assert not needs_look([lowest, PipelineView("hi", 1, snap(3, offered=5.0, p99=100.0))],
                          ArbitrationState())  # fmt: skip
