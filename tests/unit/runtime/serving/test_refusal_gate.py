"""Refusals held at the gate (runtime/serving/admission.py ``gate_wait_ms`` and
``refusal_hold_s``, runtime/serving/arrivals.py ``HeldRefusals``, the intake's
precheck): a latency refusal is held until it could be admitted, one bottleneck interval
more per refusal already held, at most the latency it would have had admitted now."""

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
from infscaler.runtime.serving.arrivals import MAX_HELD, HeldRefusals
from infscaler.runtime.serving.intake import Intake

#: one unit of two instances at 400 ms: a 200 ms bottleneck interval; 300 ms end to end
UNITS = ((400.0, 2),)


def snap(**kw) -> ArrivalSnapshot:
    base = dict(pipeline="sq", slo_ms=900.0, service_ms=300.0, interval_ms=200.0, units=UNITS)
    return ArrivalSnapshot(**{**base, **kw, "overloaded": True})


def test_a_refusal_is_held_until_it_could_be_admitted_at_most_its_late_answer() -> None:
    # 5 ahead on 2 instances: 300 + 2 x 400 = 1100 ms against 900: admitted in 200 ms
    d = admit_request(snap(ahead=5))
    assert not d.admit and d.refusal is Refusal.SLO and d.estimate_ms == pytest.approx(1100.0)
    assert d.hold_s == pytest.approx(0.2)
    # 9 ahead: 300 + 4 x 400 = 1900 ms: held 1000 ms, past the 900 ms SLO (the time it
    # would have waited admitted), where a closed-loop client came back every 900 ms
    assert admit_request(snap(ahead=9)).hold_s == pytest.approx(1.0)
    # a drain shorter than the shortest back-off: held that long (the SLO allows it)
    d = admit_request(snap(ahead=5, units=((310.0, 2),)))
    assert d.estimate_ms == pytest.approx(920.0) and d.hold_s == pytest.approx(MIN_RETRY_S)


def test_each_held_refusal_holds_the_next_one_interval_longer() -> None:
    holds = [admit_request(snap(ahead=5, held=k)).hold_s for k in range(6)]
    # 200 ms, then one bottleneck interval (400 ms / 2 instances) per refusal held ahead,
    # at most the 1100 ms it would have taken admitted now
    assert holds == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.1])
    # shedding: ahead 6 over a limit of 4: three intervals, one more per held, at most
    # the SLO
    shed = [admit_request(snap(ahead=6, queue_limit=4, held=k)).hold_s for k in (0, 1, 2)]
    assert shed == pytest.approx([0.6, 0.8, 0.9])


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
    for _ in range(MAX_HELD + 10):  # a flood: the count saturates, the list stays bounded
        h.add(3, 0.0, 5.0)
    assert h.count(3, 1.0) == MAX_HELD


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
