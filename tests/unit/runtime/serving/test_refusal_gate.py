"""Refusals held at the gate (runtime/serving/admission.py ``gate_wait_ms``,
runtime/serving/arrivals.py ``HeldRefusals``, the intake's precheck): a latency refusal
is held for the drain time itself (not Retry-After's back-off floor), one bottleneck
interval more per refusal already held, at most what was left of the SLO."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest

from infscaler.runtime.serving.admission import (
    MIN_RETRY_S,
    ArrivalSnapshot,
    Refusal,
    admit_request,
    gate_wait_ms,
)
from infscaler.runtime.serving.arrivals import HeldRefusals
from infscaler.runtime.serving.intake import Intake

#: one unit of two instances at 4 ms: a 2 ms bottleneck interval; 3 ms end to end
UNITS = ((4.0, 2),)


def snap(**kw) -> ArrivalSnapshot:
    base = dict(pipeline="sq", slo_ms=9.0, service_ms=3.0, interval_ms=2.0, units=UNITS)
    return ArrivalSnapshot(**{**base, **kw, "overloaded": True})


def test_a_short_drain_is_held_for_itself_not_for_the_back_off_floor() -> None:
    # 5 ahead on 2 instances: 3 + 2 x 4 = 11 ms against 9 ms: admitted in 2 ms
    d = admit_request(snap(ahead=5))
    assert not d.admit and d.refusal is Refusal.SLO and d.estimate_ms == pytest.approx(11.0)
    assert d.retry_after_s == pytest.approx(MIN_RETRY_S)  # what Retry-After says
    assert d.hold_s == pytest.approx(0.002)  # what the server holds: the drain
    assert d.hold_s < MIN_RETRY_S


def test_each_held_refusal_holds_the_next_one_interval_longer_up_to_the_slo() -> None:
    holds = [admit_request(snap(ahead=5, held=k)).hold_s for k in range(6)]
    # 2 ms, then one bottleneck interval (4 ms / 2 instances) per refusal held ahead
    assert holds[:4] == pytest.approx([0.002, 0.004, 0.006, 0.008])
    assert holds[4:] == pytest.approx([0.009, 0.009])  # at most the 9 ms SLO left
    # shedding too: ahead 6 over a limit of 4: three intervals of 2 ms, then one per held
    shed = [admit_request(snap(ahead=6, queue_limit=4, held=k)).hold_s for k in (0, 1)]
    assert shed == pytest.approx([0.006, 0.008])


def test_gate_wait_ms_arithmetic() -> None:
    assert gate_wait_ms(5.0, 0, 2.0) == 5.0
    assert gate_wait_ms(5.0, 3, 2.0) == 11.0
    assert gate_wait_ms(-1.0, 2, 2.0) == 4.0  # drained already: the held ones still go first
    assert gate_wait_ms(5.0, 3, None) == 5.0 and gate_wait_ms(5.0, -1, 2.0) == 5.0


def test_held_refusals_count_until_their_release() -> None:
    h = HeldRefusals()
    assert h.count(1, 0.0) == 0
    h.add(1, 0.0, 0.010)
    h.add(1, 0.001, 0.002)  # released before the first
    h.add(1, 0.0, 0.0)  # answered at once: not held
    h.add(2, 0.0, 1.0)
    assert h.count(1, 0.0) == 2 and h.count(2, 0.0) == 1
    assert h.count(1, 0.005) == 1  # the 3 ms one left
    assert h.count(1, 0.011) == 0 and h.count(2, 0.5) == 1


def _route() -> SimpleNamespace:
    """A pipeline at 5 requests in flight on 2 instances of 400 ms, SLO 900 ms, overloaded
    (long holds: a loaded host's pauses between the calls release none)."""
    stats = SimpleNamespace(rejections=[])
    stats.record_rejection = lambda slo=False: stats.rejections.append(slo)
    config = SimpleNamespace(
        slo_ms=900.0,
        request_timeout_s=30.0,
        priority=1,
        queue_policy=SimpleNamespace(max_queue_size=0),
    )
    return SimpleNamespace(
        pipeline=SimpleNamespace(name="sq", config=config),
        estimates=lambda overloaded: (300.0, 200.0),
        units=lambda overloaded: ((400.0, 2),),
        progress=lambda now: (None, ((400.0, 2),)),
        lenience=lambda now, overloaded: 1.0,
        overloaded=lambda now: True,
        accepting=True,
        unavailable_reason=None,
        retry_after_s=1.0,
        admitted=5,
        queue_limit=None,
        shed_reason="",
        queued=collections.Counter(),
        refusals=collections.Counter(),
        stats=stats,
        measured=True,
    )


def test_the_intake_holds_refusals_in_turn_at_the_gate() -> None:
    intake = Intake(
        max_pending=64, pending_per_uid=None, operator_pending=0, counters=collections.Counter()
    )
    route = _route()
    holds = [intake.precheck(route, None, (None, False)).hold_s for _ in range(3)]  # type: ignore[arg-type]
    # back to back (the refusals still held): 200 ms, then one interval (200 ms) more each
    assert holds == pytest.approx([0.2, 0.4, 0.6])
    assert route.refusals["slo"] == 3 and route.stats.rejections == [True] * 3
    assert intake.held.count(id(route), 0.0) == 3
