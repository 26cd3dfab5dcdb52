"""Threads per instance at low concurrency (runtime/scaling/threads.py) on constructed
snapshots: when it moves, the steps of a merge (K = 1 replicas), of a widening (the
one-instance partitions of a K = 2 chain, as the live service reports them) and of a
split, the trial's verdict, the backoff, and what keeps it still."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infscaler.runtime.scaling.threads import (
    Moved,
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
    assert "1 requests in flight" in flat[0].reason and "one at 2" in flat[0].reason
    assert st.phase == "merging" and st.moved == (Moved(0, 1, 2, 2, expect=1),)
    # the scale-in still draining: nothing; once one instance is left: scale_up 1 -> 2
    d, st = step(snap(12.0, 1, (unit(),)), st, CFG)
    assert d == [] and st.phase == "merging"
    d, st = step(snap(13.0, 1, (unit(n=1),)), st, CFG)
    assert [(x.action, x.from_threads, x.threads) for x in d] == [("scale_up", 1, 2)]
    assert "merged" in d[0].reason
    assert st.phase == "trial" and st.started == 13.0
    # the swap (the 2-thread instance starting beside the 1-thread one) keeps the trial
    swap = replace(unit(), threads={1: 1, 2: 1})
    d, st = step(snap(14.0, 1, (swap,)), st, CFG)
    assert d == [] and st.phase == "trial"
    d, st = step(snap(15.0, 1, (unit(n=1, threads=2),)), st, CFG)
    assert d == [] and st.phase == "trial"


def test_no_move_at_two_in_flight_nor_before_a_whole_window() -> None:
    outs, st = run(watch(30, 2, unit()))
    assert all(d == [] for d in outs)
    assert st.held is not None and st.held[0] == "in-flight"
    outs, st = run(watch(9, 1, unit()))  # 8 s watched < window_s
    assert all(d == [] for d in outs)
    assert st.held is not None and st.held[0] == "watching"


def test_no_move_without_spare_cores_or_load_or_after_a_change() -> None:
    outs, st = run(watch(12, 1, unit(), cores_busy=1.9))
    assert all(d == [] for d in outs) and st.held and st.held[0] == "busy"  # no idle half core
    outs, st = run(watch(12, 0, unit()))
    assert all(d == [] for d in outs) and st.held and st.held[0] == "idle"
    outs, st = run(watch(12, 1, unit(threads=2)))
    assert all(d == [] for d in outs)  # one instance at 2 threads is all 2 cores give
    assert st.held and st.held[0] == "none"
    outs, st = run(watch(12, 1, unit(n=1, threads=2)))
    assert all(d == [] for d in outs)
    outs, st = run(watch(12, 1, unit()), last_change=5.0)
    assert all(d == [] for d in outs)  # the scaler changed something within the window
    assert st.held and st.held[0] == "changed"
    outs, _ = run(watch(12, 1, unit(), physical=1))
    assert all(d == [] for d in outs)
    mixed = replace(unit(), threads={1: 1, 2: 1})
    outs, _ = run(watch(12, 1, mixed))
    assert all(d == [] for d in outs)


def test_no_move_while_an_arbitration_loan_is_in_force() -> None:
    """A pipeline that borrowed (or lent) an instance keeps its instances while the loan
    lasts, where the same looks without the loan merge; once it ends, the move comes."""
    looks = watch(12, 1, unit())
    state = ThreadsState()
    for s in looks:
        d, state = step(s, state, CFG, None, None, hold=("loan", "an arbitration loan in force"))
        assert d == []
    assert state.held == ("loan", "an arbitration loan in force")
    d, state = step(snap(12.0, 1, (unit(),)), state, CFG, None, None, hold=None)
    assert [x.action for x in d] == ["scale_in"]


def test_three_instances_are_merged_one_scale_in_at_a_time() -> None:
    outs, st = run(watch(12, 1, unit(n=3), physical=4))
    assert [d.action for ds in outs for d in ds] == ["scale_in"]
    assert st.moved == (Moved(0, 1, 3, 3, expect=2),)
    d, st = step(snap(12.0, 1, (unit(n=3),), physical=4), st, CFG)
    assert d == []  # still draining
    d, st = step(snap(13.0, 1, (unit(n=2),), physical=4), st, CFG)
    assert [x.action for x in d] == ["scale_in"] and st.moved[0].expect == 1
    d, st = step(snap(14.0, 1, (unit(n=1),), physical=4), st, CFG)
    assert [(x.action, x.threads) for x in d] == [("scale_up", 3)] and st.phase == "trial"


def k2(n0: int = 1, n1: int = 1, ms: tuple[float | None, float | None] = (40.0, 44.0)):  # noqa: ANN201
    """A K = 2 plan's units as the live service reports them: two partitions, one
    single-thread instance each (``inst=1+1``), or the bottleneck scaled out."""
    a = replace(unit(n=n0, index=0, service_ms=ms[0] or 0.0), service_ms=ms[0])
    b = replace(unit(n=n1, index=1, service_ms=ms[1] or 0.0), service_ms=ms[1])
    return (a, b)


def test_a_k2_chain_at_one_in_flight_widens_both_partitions_at_once() -> None:
    # the looks of vs_triton's auto server at concurrency 1 (K = 2, 1 + 1 instances):
    # no service time nor measured busy cores at the first look (then every pinned thread
    # counts busy), one request in flight, 0.2 cores busy after
    looks = [snap(0.0, 0, k2(ms=(None, None)), cores_busy=2.0, served_rate=0.0)]
    looks += [snap(float(i), 1, k2(), cores_busy=0.2, served_rate=5.5) for i in range(1, 12)]
    outs, st = run(looks)
    flat = [d for ds in outs for d in ds]
    assert [(d.action, d.unit, d.from_threads, d.threads) for d in flat] == [
        ("scale_up", 0, 1, 2),
        ("scale_up", 1, 1, 2),
    ]
    assert all("widened" in d.reason for d in flat)
    assert st.phase == "trial" and [m.unit for m in st.moved] == [0, 1]
    # both at 2 threads, served twice as fast: kept
    both = (unit(n=1, threads=2, index=0), unit(n=1, threads=2, index=1))
    for i in range(12, 40):
        d, st = step(snap(float(i), 1, both, served_rate=10.0, p99_ms=95.0), st, CFG)
        assert d == []
    assert st.phase == "kept" and "m/0, m/1: threads kept" in (st.verdict or "")
    # the concurrency rises: both split back together, then nothing to scale out
    out = []
    for i in range(40, 44):
        d, st = step(snap(float(i), 2, both), st, CFG)
        out += d
    assert [(d.action, d.unit, d.threads) for d in out] == [
        ("scale_down", 0, 1),
        ("scale_down", 1, 1),
    ]
    d, st = step(snap(45.0, 2, k2()), st, CFG)
    assert d == [] and st.phase is None
    assert {b[0] for b in st.blocked} == {0, 1}


def test_a_k2_chain_with_its_bottleneck_scaled_out_merges_it_and_widens_the_other() -> None:
    looks = [snap(float(i), 1, k2(n1=2), cores_busy=1.0) for i in range(12)]
    outs, st = run(looks)
    flat = [d for ds in outs for d in ds]
    assert [(d.action, d.unit) for d in flat] == [("scale_up", 0), ("scale_in", 1)]
    assert st.phase == "merging"
    d, st = step(snap(12.0, 1, (unit(n=1, threads=2, index=0), unit(n=1, index=1))), st, CFG)
    assert [(x.action, x.unit, x.threads) for x in d] == [("scale_up", 1, 2)]
    assert st.phase == "trial"


def test_only_model_units_are_moved() -> None:
    a, b = unit(index=0, service_ms=5.0), unit(index=1, service_ms=80.0)
    looks = [snap(float(i), 1, (a, b)) for i in range(12)]
    state = ThreadsState()
    for s in looks:
        d, state = step(s, state, CFG, None, frozenset({1}))
    assert state.phase == "merging" and [m.unit for m in state.moved] == [1]


def _merged(before_rps: float = 11.0, before_p99: float = 90.0) -> ThreadsState:
    looks = tuple((float(i), 1.0, before_rps, before_p99) for i in range(10))
    return ThreadsState(looks=looks, phase="trial", moved=(Moved(0, 1, 2, 2, 1, True),),
                        started=10.0, before_rps=before_rps, before_p99=before_p99)  # fmt: skip


def test_trial_kept_when_the_served_rate_rose() -> None:
    st = _merged()
    one = unit(n=1, threads=2)
    for i in range(11, 26):
        d, st = step(snap(float(i), 1, (one,), served_rate=20.0, p99_ms=50.0), st, CFG)
        assert d == []
    assert st.phase == "kept" and st.verdict is not None and "threads kept" in st.verdict
    assert "11 -> 20" in st.verdict


def test_trial_reverted_with_backoff_when_nothing_improved() -> None:
    st = _merged()
    one = unit(n=1, threads=2)
    out = []
    for i in range(11, 26):
        d, st = step(snap(float(i), 1, (one,), served_rate=11.0, p99_ms=92.0), st, CFG)
        out += d
    assert [(d.action, d.from_threads, d.threads) for d in out] == [("scale_down", 2, 1)]
    assert st.phase == "splitting" and "threads reverted" in (st.verdict or "")
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


def test_no_move_while_the_scalers_scale_out_trial_is_under_way() -> None:
    """One look of the whole policy (:func:`~infscaler.runtime.scaling.policy.look`):
    where the threads move would start, a scale-out on trial (the scaler's) holds it
    (``trial``): moving then would judge the trial on another configuration's rate."""
    from infscaler.runtime.scaling.policy import Observation, look
    from infscaler.runtime.scaling.types import ScalerConfig, ScalerState, Trial

    looks = watch(11, 1, unit())  # the move comes at the 11th look (t = 10 s)
    state = ThreadsState()
    for s in looks[:-1]:
        _, state = step(s, state, CFG)
    assert state.phase is None
    last = looks[-1]
    trial = Trial(unit=0, engine="cpu", name="m/0", started=last.now - 1.0, before_rps=11.0)
    for scaler, code in ((ScalerState(trial=trial), "trial"), (ScalerState(), None)):
        obs = Observation(last, scaler, ScalerConfig(), state, CFG, frozenset({0}))
        out = look(obs)
        moved = [d for d in out.decisions if d.action in ("scale_in", "scale_up")]
        assert out.threads is not None
        if code is None:
            assert moved and out.threads.phase == "merging"
        else:
            assert not moved and out.threads.held is not None and out.threads.held[0] == code
