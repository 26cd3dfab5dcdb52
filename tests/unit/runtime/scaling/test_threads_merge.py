"""The merge of single-thread instances at low concurrency (runtime/scaling/threads.py)
on constructed snapshots: when it merges, the two steps of a merge and of a split, the
trial's verdict, the backoff, and what keeps it still."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infscaler.runtime.scaling.threads import (
    ThreadsConfig,
    ThreadsState,
    config_for,
    enabled,
    in_flight,
    step,
)
from infscaler.runtime.scaling.types import EngineOption, ResourceCap, Snapshot, UnitState

CFG = ThreadsConfig(window_s=10.0, split_s=3.0, trial_s=15.0, backoff_s=60.0)


def unit(n: int = 2, threads: int = 1, index: int = 0, service_ms: float = 85.0) -> UnitState:
    return UnitState(
        index=index,
        name=f"m/{index}",
        bottleneck=1.0,
        instances={"cpu": n},
        options=(EngineOption("cpu", 85.0, 100.0, threads),),
        service_ms=service_ms,
        min_instances=n,
        threads={threads: n},
    )


def snap(now: float, pending: int, units: tuple[UnitState, ...], **kw: object) -> Snapshot:
    defaults: dict = {
        "slo_ms": 255.0,
        "p99_ms": 90.0,
        "arrival_rate": 11.0,
        "served_rate": 11.0,
        "cap": ResourceCap(4000.0, 500.0, {"cpu": 8}, cores=2, physical_cores=2),
        "cores_busy": 1.1,
    }
    cores = int(kw.pop("physical", 2))  # type: ignore[call-overload]
    defaults["cap"] = ResourceCap(4000.0, 500.0, {"cpu": 8}, cores=cores, physical_cores=cores)
    defaults.update(kw)
    return Snapshot(now=now, units=units, pending=pending, **defaults)  # type: ignore[arg-type]


def run(looks: list[Snapshot], state: ThreadsState | None = None, last_change=None):  # noqa: ANN001, ANN201
    state = state or ThreadsState()
    out = []
    for s in looks:
        d, state = step(s, state, CFG, last_change)
        out.append(d)
    return out, state


def watch(
    n_looks: int, pending: int, u: UnitState, t0: float = 0.0, **kw: object
) -> list[Snapshot]:
    return [snap(t0 + i, pending, (u,), **kw) for i in range(n_looks)]


def test_one_request_in_flight_on_two_instances_merges_in_two_steps() -> None:
    outs, st = run(watch(12, 1, unit()))
    flat = [d for ds in outs for d in ds]
    assert [d.action for d in flat] == ["scale_in"]
    assert flat[0].unit == 0 and flat[0].engine == "cpu"
    assert "1 requests in flight" in flat[0].reason and "2 threads" in flat[0].reason
    assert st.phase == "merging" and st.threads == 1
    # the scale-in still draining: nothing; once one instance is left: scale_up 1 -> 2
    d, st = step(snap(12.0, 1, (unit(),)), st, CFG)
    assert d == [] and st.phase == "merging"
    d, st = step(snap(13.0, 1, (unit(n=1),)), st, CFG)
    assert [(x.action, x.from_threads, x.threads) for x in d] == [("scale_up", 1, 2)]
    assert st.phase == "trial" and st.started == 13.0
    # the swap (the 2-thread instance starting beside the 1-thread one) keeps the trial
    swap = replace(unit(), threads={1: 1, 2: 1})
    d, st = step(snap(14.0, 1, (swap,)), st, CFG)
    assert d == [] and st.phase == "trial"


def test_no_merge_at_two_in_flight_nor_before_a_whole_window() -> None:
    outs, _ = run(watch(30, 2, unit()))
    assert all(d == [] for d in outs)
    outs, _ = run(watch(9, 1, unit()))  # 8 s watched < window_s
    assert all(d == [] for d in outs)


def test_no_merge_without_spare_cores_or_load_or_after_a_change() -> None:
    outs, _ = run(watch(12, 1, unit(), cores_busy=1.9))
    assert all(d == [] for d in outs)  # no idle half core
    outs, _ = run(watch(12, 0, unit()))
    assert all(d == [] for d in outs)  # idle: nothing to speed up
    outs, _ = run(watch(12, 1, unit(threads=2)))
    assert all(d == [] for d in outs)  # 2 x 2 threads would pin 4 > 2 cores
    outs, _ = run(watch(12, 1, unit()), last_change=5.0)
    assert all(d == [] for d in outs)  # the scaler changed something within the window
    outs, _ = run(watch(12, 1, unit(n=3), physical=4))
    assert all(d == [] for d in outs)  # only a pair is merged
    mixed = replace(unit(), threads={1: 1, 2: 1})
    outs, _ = run(watch(12, 1, mixed))
    assert all(d == [] for d in outs)


def test_the_slowest_unit_is_merged() -> None:
    a, b = unit(index=0, service_ms=5.0), unit(index=1, service_ms=80.0)
    looks = [snap(float(i), 1, (a, b)) for i in range(12)]
    outs, st = run(looks)
    flat = [d for ds in outs for d in ds]
    assert [(d.action, d.unit) for d in flat] == [("scale_in", 1)] and st.unit == 1
    # a function unit is never merged (intra-op threads do not speed it up)
    state = ThreadsState()
    for s in looks:
        d, state = step(s, state, CFG, None, frozenset({0}))
    assert state.phase == "merging" and state.unit == 0


def _merged(before_rps: float = 11.0, before_p99: float = 90.0) -> ThreadsState:
    looks = tuple((float(i), 1.0, before_rps, before_p99) for i in range(10))
    return ThreadsState(looks=looks, phase="trial", unit=0, threads=1, started=10.0,
                        before_rps=before_rps, before_p99=before_p99)  # fmt: skip


def test_trial_kept_when_the_served_rate_rose() -> None:
    st = _merged()
    one = unit(n=1, threads=2)
    for i in range(11, 26):
        d, st = step(snap(float(i), 1, (one,), served_rate=20.0, p99_ms=50.0), st, CFG)
        assert d == []
    assert st.phase == "kept" and st.verdict is not None and "kept" in st.verdict
    assert "11 -> 20" in st.verdict


def test_trial_reverted_with_backoff_when_nothing_improved() -> None:
    st = _merged()
    one = unit(n=1, threads=2)
    out = []
    for i in range(11, 26):
        d, st = step(snap(float(i), 1, (one,), served_rate=11.0, p99_ms=92.0), st, CFG)
        out += d
    assert [(d.action, d.from_threads, d.threads) for d in out] == [("scale_down", 2, 1)]
    assert st.phase == "splitting" and "reverted" in (st.verdict or "")
    assert st.blocked == ((0, 25.0 + 60.0, 1),)
    # then one more single-thread instance, and no merge again within the backoff
    d, st = step(snap(26.0, 1, (unit(n=1, threads=1),)), st, CFG)
    assert [x.action for x in d] == ["scale_out"] and st.phase is None
    outs, st = run(watch(40, 1, unit(), t0=27.0), st)
    assert all(x == [] for x in outs)
    outs, st = run(watch(12, 1, unit(), t0=90.0), st)
    assert [d.action for ds in outs for d in ds] == ["scale_in"]


def test_a_kept_merge_splits_back_when_concurrency_rises() -> None:
    st = replace(_merged(), phase="kept")
    one = unit(n=1, threads=2)
    d, st = step(snap(30.0, 1, (one,)), st, CFG)
    assert d == []
    out = []
    for i in range(31, 35):
        d, st = step(snap(float(i), 3, (one,)), st, CFG)
        out += d
    assert [(d.action, d.from_threads, d.threads) for d in out] == [("scale_down", 2, 1)]
    assert "split back" in out[0].reason
    assert st.blocked == ((0, 31.0 + 60.0, 0),)  # no merge again for backoff_s
    d, st = step(snap(35.0, 3, (one,)), st, CFG)
    assert d == []  # the scale-down still under way
    d, st = step(snap(35.5, 3, (replace(unit(), threads={1: 1, 2: 1}),)), st, CFG)
    assert d == [] and st.phase == "splitting"  # its swap under way
    d, st = step(snap(36.0, 3, (unit(n=1, threads=1),)), st, CFG)
    assert [x.action for x in d] == ["scale_out"] and st.phase is None


def test_a_unit_the_scaler_moved_is_let_go() -> None:
    st = replace(_merged(), phase="kept")
    d, st = step(snap(30.0, 1, (replace(unit(n=3), threads={1: 2, 2: 1}),)), st, CFG)
    assert d == [] and st.phase is None
    st = replace(_merged(), phase="merging", started=0.0)
    d, st = step(snap(100.0, 1, (unit(),)), st, CFG)
    assert d == [] and st.phase is None  # a scale-in that never landed


def test_in_flight_mean_and_config() -> None:
    looks = ((0.0, 1.0, 0.0, 0.0), (1.0, 3.0, 0.0, 0.0), (2.0, 2.0, 0.0, 0.0))
    assert in_flight(looks, 1.0) == pytest.approx(2.5)
    assert in_flight(looks, 5.0) is None
    with pytest.raises(ValueError, match="window_s"):
        ThreadsConfig(window_s=0.0)
    with pytest.raises(ValueError, match="gain"):
        ThreadsConfig(gain=-1.0)
    auto = type("A", (), {"interval_s": 0.5, "window_s": 2.0, "settle_s": 1.0})()
    c = config_for(auto)
    assert (c.window_s, c.split_s, c.trial_s) == (2.0, 1.5, 5.0)
    assert enabled({}) and enabled({"INFSCALER_THREADS": "on"})
    assert not enabled({"INFSCALER_THREADS": "OFF"})
