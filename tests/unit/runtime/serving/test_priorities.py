"""Priority levels and queue policies (infscaler.runtime.serving.queues, pure) and their
part in admission (admit_request): the backlog's order, DELAY, the queue timeout's
override and its bound, the request's level bounded by its pipeline's, ``max_queue_size``
over all levels and the requests ahead of a higher level, on hand-computed cases."""

from __future__ import annotations

import pytest

from infscaler.runtime.serving.admission import ArrivalSnapshot, Refusal, admit_request
from infscaler.runtime.serving.queues import (
    PriorityBacklog,
    ahead_at,
    backlog_key,
    queue_timeout_s,
    request_level,
)


def test_the_backlog_serves_levels_strictly_then_arrival() -> None:
    b: PriorityBacklog[str] = PriorityBacklog()
    for name, level in [("a3", 3), ("b1", 1), ("c3", 3), ("d2", 2), ("e1", 1)]:
        b.push(name, level)
    assert b.items() == ["b1", "e1", "d2", "a3", "c3"]
    assert [b.pop()[1] for _ in range(len(b))] == ["b1", "e1", "d2", "a3", "c3"]
    assert not b


def test_popped_items_put_back_keep_their_place() -> None:
    b: PriorityBacklog[str] = PriorityBacklog()
    for name, level in [("x2", 2), ("y1", 1), ("z2", 2)]:
        b.push(name, level)
    first = b.pop()  # y1 must wait (its pipeline's window is full)
    b.push("w1", 1)  # a later arrival at the same level
    b.extend([first])
    assert b.items() == ["y1", "w1", "x2", "z2"]


def test_delay_moves_a_request_behind_its_level_not_behind_lower_levels() -> None:
    b: PriorityBacklog[str] = PriorityBacklog()
    b.push("old1", 1)
    b.push("new1", 1)
    b.push("low2", 2)
    key, item = b.pop()
    assert item == "old1" and key == backlog_key(1, False, 0)
    b.push("old1", 1, delayed=True)  # its queue timeout passed, DELAY
    b.push("later1", 1)  # arrived after the delay: still ahead of it
    assert b.items() == ["new1", "later1", "old1", "low2"]
    assert backlog_key(1, True, 0) < backlog_key(2, False, 0)


@pytest.mark.parametrize(
    ("requested", "default", "level"),
    [(None, 3, 3), (0, 3, 3), (3, 3, 3), (7, 3, 7), (1_000_000, 3, 1_000_000), (4, 1, 4)],
)
def test_the_request_level_is_its_parameter_else_the_pipelines(requested, default, level):
    assert request_level(requested, default) == level


@pytest.mark.parametrize(("requested", "pipeline"), [(1, 2), (1, 3), (2, 3), (1, 1_000_000)])
def test_a_request_never_gets_a_higher_level_than_its_pipeline(requested, pipeline) -> None:
    # claiming level 1 on a level-2 pipeline: served at level 2, behind nobody it should not pass
    assert request_level(requested, pipeline) == pipeline


@pytest.mark.parametrize("bad", [-1, 1_000_001])
def test_a_level_out_of_range_is_an_error(bad: int) -> None:
    with pytest.raises(ValueError, match="priority must be 0 - 1000000"):
        request_level(bad, 1)


def test_the_queue_timeout_is_overridden_only_when_allowed() -> None:
    assert queue_timeout_s(None, False, None) is None
    assert queue_timeout_s(250.0, False, 5_000_000) == 0.25  # ignored, as Triton does
    assert queue_timeout_s(250.0, True, 5_000_000) == 5.0  # µs -> s
    assert queue_timeout_s(250.0, True, 0) == 0.25  # 0: the policy's
    assert queue_timeout_s(None, True, 1500) == 0.0015


def test_the_queue_timeout_override_never_passes_the_pipelines_request_timeout() -> None:
    hour_us = 3_600_000_000
    assert queue_timeout_s(250.0, True, hour_us, 30.0) == 30.0
    assert queue_timeout_s(None, True, hour_us, 60.0) == 60.0
    assert queue_timeout_s(250.0, True, 5_000_000, 30.0) == 5.0  # shorter: its own
    assert queue_timeout_s(250.0, False, hour_us, 30.0) == 0.25  # not allowed: the policy's


def test_ahead_at_leaves_out_the_lower_levels_queued() -> None:
    # 7 admitted: 2 in the units, queued 1 at level 1, 3 at level 2, 1 at level 5
    queued = {1: 1, 2: 3, 5: 1}
    assert ahead_at(1, 7, queued) == 3  # 2 running + the one at level 1
    assert ahead_at(2, 7, queued) == 6
    assert ahead_at(5, 7, queued) == 7
    assert ahead_at(9, 7, queued) == 7


def snap(**kw) -> ArrivalSnapshot:
    return ArrivalSnapshot(pipeline="ocr", **kw)


def test_max_queue_size_counts_the_pipelines_queue_across_levels() -> None:
    full = snap(level=2, queued=((2, 3), (1, 1)), max_queue_size=4, ahead=6)
    d = admit_request(full)
    assert not d.admit and d.refusal is Refusal.QUEUE_FULL and d.status == 503
    assert "queue full (max_queue_size 4): 4 requests wait" in d.reason
    assert d.retry_after_s is not None
    # a level of its own (a new level per request) does not escape the bound
    for level in (1, 7, 1_000_000):
        d = admit_request(snap(level=level, queued=((2, 3), (1, 1)), max_queue_size=4))
        assert d.refusal is Refusal.QUEUE_FULL, level
    # one request per level, each level below the bound: the pipeline's queue is full
    spread = tuple((lvl, 1) for lvl in range(1, 5))
    assert admit_request(snap(level=9, queued=spread, max_queue_size=4)).refusal is (
        Refusal.QUEUE_FULL
    )
    assert admit_request(snap(level=2, queued=((2, 3),), max_queue_size=4)).admit
    assert admit_request(snap(level=2, queued=((2, 4),), max_queue_size=0)).admit


def test_a_high_priority_request_is_judged_on_the_requests_at_its_level_or_higher() -> None:
    # SLO 100 ms, 20 ms per request on one instance; 6 admitted: 1 running, 5 queued at 3
    base = dict(
        slo_ms=100.0,
        service_ms=20.0,
        interval_ms=20.0,
        units=((20.0, 1),),
        ahead=6,
        queued=((3, 5),),
        remaining_ms=(200.0, 180.0, 160.0, 140.0, 120.0, 10.0),
    )
    low = admit_request(snap(level=3, **base))
    # tracked: the latest admitted has 200 ms left -> 200 + 20 = 220 ms > 100
    assert not low.admit and low.refusal is Refusal.SLO and low.estimate_ms == 220.0
    high = admit_request(snap(level=1, **base))
    # 1 ahead (the running one): drain 20 + 1 x 20 = 40 ms; the tracked chain not used
    assert high.admit and high.estimate_ms == 40.0
    # the scaler's queue bound still counts every admitted request
    shed = admit_request(snap(level=1, queue_limit=6, **base))
    assert not shed.admit and shed.refusal is Refusal.SHED
