"""``infscaler plan A.yaml B.yaml --rate a=R --rate b=R``: two small ONNX pipelines (the
three-convolution chain of tests/integration/runtime/planning/test_autoplan.py) measured
and planned together within the cpu-host cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infscaler.base.errors import InfScalerError
from infscaler.cli import app
from tests.helpers import save
from tests.integration.runtime.planning.test_autoplan import conv_chain


@pytest.fixture
def two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    model = save(conv_chain(), tmp_path / "chain.onnx")
    out = []
    for name, prio, slo in (("a", 1, "500ms"), ("b", 2, None)):
        spec = {"name": name, "priority": prio, "stages": [{"name": "m", "model": str(model)}]}
        if slo:
            spec.update(slo=slo, autoscale={})
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(spec))
        out.append(p)
    return out[0], out[1]


def test_plan_two_pipelines_together_within_the_cap(two: tuple[Path, Path]) -> None:
    a, b = two
    r = CliRunner().invoke(
        app,
        ["plan", str(a), str(b), "--rate", "a=40", "--rate", "b=10", "--slo", "b=400ms",
         "--max-partitions", "2", "--device", "cpu-host", "--json", "--explain"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{") :])
    assert list(d["pipelines"]) == ["a", "b"] and d["device"] == "cpu-host"
    pa, pb = d["pipelines"]["a"], d["pipelines"]["b"]
    assert (pa["priority"], pb["priority"]) == (1, 2)
    assert (pa["rate"], pb["rate"], pa["slo_ms"], pb["slo_ms"]) == (40.0, 10.0, 500.0, 400.0)
    # each chosen among its own search's candidates, answering within its SLO at its rate
    for p in (pa, pb):
        assert 0 < p["goodput_rps"] <= p["rate"] + 1e-9
        assert p["why"] and p["search"]["candidates"]
        assert p["chosen"] in [c["label"] for c in p["search"]["candidates"]]
    # together within the cap: memory, thread slots, busy cores
    used, avail = d["used"], d["available"]
    assert used["memory_mb"] == pytest.approx(pa["memory_mb"] + pb["memory_mb"], abs=0.1)
    assert used["memory_mb"] <= avail["memory_mb"] and used["threads"] <= avail["threads"]
    assert used["busy_cores"] <= avail["busy_cores"] + 1e-6
    assert d["fitting"] >= 1 and d["combinations"] >= d["fitting"]


def test_plan_set_bad_arguments_name_what_was_wrong(two: tuple[Path, Path]) -> None:
    a, b = two
    runner = CliRunner()
    for args, needle in [
        (["--rate", "c=4"], "no pipeline named 'c'"),
        (["--rate", "a=4", "--rate", "a=5"], "--rate for a given twice"),
        ([], "pipeline b has no SLO"),  # b's YAML has none, nor --slo
        (["--slo", "b=fast"], "--slo for b"),
        (["--slo", "b=1s", "--top", "0"], "--top"),
    ]:
        r = runner.invoke(app, ["plan", str(a), str(b), *args])
        assert isinstance(r.exception, InfScalerError), (args, r.output)
        assert needle in str(r.exception), (args, str(r.exception))


def test_a_pipeline_that_fits_in_no_way_is_named(two: tuple[Path, Path]) -> None:
    a, b = two
    r = CliRunner().invoke(
        app,
        ["plan", str(a), str(b), "--slo", "b=0.001ms", "--max-partitions", "1",
         "--refine", "0", "--device", "cpu-host"],
    )  # fmt: skip
    assert isinstance(r.exception, InfScalerError), r.output
    assert "pipeline b: no configuration meets its SLO" in str(r.exception)


def test_deploy_time_plans_the_set_together_and_keeps_each_decision(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    from infscaler.base.config import load_pipeline
    from infscaler.base.device import load_profile
    from infscaler.service.deploy import DeployMixin

    class Deployer(DeployMixin):  # the planning part of the service, no instances
        objective = "auto"
        device = load_profile("cpu-host")
        state_dir = tmp_path / "state"
        cpu_wake_latency_planned_us = None

    a_yaml, _ = two
    a = load_pipeline(yaml.safe_load(a_yaml.read_text()))
    b = load_pipeline({**yaml.safe_load(a_yaml.read_text()), "name": "b", "priority": 2})
    d, said = Deployer(), []
    assert d.plan_set([a, b], said.append) == ["a", "b"]
    assert any(line.startswith("2 pipelines within the cap") for line in said), said
    planned = {c.name: d._planned(c, said.append) for c in (a, b)}
    for name, (cfg, live) in planned.items():
        assert cfg.name == name and cfg.stages[0].threads >= 1
        assert live is not None and live.other is None  # nothing to switch to in a set
        assert "-set-" in live.path.name and live.path.is_file()
    # taken once: a later deploy of the same pipeline alone plans it alone
    assert "a" not in d._set_planned
    # the kept decisions are reused: nothing measured again, the same configurations
    said.clear()
    d.plan_set([a, b], said.append)
    assert sum("kept in" in ln for ln in said) == 2, said
    assert not any("measuring" in ln or "timing" in ln for ln in said), said
    assert d._planned(b, said.append)[0] == planned["b"][0]
    # one pipeline left to the planner is planned alone at its deploy, as before
    assert Deployer().plan_set([a], said.append) == []
