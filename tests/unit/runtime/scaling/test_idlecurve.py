"""The served idle slowdown kept for the planner (runtime.idlecurve): files, what is
learned from a deployment, and the planner reading it (measure_model_stage, the
decision key)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from infscaler.runtime.scaling import idlecurve
from infscaler.runtime.scaling.idlecurve import curve_for, curve_path, learn, load_curve, save_curve
from infscaler.runtime.serving.stats import PipelineStats
from tests.helpers import save
from tests.integration.runtime.planning.test_autoplan import conv_chain

PTS = ((0.06, 1.2), (0.3, 1.75))
MS = 1_000_000


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    return save(conv_chain(), tmp_path / "chain.onnx")


def test_kept_per_model_threads_and_wake_setting(model: Path):
    path = save_curve(model, 2, None, PTS, items=40)
    assert path.parent.name == "idle" and path.name.endswith("-t2-sleep.json")
    assert load_curve(model, 2, None) == PTS
    assert load_curve(model, 1, None) == ()  # another thread count
    assert load_curve(model, 2, 0) == ()  # kept while the CPUs slept, not under PM QoS
    save_curve(model, 2, 0, ((0.3, 1.1),), items=12)
    assert load_curve(model, 2, 0) == ((0.3, 1.1),)
    data = json.loads(path.read_text())
    assert data["items"] == 40 and data["threads"] == 2 and data["wake_latency_us"] is None


def test_a_changed_model_file_or_an_old_curve_is_not_used(model: Path):
    save_curve(model, 1, None, PTS, items=40)
    assert load_curve(model, 1, None, now=time.time() + idlecurve.MAX_AGE_S + 1) == ()
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert load_curve(model, 1, None) == ()


@pytest.mark.parametrize(
    "text",
    ["{not json", '{"schema": 1}', '{"schema": 1, "saved_at": 0, "points": [[0.1, 0.5]]}',
     '{"schema": 99, "saved_at": 0, "points": []}'],
)  # fmt: skip
def test_a_bad_file_plans_without(model: Path, text: str):
    p = curve_path(model, 1, None)
    p.parent.mkdir(parents=True)
    p.write_text(text.replace('"saved_at": 0', f'"saved_at": {time.time()}'))
    assert load_curve(model, 1, None) == ()


@pytest.mark.parametrize("bad", [(), ((0.0, 1.2),), ((0.1, 0.9),), ((0.1, float("nan")),)])
def test_refuses_points_the_simulator_would(model: Path, bad):
    with pytest.raises(ValueError, match="idle points"):
        save_curve(model, 1, None, bad, items=1)


def _served(stats: PipelineStats, unit: int, n: int) -> None:
    """n warm items (2 ms apart) then n after 0.3 s idle on instance 0 of ``unit``."""
    t = 0
    for i in range(2 * n):
        submit = t + (2 if i < n else 300) * MS
        start, end = submit + MS, submit + (11 if i < n else 16) * MS
        rows = [[unit, 0, start, end]]
        stats.record_success((end + MS - submit) / 1e6, np.array(rows), submit)
        t = end + MS


def test_learn_keeps_whole_cpu_model_units_at_one_thread_count(model: Path):
    stats = PipelineStats(["model"])
    _served(stats, 0, 12)
    unit = SimpleNamespace(index=0, kind="model", engine="cpu", num_partitions=1, steps=[],
                           path=str(model))  # fmt: skip
    dep = SimpleNamespace(name="p", pipeline=SimpleNamespace(units=[unit]),
                          route=SimpleNamespace(stats=stats))  # fmt: skip
    h = [SimpleNamespace(key=("p", 0), unit=SimpleNamespace(threads=2))]
    [written] = learn(dep, h, None, handover_ms=0.5)
    assert written == curve_path(model, 2, None)
    # (15 compute + 1 wake + 1 tail - 2 hops x 0.5) / 10 warm
    assert load_curve(model, 2, None) == ((0.302, pytest.approx(1.6)),)
    # instances at two thread counts (a scale-up under way): nothing is kept
    h2 = [*h, SimpleNamespace(key=("p", 0), unit=SimpleNamespace(threads=1))]
    assert learn(dep, h2, None, handover_ms=0.5) == []
    # a partition, a fused unit, another engine: not a whole model's curve
    for change in ({"num_partitions": 2}, {"steps": [object()]}, {"engine": "gpu"}):
        other = SimpleNamespace(**{**vars(unit), **change})
        dep.pipeline.units = [other]
        assert learn(dep, h, 0, handover_ms=0.5) == []


def test_the_planner_plans_with_the_kept_curve(model: Path):
    from infscaler.runtime.planning.stageprofile import measure_model_stage

    seen = []

    def kept(t: int):
        seen.append(t)
        return PTS if t == 1 else ()

    st = measure_model_stage(model, threads=(1, 2), repeats=3, learned_idle=kept)
    assert st.idle_by_threads == {1: PTS}  # 2 threads: none kept, not measured (IDLE_DEFAULT)
    assert 1 in seen


def test_a_newly_kept_curve_plans_again_a_rekept_one_does_not(model: Path, tmp_path: Path):
    from infscaler.base.config import load_pipeline
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.decisions import decision_path

    cfg = load_pipeline(
        {
            "name": "p",
            "slo": "200ms",
            "autoscale": {},
            "stages": [{"name": "m", "model": str(model)}],
        }
    )
    dev = load_profile("cpu-host")

    def key() -> Path:
        return decision_path(cfg, dev, tmp_path / "s", None, ("eq1",), None)

    before = key()
    save_curve(model, 1, None, PTS, items=40)
    after = key()
    assert after != before
    save_curve(model, 1, None, ((0.061, 1.21), (0.31, 1.7)), items=80)  # same shape
    assert key() == after
    save_curve(model, 1, None, ((0.06, 1.2), (0.3, 2.5)), items=80)  # moved
    assert key() != after
    assert decision_path(cfg, dev, tmp_path / "s", None, ("eq1",), 0) == before  # PM QoS: none


def test_a_count_with_no_curve_plans_with_the_nearest_kept_one(model: Path):
    """Known at 2 threads only: 1 thread must not look free of idle costs."""
    assert curve_for(model, 1, None, (1, 2, 4)) == ()
    save_curve(model, 2, None, PTS, items=40)
    assert curve_for(model, 1, None, (1, 2, 4)) == PTS
    save_curve(model, 4, None, ((0.3, 3.0),), items=40)
    assert curve_for(model, 3, None, (1, 2, 4)) == ((0.3, 3.0),)  # a tie: the larger count
    save_curve(model, 1, None, ((0.3, 1.05),), items=40)
    assert curve_for(model, 1, None, (1, 2, 4)) == ((0.3, 1.05),)  # its own first
    assert curve_for(model, 1, 0, (1, 2, 4)) == ()  # another wake setting: none kept
