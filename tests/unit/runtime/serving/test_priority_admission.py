"""Admission across pipelines (infscaler.runtime.serving.priority_admission) on
hand-computed loads: a lower level is refused (code ``priority``, held) while a strictly
higher level's estimate is past the headroom of its SLO, never by an equal or lower one."""

from __future__ import annotations

import math

import pytest

from infscaler.runtime.serving.admission import ArrivalDecision, Refusal, drain_ms
from infscaler.runtime.serving.priority_admission import (
    PRIORITY_HEADROOM,
    HigherLoad,
    admit_across,
    higher_load,
)

ADMIT = ArrivalDecision(True, 30.0, estimate_ms=40.0)


def across(level: int, *higher: HigherLoad, left_ms: float = 1000.0) -> ArrivalDecision:
    return admit_across(ADMIT, pipeline="lo", level=level, higher=higher, left_ms=left_ms)


def test_a_higher_level_within_its_headroom_lets_the_request_in() -> None:
    # 100 of 131 ms: under 0.8 x 131 = 104.8
    assert across(2, HigherLoad("hi", 1, 131.0, 100.0)) is ADMIT
    assert across(2) is ADMIT


def test_a_higher_level_at_risk_refuses_the_lower_request_and_holds_it() -> None:
    d = across(2, HigherLoad("hi", 1, 131.0, 176.0))
    assert not d.admit and d.refusal is Refusal.PRIORITY and d.status == 503
    assert d.refusal.value == "priority"
    assert "pipeline hi (priority 1) is at risk" in d.reason and "176 ms of 131" in d.reason
    # back under the bound after 176 - 0.8 x 131 = 71.2 ms
    assert d.retry_after_s == pytest.approx(0.071, abs=1e-3)
    assert d.hold_s == pytest.approx(0.071, abs=1e-3)
    assert d.timeout_s == 30.0  # the rest of the decision is kept


def test_the_hold_never_outlasts_what_is_left_of_the_requests_own_bound() -> None:
    d = across(3, HigherLoad("hi", 1, 100.0, 5000.0), left_ms=20.0)
    assert not d.admit and d.retry_after_s == pytest.approx(4.92) and d.hold_s == 0.02


@pytest.mark.parametrize("other_level", [2, 3])
def test_equal_or_lower_levels_never_refuse(other_level: int) -> None:
    assert across(2, HigherLoad("peer", other_level, 100.0, 10_000.0)) is ADMIT


def test_the_pipeline_most_at_risk_is_named() -> None:
    d = across(
        3,
        HigherLoad("a", 1, 100.0, 90.0),  # 0.9 x its SLO
        HigherLoad("b", 2, 100.0, 150.0),  # 1.5 x
    )
    assert not d.admit and "pipeline b (priority 2)" in d.reason


def test_a_refusal_already_made_is_kept() -> None:
    refused = ArrivalDecision(False, 30.0, Refusal.SLO, 503, "too slow")
    d = admit_across(
        refused, pipeline="lo", level=2, higher=[HigherLoad("hi", 1, 1.0, 99.0)], left_ms=1.0
    )
    assert d is refused


def test_the_headroom_is_a_parameter() -> None:
    h = HigherLoad("hi", 1, 100.0, 90.0)
    assert admit_across(ADMIT, pipeline="lo", level=2, higher=[h], left_ms=1.0).admit is False
    d = admit_across(ADMIT, pipeline="lo", level=2, higher=[h], left_ms=1.0, headroom=1.0)
    assert d.admit
    assert PRIORITY_HEADROOM == 0.8


@pytest.mark.parametrize(
    "bad", [dict(headroom=0.0), dict(headroom=1.5)]
)  # fmt: skip
def test_a_bad_headroom_is_refused_with_a_clear_error(bad) -> None:
    with pytest.raises(ValueError, match="headroom must be in"):
        admit_across(ADMIT, pipeline="lo", level=2, higher=[], left_ms=1.0, **bad)


@pytest.mark.parametrize("slo, est", [(0.0, 1.0), (math.nan, 1.0), (10.0, -1.0)])
def test_a_bad_load_is_refused_with_a_clear_error(slo: float, est: float) -> None:
    with pytest.raises(ValueError, match="slo_ms must be > 0 and estimate_ms >= 0"):
        across(2, HigherLoad("hi", 1, slo, est))


def test_higher_load_is_the_drain_time_estimate() -> None:
    # 3 requests in flight on one 44 ms instance: 44 + 3 x 44 = 176 ms
    h = higher_load("hi", 1, 131.0, 3, 44.0, 44.0, ((44.0, 1),))
    assert h == HigherLoad("hi", 1, 131.0, 176.0)
    assert h.estimate_ms == drain_ms(3, 44.0, ((44.0, 1),))
    # two instances take two of them at once: 44 + 1 x 44
    assert higher_load("hi", 1, 131.0, 3, 44.0, 22.0, ((44.0, 2),)).estimate_ms == 88.0


def route(name: str, priority: int, slo_ms: float | None, admitted: int, unit_ms: float):
    """A measured one-unit route (one instance) of pipeline ``name``."""
    from types import SimpleNamespace

    from infscaler.runtime.serving.route import Route

    config = SimpleNamespace(priority=priority, slo_ms=slo_ms)
    r = Route(
        pipeline=SimpleNamespace(name=name, config=config),  # type: ignore[arg-type]
        stage_ids=[1],
        stats=None,  # type: ignore[arg-type]
    )
    r.unit_ms, r.service_ms, r.measured, r.admitted = [unit_ms], unit_ms, True, admitted
    return r


def test_higher_loads_reads_only_strictly_higher_measured_busy_routes_with_an_slo() -> None:
    from infscaler.runtime.serving.arrivals import higher_loads

    lo = route("lo", 2, 1000.0, 5, 20.0)
    routes = [
        lo,
        route("hi", 1, 131.0, 3, 44.0),
        route("peer", 2, 131.0, 9, 44.0),  # equal level
        route("idle", 1, 131.0, 0, 44.0),  # nothing in flight
        route("free", 1, None, 9, 44.0),  # no SLO
    ]
    unmeasured = route("new", 1, 131.0, 3, 44.0)
    unmeasured.measured = False
    routes.append(unmeasured)
    assert higher_loads(routes, lo, 2) == (HigherLoad("hi", 1, 131.0, 176.0),)
    # a request sent at a lower level than its pipeline's: the peer is higher now
    assert [h.pipeline for h in higher_loads(routes, lo, 3)] == ["hi", "peer"]
    d = admit_across(ADMIT, pipeline="lo", level=2, higher=higher_loads(routes, lo, 2), left_ms=9)
    assert d.refusal is Refusal.PRIORITY
