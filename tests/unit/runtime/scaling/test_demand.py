"""The cpu cap counted in demand (:mod:`infscaler.runtime.scaling.demand`): light stages
and a bottleneck on 2 cores scale the bottleneck out where pinned threads refused it; a
scale-out whose served rate did not rise is reverted, with a backoff that doubles, so
the scaler does not flap; synthetic busy fractions, hand-computed."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from infscaler.runtime.scaling.demand import MIN_SHARE, expected_share, fits_cores
from infscaler.runtime.scaling.monitor import unit_demand
from infscaler.runtime.scaling.scaler import decide
from infscaler.runtime.scaling.types import (
    EngineOption,
    ResourceCap,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)

CFG = ScalerConfig(settle_s=0.0, sustain_s=0.0, cooldown_s=0.0)
THREADS = replace(CFG, core_cap="threads")


def stage(index: int, ms: float, n: int, busy: float) -> UnitState:
    return UnitState(
        index=index,
        name=f"p/{index}",
        bottleneck=ms,
        instances={"cpu": n},
        options=(EngineOption("cpu", latency_ms=ms, memory_mb=50.0, cores=1),),
        service_ms=ms,
        arrival_rate=13.0,
        threads={1: n},
        busy=busy,
    )


def k3(
    *, now: float = 100.0, heavy: int = 1, heavy_busy: float = 0.6, served: float = 13.0
) -> Snapshot:
    """A K=3 partitioned model on 2 cores (cpu-host: 4 thread slots): stages of 1, 45 and
    10 ms per request at 13 requests/s served, 30 offered, requests refused at arrival."""
    units = (stage(0, 1.0, 1, 0.013), stage(1, 45.0, heavy, heavy_busy), stage(2, 10.0, 1, 0.13))
    pinned = 2 + heavy
    return Snapshot(
        now=now,
        slo_ms=80.0,
        p99_ms=70.0,
        arrival_rate=13.0,
        units=units,
        cap=ResourceCap(2000.0, 500.0, {"cpu": 8}, cores=4, physical_cores=2),
        cores_used=pinned,
        instances_used={"cpu": pinned},
        offered_rate=30.0,
        slo_refused_rate=17.0,
        cores_demand=sum(u.busy or 0.0 for u in units),
        served_rate=served,
    )


def test_fits_cores_counts_demand_and_refuses_bad_figures() -> None:
    assert fits_cores(0.743, 0.6, 2) is None  # 1.343 <= 2
    assert fits_cores(1.5, 0.5, 2) is None  # exactly full fits
    assert fits_cores(1.45, 0.95, 2) == "demand 1.45+0.95 cores busy > 2 cores"
    with pytest.raises(ValueError, match="share must be a finite number >= 0"):
        fits_cores(1.0, -0.1, 2)
    with pytest.raises(ValueError, match="cores must be > 0"):
        fits_cores(0.0, 0.1, 0)


def test_expected_share_is_the_stage_share_per_thread() -> None:
    u = stage(1, 45.0, 2, 1.2)  # 2 single-thread instances keep 1.2 cores busy
    assert expected_share(u, 1) == pytest.approx(0.6)
    assert expected_share(u, 2) == pytest.approx(1.2)
    assert expected_share(replace(u, busy=0.0), 1) == MIN_SHARE  # idle: the floor
    assert expected_share(replace(u, busy=5.0), 1) == 1.0  # at most a core per thread
    assert expected_share(replace(u, busy=None), 2) == 2.0  # not measured: whole cores


def test_light_stages_and_a_bottleneck_on_2_cores_scale_the_bottleneck_out() -> None:
    s = k3()
    out, st = decide(s, ScalerState(), CFG)
    assert [(d.action, d.unit, d.engine) for d in out] == [("scale_out", 1, "cpu")]
    assert "a trial: pinned threads 3+ > physical cores 2" in out[0].reason
    assert st.trial is not None and (st.trial.unit, st.trial.before_rps) == (1, 13.0)
    # the cap that counts threads refuses it (the pipeline sheds instead)
    out, st = decide(s, ScalerState(), THREADS)
    assert all(d.action != "scale_out" for d in out) and st.trial is None
    assert any("pinned threads 3+1 > physical cores 2" in d.reason for d in out), out


def test_demand_that_does_not_fit_the_cores_refuses() -> None:
    # the light stages busy 0.5 in all and the bottleneck 0.95: 1.45 + 0.95 > 2
    s = k3(heavy_busy=0.95)
    s = replace(s, units=(replace(s.units[0], busy=0.2), s.units[1], replace(s.units[2], busy=0.3)))
    s = replace(s, cores_demand=1.45)
    out, st = decide(s, ScalerState(), CFG)
    assert all(d.action != "scale_out" for d in out) and st.trial is None
    assert any("demand 1.45+0.95 cores busy > 2 cores" in d.reason for d in out), out


def test_not_measured_falls_back_to_pinned_threads() -> None:
    out, _ = decide(replace(k3(), cores_demand=None), ScalerState(), CFG)
    assert all(d.action != "scale_out" for d in out)


def _after(now: float, served: float, **kw: float) -> Snapshot:
    return k3(now=now, heavy=2, served=served, **kw)


def test_a_scale_out_that_did_not_raise_the_served_rate_is_reverted() -> None:
    _, st = decide(k3(), ScalerState(), CFG)
    # within trial_s (10 s) a violation waits for the verdict
    out, st = decide(_after(105.0, 13.5), st, CFG)
    assert out == [] and st.waiting is not None and "trial of p/1" in st.waiting
    out, st = decide(_after(110.0, 13.5), st, CFG)  # +4 % < +10 %, still refusing
    assert [(d.action, d.unit, d.engine) for d in out] == [("scale_in", 1, "cpu")]
    assert "reverted: served 13 req/s before, 13.5 req/s after" in out[0].reason
    assert st.trial is None and st.blocked == ((1, 170.0, 1),) and st.last_change == 110.0
    # blocked: the next violation does not scale p/1 out again
    out, st = decide(k3(now=130.0), st, CFG)
    assert all(d.action != "scale_out" for d in out)
    assert any("did not raise the served rate" in d.reason for d in out), out


def test_a_scale_out_that_raised_the_served_rate_or_met_the_slo_is_kept() -> None:
    _, st0 = decide(k3(), ScalerState(), CFG)
    out, st = decide(_after(110.0, 19.0), st0, CFG)  # +46 %
    assert all(d.action != "scale_in" for d in out) and st.trial is None
    assert st.trial_verdict is not None and "kept" in st.trial_verdict and not st.blocked
    met = replace(_after(110.0, 13.0), slo_refused_rate=0.0, p99_ms=60.0)
    out, st = decide(met, st0, CFG)
    assert out == [] and st.trial_verdict is not None and "the SLO is met" in st.trial_verdict


def test_no_flapping_a_trial_that_never_helps_backs_off() -> None:
    """Ten minutes of a bottleneck whose second instance never raises the served rate:
    trials at 100, 170 (reverted at 110 + 60), 300 (180 + 120), 550 (310 + 240) s:
    four, not one a minute."""
    st, heavy, outs = ScalerState(), 1, []
    for t in range(100, 700):
        out, st = decide(k3(now=float(t), heavy=heavy), st, CFG)
        for d in out:
            if d.action in ("scale_out", "scale_in"):
                outs.append((t, d.action))
                heavy += 1 if d.action == "scale_out" else -1
    ups = [t for t, a in outs if a == "scale_out"]
    assert ups == [100, 170, 300, 550], outs
    assert [t for t, a in outs if a == "scale_in"] == [110, 180, 310, 560]


def test_unit_demand_from_the_instances_busy_ms_and_cpu_seconds() -> None:
    def h(pid: int, key: tuple[str, int], threads: int = 1) -> SimpleNamespace:
        return SimpleNamespace(pid=pid, key=key, unit=SimpleNamespace(threads=threads))

    a, b = ("p", 0), ("p", 1)
    live = [h(1, a), h(2, b, threads=2), h(3, b, threads=2), h(4, a)]  # pid 3 started since
    old = {1: (100.0, 5.0), 2: (0.0, None), 4: (0.0, 1.0)}
    now = {1: (600.0, 5.9), 2: (1000.0, None), 3: (50.0, 0.1), 4: (1800.0, 1.4)}
    per, total = unit_demand(live, now, old, 2000.0)
    # pid 1: busy 500 of 2000 ms = 0.25 (its 0.9 CPU s would allow 0.45); pid 4: busy
    # 0.9 but 0.4 CPU s = 0.2 (it waited for a core); pid 2: 0.5 x 2 threads = 1.0 (no
    # CPU figure); pid 3 counts b's measured share per thread (0.5) x 2
    assert per == {a: pytest.approx(0.45), b: pytest.approx(2.0)}
    assert total == pytest.approx(2.45)


def test_the_rate_before_a_trial_leaves_out_the_settle_window() -> None:
    # a change at 90 s, settle 5 s: the look at 93 s (instances warming up, 4 req/s) is
    # left out, those at 96 and 98 s (12 and 14 req/s) count, and the trial's own look
    cfg = ScalerConfig(settle_s=5.0, sustain_s=0.0, cooldown_s=0.0)
    st = ScalerState(last_change=90.0, served=((93.0, 4.0), (96.0, 12.0), (98.0, 14.0)))
    out, st = decide(k3(now=100.0, served=13.0), st, cfg)
    assert [d.action for d in out] == ["scale_out"]
    assert st.trial is not None and st.trial.before_rps == pytest.approx(13.0)
