"""Batching decided by measurement (infscaler.runtime.serving.batching.decide_batching):
on where a measured batch size saves more than the margin per item, off where not."""

from __future__ import annotations

import pytest

from infscaler.runtime.serving.batching import decide_batching


def test_on_where_a_batch_saves_per_item() -> None:
    # ms per item: 20, 15, 10, 11.25 -> b=4 saves 50 %
    d = decide_batching({1: 20.0, 2: 30.0, 4: 40.0, 8: 90.0})
    assert d.on and d.batch_size == 4
    assert d.per_item_ms == {1: 20.0, 2: 15.0, 4: 10.0, 8: 11.25}
    assert d.delay_ms == pytest.approx(10.0)  # what one more item saves: 20 - 10
    assert "b=4 saves 50%" in d.reason and "b=1 20" in d.reason


def test_off_where_no_size_saves_enough() -> None:
    d = decide_batching({1: 20.0, 2: 38.0, 4: 76.0})  # 5 % per item: within the noise
    assert not d.on and d.batch_size == 1 and d.delay_ms == 0.0
    assert "off" in d.reason and "saves 5%" in d.reason
    assert not decide_batching({1: 20.0}).on  # nothing measured beyond 1


def test_the_budget_and_max_batch_bound_the_size() -> None:
    profile = {1: 20.0, 2: 30.0, 4: 40.0, 8: 60.0}  # per item 20, 15, 10, 7.5
    assert decide_batching(profile).batch_size == 8
    assert decide_batching(profile, max_batch=4).batch_size == 4
    d = decide_batching(profile, budget_ms=45.0)
    assert d.batch_size == 4 and d.delay_ms == pytest.approx(5.0)  # 45 - T_4
    off = decide_batching(profile, budget_ms=25.0)
    assert not off.on and "no size within the budget 25 ms" in off.reason


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="batch size 1"):
        decide_batching({2: 10.0})
    with pytest.raises(ValueError, match="budget_ms"):
        decide_batching({1: 10.0}, budget_ms=0.0)
    with pytest.raises(ValueError, match="max_batch"):
        decide_batching({1: 10.0}, max_batch=0)
    with pytest.raises(ValueError, match="margin"):
        decide_batching({1: 10.0}, margin=1.0)


def test_the_wait_stops_at_the_size_recent_batches_reached() -> None:
    from infscaler.runtime.serving.batching import WaitPolicy

    w = WaitPolicy(history=4, probe_every=3)
    assert w.target(8) == 8  # nothing formed yet: up to the limit
    for size in (4, 3, 4):
        w.formed(size)
    assert w.target(8) == 4 and w.target(3) == 3
    for _ in range(4):
        w.formed(1)  # one client at a time: still worth looking for a second
    assert w.target(8) == 2
    with pytest.raises(ValueError, match=">= 1"):
        WaitPolicy(history=0)


def test_waits_that_catch_nothing_are_skipped_but_probed_again() -> None:
    from infscaler.runtime.serving.batching import WaitPolicy

    w = WaitPolicy(history=4, probe_every=3)
    for _ in range(4):
        assert w.should_wait()
        w.waited(0)
    assert [w.should_wait() for _ in range(6)] == [False, False, True, False, False, True]
    w.waited(2)  # a probe caught something: wait again
    assert w.should_wait() and w.should_wait()


def test_live_times_replace_the_load_profile_once_a_size_ran_often() -> None:
    from infscaler.runtime.serving.batching import ExecCounts, live_batch_ms

    c = ExecCounts()
    for _ in range(20):
        c.add(1, 0, 8_000_000, 0)  # 8 ms each
    for _ in range(19):
        c.add(4, 0, 40_000_000, 0)  # too few runs of 4 to count
    assert live_batch_ms(c) == {1: 8.0}
    c.add(4, 0, 40_000_000, 0)
    assert live_batch_ms(c) == {1: 8.0, 4: 40.0}
    # the load profile said batching pays; what ran says it does not (10 ms per item at 4)
    loaded = {1: 20.0, 4: 40.0}
    assert decide_batching(loaded).on
    assert not decide_batching({**loaded, **live_batch_ms(c)}).on


def test_batching_only_at_the_bottleneck() -> None:
    from infscaler.runtime.serving.batching import bottlenecks

    assert bottlenecks({0: 2.0, 1: 30.0, 2: 25.0}) == {1, 2}  # 25 >= 0.8 x 30
    assert bottlenecks({0: 2.0, 1: 30.0, 2: 20.0}) == {1}
    assert bottlenecks({0: 2.0, 1: None}) == {0, 1}  # not measured yet: no unit ruled out
    assert bottlenecks({0: 0.0, 1: 0.0}) == {0, 1}
    with pytest.raises(ValueError, match="within"):
        bottlenecks({0: 1.0}, within=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        bottlenecks({0: -1.0})
