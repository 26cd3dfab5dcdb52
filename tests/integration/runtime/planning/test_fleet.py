"""The fleet planner (runtime/planning/fleet.py): hand-computed placements, the lower bound, the
capacity curve from the single-device planner, and `infscaler plan --fleet`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"streams": [{"name": "x", "pipeline": "nope", "rate": 1}]}, "streams[0].pipeline"),
        (
            {"streams": [{"name": "x", "pipeline": "det", "rate": "fast"}]},
            "streams[0]: cannot read rate",
        ),
        (
            {"nodes": [{"name": "n", "device": "no-such-soc"}]},
            "nodes[0].device: unknown device profile",
        ),
        ({"nodes": [{"name": "n", "device": "orin-nx", "ram": 3}]}, "nodes[0].ram"),
    ],
)
def test_plan_fleet_refuses_a_bad_file_with_its_path(
    tmp_path: Path, patch: dict, message: str
) -> None:
    fleet = {
        "nodes": [{"name": "n1", "device": "orin-nx"}],
        "pipelines": {
            "det": {
                "slo": "100ms",
                "units": [{"name": "det", "engines": {"cpu": {"mean_ms": 10, "memory_mb": 100}}}],
            }
        },
        "streams": [{"name": "s", "pipeline": "det", "rate": 5}],
    }
    f = tmp_path / "fleet.yaml"
    f.write_text(yaml.safe_dump({**fleet, **patch}))
    r = subprocess.run(
        [sys.executable, "-m", "infscaler", "plan", "--fleet", str(f)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert message in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
