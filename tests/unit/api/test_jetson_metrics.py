"""The Jetson gauges of ``GET /metrics``: :func:`~infscaler.api.metrics.jetson_families`
from jtop readings (jetson-stats' own test data, ``tests/unit/runtime/scaling/jtop_examples``)
written by :func:`~infscaler.api.metrics.exposition` and read back with prometheus-client's
parser; the absent-with-reason path of a host without jtop; and ``infscaler status``'s line."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from infscaler.api.metrics import exposition as write
from infscaler.api.metrics import jetson_families, make_registry
from infscaler.runtime.scaling.telemetry import JetsonSampler, JetsonState, jetson_reading
from tests.unit.runtime.scaling.jtop_examples import ORIN_JP5, ORIN_JP7


class _Registry:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def _text(state: JetsonState) -> str:
    return write(_Registry(jetson_families(state))).decode()  # type: ignore[arg-type]


def _parse(state: JetsonState) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name -> its samples (labels, value), as prometheus-client parses them."""
    return {
        fam.name: [(s.labels, s.value) for s in fam.samples]
        for fam in text_string_to_metric_families(_text(state))
    }


def test_orin_reading_as_triton_and_jetson_metrics():
    state = JetsonState(True, "", jetson_reading(ORIN_JP7), energy_j=41.5, age_s=0.2)
    m = _parse(state)
    assert m["infscaler_telemetry_info"] == [
        ({"source": "jtop", "available": "true", "reason": ""}, 1.0)
    ]
    assert m["nv_gpu_utilization"] == [({"gpu_uuid": "gpu"}, pytest.approx(0.12))]
    assert m["nv_gpu_power_usage"] == [({"gpu_uuid": "gpu"}, pytest.approx(13.907))]
    assert m["nv_energy_consumption"] == [({"gpu_uuid": "gpu"}, 41.5)]
    # Triton's spelling: the counter's sample has no _total
    assert 'nv_energy_consumption{gpu_uuid="gpu"} 41.5\n' in _text(state)
    assert m["nv_gpu_memory_used_bytes"] == [({"gpu_uuid": "gpu"}, 20642 * 2**20)]
    assert m["nv_gpu_memory_total_bytes"] == [({"gpu_uuid": "gpu"}, 62817 * 2**20)]
    rails = {lab["rail"]: v for lab, v in m["infscaler_jetson_power_watts"]}
    assert rails == {
        "VDD_GPU_SOC": pytest.approx(5.139),
        "VDD_CPU_CV": pytest.approx(3.268),
        "VIN_SYS_5V0": pytest.approx(5.5),
    }
    temps = {lab["sensor"]: v for lab, v in m["infscaler_jetson_temperature_celsius"]}
    assert temps == {"cpu": 52.968, "soc2": 48.406, "soc0": 49.531, "gpu": 47.625}
    freqs = {lab["engine"]: v for lab, v in m["infscaler_jetson_frequency_hz"]}
    assert freqs == {"gpu": 1.3e9, "emc": 3.199e9, "APE": 1.74e8}
    # jtop did not report these here: left out, not zero
    assert "infscaler_jetson_power_mode_info" not in m
    assert "infscaler_jetson_gpu_mapped_bytes" not in m


def test_power_mode_and_no_gpu():
    m = _parse(JetsonState(True, "", jetson_reading(ORIN_JP5), energy_j=None, age_s=0.0))
    assert m["infscaler_jetson_power_mode_info"] == [({"mode": "MAXN"}, 1.0)]
    assert "nv_gpu_utilization" not in m
    assert "nv_energy_consumption" not in m  # no integral before a second reading
    assert m["nv_gpu_power_usage"] == [({"gpu_uuid": "gpu"}, pytest.approx(7.009))]


def test_unavailable_is_one_info_metric_with_the_reason():
    reason = 'jetson-stats is not installed ("jtop"): pip install jetson-stats'
    m = _parse(JetsonState(False, reason))
    assert m == {
        "infscaler_telemetry_info": [
            ({"source": "jtop", "available": "false", "reason": reason}, 1.0)
        ]
    }


def test_stale_reading_is_not_exported():
    state = JetsonState(False, "last jtop reading 9 s old", jetson_reading(ORIN_JP7))
    assert set(_parse(state)) == {"infscaler_telemetry_info"}


def test_registry_of_a_host_without_jtop():
    sampler = JetsonSampler(unavailable=lambda: "not a Jetson (test)")
    text = write(make_registry(object(), process=False, jetson=sampler)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (sample,) = fams["infscaler_telemetry_info"].samples
    assert sample.labels == {
        "source": "jtop",
        "available": "false",
        "reason": "not a Jetson (test)",
    }
    assert not [n for n in fams if n.startswith(("nv_gpu", "nv_energy", "infscaler_jetson"))]


def test_status_prints_the_reason(capsys: pytest.CaptureFixture[str]):
    from infscaler.cli.client import print_status

    st = {
        "control_path": {"kind": "userspace", "policy": "auto", "reason": "x"},
        "pool": {"mapped_mb": 0, "cap_mb": 64, "slots_in_use": 0, "slots_free": 0},
        "telemetry": {"source": "jtop", "available": False, "reason": "not a Jetson (test)"},
        "pipelines": [],
    }
    print_status(st)
    assert "telemetry (jtop): not read: not a Jetson (test)" in capsys.readouterr().out
