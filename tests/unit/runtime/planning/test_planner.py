"""The planner (runtime/planning/planner.py), unit profiles measured in-process
(runtime/planning/unitprofile.py), and ``infscaler plan`` end to end on a function-stage pipeline
(tests/stagefuncs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from infscaler.base.config import load_pipeline, pipeline_for_model
from infscaler.base.device import load_profile
from infscaler.base.errors import InfScalerError
from infscaler.cli import app
from infscaler.cli.units import parse_rate, parse_slo_ms
from infscaler.runtime.planning.planner import plan, predict
from infscaler.runtime.planning.simulator import EngineProfile, UnitConfig, UnitProfile, simulate
from infscaler.runtime.planning.unitprofile import profile_pipeline, sample_inputs
from infscaler.runtime.scaling.types import ResourceCap
from infscaler.runtime.serving.pipeline import compile_pipeline
from tests.helpers import chain_pipeline, residual_model, save

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def unit(name: str, ms: float, mem: float = 100.0, cv: float = 0.5, **kw) -> UnitProfile:
    engines = {"cpu": EngineProfile("cpu", ms, cv=cv, memory_mb=mem, cores=1)}
    engines.update(kw.pop("extra", {}))
    return UnitProfile(name, engines, **kw)


CHAIN = [unit("pre", 5.0, kind="function"), unit("det", 40.0), unit("post", 5.0)]
BIG = ResourceCap(memory_cap_mb=10_000, memory_used_mb=0, max_instances={"cpu": 16}, cores=16)


# -- the search ----------------------------------------------------------------------------


def test_plan_adds_instances_to_the_bottleneck() -> None:
    res = plan(CHAIN, 60.0, 200.0, BIG, duration_s=60)
    assert res.feasible, res.reason
    inst = {u.name: c.total for u, c in zip(res.units, res.config, strict=True)}
    assert inst["det"] >= 3  # 60/s x 40 ms = 2.4 erlangs
    assert inst["pre"] == 1 and inst["post"] == 1
    assert res.prediction.p99_ms <= 200.0
    assert res.steps[0].startswith("+1 det")
    assert res.memory_mb == pytest.approx(100 * (inst["det"] + 2))
    # least memory: one det instance fewer misses the SLO (or cannot keep up)
    fewer = [UnitConfig({"cpu": 1}), UnitConfig({"cpu": inst["det"] - 1}), UnitConfig({"cpu": 1})]
    r = predict(CHAIN, fewer, "poisson", rate=60.0, duration_s=60, slo_ms=200.0)
    assert r.p99_ms > 200.0
    rows = {r["unit"]: r for r in res.rows()}
    assert rows["det"]["instances"] == inst["det"] and 0.5 < rows["det"]["utilisation"] < 1
    json.dumps(res.to_dict())


def test_plan_reports_infeasible_under_a_tiny_cap() -> None:
    tiny = ResourceCap(memory_cap_mb=350, memory_used_mb=0, max_instances={"cpu": 8}, cores=8)
    res = plan(CHAIN, 60.0, 200.0, tiny, duration_s=20)
    assert not res.feasible
    assert "memory" in res.reason and "cap" in res.reason
    assert "det" in res.reason  # names the bottleneck
    slots = ResourceCap(memory_cap_mb=10_000, memory_used_mb=0, max_instances={"cpu": 3})
    res2 = plan(CHAIN, 60.0, 200.0, slots, duration_s=20)
    assert not res2.feasible and "cpu slots" in res2.reason
    too_small = ResourceCap(memory_cap_mb=100, memory_used_mb=0, max_instances={"cpu": 8})
    res3 = plan(CHAIN, 1.0, 200.0, too_small, duration_s=20)
    assert not res3.feasible and "minimum configuration needs 300 MB" in res3.reason


def test_plan_infeasible_when_service_time_exceeds_the_slo() -> None:
    res = plan(CHAIN, 1.0, 30.0, BIG, duration_s=20)
    assert not res.feasible and "service time alone is 50.0 ms" in res.reason
    assert res.simulations == 0


def test_plan_picks_the_fastest_engine_the_device_has() -> None:
    gpu = {"gpu": EngineProfile("gpu", 8.0, memory_mb=300)}
    units = [unit("pre", 2.0, kind="function"), unit("det", 40.0, extra=gpu)]
    on_orin = plan(units, 60.0, 100.0, load_profile("orin-agx"), duration_s=30)
    assert on_orin.feasible and dict(on_orin.config[1].instances) == {"gpu": 1}
    on_x86 = plan(units, 60.0, 200.0, load_profile("generic-x86"), duration_s=30)
    assert "gpu" not in on_x86.config[1].instances


def test_plan_raises_the_batch_when_no_instance_fits() -> None:
    batch = {1: 20.0, 2: 24.0, 4: 30.0, 8: 44.0}
    m = UnitProfile(
        "m",
        {"cpu": EngineProfile("cpu", 20.0, memory_mb=100, cores=1, batch_ms=batch)},
        max_batch=8,
    )
    cap = ResourceCap(memory_cap_mb=1000, memory_used_mb=0, max_instances={"cpu": 1}, cores=4)
    res = plan([m], 120.0, 300.0, cap, duration_s=30)
    assert res.feasible, res.reason
    assert res.config[0].total == 1 and res.config[0].batch >= 4
    assert any("batch of m" in s for s in res.steps)
    # the runtime's default window (instances + 1) would cap batches at 2: the plan says so
    assert any("max_inflight" in n for n in res.notes)


def test_plan_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="rate"):
        plan(CHAIN, 0, 200.0, BIG)
    with pytest.raises(ValueError, match="slo_ms"):
        plan(CHAIN, 10, -5, BIG)
    with pytest.raises(ValueError, match="unknown arrivals"):
        plan(CHAIN, 10, 200.0, BIG, arrivals="weibull")


def test_predict_is_the_simulation() -> None:
    times = [0.0, 0.01, 0.02]
    r = predict(CHAIN, None, times, max_inflight=None)
    assert r.to_dict() == simulate(CHAIN, None, times).to_dict()
    with pytest.raises(ValueError, match="need a rate"):
        predict(CHAIN, None, "poisson")


# -- unit profiles -------------------------------------------------------------------------


def fan_pipeline() -> dict:
    return {
        "name": "fx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["sums"],
        "stages": [
            {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
            {
                "name": "split",
                "function": "stagefuncs:split_rows",
                "fan_out": True,
                "inputs": ["y"],
                "outputs": ["row"],
            },
            {
                "name": "slow",
                "function": "stagefuncs:slow",
                "inputs": ["row"],
                "outputs": ["y2"],
                "params": {"ms": 2},
            },
            {
                "name": "gather",
                "function": "stagefuncs:gather_sums",
                "fan_in": True,
                "inputs": ["s"],
                "outputs": ["sums"],
            },
        ],
    }


def test_profile_function_pipeline(tmp_path: Path) -> None:
    spec = fan_pipeline()
    spec["stages"][2] = {
        "name": "sum",
        "function": "stagefuncs:row_sum",
        "inputs": ["row"],
        "outputs": ["s"],
        "instances": 2,
    }
    compiled = compile_pipeline(load_pipeline(spec), state_dir=tmp_path)
    feeds = sample_inputs(compiled)
    assert feeds["x"].shape == (4, 4)  # -1 rows made 4
    prof = profile_pipeline(compiled, repeats=3)
    units = {u.name: u for u in prof.units}
    assert list(units) == ["scale", "split", "sum", "gather"]
    assert prof.items == (4, 4, 4) and units["split"].items == (4, 4, 4)
    assert len(prof.samples_ms["sum"]) == 12 and len(prof.samples_ms["scale"]) == 3
    assert not units["gather"].served and units["gather"].fan_in
    assert units["sum"].min_instances == 2
    cpu = units["scale"].engines["cpu"]
    assert list(units["scale"].engines) == ["cpu"] and cpu.cores == 0
    assert cpu.memory_mb == pytest.approx(45.0)  # instance overhead only
    assert cpu.mean_ms > 0 and len(cpu.samples_ms) == 3


def test_profile_model_unit_and_plan_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infscaler.partitioner import profiler

    path = save(residual_model(channels=4, size=8), tmp_path / "block.onnx")
    compiled = compile_pipeline(pipeline_for_model(path), state_dir=tmp_path)
    (u,) = compiled.units
    u.plan_latency_ms = {"gpu": 0.5, "dla": {"unavailable": "no DLA on this host"}}
    prof = profile_pipeline(compiled, repeats=2, device=load_profile("orin-agx"))
    (p,) = prof.units
    assert p.kind == "model" and sorted(p.engines) == ["cpu", "gpu"]  # no latency invented
    assert p.engines["gpu"].mean_ms == 0.5
    assert p.engines["cpu"].cores == 1
    file_mb = path.stat().st_size / 2**20
    assert p.engines["cpu"].memory_mb == pytest.approx(file_mb + 45.0)
    on_x86 = profile_pipeline(compiled, repeats=1, device=load_profile("generic-x86"))
    assert list(on_x86.units[0].engines) == ["cpu"]
    assert any("device has no gpu" in n for n in on_x86.notes)
    # the co-running slowdown only when asked (measure_corun: 2 copies of 1 thread)
    assert p.engines["cpu"].corun == 0.0
    calls = []

    def corun(model, feeds, *, threads):
        calls.append((Path(model), sorted(feeds), threads))
        return 0.07

    monkeypatch.setattr(profiler, "measure_corun", corun)
    (q,) = profile_pipeline(compiled, repeats=1, corun=True).units
    assert q.engines["cpu"].corun == 0.07 and calls == [(Path(u.path), ["x"], 1)]


def test_profile_refuses_a_unit_that_never_ran(tmp_path: Path) -> None:
    compiled = compile_pipeline(load_pipeline(fan_pipeline_sum()), state_dir=tmp_path)
    with pytest.raises(InfScalerError, match="never ran"):
        profile_pipeline(compiled, {"x": np.zeros((0, 4), np.float32)}, repeats=1)


def fan_pipeline_sum() -> dict:
    spec = fan_pipeline()
    spec["stages"][2] = {
        "name": "sum",
        "function": "stagefuncs:row_sum",
        "inputs": ["row"],
        "outputs": ["s"],
    }
    return spec


# -- the CLI -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, rps", [("40/s", 40.0), ("40", 40.0), (" 2.5rps ", 2.5), ("2400/min", 40.0)]
)
def test_parse_rate(text: str, rps: float) -> None:
    assert parse_rate(text) == rps


@pytest.mark.parametrize(
    "text, needle", [("-5/s", "positive"), ("0/s", "positive"), ("fast", "cannot read rate")]
)
def test_parse_rate_refuses(text: str, needle: str) -> None:
    with pytest.raises(InfScalerError, match=needle):
        parse_rate(text)


@pytest.mark.parametrize("text, ms", [("200ms", 200.0), ("0.2s", 200.0), ("150", 150.0)])
def test_parse_slo(text: str, ms: float) -> None:
    assert parse_slo_ms(text) == ms


@pytest.mark.parametrize(
    "text, needle",
    [("-3ms", "positive"), ("0ms", "positive"), ("1.5x", "absolute"), ("soon", "cannot read")],
)
def test_parse_slo_refuses(text: str, needle: str) -> None:
    with pytest.raises(InfScalerError, match=needle):
        parse_slo_ms(text)


def chain_yaml(tmp_path: Path) -> Path:
    spec = chain_pipeline(5)
    p = tmp_path / "chain.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_cli_plan_table_and_infeasible(tmp_path: Path) -> None:
    p = chain_yaml(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(
        app, ["plan", str(p), "--rate", "100/s", "--slo", "0.1s", "--device", "orin-nx",
              "--duration", "10", "--state-dir", str(tmp_path / "s")],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "Starting configuration for chain" in ok.output and "predicted: P99" in ok.output
    bad = runner.invoke(
        app, ["plan", str(p), "--rate", "10/s", "--slo", "2ms", "--device", "orin-nx",
              "--duration", "10", "--state-dir", str(tmp_path / "s")],
    )  # fmt: skip
    assert bad.exit_code == 1
    assert "infeasible" in bad.output and "service time alone" in bad.output


def test_plan_keeps_batch_1_where_batching_does_not_pay() -> None:
    linear = {1: 20.0, 2: 40.0, 4: 80.0, 8: 160.0}  # T_b = b x T_1: no saving per item
    m = UnitProfile(
        "m",
        {"cpu": EngineProfile("cpu", 20.0, memory_mb=100, cores=1, batch_ms=linear)},
        max_batch=8,
    )
    cap = ResourceCap(memory_cap_mb=1000, memory_used_mb=0, max_instances={"cpu": 1}, cores=4)
    res = plan([m], 120.0, 300.0, cap, duration_s=30)
    assert not res.feasible and res.config[0].batch == 1
    assert "batching m would not pay" in res.reason and "saves 0% per item" in res.reason
