"""`infscaler perf` against a real `infscaler serve` process: a tiny function pipeline
(x -> scale -> a 2 ms sleep -> y), a concurrency sweep and a request-rate point with short
windows; the JSON's fields, throughput > 0, every request sent counted once (by the
client and by the service's statistics), the CSV and the table."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from infscaler.api.client import Client
from tests import TESTS_DIR
from tests.helpers import chain_pipeline, wait_for

INFSCALER = [sys.executable, "-m", "infscaler"]


@pytest.fixture
def served(tmp_path: Path):
    """(socket, env) of a running `infscaler serve` of the `chain` pipeline."""
    env = dict(os.environ, COLUMNS="80", INFSCALER_STATE_DIR=str(tmp_path / "state"))
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{TESTS_DIR}{os.pathsep}{old}" if old else str(TESTS_DIR)
    pipeline = tmp_path / "chain.yaml"
    pipeline.write_text(yaml.safe_dump(chain_pipeline(2)))
    sock = tmp_path / "svc.sock"
    proc = subprocess.Popen(
        [*INFSCALER, "serve", "--socket", str(sock), "--control-path", "userspace", str(pipeline)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: Client(sock).is_ready() or proc.poll() is not None, 120, "the service")
        assert proc.poll() is None, "the service exited"
        yield sock, env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _perf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*INFSCALER, "perf", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_perf_sweeps_a_served_pipeline(served, tmp_path: Path) -> None:
    sock, env = served
    js, cs = tmp_path / "perf.json", tmp_path / "perf.csv"
    r = _perf(
        env, "chain", "--socket", str(sock), "--concurrency-range", "1:3:2",
        "-p", "300", "--max-trials", "4", "--slo", "1s", "--json", str(js), "--csv", str(cs),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(js.read_text())
    assert doc["model"] == "chain" and doc["inputs"] == {"x": ["float32", [1, 4]]}
    assert [p["value"] for p in doc["points"]] == [1, 3]
    for p in doc["points"]:
        assert p["mode"] == "concurrency" and 3 <= p["trials"] <= 4
        assert p["throughput"] > 0
        lat = p["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
        assert 0 < p["goodput"] <= p["throughput"] + 1e-9  # all within 1 s here
        t = p["totals"]
        # every request sent got exactly one outcome, and the service counted each once
        assert t["sent"] == t["ok"] + t["refused"] + t["errors"] and t["sent"] > 0
        assert t["errors"] == 0 and t["refused"] == 0
        assert t["server_success"] == t["ok"]
        assert sum(w["ok"] for w in p["windows"]) <= t["ok"]
        assert p["server"]["compute_ms"] >= 2.0  # the slow stage sleeps 2 ms
        assert p["server"]["queue_ms"] >= 0
    rows = list(csv.reader(cs.open()))
    assert rows[0][:3] == ["Concurrency", "Inferences/Second", "Server Queue"]
    assert [row[0] for row in rows[1:]] == ["1", "3"]
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    assert "infer/s" in r.stdout and "P99" in r.stdout
    # progress on stderr while it measures: a line as each point starts, one per window
    lines = r.stderr.splitlines()
    for p in doc["points"]:
        label = f"concurrency {p['value']:g}"
        assert f"{label}: measuring" in r.stderr, r.stderr
        passes = [x for x in lines if x.startswith(f"{label}: pass [")]
        assert len(passes) == p["trials"], r.stderr
        assert passes[0].startswith(f"{label}: pass [1] ") and "infer/s" in passes[0]


def test_perf_request_rate_and_shared_memory(served, tmp_path: Path) -> None:
    sock, env = served
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "x.npy", np.arange(8, dtype=np.float32).reshape(2, 4))
    js = tmp_path / "rate.json"
    r = _perf(
        env, "chain", "--socket", str(sock), "--request-rate-range", "40",
        "--request-distribution", "poisson", "--input-data", str(data),
        "--shared-memory", "system", "-p", "500", "--max-trials", "3", "--json", str(js),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (p,) = json.loads(js.read_text())["points"]
    assert p["mode"] == "request_rate" and p["distribution"] == "poisson"
    t = p["totals"]
    assert t["sent"] == t["ok"] + t["refused"] + t["errors"] and t["errors"] == 0
    assert t["server_success"] == t["ok"]
    assert 10 < p["throughput"] < 100  # about 40/s offered
    assert Client(sock).system_shm_status() == []  # the region was unregistered


def test_perf_bad_input_is_a_clear_error(served) -> None:
    sock, env = served
    r = _perf(env, "chain", "--socket", str(sock), "--concurrency-range", "3:1")
    assert r.returncode == 2 and "below start" in r.stderr and "Traceback" not in r.stderr
    r = _perf(env, "chain", "--socket", str(sock), "--shape", "z:1x4")
    assert r.returncode == 2 and "no input 'z'" in r.stderr
    r = _perf(env, "nope", "--socket", str(sock))
    assert r.returncode == 2 and "unknown model" in r.stderr


def test_count_windows_and_the_benchs_offline_scenario(served, tmp_path: Path) -> None:
    sock, env = served
    js = tmp_path / "count.json"
    r = _perf(
        env, "chain", "--socket", str(sock), "--concurrency-range", "2",
        "--measurement-mode", "count_windows", "--measurement-request-count", "25",
        "--max-trials", "3", "--json", str(js),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (p,) = json.loads(js.read_text())["points"]
    assert p["trials"] == 3 and all(w["ok"] >= 25 for w in p["windows"])
    assert p["totals"]["sent"] == p["totals"]["ok"] == p["totals"]["server_success"]
    # the benchmarks' offline scenario (bench/harness) is the same load generator's closed loop
    sys.path.insert(0, str(TESTS_DIR.parent / "bench"))
    try:
        from harness import scenarios
    finally:
        sys.path.pop(0)
    x = {"x": np.ones((1, 4), np.float32)}
    cap = scenarios.run(str(sock), "chain", x, scenarios.OFFLINE, 2, duration_s=1.5)
    assert cap["failed"] == 0 and cap["ok"] >= 30 and cap["throughput_rps"] > 0
    assert cap["p50_ms"] > 2.0  # the slow stage sleeps 2 ms
