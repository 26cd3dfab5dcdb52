"""The jtop side of the Jetson telemetry: the pure mapping of jtop's stats dicts
(jetson-stats' own test data, :mod:`.jtop_examples`), the energy counter against
hand-computed integrals, and the sampler's cache, staleness and absent-with-reason
paths (a fake clock and a fake jtop client; no thread talks to a real service)."""

from __future__ import annotations

import threading
import time

import pytest

from infscaler.runtime.scaling.telemetry import (
    EnergyCounter,
    JetsonSampler,
    is_jetson,
    jetson_reading,
)
from tests.unit.runtime.scaling.jtop_examples import ORIN_JP5, ORIN_JP7, WITH_VDD_IN


def test_orin_jp7_reading_in_si_units():
    r = jetson_reading(ORIN_JP7)
    assert r.gpu_utilization == {"gpu": pytest.approx(0.12)}
    assert r.power_w == pytest.approx(13.907)
    assert r.rails_w == {
        "VDD_GPU_SOC": pytest.approx(5.139),
        "VDD_CPU_CV": pytest.approx(3.268),
        "VIN_SYS_5V0": pytest.approx(5.5),
    }
    assert r.temperatures_c == {"cpu": 52.968, "soc2": 48.406, "soc0": 49.531, "gpu": 47.625}
    # GR3D 1300 MHz, EMC 3199 MHz, APE 174 MHz; the NVDLAs are off and left out
    assert r.frequencies_hz == {"gpu": 1.3e9, "emc": 3.199e9, "APE": 1.74e8}
    assert r.memory_used_bytes == 20642 * 2**20
    assert r.memory_total_bytes == 62817 * 2**20
    assert r.gpu_mapped_bytes is None  # tegrastats has no NvMap figure: not invented
    assert r.power_mode is None


def test_orin_jp5_offline_sensors_and_no_gpu():
    r = jetson_reading(ORIN_JP5)
    assert r.gpu_utilization == {}
    assert set(r.temperatures_c) == {"CPU", "Tboard", "SOC2", "Tdiode", "SOC0", "tj", "SOC1"}
    assert r.temperatures_c["tj"] == 41.656
    assert r.power_w == pytest.approx(7.009)
    assert sum(r.rails_w.values()) == pytest.approx(r.power_w)
    assert r.frequencies_hz == {"emc": 2.04e8}
    assert r.power_mode == "MAXN"


def test_vdd_in_is_the_total_not_the_sum():
    r = jetson_reading(WITH_VDD_IN)
    assert r.power_w == pytest.approx(14.025)
    assert "VDD_IN" not in r.rails_w
    assert r.rails_w["VDD_GPU"] == pytest.approx(6.854)
    assert sum(r.rails_w.values()) == pytest.approx(13.155)  # rails are parts, not the total
    assert r.temperatures_c == {} and r.frequencies_hz == {}


def test_missing_and_non_numeric_fields_are_left_out():
    r = jetson_reading(
        {
            "gpu": {"gpu": {"status": {}, "freq": {"cur": "OFF"}}},
            "memory": {"EMC": {"online": False, "cur": 1866000}},
            "temperature": {"x": {"online": True, "temp": -256}},
            "power": {},
        }
    )
    assert r.gpu_utilization == {} and r.frequencies_hz == {} and r.temperatures_c == {}
    assert r.power_w is None and r.rails_w == {}
    assert r.memory_used_bytes is None and r.memory_total_bytes is None
    assert jetson_reading({}) == r


def test_energy_trapezoids_by_hand():
    e = EnergyCounter(max_gap_s=10.0)
    assert e.add(0.0, 10.0) == 0.0  # baseline only
    assert e.add(1.0, 20.0) == pytest.approx(15.0)  # (10 + 20) / 2 * 1
    assert e.add(3.0, 20.0) == pytest.approx(55.0)  # + (20 + 20) / 2 * 2
    assert e.add(3.0, 500.0) == pytest.approx(55.0)  # same time: ignored
    assert e.add(20.0, 5.0) == pytest.approx(55.0)  # 17 s gap: a new baseline
    assert e.add(21.0, 7.0) == pytest.approx(61.0)  # + (5 + 7) / 2 * 1
    e.reset_baseline()
    assert e.add(22.0, 7.0) == pytest.approx(61.0)
    assert e.add(22.5, 9.0) == pytest.approx(65.0)  # + (7 + 9) / 2 * 0.5


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_sampler_caches_and_integrates_the_module_power():
    clock = _Clock()
    s = JetsonSampler(interval_s=1.0, clock=clock, unavailable=lambda: "")
    # as if its thread were running (none is started): record() is what it calls per update
    s._checked = ""
    s._thread = threading.current_thread()
    assert not s.state().available and s.state().reason == "jtop not read yet"
    s.record(ORIN_JP7)
    st = s.state()
    assert st.available and st.reason == "" and st.energy_j == 0.0 and st.age_s == 0.0
    assert st.reading == jetson_reading(ORIN_JP7)
    clock.t += 2.0
    s.record(ORIN_JP5)
    # (13.907 W + 7.009 W) / 2 * 2 s
    assert s.state().energy_j == pytest.approx(20.916)
    clock.t += 6.5  # past stale_s = 5 intervals + 1 s
    st = s.state()
    assert not st.available and st.reading is None and "6 s old" in st.reason


def test_sampler_without_jtop_says_why_and_starts_no_thread():
    s = JetsonSampler(unavailable=lambda: "jetson-stats is not installed")
    before = threading.active_count()
    st = s.state()
    assert not st.available and st.reason == "jetson-stats is not installed"
    assert st.reading is None and st.energy_j is None
    assert s._thread is None and threading.active_count() == before


def test_default_sampler_on_this_host():
    if is_jetson():
        pytest.skip("a Jetson: the reason path is for hosts without jtop")
    st = JetsonSampler().state()
    assert not st.available and st.reason.startswith("not a Jetson")


class _FakeJtop:
    """A jtop client that answers ``updates`` times, then reports its service gone."""

    def __init__(self, updates: int) -> None:
        self.updates = updates
        self.gpu = ORIN_JP7["gpu"]
        self.power = ORIN_JP7["power"]
        self.temperature = ORIN_JP7["temperature"]
        self.memory = ORIN_JP7["memory"]
        self.engine = ORIN_JP7["engine"]
        self.nvpmodel = None

    def __enter__(self) -> _FakeJtop:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def ok(self) -> bool:
        self.updates -= 1
        return self.updates >= 0


def _wait(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the sampler thread did not get there"
        time.sleep(0.01)


def test_sampler_thread_reads_jtop_then_reports_it_gone():
    s = JetsonSampler(
        interval_s=1.0, retry_s=60, opener=lambda i: _FakeJtop(2), unavailable=lambda: ""
    )
    try:
        s.start()
        _wait(lambda: "not reachable" in s._reason)
        assert "(RuntimeError)" in s._reason
        assert s._reading == jetson_reading(ORIN_JP7)
    finally:
        s.close()


def test_sampler_thread_when_the_service_refuses():
    def refuse(interval_s: float) -> _FakeJtop:
        raise ConnectionRefusedError("[Errno 111] /run/jtop.sock")

    s = JetsonSampler(interval_s=1.0, retry_s=60, opener=refuse, unavailable=lambda: "")
    try:
        _wait(lambda: "not reachable" in s.state().reason)
        st = s.state()
        assert not st.available and "(ConnectionRefusedError)" in st.reason
        assert "systemctl" in st.reason and "/run" not in st.reason  # no path in a label
    finally:
        s.close()
