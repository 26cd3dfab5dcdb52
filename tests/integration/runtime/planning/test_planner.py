"""The planner (runtime/planning/planner.py), unit profiles measured in-process
(runtime/planning/unitprofile.py), and ``infscaler plan`` end to end on a function-stage pipeline
(tests/stagefuncs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infscaler.base.errors import InfScalerError
from infscaler.cli import app
from tests.unit.runtime.planning.test_planner import chain_yaml

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run(
        [sys.executable, "-m", "infscaler", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_cli_plan_json_end_to_end(tmp_path: Path) -> None:
    p = chain_yaml(tmp_path)
    proc = run_cli(
        "plan", str(p), "--rate", "300/s", "--slo", "50ms", "--device", "generic-x86",
        "--duration", "20", "--state-dir", str(tmp_path / "state"), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["pipeline"] == "chain" and out["device"] == "generic-x86"
    res = out["plan"]
    assert res["feasible"] is True and res["arrivals"] == "poisson"
    rows = {r["unit"]: r for r in res["units"]}
    assert rows["slow"]["instances"] >= 2  # 300/s x ~5 ms > one instance
    assert rows["scale"]["instances"] == 1
    assert res["predicted"]["p99_ms"] <= 50.0
    assert res["memory_mb"] == pytest.approx(45.0 * (rows["slow"]["instances"] + 1))
    assert out["profile"]["units"][1]["engines"]["cpu"]["mean_ms"] >= 5.0


def test_cli_plan_bad_arguments_exit_2_with_a_message(tmp_path: Path) -> None:
    p = chain_yaml(tmp_path)
    proc = run_cli("plan", str(p), "--rate=-5/s", "--slo", "50ms")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error:" in proc.stderr and "rate must be positive" in proc.stderr
    runner = CliRunner()
    for args, needle in [
        (["--rate", "5/s", "--slo", "1.5x"], "absolute"),
        (["--rate", "5/s", "--slo", "50ms", "--arrivals", "gamma:x"], "gamma:CV2"),
        (["--rate", "5/s", "--slo", "50ms", "--device", "no-such"], "unknown device profile"),
        (["--slo", "50ms"], "--rate"),
        (["--rate", "5/s", "--slo", "50ms", "--duration", "-1"], "--duration"),
    ]:
        r = runner.invoke(app, ["plan", str(p), *args])
        assert r.exit_code != 0
        assert isinstance(r.exception, InfScalerError), (args, r.output)
        assert needle in str(r.exception), (args, str(r.exception))
