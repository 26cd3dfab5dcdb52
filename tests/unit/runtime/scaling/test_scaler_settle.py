"""The scaler does not chase transients (infscaler.runtime.scaling.scaler.decide on hand-computed
snapshots): no violation counts within ``settle_s`` of a change, a scale-out needs the
violation sustained for ``sustain_s``, and no cpu scale-out or thread step takes the
pinned threads of all instances past the physical cores unless ``oversubscribe``.

The case these come from: right after a deploy on a 2-core host, a planned pipeline's
two partitions were each scaled out to 2 single-thread instances (4 threads pinned to 2
cores) on P99s of 497 and 232 ms measured in the first, warm-up windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.errors import ConfigError
from infscaler.runtime.scaling.autoscaler import scaler_config
from infscaler.runtime.scaling.scaler import decide
from infscaler.runtime.scaling.types import ScalerConfig, ScalerState, Snapshot
from tests.integration.runtime.scaling.test_autoscale import step_pipeline
from tests.unit.runtime.scaling.test_scaler import CPU, only, snap, threaded, unit

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

#: the settle window alone (no sustain, no cooldown)
SETTLE = ScalerConfig(settle_s=5.0, sustain_s=0.0, cooldown_s=0.0)
#: the sustain rule alone (no settle window, no cooldown)
SUSTAIN = ScalerConfig(settle_s=0.0, sustain_s=2.0, cooldown_s=0.0)


def one_unit(now: float, p99: float | None, **kw: object) -> Snapshot:
    """One cpu unit (1 instance, 50 ms), 10 req/s at SLO 200 ms, room for more."""
    return snap([unit(0, 50.0, {"cpu": 1}, service_ms=50.0, arrival_rate=10.0)], now=now,
                p99=p99, **kw)  # fmt: skip


# -- the settle window -----------------------------------------------------------------------


def test_no_scale_out_inside_the_settle_window_even_at_a_huge_p99() -> None:
    deployed = ScalerState(last_change=100.0)  # the autoscaler's first state: the deploy
    for now in (100.0, 101.0, 103.0, 104.9):
        out, st = decide(one_unit(now, p99=5000.0), deployed, SETTLE)
        assert out == [] and st.violating_since is None and st.last_change == 100.0
        assert st.waiting is not None and "P99 5000 ms > SLO 200 ms within the settle" in (
            st.waiting
        )
        assert f"{now - 100.0:.4g} s since the last change < settle_s 5 s" in st.waiting
    # 5 s after the deploy the violation counts
    out, st = decide(one_unit(105.0, p99=5000.0), deployed, SETTLE)
    assert only(out).action == "scale_out" and st.last_change == 105.0 and st.waiting is None
    # the scale-out is a change: its first 5 s do not count either
    out, st2 = decide(one_unit(109.0, p99=5000.0), st, SETTLE)
    assert out == [] and "4 s since the last change" in (st2.waiting or "")
    assert only(decide(one_unit(110.0, p99=5000.0), st, SETTLE)[0]).action == "scale_out"


def test_refusals_at_arrival_inside_the_settle_window_do_not_count() -> None:
    s = replace(one_unit(102.0, p99=None), slo_refused_rate=3.0)
    out, st = decide(s, ScalerState(last_change=100.0), SETTLE)
    assert out == [] and "3.00 requests/s refused at arrival" in (st.waiting or "")
    assert "settle_s 5 s" in (st.waiting or "")


def test_a_scale_in_and_a_thread_step_start_a_settle_window_too() -> None:
    # scale-in: at t=120 the quiet unit (3 instances, 1 req/s) gives one back ...
    quiet = snap([unit(0, 50.0, {"cpu": 3}, service_ms=50.0, arrival_rate=1.0)], now=120.0,
                 p99=20.0, rate=1.0)  # fmt: skip
    out, st = decide(quiet, ScalerState(last_change=100.0), SETTLE)
    assert only(out).action == "scale_in" and st.last_change == 120.0
    # ... and a violation 2 s later is the new configuration settling
    out, st = decide(replace(quiet, now=122.0, p99_ms=900.0), st, SETTLE)
    assert out == [] and "settle_s 5 s" in (st.waiting or "")
    # a thread step up is a change like a scale-out
    u = threaded(0, 100, 1, {1: 100.0, 2: 60.0}, service_ms=100.0, arrival_rate=8.0)
    s = snap([replace(u, max_instances=1)], now=200.0, rate=8.0, cores=4, cores_used=1)
    out, st = decide(s, ScalerState(), SETTLE)
    assert only(out).action == "scale_up" and st.last_change == 200.0
    assert decide(replace(s, now=204.0), st, SETTLE)[0] == []


def test_with_no_change_known_there_is_no_settle_window() -> None:
    # ScalerState() (the simulator's start): nothing to settle from
    assert only(decide(one_unit(0.5, p99=900.0), ScalerState(), SETTLE)[0]).action == "scale_out"


# -- the sustained violation -----------------------------------------------------------------


def test_a_violation_shorter_than_sustain_s_does_not_scale_out() -> None:
    st = ScalerState()
    out, st = decide(one_unit(100.0, p99=900.0), st, SUSTAIN)
    assert out == [] and st.violating_since == 100.0
    assert (
        st.waiting == "P99 900 ms > SLO 200 ms for 0 s < sustain_s 2 s: waiting for it to persist"
    )
    out, st = decide(one_unit(101.0, p99=900.0), st, SUSTAIN)
    assert out == [] and st.violating_since == 100.0 and "for 1 s < sustain_s 2 s" in st.waiting
    # one call within the SLO ends the run: the next violation starts a new one
    out, st = decide(one_unit(101.5, p99=150.0), st, SUSTAIN)
    assert out == [] and st.violating_since is None and st.waiting is None
    out, st = decide(one_unit(102.0, p99=900.0), st, SUSTAIN)
    assert out == [] and st.violating_since == 102.0
    out, st = decide(one_unit(103.0, p99=900.0), st, SUSTAIN)
    assert out == []


def test_a_violation_sustained_for_sustain_s_scales_out() -> None:
    st = ScalerState()
    for now in (100.0, 101.0):
        out, st = decide(one_unit(now, p99=900.0), st, SUSTAIN)
        assert out == []
    out, st = decide(one_unit(102.0, p99=900.0), st, SUSTAIN)
    d = only(out)
    assert (d.action, d.unit, d.engine) == ("scale_out", 0, "cpu")
    # the change ends the run: the new instance must be shown short again
    assert st.violating_since is None and st.last_change == 102.0
    assert decide(one_unit(103.0, p99=900.0), st, SUSTAIN)[0] == []


def test_settle_then_sustain_the_earliest_scale_out_after_a_deploy() -> None:
    # defaults: settle 5 s, sustain 2 s; the deploy at t=100, a look every second
    cfg = ScalerConfig(cooldown_s=0.0)
    st = ScalerState(last_change=100.0)
    acted = []
    for now in range(100, 110):
        out, st = decide(one_unit(float(now), p99=900.0), st, cfg)
        acted += [(now, d.action) for d in out]
        if now == 105:  # the first counted violation starts the run
            assert st.violating_since == 105.0
    assert acted == [(107, "scale_out")]


def test_shedding_at_the_cap_waits_for_the_sustained_violation_too() -> None:
    # no slot left: the pipeline can only shed; u0 serves 20 req/s, 20 are offered
    u = unit(0, 50.0, {"cpu": 1}, service_ms=50.0, arrival_rate=20.0)
    at_cap = dict(rate=20.0, offered=20.0, slots={"cpu": 1, "gpu": 0}, p99=900.0)
    out, st = decide(snap([u], now=100.0, **at_cap), ScalerState(), SUSTAIN)
    assert out == [] and "sustain_s" in (st.waiting or "")
    out, st = decide(snap([u], now=102.0, **at_cap), st, SUSTAIN)
    d = only(out)
    assert d.action == "shed" and d.queue_limit == 4 and "cpu slots 1+1 > 1" in d.reason


def test_config_is_checked() -> None:
    for bad in (ScalerConfig(settle_s=-1.0), ScalerConfig(sustain_s=float("nan"))):
        with pytest.raises(ValueError, match=r"(settle_s|sustain_s) must be >= 0 s"):
            decide(one_unit(0.0, p99=None), ScalerState(), bad)


def test_the_pipeline_autoscale_block_maps_and_validates_the_new_fields() -> None:
    auto = load_pipeline(step_pipeline(settle_s=8.0, sustain_s=3.0, oversubscribe=True)).autoscale
    cfg = scaler_config(auto)
    assert (cfg.settle_s, cfg.sustain_s, cfg.oversubscribe) == (8.0, 3.0, True)
    defaults = scaler_config(load_pipeline({**step_pipeline(), "autoscale": True}).autoscale)
    assert (defaults.settle_s, defaults.sustain_s, defaults.oversubscribe) == (5.0, 2.0, False)
    with pytest.raises(ConfigError, match=r"settle_s must be 0-600 s \(how long after a deploy"):
        load_pipeline(step_pipeline(settle_s=-1))
    with pytest.raises(ConfigError, match=r"sustain_s must be 0-600 s \(how long the SLO"):
        load_pipeline(step_pipeline(sustain_s=601))


# -- pinned threads past the physical cores --------------------------------------------------

#: the observed deploy: two partitions, 1 single-thread instance each, both cores pinned,
#: 4 thread slots (threads_per_core 2), the violation counted (no settle, no sustain)
NOW = ScalerConfig(settle_s=0.0, sustain_s=0.0)


def two_partitions(physical: int = 2) -> Snapshot:
    # u0: 1000 / 80 ms = 12.5 req/s, u1: 1000 / 40 ms = 25 req/s; 20 req/s offered: both
    # short (utilisation 1.6 and 0.8 > 0.6), so only the cores can refuse them
    units = [
        unit(0, 80.0, {"cpu": 1}, CPU, service_ms=80.0, arrival_rate=20.0),
        unit(1, 40.0, {"cpu": 1}, CPU, service_ms=40.0, arrival_rate=20.0),
    ]
    s = snap(units, p99=497.0, rate=20.0, offered=20.0, cores=4, cores_used=2)
    return replace(s, cap=replace(s.cap, physical_cores=physical))


def test_a_cpu_scale_out_past_the_physical_cores_is_refused() -> None:
    out, _ = decide(two_partitions(), ScalerState(), NOW)
    d = only(out)
    # 12.5 req/s x 0.2 s: a bound of 2 requests; each partition refused by the cores
    assert (d.action, d.queue_limit) == ("shed", 2)
    assert "u0 (B_k/S_k 80) fits no engine (cpu refused: pinned threads 2+1 > physical " \
        "cores 2 (oversubscribe is off))" in d.reason  # fmt: skip
    assert "u1 (B_k/S_k 40) fits no engine (cpu refused: pinned threads 2+1" in d.reason


def test_oversubscribe_allows_it_and_unknown_cores_do_not_refuse() -> None:
    d = only(decide(two_partitions(), ScalerState(), replace(NOW, oversubscribe=True))[0])
    assert (d.action, d.unit, d.engine) == ("scale_out", 0, "cpu")
    assert "cores 2+1 <= 4" in d.reason  # the thread slots still bound it
    d = only(decide(two_partitions(physical=0), ScalerState(), NOW)[0])
    assert (d.action, d.unit) == ("scale_out", 0)
    # within the physical cores: 1 pinned of 4
    s = replace(two_partitions(physical=4), cores_used=1)
    assert only(decide(s, ScalerState(), NOW)[0]).action == "scale_out"


def test_a_thread_step_past_the_physical_cores_is_refused() -> None:
    # one instance at its max_instances, 1 -> 2 threads measured faster; the other core
    # is pinned by another pipeline: 2+1 > 2
    u = threaded(0, 100, 1, {1: 100.0, 2: 60.0}, service_ms=100.0, arrival_rate=8.0)
    s = snap([replace(u, max_instances=1)], rate=8.0, offered=10.0, cores=4, cores_used=2)
    s = replace(s, cap=replace(s.cap, physical_cores=2))
    d = only(decide(s, ScalerState(), NOW)[0])
    assert d.action == "shed"
    assert "no thread scale-up: pinned threads 2+1 > physical cores 2 (oversubscribe is " \
        "off)" in d.reason  # fmt: skip
    d = only(decide(s, ScalerState(), replace(NOW, oversubscribe=True))[0])
    assert (d.action, d.from_threads, d.threads) == ("scale_up", 1, 2)
