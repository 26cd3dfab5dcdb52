"""runtime.scaling.placement: which cores a new instance is pinned to and which instance a
scale-in stops, as pure functions (hand-computed cases)."""

from __future__ import annotations

from types import SimpleNamespace

from infscaler.runtime.scaling.placement import (
    core_load,
    pick_cores,
    pinnable_cores,
    scale_in_victim,
)

A, B = ("p", 0), ("p", 1)


def _h(key, cores, state="ready", started=0.0, iid=0):
    return SimpleNamespace(key=key, cores=cores, state=state, started=started, iid=iid)


def test_core_load_counts_the_units_own_threads_and_every_live_ones():
    handles = [
        _h(A, [0, 1]),
        _h(A, [1], state="starting"),
        _h(B, [1, 2]),
        _h(A, [3], state="exited"),  # holds no core
        _h(B, None),  # not pinned
    ]
    assert core_load(handles, A) == {0: (1, 1), 1: (2, 3), 2: (0, 1)}
    assert core_load(handles, B) == {0: (0, 1), 1: (1, 3), 2: (1, 1)}
    assert core_load(handles) == {0: (0, 1), 1: (0, 3), 2: (0, 1)}
    assert core_load([]) == {}


def test_pinnable_cores_are_the_profiles_cpu_cores_this_host_has():
    host = [0, 1, 2, 3]
    assert pinnable_cores(host) == [0, 1, 2, 3]
    cpu = SimpleNamespace(engine="cpu", cores=[2, 3, 7])
    gpu = SimpleNamespace(engine="gpu", cores=None)
    assert pinnable_cores(host, SimpleNamespace(accelerators=[gpu, cpu])) == [2, 3]
    # none of the profile's cores here, or none listed: the host's
    away = SimpleNamespace(engine="cpu", cores=[8, 9])
    assert pinnable_cores(host, SimpleNamespace(accelerators=[away])) == host
    assert pinnable_cores(host, SimpleNamespace(accelerators=[gpu])) == host
    # the last cpu entry that lists cores decides
    both = SimpleNamespace(accelerators=[cpu, SimpleNamespace(engine="cpu", cores=[0])])
    assert pinnable_cores(host, both) == [0]


def test_pick_cores_takes_all_when_n_covers_them():
    assert pick_cores(4, [3, 1, 2, 0], {}, 5) == [0, 1, 2, 3]
    assert pick_cores(6, [2, 0], {0: (9, 9)}, 0) == [0, 2]


def test_pick_cores_takes_the_least_loaded_by_the_unit_then_by_all():
    cores = [0, 1, 2, 3]
    # core 0 holds the unit's own instance, 1 another unit's: 2 and 3 are free
    load = {0: (1, 1), 1: (0, 1)}
    assert pick_cores(2, cores, load, 0) == [2, 3]
    # one core: of the free ones, the first from the cursor (2 then 3 from cursor 0;
    # from cursor 3: index 3 first)
    assert pick_cores(1, cores, load, 0) == [2]
    assert pick_cores(1, cores, load, 3) == [3]
    # the unit's own load comes before the total: 1 (0 own, 5 all) beats 0 (1 own, 1 all)
    assert pick_cores(2, cores, {0: (1, 1), 1: (0, 5), 2: (1, 1)}, 0) == [1, 3]
    assert pick_cores(1, cores, {0: (1, 1), 1: (0, 5), 2: (1, 1)}, 3) == [3]
    assert pick_cores(3, cores, {0: (1, 1), 1: (0, 5), 2: (1, 1)}, 0) == [0, 1, 3]


def test_pick_cores_floats_once_every_core_holds_an_instance():
    # 2 cores, each with one pinned instance: a third floats over both
    assert pick_cores(1, [0, 1], {0: (1, 1), 1: (0, 1)}, 0) == [0, 1]
    assert pick_cores(2, [0, 1, 2, 3], {c: (0, 1) for c in range(4)}, 7) == [0, 1, 2, 3]
    # one core still free: pinned there
    assert pick_cores(1, [0, 1, 2], {0: (1, 1), 1: (0, 2)}, 0) == [2]


def test_pick_cores_ties_go_round_from_the_cursor():
    cores = [4, 5, 6]
    # the cursor is an index into cores, any int (taken modulo their number)
    assert [pick_cores(1, cores, {}, s) for s in range(4)] == [[4], [5], [6], [4]]
    assert pick_cores(2, cores, {}, 2) == [4, 6]
    assert pick_cores(2, cores, {}, -1) == [4, 6]


def test_scale_in_stops_the_instance_on_the_most_shared_cores_then_the_youngest():
    load = {0: (2, 2), 1: (1, 2), 2: (1, 1)}
    old_shared = _h(A, [0], started=1.0, iid=1)
    young_alone = _h(A, [2], started=5.0, iid=2)
    assert scale_in_victim([old_shared, young_alone], load) is old_shared
    # the same sharing: the youngest
    young_shared = _h(A, [0], started=3.0, iid=3)
    assert scale_in_victim([old_shared, young_shared], load) is young_shared
    # sums over the instance's cores; unpinned counts 0
    two = _h(A, [1, 2], started=0.0, iid=4)  # 1 + 1
    assert scale_in_victim([two, young_alone], load) is two
    unpinned = _h(A, None, started=9.0, iid=5)
    assert scale_in_victim([unpinned, young_alone], load) is young_alone
