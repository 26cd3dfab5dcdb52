"""runtime.scaling.coresets (pure) and coreact.CoreSetKeeper (with a stand-in re-pin):
which cores each priority level may use while a higher one is at risk, the hold, and the
re-pins and records that follow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infscaler.runtime.scaling.coreact import CoreSetKeeper, enabled
from infscaler.runtime.scaling.coresets import (
    allowed_cores,
    hold_risk,
    reserved_cores,
    target_affinity,
)

CORES = [0, 1, 2, 3]


def test_a_lower_level_is_kept_off_the_cores_of_a_higher_one_at_risk():
    levels = {"hi": 1, "lo": 2}
    pinned = {"hi": [[0], [1]], "lo": [[2], [3], [0, 1, 2, 3]]}
    assert allowed_cores(CORES, levels, pinned, {"hi": True}) == {
        "hi": CORES,
        "lo": [2, 3],
    }
    # not at risk: everyone keeps every core
    assert allowed_cores(CORES, levels, pinned, {"hi": False}) == {"hi": CORES, "lo": CORES}
    # a lower pipeline at risk reserves nothing from a higher one
    assert allowed_cores(CORES, levels, pinned, {"lo": True}) == {"hi": CORES, "lo": CORES}


def test_equal_levels_do_not_reserve_cores_from_each_other():
    levels = {"a": 1, "b": 1}
    pinned = {"a": [[0]], "b": [[1]]}
    assert allowed_cores(CORES, levels, pinned, {"a": True, "b": True}) == {
        "a": CORES,
        "b": CORES,
    }


def test_three_levels_the_lowest_keeps_off_every_higher_level_at_risk():
    levels = {"a": 1, "b": 2, "c": 3}
    pinned = {"a": [[0]], "b": [[1]], "c": [[2, 3]]}
    got = allowed_cores(CORES, levels, pinned, {"a": True, "b": True})
    assert got == {"a": CORES, "b": [1, 2, 3], "c": [2, 3]}
    assert reserved_cores(3, levels, pinned, {"a": True, "b": True}) == {0: 1, 1: 1}


def test_never_fewer_than_one_core_the_least_held_then_the_last():
    levels = {"hi": 1, "lo": 2}
    # hi floats over both cores with two instances, and one more on core 0
    pinned = {"hi": [[0, 1], [0, 1], [0]]}
    assert allowed_cores([0, 1], levels, pinned, {"hi": True})["lo"] == [1]
    pinned = {"hi": [[0, 1]]}  # a tie: the last core
    assert allowed_cores([0, 1], levels, pinned, {"hi": True})["lo"] == [1]
    with pytest.raises(ValueError):
        allowed_cores([], levels, pinned, {})


def test_the_risk_counts_for_the_hold_time_after_it_was_last_seen():
    flags, last = hold_risk(100.0, {"hi": True, "lo": False}, {}, hold_s=10.0)
    assert flags == {"hi": True, "lo": False} and last == {"hi": 100.0}
    flags, last = hold_risk(109.0, {"hi": False, "lo": False}, last, hold_s=10.0)
    assert flags["hi"] is True and last == {"hi": 100.0}
    flags, last = hold_risk(110.5, {"hi": False, "lo": False}, last, hold_s=10.0)
    assert flags["hi"] is False
    # a pipeline gone is dropped
    flags, last = hold_risk(111.0, {"lo": False}, {"hi": 105.0}, hold_s=10.0)
    assert flags == {"lo": False} and last == {}


def test_target_affinity_home_within_the_set_else_the_set_and_back():
    assert target_affinity([0], [2, 3], CORES, placed_in=False) == [2, 3]
    assert target_affinity([0, 1, 2, 3], [2, 3], CORES, placed_in=False) == [2, 3]
    assert target_affinity([3], [2, 3], CORES, placed_in=False) == [3]
    assert target_affinity([0], CORES, CORES, placed_in=False) == [0]
    # placed among the remaining cores: floats over all of them once released
    assert target_affinity([3], CORES, CORES, placed_in=True) == CORES


def _handle(name, pid, cores, state="ready", started=-1.0):
    proc = SimpleNamespace(pid=pid)
    return SimpleNamespace(key=(name, 0), cores=cores, state=state, proc=proc, started=started)


def test_keeper_repins_lower_instances_records_and_gives_the_cores_back():
    pins: list[tuple[int, list[int]]] = []
    keeper = CoreSetKeeper(True, hold_s=5.0, repin=lambda pid, c: pins.append((pid, list(c))))
    levels = {"hi": 1, "lo": 2}
    hs = [_handle("hi", 10, [0]), _handle("lo", 20, [1]), _handle("lo", 21, [0, 1])]
    hs.append(_handle("lo", 22, [0], state="starting"))  # pins itself when it loads
    cores = [0, 1]
    out = keeper.step(0.0, cores, levels, {"hi": "misses its SLO"}, hs)
    assert [(n, e["action"], e["cores"]) for n, e in out] == [("lo", "core_set", [1])]
    assert out[0][1]["kept_for"] == ["hi"] and "misses its SLO" in out[0][1]["reason"]
    assert pins == [(21, [1])]  # 20 is already on core 1; hi and the starting one untouched
    assert keeper.cores_for("lo", cores) == [1] and keeper.cores_for("hi", cores) == cores
    assert keeper.state()["kept"] == {"lo": [1]}
    # within the hold: nothing changes
    assert keeper.step(4.0, cores, levels, {"hi": None}, hs) == [] and len(pins) == 1
    out = keeper.step(5.5, cores, levels, {"hi": None}, hs)
    assert [(n, e["action"]) for n, e in out] == [("lo", "core_set_release")]
    assert pins[1:] == [(21, [0, 1])]
    assert keeper.cores_for("lo", cores) == cores and keeper.state()["repins"] == 2


def test_keeper_an_instance_placed_while_kept_off_floats_once_released():
    pins: list[tuple[int, list[int]]] = []
    keeper = CoreSetKeeper(True, hold_s=5.0, repin=lambda pid, c: pins.append((pid, list(c))))
    levels, cores = {"hi": 1, "lo": 2}, [0, 1]
    hs = [_handle("hi", 10, [0]), _handle("lo", 20, [1])]
    keeper.step(0.0, cores, levels, {"hi": "ahead"}, hs)
    hs.append(_handle("lo", 23, [1], started=2.0))  # placed by cores_for on core 1
    keeper.step(3.0, cores, levels, {"hi": "ahead"}, hs)
    assert pins == []
    keeper.step(20.0, cores, levels, {"hi": None}, hs)
    assert pins == [(23, [0, 1])]  # 20 was placed on core 1 before: it stays there


def test_keeper_off_does_nothing_and_the_mode_is_cores_only():
    keeper = CoreSetKeeper(False, repin=lambda pid, c: pytest.fail("re-pinned"))
    hs = [_handle("hi", 10, [0]), _handle("lo", 21, [0, 1])]
    assert keeper.step(0.0, [0, 1], {"hi": 1, "lo": 2}, {"hi": "x"}, hs) == []
    assert enabled({"INFSCALER_CPU_PRIORITY": "cores"}) and enabled(
        {"INFSCALER_CPU_PRIORITY": "CORES"}
    )
    assert not enabled({}) and not enabled({"INFSCALER_CPU_PRIORITY": "nice"})


def test_risk_of_a_view_violated_or_none():
    from infscaler.runtime.scaling.coreact import risk_of

    snap = SimpleNamespace(p99_ms=180.4, slo_ms=131.0)
    assert risk_of(SimpleNamespace(violated=True, snapshot=snap)) == (
        "misses its SLO (P99 180 ms, SLO 131 ms)"
    )
    assert risk_of(None) is None
