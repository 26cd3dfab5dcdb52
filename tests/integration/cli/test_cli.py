"""The infscaler CLI: plans written on success; clear message, exit 2, nothing written on
bad input. Runs the real entry point in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import residual_model, save


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run(
        [sys.executable, "-m", "infscaler.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    return save(residual_model(channels=8, size=16), tmp_path / "block.onnx")


def test_partition_writes_plan_and_json(tmp_path, model_path):
    out = tmp_path / "plan"
    proc = run("partition", str(model_path), "-k", "2", "-o", str(out), "--json", "--slo", "1s")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["plan_dir"] == str(out)
    assert len(summary["partitions"]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["part_0.onnx", "part_1.onnx", "plan.yaml"]
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert plan["slo"]["ms"] == 1000.0
    assert plan["verification"]["passed"] is True
    assert plan["partitions"][0]["latency_ms"]["cpu"] > 0


def test_partition_table_output(tmp_path, model_path):
    proc = run("partition", str(model_path), "-k", "2", "-o", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    assert "Plan: K = 2" in proc.stdout and "plan written to" in proc.stdout


def test_existing_plan_needs_force(tmp_path, model_path):
    out = tmp_path / "plan"
    assert run("partition", str(model_path), "-k", "2", "-o", str(out)).returncode == 0
    before = (out / "plan.yaml").read_text()
    assert_clean_error(run("partition", str(model_path), "-k", "1", "-o", str(out)), "--force")
    assert (out / "plan.yaml").read_text() == before
    assert run("partition", str(model_path), "-k", "1", "-o", str(out), "--force").returncode == 0
    assert len(yaml.safe_load((out / "plan.yaml").read_text())["partitions"]) == 1
    assert not (out / "part_1.onnx").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_missing_path(tmp_path):
    out = tmp_path / "plan"
    assert_clean_error(run("partition", str(tmp_path / "nope.onnx"), "-o", str(out)), "not found")
    assert not out.exists()


def test_text_file(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("hello\n" * 100)
    out = tmp_path / "plan"
    assert_clean_error(run("partition", str(p), "-o", str(out)), "ONNX")
    assert not out.exists()


def test_truncated_model(tmp_path, model_path):
    p = tmp_path / "cut.onnx"
    p.write_bytes(model_path.read_bytes()[:-200])
    out = tmp_path / "plan"
    assert_clean_error(run("partition", str(p), "-o", str(out)), "truncated")
    assert not out.exists()


def test_slo_below_model_latency(tmp_path, model_path):
    out = tmp_path / "plan"
    proc = run("partition", str(model_path), "--slo", "1us", "-o", str(out))
    assert_clean_error(proc, "above the SLO", "--slo")
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slo", "fast"], "cannot read SLO"),
        (["--slo", "0.5x"], "never be met"),
        (["--shapes", "y:1x2"], "not an input"),
        (["--device", "jetson-tx9"], "unknown device profile"),
        (["--measure", "joules"], "--measure"),
        (["-k", "50"], "at most"),
    ],
)
def test_bad_options(tmp_path, model_path, args, needle):
    out = tmp_path / "plan"
    assert_clean_error(run("partition", str(model_path), "-o", str(out), *args), needle)
    assert not out.exists()


def test_dynamic_dims_need_shapes(tmp_path):
    p = save(residual_model(batch="N"), tmp_path / "dyn.onnx")
    # a dynamic batch dim alone takes 1, with a warning (trtexec's convention)
    proc = run("inspect", str(p), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["inputs"] == {"x": [1, 4, 8, 8]}
    assert "dynamic batch dim 'N': using 1" in proc.stderr
    m = residual_model(batch="N")
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    q = save(m, tmp_path / "dyn_hw.onnx")
    assert_clean_error(run("inspect", str(q)), "dim 0 'N'", "dim 2 'H'", "--shapes")
    proc = run("inspect", str(p), "--shapes", "x:2x4x8x8", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["inputs"] == {"x": [2, 4, 8, 8]}


def test_inspect_table_json_and_png(tmp_path, model_path):
    png = tmp_path / "ops.png"
    proc = run("inspect", str(model_path), "--png", str(png), "--profile")
    assert proc.returncode == 0, proc.stderr
    assert "conv1" in proc.stdout and "representative operators" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(run("inspect", str(model_path), "--json").stdout)
    flops = [o["flops"] for o in report["operators"]]
    mean = sum(flops) / len(flops)
    assert [o["representative"] for o in report["operators"]] == [f > mean for f in flops]


def test_models_and_devices_lists():
    proc = run("models", "--json")
    assert proc.returncode == 0
    aliases = {m["alias"]: m for m in json.loads(proc.stdout)}
    assert aliases["ppocrv4-det"]["status"] == "installed"
    proc = run("devices")
    assert proc.returncode == 0 and "xavier-agx" in proc.stdout and "orin-nano" in proc.stdout


def test_device_profile_reports_its_engines(tmp_path, model_path):
    proc = run(
        "partition", str(model_path), "-k", "2", "--device", "orin-nano", "--dry-run", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    latency = json.loads(proc.stdout)["partitions"][0]["latency_ms"]
    assert set(latency) == {"cpu", "gpu"}
    assert "unavailable" in latency["gpu"]


def test_short_help_and_version():
    from infscaler.base import __version__

    top = run("-h")
    assert top.returncode == 0 and "serve" in top.stdout and "--version" in top.stdout
    serve = run("serve", "-h")
    assert serve.returncode == 0 and "--max-regions-per-uid" in serve.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"infscaler {__version__}"
