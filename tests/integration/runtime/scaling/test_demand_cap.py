"""The cpu cap counts demand end to end: a 3-partition model with one heavy partition,
served with one instance per partition under closed-loop load, gets a second instance
of its bottleneck (a trial: the pinned threads pass the cores, the busy cores do not),
and every request is answered or refused with a reason.

The scenario is ``bench/demand_cap.py``'s (its model, pipeline and load), run here on
the default cap for a few seconds; the bench compares it with the pinned-threads cap.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import bench_module


@pytest.mark.slow
def test_the_bottleneck_of_a_k3_model_scales_out_on_2_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dc = bench_module("demand_cap")
    monkeypatch.setenv("INFSCALER_CORE_CAP", "demand")
    size = 128
    model = dc.k3_model(tmp_path / "k3.onnx", size)
    # an SLO of 2 x the whole model's latency: 6 clients on one heavy instance miss it
    slo = 2.0 * dc.whole_ms(model, size)
    r = dc.run_arm("demand", model, slo, size, clients=6, seconds=20.0, tmp=tmp_path)
    # every request answered, or refused with a reason (503 at arrival or shed)
    assert r["errors"] == 0, r["error_samples"]
    assert r["answered"] > 0
    outs = [d for d in r["decisions"] if d["action"] == "scale_out"]
    assert any(d["unit"] == 1 for d in outs), r["decisions"]
    assert r["heavy_peak_instances"] == 2, r["timeline"]
    first = next(d for d in outs if d["unit"] == 1)
    if len(os.sched_getaffinity(0)) < 4:  # 3 + 1 pinned threads pass the cores: a trial
        assert "a trial: pinned threads 3+ > physical cores" in first["reason"], first
    # the scaler read demand, and it was below the cores
    read = [t["cores_demand"] for t in r["timeline"] if t.get("cores_demand") is not None]
    assert read and min(read) < 2.0, r["timeline"]
