"""The pure scaling policy (infscaler.runtime.scaling.scaler.decide) on hand-computed snapshots:
InfScaler Algorithm 1 (scale out), InferLine Algorithm 4 (scale in with hysteresis), load
shedding at the cap, and a property test that no decision sequence breaks the cap."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infscaler.runtime.scaling import scaler
from infscaler.runtime.scaling.cores import refusals
from infscaler.runtime.scaling.scaler import (
    decide,
    effective_bottleneck,
    pipeline_capacity_rps,
    shed_queue_limit,
)
from infscaler.runtime.scaling.types import (
    Decision,
    EngineOption,
    ResourceCap,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)

CPU = EngineOption("cpu", latency_ms=50.0, memory_mb=100.0, cores=1)
GPU = EngineOption("gpu", latency_ms=10.0, memory_mb=200.0)


#: The tests here are about what a counted violation does, so it counts at once: no
#: settle window after a change and no sustain (both are tested in
#: tests/unit/runtime/scaling/test_scaler_settle.py).
def config(**kw: object) -> ScalerConfig:
    return ScalerConfig(**{"settle_s": 0.0, "sustain_s": 0.0, **kw})  # type: ignore[arg-type]


NOW = config()


def unit(index: int, bottleneck: float, instances: dict[str, int], *options, **kw) -> UnitState:
    return UnitState(
        index=index,
        name=f"u{index}",
        bottleneck=bottleneck,
        instances=instances,
        options=tuple(options) or (CPU,),
        **kw,
    )


def snap(
    units: list[UnitState],
    *,
    now: float = 100.0,
    p99: float | None = 300.0,
    slo: float = 200.0,
    rate: float = 10.0,
    mem_used: float = 500.0,
    mem_cap: float = 2000.0,
    slots: dict[str, int] | None = None,
    cores: int = 0,
    cores_used: int = 0,
    used: dict[str, int] | None = None,
    offered: float | None = None,
) -> Snapshot:
    if used is None:  # this pipeline's instances are all the device runs
        used = {}
        for u in units:
            for e, n in u.instances.items():
                used[e] = used.get(e, 0) + n
    return Snapshot(
        now=now,
        slo_ms=slo,
        p99_ms=p99,
        arrival_rate=rate,
        units=tuple(units),
        cap=ResourceCap(mem_cap, mem_used, slots or {"cpu": 8, "gpu": 4}, cores),
        cores_used=cores_used,
        instances_used=used,
        offered_rate=offered,
    )


def only(decisions: list[Decision]) -> Decision:
    assert len(decisions) == 1, decisions
    return decisions[0]


# -- scale out (Algorithm 1) -----------------------------------------------------------------


def test_scale_out_picks_the_largest_effective_bottleneck() -> None:
    # B_k / S_k: u0 10/1 = 10, u1 30/2 = 15, u2 12/1 = 12 -> u1
    units = [unit(0, 10, {"cpu": 1}), unit(1, 30, {"cpu": 2}), unit(2, 12, {"cpu": 1})]
    out, st_ = decide(snap(units), ScalerState(), NOW)
    d = only(out)
    assert (d.action, d.unit, d.engine) == ("scale_out", 1, "cpu")
    # P99 300 > SLO 200; memory 500 + 100 <= 2000; cpu slots 4 + 1 <= 8
    assert "P99 300 ms > SLO 200 ms" in d.reason
    assert "largest B_k/S_k 15" in d.reason
    assert "memory 500+100 <= 2000 MB" in d.reason and "cpu slots 4+1 <= 8" in d.reason
    assert st_.last_scale_out == 100.0 and st_.last_change == 100.0
    assert st_.rates == ((100.0, 10.0),)
    assert effective_bottleneck(units[1]) == 15.0


def test_equal_bottlenecks_go_to_the_lower_index() -> None:
    # u0 20/2 = 10 and u1 10/1 = 10: a tie, the lower index wins
    units = [unit(0, 20, {"cpu": 2}), unit(1, 10, {"cpu": 1})]
    assert only(decide(snap(units), ScalerState(), NOW)[0]).unit == 0


def test_no_violation_no_scale_out() -> None:
    units = [unit(0, 10, {"cpu": 1}, service_ms=50.0, arrival_rate=10.0)]
    # P99 200 is not > 1.0 x 200; None is no sample; 230 is not > 1.2 x 200 = 240
    assert decide(snap(units, p99=200.0), ScalerState(last_change=99.0), NOW)[0] == []
    assert decide(snap(units, p99=None), ScalerState(last_change=99.0), NOW)[0] == []
    cfg = config(violation_ratio=1.2)
    assert decide(snap(units, p99=230.0), ScalerState(last_change=99.0), cfg)[0] == []
    d = only(decide(snap(units, p99=241.0), ScalerState(), cfg)[0])
    assert d.action == "scale_out" and "1.2 x SLO 200 ms" in d.reason


def test_affinity_order_fastest_engine_that_fits() -> None:
    # options listed cpu first, but gpu is faster (10 < 50 ms): gpu while it has a slot
    u = unit(0, 10, {"cpu": 1}, CPU, GPU)
    d = only(decide(snap([u], slots={"cpu": 8, "gpu": 1}), ScalerState(), NOW)[0])
    assert d.engine == "gpu" and "memory 500+200 <= 2000 MB" in d.reason
    # the gpu's one slot is taken (by another pipeline): falls to cpu
    full = snap([u], slots={"cpu": 8, "gpu": 1}, used={"cpu": 1, "gpu": 1})
    d = only(decide(full, ScalerState(), NOW)[0])
    assert d.engine == "cpu" and "gpu refused: gpu slots 1+1 > 1; cpu (50 ms) admits it" in d.reason


def test_memory_cap_refuses_an_engine() -> None:
    u = unit(0, 10, {"cpu": 1}, CPU, GPU)
    # gpu: 1850 + 200 = 2050 > 2000 refused; cpu: 1850 + 100 = 1950 <= 2000 admitted
    d = only(decide(snap([u], mem_used=1850.0), ScalerState(), NOW)[0])
    assert d.engine == "cpu"
    assert "memory 1850+200 > 2000 MB" in d.reason and "memory 1850+100 <= 2000 MB" in d.reason
    # exactly at the cap is admitted: 1900 + 100 = 2000 <= 2000
    assert only(decide(snap([u], mem_used=1900.0), ScalerState(), NOW)[0]).engine == "cpu"
    # 1950 + 100 = 2050 > 2000 and 1950 + 200 > 2000: nothing fits, so the queue is bounded
    d = only(decide(snap([u], mem_used=1950.0), ScalerState(), NOW)[0])
    assert d.action == "shed"


def test_cores_cap_refuses_and_zero_cores_is_not_counted() -> None:
    big = EngineOption("cpu", 50.0, 100.0, cores=2)
    small = EngineOption("cpu", 80.0, 100.0, cores=1)
    units = [unit(0, 100, {"cpu": 1}, big), unit(1, 60, {"cpu": 1}, small)]
    # u0 (100/1) first: cores 3 + 2 = 5 > 4 refused; u1 (60 >= 0.5 x 100): 3 + 1 = 4 <= 4
    d = only(decide(snap(units, cores=4, cores_used=3), ScalerState(), NOW)[0])
    assert (d.unit, d.engine) == (1, "cpu")
    assert "cores 3+2 > 4" in d.reason and "cores 3+1 <= 4" in d.reason
    # cap.cores = 0: cores are not counted, u0 is admitted though 10 + 2 > anything
    d = only(decide(snap(units, cores=0, cores_used=10), ScalerState(), NOW)[0])
    assert d.unit == 0


def test_next_best_unit_when_the_argmax_cannot_fit() -> None:
    heavy = EngineOption("cpu", 50.0, 500.0)
    light = EngineOption("cpu", 20.0, 50.0)
    units = [unit(0, 100, {"cpu": 1}, heavy), unit(1, 60, {"cpu": 1}, light)]
    # u0: 1600 + 500 = 2100 > 2000; u1 (60/1 >= 0.5 x 100, the next largest): 1650 <= 2000
    d = only(decide(snap(units, mem_used=1600.0), ScalerState(), NOW)[0])
    assert (d.action, d.unit) == ("scale_out", 1)
    assert "u0 (B_k/S_k 100) fits no engine" in d.reason and "next largest" in d.reason
    # an engine the device lacks is not admissible: u0 only runs on dla
    dla = EngineOption("dla", 5.0, 10.0)
    units = [unit(0, 100, {"dla": 1}, dla), unit(1, 60, {"cpu": 1}, light)]
    d = only(decide(snap(units), ScalerState(), NOW)[0])
    assert d.unit == 1 and "dla is not on this device" in d.reason


def test_a_light_unit_is_not_scaled_in_the_bottlenecks_place() -> None:
    heavy = EngineOption("cpu", 50.0, 500.0)
    light = EngineOption("cpu", 20.0, 50.0)
    units = [unit(0, 100, {"cpu": 1}, heavy), unit(1, 10, {"cpu": 1}, light)]
    # u0 does not fit (2100 > 2000 MB); u1's 10 < 0.5 x 100: more u1 would not help -> shed
    d = only(decide(snap(units, mem_used=1600.0), ScalerState(), NOW)[0])
    assert d.action == "shed" and "u1 (B_k/S_k 10) is below 0.5 x" in d.reason


def test_unit_at_max_instances_is_skipped() -> None:
    units = [unit(0, 100, {"cpu": 2}, max_instances=2), unit(1, 30, {"cpu": 1})]
    # u0 has 100/2 = 50 > 30 but is at its max_instances 2; 30 >= 0.5 x 50
    d = only(decide(snap(units), ScalerState(), NOW)[0])
    assert d.unit == 1 and "u0 (B_k/S_k 50) is at its max_instances 2" in d.reason


def test_cooldown_blocks_a_second_scale_out() -> None:
    units = [unit(0, 10, {"cpu": 1})]
    cfg = config(cooldown_s=3.0)
    out, s1 = decide(snap(units, now=100.0), ScalerState(), cfg)
    assert only(out).action == "scale_out"
    grown = [unit(0, 10, {"cpu": 2})]
    # 102 - 100 = 2 < 3: still cooling down, nothing (not even a shed)
    out, s2 = decide(snap(grown, now=102.0), s1, cfg)
    assert out == [] and s2.last_scale_out == 100.0
    # 103 - 100 = 3 >= 3: the next scale-out
    out, s3 = decide(snap(grown, now=103.0), s2, cfg)
    assert only(out).action == "scale_out" and s3.last_scale_out == 103.0
    assert [t for t, _ in s3.rates] == [100.0, 102.0, 103.0]


# -- scale in (InferLine Algorithm 4) --------------------------------------------------------


def quiet_unit(n: int = 3, **kw) -> UnitState:
    kw.setdefault("service_ms", 100.0)
    kw.setdefault("arrival_rate", 1.0)
    return unit(0, 10, {"cpu": n}, **kw)


def test_scale_in_waits_for_hold_s_after_a_change() -> None:
    cfg = config(hold_s=15.0)
    state = ScalerState(last_change=100.0)
    # 1 req/s x 100 ms / 0.6 = 0.17 -> 1 needed < 3 instances, but only 10 s since a change
    # (SLO 500 ms: one instance's P99 at load 0.1, 228 ms, is within it)
    quiet = dict(p99=50.0, rate=1.0, slo=500.0)
    assert decide(snap([quiet_unit()], now=110.0, **quiet), state, cfg)[0] == []
    assert decide(snap([quiet_unit()], now=115.0, **quiet), state, cfg)[0] == []  # not > 15
    out, s = decide(snap([quiet_unit()], now=115.5, **quiet), state, cfg)
    d = only(out)
    assert (d.action, d.unit, d.engine) == ("scale_in", 0, "cpu")
    assert "needs 1 instance(s)" in d.reason and "3 > 1" in d.reason
    assert s.last_change == 115.5 and s.last_scale_out is None
    # one at a time: the next call is within hold_s of this one
    assert decide(snap([quiet_unit(2)], now=116.0, **quiet), s, cfg)[0] == []


def test_scale_in_serves_the_max_rate_over_the_horizon() -> None:
    cfg = config(hold_s=15.0, rate_horizon_s=30.0)
    s = ScalerState()
    # t = 0: a burst of 20 req/s: 20 x 100 ms / 0.6 = 3.33 -> 4 needed >= 3: keep all
    out, s = decide(snap([quiet_unit(arrival_rate=20.0)], now=0.0, p99=50.0, rate=20.0), s, cfg)
    assert out == []
    # t = 20 and 30: 1 req/s now, but max over the last 30 s is still 20 -> 4 needed
    for now in (20.0, 30.0):
        out, s = decide(snap([quiet_unit()], now=now, p99=50.0, rate=1.0), s, cfg)
        assert out == [], now
    # t = 31: the burst is 31 s old and dropped; max 1 req/s -> 1 needed < 3
    out, s = decide(snap([quiet_unit()], now=31.0, p99=50.0, rate=1.0), s, cfg)
    assert only(out).action == "scale_in" and "max rate 1 req/s" in out[0].reason
    assert [t for t, _ in s.rates] == [20.0, 30.0, 31.0]


def test_scale_in_counts_fan_out() -> None:
    # 10 req/s x 3 items/req = 30 items/s x 30 ms / 0.6 = 1.5 -> 2 needed: keep both
    # (without the fan-out it would be 10 x 30 ms / 0.6 = 0.5 -> 1, and one would go)
    u = unit(0, 10, {"cpu": 2}, service_ms=30.0, arrival_rate=30.0)
    assert decide(snap([u], p99=50.0, rate=10.0), ScalerState(), NOW)[0] == []
    # 20 ms: 30 x 20 ms / 0.6 = 1.0 -> 1 needed < 2
    u = replace(u, service_ms=20.0)
    assert only(decide(snap([u], p99=50.0, rate=10.0), ScalerState(), NOW)[0]).action == "scale_in"


def test_scale_in_gives_back_the_slowest_engine_first_one_per_unit() -> None:
    # u0 runs on gpu (10 ms) and cpu (50 ms): the cpu instance goes first
    u0 = unit(0, 10, {"gpu": 1, "cpu": 2}, CPU, GPU, service_ms=20.0, arrival_rate=0.0)
    u1 = unit(1, 5, {"cpu": 2}, service_ms=20.0, arrival_rate=0.0)
    out, s = decide(snap([u0, u1], p99=None, rate=0.0), ScalerState(), NOW)
    assert [(d.action, d.unit, d.engine) for d in out] == [
        ("scale_in", 0, "cpu"),
        ("scale_in", 1, "cpu"),
    ]
    # the service time falls back to the fastest option when there is no sample
    u2 = unit(0, 10, {"gpu": 2}, CPU, GPU, arrival_rate=0.0)
    assert only(decide(snap([u2], p99=None, rate=0.0), ScalerState(), NOW)[0]).engine == "gpu"


def test_never_below_min_instances() -> None:
    # no load: 0 needed, but min_instances 2 keeps both
    u = quiet_unit(2, min_instances=2, arrival_rate=0.0)
    assert decide(snap([u], p99=None, rate=0.0), ScalerState(), NOW)[0] == []
    u = quiet_unit(3, min_instances=2, arrival_rate=0.0)
    d = only(decide(snap([u], p99=None, rate=0.0), ScalerState(), NOW)[0])
    assert d.action == "scale_in" and "3 > 2" in d.reason


def test_no_scale_in_while_violated() -> None:
    u = quiet_unit(3)
    # violated but the cap is reached (memory 2000 + 100 > 2000) at 30 req/s offered:
    # shed, never scale in
    s = snap([u], p99=300.0, rate=1.0, mem_used=2000.0, offered=30.0)
    out, _ = decide(s, ScalerState(), NOW)
    assert [d.action for d in out] == ["shed"]
    # below 0.9 x its capacity the queue drains by itself: nothing is shed, nothing
    # scaled in
    cap = pipeline_capacity_rps(s)
    assert cap is not None
    low = snap([u], p99=300.0, rate=1.0, mem_used=2000.0, offered=0.85 * cap)
    assert decide(low, ScalerState(), NOW)[0] == []


# -- shedding at the cap ---------------------------------------------------------------------


def capped_pipeline() -> list[UnitState]:
    # u0: 2 instances x 1000 / 50 ms = 40 items/s, 2 items/req -> 20 req/s
    # u1: 1 instance x 1000 / 20 ms = 50 items/s, 1 item/req -> 50 req/s
    return [
        unit(0, 50, {"cpu": 2}, service_ms=50.0, arrival_rate=10.0),
        unit(1, 10, {"cpu": 1}, service_ms=20.0, arrival_rate=5.0),
    ]


def test_shed_at_the_cap_with_littles_law_then_lift() -> None:
    units = capped_pipeline()
    # 1950 + 100 > 2000 for every unit; 20 req/s offered (the capacity: an overload)
    full = dict(rate=5.0, mem_used=1950.0, offered=20.0)
    s0 = snap(units, **full)
    assert pipeline_capacity_rps(s0) == pytest.approx(20.0)
    # 20 req/s x 0.2 s = 4 requests
    assert shed_queue_limit(s0) == 4
    out, s = decide(s0, ScalerState(), NOW)
    d = only(out)
    assert (d.action, d.queue_limit, d.unit, d.engine) == ("shed", 4, None, None)
    assert "cap reached" in d.reason and "memory 1950+100 > 2000 MB" in d.reason
    assert "4 requests" in d.reason and "20 req/s" in d.reason
    assert s.queue_limit == 4 and s.last_change is None
    # still violated, same bound: nothing new
    out, s = decide(snap(units, now=105.0, **full), s, NOW)
    assert out == [] and s.queue_limit == 4
    # 170 ms is below the SLO but not below 0.8 x 200 = 160, and 17 req/s are offered
    # (shed ones included), above 0.8 x 20 = 16: the bound stays
    busy = dict(full, offered=17.0)
    out, s = decide(snap(units, now=110.0, p99=170.0, **busy), replace(s, last_change=109.0), NOW)
    assert out == [] and s.queue_limit == 4
    # 150 < 160: lifted
    out, s2 = decide(snap(units, now=111.0, p99=150.0, **busy), s, NOW)
    d = only(out)
    assert (d.action, d.queue_limit) == ("shed", None) and "lifted" in d.reason
    assert "P99 150 ms < 0.8 x SLO 200 ms" in d.reason
    assert s2.queue_limit is None
    # the same 170 ms, but the offered load fell to 16 <= 0.8 x 20: the overload is over
    out, s3 = decide(snap(units, now=111.0, p99=170.0, **dict(full, offered=16.0)), s, NOW)
    d = only(out)
    assert (d.action, d.queue_limit) == ("shed", None)
    assert "offered load 16 req/s <= 0.8 x capacity 20 req/s" in d.reason
    assert s3.queue_limit is None
    # no sample at all (P99 unknown) and nothing offered: lifted too
    out, s4 = decide(snap(units, now=111.0, p99=None, **dict(full, rate=0.0, offered=0.0)), s, NOW)
    assert only(out).queue_limit is None and s4.queue_limit is None


def test_scale_in_counts_the_shed_load() -> None:
    # 2 instances x 1000 / 50 ms = 40 items/s; 10 req/s admitted but 30 offered
    u = unit(0, 50, {"cpu": 2}, service_ms=50.0, arrival_rate=10.0)
    st = ScalerState(last_change=0.0)
    # (SLO 400 ms: one instance's P99 at 10 req/s, 246 ms, is within it)
    out, st = decide(snap([u], now=100.0, p99=50.0, rate=10.0, offered=30.0, slo=400.0), st, NOW)
    # needed = ceil(30 x 50 / 1000 / 0.6) = 3 >= 2: no scale-in
    assert out == [] and st.rates[-1] == (100.0, 30.0)
    # without the refused requests: needed = ceil(10 x 0.05 / 0.6) = 1 < 2: one back
    out, _ = decide(
        snap([u], now=100.0, p99=50.0, rate=10.0, slo=400.0), ScalerState(last_change=0.0), NOW
    )
    assert [d.action for d in out] == ["scale_in"]


def test_shed_names_the_slots_and_respects_config() -> None:
    units = [unit(0, 10, {"cpu": 2}, service_ms=500.0, arrival_rate=10.0)]
    s0 = snap(units, slots={"cpu": 2})
    # capacity 2 x 1000 / 500 = 4 req/s x 0.2 s = 0.8 -> at least 1
    d = only(decide(s0, ScalerState(), NOW)[0])
    assert d.queue_limit == 1 and "cpu slots 2+1 > 2" in d.reason
    assert decide(s0, ScalerState(), config(shed=False))[0] == []


def test_refusals_alone_with_capacity_unknown_shed_nothing() -> None:
    # P99 within the SLO, requests refused at arrival, the cap full, and no unit with a
    # service time (no P50 yet, no profiled option): admission bounds the queue already
    u = unit(0, 10, {"cpu": 2}, EngineOption("cpu", latency_ms=0.0, memory_mb=100.0, cores=1))
    s0 = replace(snap([u], p99=120.0, slots={"cpu": 2}), slo_refused_rate=3.0)
    assert pipeline_capacity_rps(s0) is None
    assert decide(s0, ScalerState(), NOW)[0] == []
    # the same with P99 above the SLO: the queue is bounded (at the pending requests)
    d = only(decide(replace(s0, p99_ms=400.0), ScalerState(), NOW)[0])
    assert d.action == "shed" and "capacity unknown" in d.reason
    # refusals alone but the capacity known: bounded by Little's law as before
    known = replace(s0, units=(replace(u, service_ms=500.0, arrival_rate=10.0),))
    d = only(decide(known, ScalerState(), NOW)[0])
    assert d.action == "shed" and "Little's law" in d.reason


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="scale_in_utilisation"):
        decide(snap([]), ScalerState(), config(scale_in_utilisation=0.0))
    with pytest.raises(ValueError, match="hold_s"):
        decide(snap([]), ScalerState(), config(hold_s=-1.0))


# -- property: the cap and the minimum always hold -------------------------------------------

ENGINES = ("cpu", "gpu", "dla")


@st.composite
def scenarios(
    draw: st.DrawFn, threads_only: bool = False
) -> tuple[Snapshot, list[tuple[float, float, float | None]], list]:
    """A device, a pipeline on it, and a load sequence; ``threads_only``: cpu units that
    may all scale threads, on a device that counts cores (the scale_up / scale_down
    paths, rare otherwise)."""
    n_units = draw(st.integers(1, 4))
    units: list[UnitState] = []
    fan = []
    for i in range(n_units):
        engines = (
            ["cpu"]
            if threads_only
            else draw(st.lists(st.sampled_from(ENGINES), min_size=1, max_size=3, unique=True))
        )
        options = tuple(
            EngineOption(
                e,
                latency_ms=draw(st.floats(0.5, 300.0)),
                memory_mb=draw(st.floats(0.0, 600.0)),
                cores=draw(st.integers(1 if threads_only else 0, 4)) if e == "cpu" else 0,
            )
            for e in engines
        )
        lo = draw(st.integers(1, 3))
        hi = draw(st.one_of(st.none(), st.integers(lo, lo + 4)))
        # cpu units may scale threads: measured latencies per count, some missing
        vertical = (
            options[0].engine == "cpu"
            and options[0].cores >= 1
            and (threads_only or draw(st.booleans()))
        )
        base = options[0].cores if vertical else 1
        lat = (
            {
                k: draw(st.floats(0.5, 300.0))
                for k in range(base, base + 4)
                if k == base or draw(st.booleans())
            }
            if vertical
            else {}
        )
        units.append(
            UnitState(
                index=i,
                name=f"u{i}",
                bottleneck=draw(st.floats(0.0, 1e9)),
                instances={options[0].engine: lo},
                options=options,
                service_ms=draw(st.one_of(st.none(), st.floats(0.5, 300.0))),
                min_instances=lo,
                max_instances=hi,
                threads={base: lo} if vertical else {},
                latency_ms_by_threads=lat,
                min_threads=base,
                max_threads=base + draw(st.integers(1 if threads_only else 0, 3))
                if vertical
                else None,
            )
        )
        fan.append(draw(st.floats(0.0, 4.0)))
    used: dict[str, int] = {}
    mem = draw(st.floats(0.0, 200.0))  # the tensor pool
    cores_used = 0
    for u in units:
        o = u.options[0]
        used[o.engine] = used.get(o.engine, 0) + u.total_instances
        mem += o.memory_mb * u.total_instances
        cores_used += o.cores * u.total_instances
    slots = {e: n + draw(st.integers(0, 4)) for e, n in used.items()}
    for e in ENGINES:  # an engine no unit runs on yet may or may not be on the device
        if e not in slots and draw(st.booleans()):
            slots[e] = draw(st.integers(0, 4))
    more = st.integers(0, 6).map(lambda x: cores_used + x)
    cores = draw(more if threads_only else st.one_of(st.just(0), more))
    cap = ResourceCap(mem + draw(st.floats(0.0, 1500.0)), mem, slots, cores)
    first = Snapshot(
        now=0.0,
        slo_ms=draw(st.floats(10.0, 500.0)),
        p99_ms=None,
        arrival_rate=0.0,
        units=tuple(units),
        cap=cap,
        cores_used=cores_used,
        instances_used=used,
    )
    steps = draw(
        st.lists(
            st.tuples(
                st.floats(0.1, 20.0),  # dt, s
                st.floats(0.0, 200.0),  # requests/s
                st.one_of(st.none(), st.floats(0.0, 2000.0)),  # P99, ms
            ),
            min_size=1,
            max_size=15,
        )
    )
    return first, steps, fan


def apply(s: Snapshot, decisions: list[Decision]) -> Snapshot:
    """What the runtime does with the decisions: start / stop instances."""
    units = list(s.units)
    mem, cores, used = s.cap.memory_used_mb, s.cores_used, dict(s.instances_used)
    for d in decisions:
        if d.action == "shed":
            continue
        assert d.unit is not None and d.engine is not None
        u = units[d.unit]
        if d.action in ("scale_up", "scale_down"):
            # one instance of from_threads replaced by one of threads (after the swap)
            assert d.engine == "cpu" and d.threads is not None and d.from_threads is not None
            assert u.threads.get(d.from_threads, 0) >= 1
            assert d.threads in u.latency_ms_by_threads  # only measured counts
            assert u.min_threads <= d.threads <= (u.max_threads or 0)
            th = dict(u.threads)
            th[d.from_threads] -= 1
            th[d.threads] = th.get(d.threads, 0) + 1
            units[d.unit] = replace(u, threads={k: n for k, n in th.items() if n})
            cores += d.threads - d.from_threads
            continue
        o = next(o for o in u.options if o.engine == d.engine)
        sign = 1 if d.action == "scale_out" else -1
        assert d.action in ("scale_out", "scale_in")
        inst = dict(u.instances)
        inst[d.engine] = inst.get(d.engine, 0) + sign
        assert inst[d.engine] >= 0
        th = dict(u.threads)
        pinned = o.cores
        if d.engine == "cpu" and th:
            # a new instance runs the base threads; a stopped one is a base one if any
            k = o.cores if sign > 0 or th.get(o.cores) else min(th)
            th[k] = th.get(k, 0) + sign
            th = {t: n for t, n in th.items() if n}
            pinned = k
        units[d.unit] = replace(u, instances=inst, threads=th)
        mem = mem + o.memory_mb if sign > 0 else mem - o.memory_mb
        cores += sign * pinned
        used[d.engine] = used.get(d.engine, 0) + sign
    return replace(
        s,
        units=tuple(units),
        cap=replace(s.cap, memory_used_mb=mem),
        cores_used=cores,
        instances_used=used,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(scenarios(), scenarios(threads_only=True)),
    st.sampled_from([0.0, 1.0, 3.0]),
    st.sampled_from([0.0, 2.0, 15.0]),
)
def test_decisions_never_break_the_cap_or_the_minimum(scenario, cooldown, hold) -> None:
    """The cap (memory, engine slots, cores counting every instance's threads) and the
    bounds (min / max instances, min / max threads, measured counts only) hold after
    every decision, whatever the load."""
    s, steps, fan = scenario
    cfg = config(cooldown_s=cooldown, hold_s=hold, rate_horizon_s=10.0)
    state = ScalerState()
    for dt, rate, p99 in steps:
        s = replace(
            s,
            now=s.now + dt,
            arrival_rate=rate,
            p99_ms=p99,
            units=tuple(
                replace(u, arrival_rate=rate * f) for u, f in zip(s.units, fan, strict=True)
            ),
        )
        out, state = decide(s, state, cfg)
        acts = [d.action for d in out]
        assert acts.count("scale_out") + acts.count("scale_up") <= 1 and acts.count("shed") <= 1
        grow = {"scale_out", "scale_up"} & set(acts)
        assert not (grow and {"scale_in", "scale_down"} & set(acts))
        ins = [d.unit for d in out if d.action in ("scale_in", "scale_down")]
        assert len(ins) == len(set(ins))
        s = apply(s, out)
        assert s.cap.memory_used_mb <= s.cap.memory_cap_mb
        for e, n in s.instances_used.items():
            assert n <= s.cap.max_instances.get(e, 0), (e, n)
        if s.cap.cores:
            assert s.cores_used <= s.cap.cores
        for u in s.units:
            assert u.total_instances >= u.min_instances
            assert u.max_instances is None or u.total_instances <= u.max_instances
        assert all(s.now - t <= cfg.rate_horizon_s for t, _ in state.rates)


# -- vertical scaling (intra-op threads) and the flapping fix ---------------------------------


def threaded(
    index: int,
    bottleneck: float,
    n: int,
    lat: dict[int, float],
    *,
    mem: float = 100.0,
    threads: dict[int, int] | None = None,
    max_threads: int | None = 2,
    **kw,
) -> UnitState:
    """A cpu unit of ``n`` instances (1 thread each unless ``threads``) whose instances
    measured ``lat`` ms per item at load per thread count."""
    opt = EngineOption("cpu", latency_ms=kw.get("service_ms") or lat[1], memory_mb=mem, cores=1)
    return UnitState(
        index=index,
        name=f"u{index}",
        bottleneck=bottleneck,
        instances={"cpu": n},
        options=(opt,),
        threads=threads or {1: n},
        latency_ms_by_threads=lat,
        max_threads=max_threads,
        **kw,
    )


def test_weights_in_a_cheap_partition_cores_bind_so_a_new_instance_beats_threads() -> None:
    # conv: 135 ms per item, 60 MB; 2 threads measured 75 ms. fc: 50 ms, 560 MB of weights.
    conv = threaded(0, 135, 1, {1: 135.0, 2: 75.0}, mem=60.0, service_ms=135.0, arrival_rate=5.0)
    fc = threaded(1, 50, 1, {1: 50.0, 2: 30.0}, mem=560.0, service_ms=50.0, arrival_rate=5.0)
    s = snap([conv, fc], rate=5.0, mem_used=1000.0, cores=4, cores_used=2)
    d = only(decide(s, ScalerState(), NOW)[0])
    # scale-out: +1000/135 = 7.407 items/s for max(60/1000, 1/6 slots, 1/2 cores) = 50 %
    #   -> 14.8 per share; scale-up 1 -> 2: 1000/75 - 1000/135 = 5.926 items/s for 1/2
    #   cores = 50 % -> 11.9: the new instance wins, on the compute-heavy unit (not fc)
    assert (d.action, d.unit, d.engine) == ("scale_out", 0, "cpu")
    assert "adds 7.407 items/s for 50% of the free cores" in d.reason
    assert "rather than one cpu instance 1 -> 2 threads: 135 -> 75 ms" in d.reason
    assert "adds 5.926 items/s for 50% of the free cores" in d.reason


def test_one_dominant_operator_group_scarce_memory_takes_threads() -> None:
    # one group does almost all the work: 200 ms per item, 500 MB per instance; 2
    # threads measured 110 ms at load, the live P50 is 220 ms (contention, real inputs)
    u = threaded(0, 220, 1, {1: 200.0, 2: 110.0}, mem=500.0, service_ms=220.0, arrival_rate=4.0)
    s = snap([u], rate=4.0, mem_used=1480.0, mem_cap=2000.0, cores=2, cores_used=1)
    d = only(decide(s, ScalerState(), NOW)[0])
    # scale-out: 1000/220 = 4.545 items/s for max(500/520 memory, 1/7 slots, 1/1 cores)
    #   = 100 % -> 4.5; scale-up: P50 x 110/200 = 121 ms: 1000/121 - 1000/220 = 3.719
    #   items/s for 1/1 cores = 100 % -> 3.7: still the scale-out (both take the last core)
    assert d.action == "scale_out"
    # with 3 free cores the core share of the thread step drops to 1/3 (and the new
    # instance's binding share is memory, 500/520 = 96 %): threads win
    s = replace(s, cap=replace(s.cap, cores=4))
    d = only(decide(s, ScalerState(), NOW)[0])
    assert (d.action, d.unit, d.engine, d.from_threads, d.threads) == ("scale_up", 0, "cpu", 1, 2)
    assert "220 -> 121 ms per item (measured at load 200 / 110 ms)" in d.reason
    assert "adds 3.719 items/s for 33% of the free cores (cores 1+1 <= 4" in d.reason
    assert "rather than scale-out" in d.reason and "96% of the free memory" in d.reason


def test_a_cap_that_admits_one_replica_scales_threads_then_sheds() -> None:
    # one replica of 900 MB fits the 1000 MB cap, a second does not; 2 free cores
    u = threaded(0, 100, 1, {1: 100.0, 2: 60.0}, mem=900.0, service_ms=100.0, arrival_rate=8.0)
    s = snap([u], rate=8.0, mem_used=950.0, mem_cap=1000.0, cores=2, cores_used=1)
    out, st1 = decide(s, ScalerState(), NOW)
    d = only(out)
    assert (d.action, d.threads, d.from_threads) == ("scale_up", 2, 1)
    assert "no scale-out: cpu refused: memory 950+900 > 1000 MB" in d.reason
    assert st1.last_scale_out == 100.0 and st1.last_change == 100.0
    # after the swap: one instance of 2 threads, both cores pinned, P50 60 ms; still late
    swapped = replace(u, threads={2: 1}, service_ms=60.0)
    s2 = snap([swapped], now=110.0, rate=8.0, mem_used=950.0, mem_cap=1000.0, cores=2, offered=16.0)
    s2 = replace(s2, cores_used=2)
    d = only(decide(s2, st1, NOW)[0])
    # max_threads 2 reached (nothing measured above 2): the queue is bounded at the cap
    assert d.action == "shed"
    assert "no thread scale-up: no measured latency above 2 thread(s) (max_threads 2)" in d.reason
    # Little's law on the 2-thread capacity: 1000 / 60 = 16.67 req/s x 0.2 s = 3
    assert d.queue_limit == 3


def test_no_measurement_no_scale_up_and_no_assumed_speedup() -> None:
    full = dict(rate=8.0, mem_used=950.0, mem_cap=1000.0, cores=4, cores_used=1)
    # no per-thread measurement at all: never scaled up, the reason says so
    u = UnitState(
        0, "u0", 100, {"cpu": 1}, (EngineOption("cpu", 100.0, 900.0, 1),),
        service_ms=100.0, threads={1: 1}, max_threads=2,
    )  # fmt: skip
    d = only(decide(snap([u], **full), ScalerState(), NOW)[0])
    assert d.action == "shed" and "no measured latency above 1 thread(s)" in d.reason
    # 2 threads measured slower than 1 (a memory-bound operator group): no scale-up
    u = threaded(0, 100, 1, {1: 100.0, 2: 104.0}, mem=900.0, service_ms=100.0)
    d = only(decide(snap([u], **full), ScalerState(), NOW)[0])
    assert d.action == "shed" and "2 threads measured no faster than 1 (104 vs 100 ms)" in d.reason
    # without max_threads the unit is never scaled vertically (and says nothing of it)
    u = threaded(0, 100, 1, {1: 100.0, 2: 50.0}, mem=900.0, service_ms=100.0, max_threads=None)
    d = only(decide(snap([u], **full), ScalerState(), NOW)[0])
    assert d.action == "shed" and "thread" not in d.reason
    # the device counts no cores: no budget to take threads from
    u = threaded(0, 100, 1, {1: 100.0, 2: 50.0}, mem=900.0, service_ms=100.0)
    d = only(decide(snap([u], **dict(full, cores=0)), ScalerState(), NOW)[0])
    assert d.action == "shed" and "counts no cpu cores" in d.reason
    # cores full: 2 + 1 > 2
    d = only(decide(snap([u], **dict(full, cores=2, cores_used=2)), ScalerState(), NOW)[0])
    assert d.action == "shed" and "cores 2+1 > 2" in d.reason


def test_at_max_instances_a_unit_can_still_take_threads() -> None:
    u = threaded(0, 100, 2, {1: 100.0, 2: 60.0}, service_ms=100.0, max_instances=2)
    d = only(decide(snap([u], cores=4, cores_used=2), ScalerState(), NOW)[0])
    assert (d.action, d.threads) == ("scale_up", 2)
    assert "no scale-out: at its max_instances 2" in d.reason


def test_scale_down_gives_cores_back_when_the_load_falls() -> None:
    cfg = config(hold_s=15.0)
    # one instance at 2 threads (P50 60 ms; measured 100 / 60 ms at 1 / 2 threads)
    u = threaded(0, 60, 1, {1: 100.0, 2: 60.0}, threads={2: 1}, service_ms=60.0, arrival_rate=5.0)
    # 5 req/s: at 1 thread 1000 / (60 x 100/60) = 10 items/s; 5 <= 0.6 x 10 = 6 -> down
    # (SLO 1 s: its P99 at 1 thread, 100 + ln(50) / (2 x (10 - 5)) s = 491 ms, is within)
    loose = dict(p99=50.0, slo=1000.0)
    out, st1 = decide(snap([u], rate=5.0, cores=2, cores_used=2, **loose), ScalerState(), cfg)
    d = only(out)
    assert (d.action, d.unit, d.engine, d.from_threads, d.threads) == ("scale_down", 0, "cpu", 2, 1)
    assert "5 items/s <= 0.6 x 10 items/s" in d.reason and "1 core(s) back" in d.reason
    assert st1.last_change == 100.0
    # 7 req/s: 7 > 6 -> keep the threads
    u7 = replace(u, arrival_rate=7.0)
    assert decide(snap([u7], rate=7.0, cores=2, **loose), ScalerState(), cfg)[0] == []
    # at the default SLO of 200 ms the P99 at 1 thread (491 ms) would miss it: keep
    assert decide(snap([u], p99=50.0, rate=5.0, cores=2), ScalerState(), cfg)[0] == []
    # never below the stage's threads (min_threads 2)
    u2 = replace(u, min_threads=2)
    assert decide(snap([u2], p99=50.0, rate=0.1, cores=2), ScalerState(), cfg)[0] == []
    # within the hold: nothing
    assert (
        decide(snap([u], p99=50.0, rate=5.0, cores=2), ScalerState(last_change=95.0), cfg)[0] == []
    )


def vgg_like(fc_instances: int) -> list[UnitState]:
    """VGG-19 on the quiet host (bench/HISTORY.md): the convolution partition at its
    max_instances 2 (135 ms per item), the fully connected one (532 MB of weights read
    per request, ~50 ms) next; 5 req/s offered."""
    conv = unit(0, 135.0, {"cpu": 2}, service_ms=135.0, arrival_rate=5.0, max_instances=2)
    fc = unit(
        1, 50.0 * fc_instances, {"cpu": fc_instances},
        EngineOption("cpu", 50.0, 560.0, cores=1),
        service_ms=50.0, arrival_rate=5.0,
    )  # fmt: skip
    return [conv, fc]


def test_the_weight_heavy_partition_no_longer_flaps() -> None:
    """The cycle of bench/HISTORY.md, on snapshots: every ~25 s a burst violates the SLO
    while the conv partition is at max_instances; the fc partition's B_k/S_k 50 passes
    the 0.5 x 67.5 rule, so it used to be scaled out, then scaled in after the hold
    (needed = ceil(5 x 50 ms / 0.6) = 1), and again at the next burst."""
    cfg = config(cooldown_s=6.0, hold_s=15.0, rate_horizon_s=30.0)
    state = ScalerState()
    fc_n = 1
    actions = []
    for k in range(20):  # 100 s: a burst at 0, 25, 50, 75 s, calm in between
        now = 100.0 + 5.0 * k
        p99 = 900.0 if k % 5 == 0 else 300.0
        s = snap(vgg_like(fc_n), now=now, p99=p99, slo=600.0, rate=5.0, mem_used=1050.0)
        out, state = decide(s, state, cfg)
        for d in out:
            actions.append((now, d.action, d.unit))
            if d.unit == 1:
                fc_n += 1 if d.action == "scale_out" else -1
    assert not [a for a in actions if a[2] == 1], actions  # fc is never scaled, in or out
    assert fc_n == 1
    # 5 req/s is a third of the conv partition's 14.8: the bursts are left to admission
    # (a queue bound below capacity only refused requests that would have made the SLO)
    assert not [a for a in actions if a[1] == "shed"], actions
    assert decide(snap(vgg_like(1), p99=900.0, slo=600.0, rate=5.0), ScalerState(), cfg)[0] == []
    # at 15 req/s the fc partition is short (15 x 50 ms = 0.75 > 0.6): it is scaled out
    units = [replace(u, arrival_rate=15.0) for u in vgg_like(1)]
    d = only(decide(snap(units, p99=900.0, slo=600.0, rate=15.0), ScalerState(), cfg)[0])
    assert (d.action, d.unit) == ("scale_out", 1)


# -- saturated cores: pinned threads may oversubscribe, busy cores may not ----------------------


def _busy(s: Snapshot, busy: float | None, physical: int = 2) -> Snapshot:
    return replace(s, cap=replace(s.cap, physical_cores=physical), cores_busy=busy)


def test_saturated_cores_refuse_a_cpu_scale_out_and_fall_to_the_gpu() -> None:
    # one single-thread instance on 2 physical cores, another pipeline's pinning the
    # other, 4 thread slots (threads_per_core 2) and oversubscribe on (pinned threads
    # past the physical cores allowed: tests/unit/runtime/scaling/test_scaler_settle.py): the pinned
    # count admits a second ...
    over = config(oversubscribe=True)
    u = unit(0, 80.0, {"cpu": 1}, CPU, service_ms=80.0, arrival_rate=20.0)
    s = snap([u], rate=20.0, cores=4, cores_used=2, used={"cpu": 2}, offered=25.0)
    assert only(decide(_busy(s, None), ScalerState(), over)[0]).action == "scale_out"
    # ... and so does a half-busy host: 2 - 1.0 = 1.0 idle >= 0.75 per thread
    d = only(decide(_busy(s, 1.0), ScalerState(), over)[0])
    assert (d.action, d.engine) == ("scale_out", "cpu")
    # busy 1.2 of 2: 0.8 idle >= 0.75 per thread, admitted; busy 1.3: 0.7 idle < 0.75 ->
    # no cpu instance; with no other engine it sheds
    d = only(decide(_busy(s, 1.2), ScalerState(), over)[0])
    assert (d.action, d.engine) == ("scale_out", "cpu")
    d = only(decide(_busy(s, 1.3), ScalerState(), over)[0])
    assert d.action == "shed"
    assert "cores saturated: busy 1.30 of 2 (another 1 thread(s) need 0.75 idle)" in d.reason
    # a gpu option still admits (it takes no core)
    u2 = replace(u, options=(CPU, GPU))
    d = only(
        decide(_busy(snap([u2], rate=20.0, cores=4, cores_used=2), 1.9), ScalerState(), NOW)[0]
    )
    assert (d.action, d.engine) == ("scale_out", "gpu")


def test_saturated_cores_refuse_a_thread_step_too() -> None:
    # the unit at its max_instances: only a thread step could grow it; 1 -> 2 threads
    # needs three quarters of an idle core for the one more thread
    u = threaded(0, 100, 1, {1: 100.0, 2: 60.0}, mem=100.0, service_ms=100.0, arrival_rate=8.0)
    u = replace(u, max_instances=1)
    s = snap([u], rate=8.0, cores=4, cores_used=1, offered=10.0)  # capacity 10 req/s
    d = only(decide(_busy(s, 1.0), ScalerState(), NOW)[0])
    assert (d.action, d.from_threads, d.threads) == ("scale_up", 1, 2)
    d = only(decide(_busy(s, 1.3), ScalerState(), NOW)[0])
    assert d.action == "shed"
    assert "no thread scale-up: cores saturated: busy 1.30 of 2" in d.reason


def test_unknown_physical_cores_keep_the_pinned_rule() -> None:
    u = unit(0, 80.0, {"cpu": 2}, CPU, service_ms=80.0, arrival_rate=20.0)
    s = snap([u], rate=20.0, cores=4, cores_used=2)
    d = only(decide(_busy(s, 1.99, physical=0), ScalerState(), NOW)[0])
    assert (d.action, d.engine) == ("scale_out", "cpu")


# -- one unit's instances beyond the cores ---------------------------------------------------


def _replicas(rate: float, p99: float) -> Snapshot:
    """ResNet-50 at 2 x L0 on 2 cores (bench/HISTORY.md, issue 15): 2 single-thread
    replicas of 80 ms, 4 thread slots (threads_per_core 2), both cores pinned."""
    cpu = EngineOption("cpu", latency_ms=80.0, memory_mb=290.0, cores=1)
    u = unit(0, 80.0, {"cpu": 2}, cpu, service_ms=80.0, arrival_rate=rate)
    s = snap([u], p99=p99, slo=157.0, rate=rate, mem_used=580.0, mem_cap=11_000.0, cores_used=2)
    return replace(s, cap=replace(s.cap, cores=4, physical_cores=2))


def test_a_unit_not_short_of_capacity_does_not_grow_past_the_cores() -> None:
    # 7 req/s x 80 ms = 0.56 of 2 instances (<= 0.6) and their M/D/2 P99 ~150 ms is
    # within 157 ms: the P99 161 ms is the service times' spread, and a third
    # single-thread instance would pin 3 threads on 2 cores
    out, st_ = decide(_replicas(7.0, 161.0), ScalerState(), NOW)
    assert out == [] and st_.last_scale_out is None
    # short of capacity (18 req/s: 0.72 of 2 instances) it does not grow past the cores
    # either: a third instance would share a core with one of its own, the same
    # requests per second at up to twice the latency (below 0.9 of the capacity the
    # pipeline does not shed: no action)
    s = _replicas(18.0, 400.0)
    assert decide(s, ScalerState(), NOW)[0] == []
    assert refusals(s, s.units[0], s.units[0].options[0], NOW) == [
        "u0's own instances would pin 2+1 > 2 cores",
        "pinned threads 2+1 > physical cores 2 (oversubscribe is off)",
    ]
    # a thread step is refused alike: 2 instances x 1 thread -> one at 2 threads
    up = replace(s.units[0], threads={1: 2}, latency_ms_by_threads={1: 80.0, 2: 45.0},
                 max_threads=2)  # fmt: skip
    assert scaler._up_candidate(s, NOW, up) == (None, "u0's own instances would pin 2+1 > 2 cores")
    # within the cores (4 physical) the argmax grows as before
    s = _replicas(7.0, 161.0)
    s = replace(s, cap=replace(s.cap, physical_cores=4))
    assert only(decide(s, ScalerState(), NOW)[0]).action == "scale_out"
