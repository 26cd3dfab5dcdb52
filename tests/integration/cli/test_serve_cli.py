"""`infscaler serve` as systemd runs it: a real process, a fake NOTIFY_SOCKET, SIGTERM
with requests in flight; and the client commands (`infer`, `status`, `deploy`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import yaml

from infscaler.api.client import Client
from tests import TESTS_DIR
from tests.helpers import wait_for

HERE = TESTS_DIR  # tests/: stagefuncs.py
INFSCALER = [sys.executable, "-m", "infscaler"]

SLOW = {
    "name": "slow",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
    "outputs": ["y"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {
            "name": "wait",
            "function": "stagefuncs:slow",
            "inputs": ["y"],
            "outputs": ["y"],
            "params": {"ms": 150},
        },
    ],
}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    env["INFSCALER_STATE_DIR"] = str(tmp_path / "state")
    env.update(extra)
    return env


def _pending(c: Client, model: str) -> float:
    """The service's ``nv_inference_pending_request_count`` for ``model`` (its /metrics)."""
    for line in c.request("GET", "/metrics").text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_serve_notifies_systemd_and_drains_on_sigterm(tmp_path: Path) -> None:
    pipeline = tmp_path / "slow.yaml"
    pipeline.write_text(yaml.safe_dump(SLOW))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = tmp_path / "notify.sock"
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    messages: list[str] = []

    def collect() -> None:
        while True:
            try:
                messages.append(notify.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=collect, daemon=True).start()
    sock = tmp_path / "run" / "infscaler.sock"
    proc = subprocess.Popen(
        [*INFSCALER, "serve", "--socket", str(sock), "--control-path", "userspace", str(pipeline)],
        env=_env(tmp_path, NOTIFY_SOCKET=str(notify_path), WATCHDOG_USEC="400000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: any("READY=1" in m for m in messages) or proc.poll() is not None, 90, "READY=1"
        )
        assert proc.poll() is None, proc.stdout.read()
        # READY=1 comes only once the pipeline answers
        with Client(sock) as c:
            assert c.is_ready() and c.model_ready("slow")
            np.testing.assert_array_equal(
                c.infer("slow", {"x": np.ones(3, np.float32)}).outputs["y"], 2.0
            )
        wait_for(lambda: any("WATCHDOG=1" in m for m in messages), 5, "a watchdog ping")
        # requests in flight when SIGTERM arrives are answered, then the process exits 0
        results: list[object] = []

        def call(i: int) -> None:
            with Client(sock) as c:
                try:
                    results.append(c.infer("slow", {"x": np.full(2, i, np.float32)}).outputs["y"])
                except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                    results.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # SIGTERM once all four are admitted (in flight or answered; a fixed sleep races a
        # loaded host)
        with Client(sock) as c:
            wait_for(lambda: _pending(c, "slow") + len(results) >= 4, 60, "4 requests admitted")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(30) == 0
        assert len(results) == 4 and all(isinstance(r, np.ndarray) for r in results), results
        assert any("STOPPING=1" in m for m in messages)
        assert not sock.exists()
        said = proc.stdout.read()
        assert "stopping: draining" in said and "infscaler: stopped in" in said, said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()


def test_client_commands_against_a_running_service(tmp_path: Path) -> None:
    sock = tmp_path / "svc.sock"
    # `deploy` goes through the API: its function stages must be allowed (here by the
    # environment variable the systemd env file sets)
    env = _env(tmp_path, INFSCALER_SOCKET=str(sock), INFSCALER_ALLOW_FUNCTIONS="stagefuncs")
    proc = subprocess.Popen(
        [*INFSCALER, "serve", "--control-path", "userspace"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: Client(sock).is_live() or proc.poll() is not None, 60, "the socket")
        # the API's event loop runs on the main thread, named for its role in the kernel
        comm = Path(f"/proc/{proc.pid}/task/{proc.pid}/comm").read_text().strip()
        assert comm == "infscaler-api"
        pipeline = tmp_path / "slow.yaml"
        pipeline.write_text(yaml.safe_dump(dict(SLOW, stages=SLOW["stages"][:1])))

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [*INFSCALER, *args], env=env, capture_output=True, text=True, timeout=120
            )

        r = run("deploy", str(pipeline))
        assert r.returncode == 0, r.stderr
        np.save(tmp_path / "x.npy", np.arange(4, dtype=np.float32))
        r = run("infer", "slow", "--input", f"x={tmp_path / 'x.npy'}", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["outputs"]["y"] == [0.0, 2.0, 4.0, 6.0]
        r = run("status", "--json")
        st = json.loads(r.stdout)
        assert st["control_path"]["kind"] == "userspace"
        assert st["pipelines"][0]["name"] == "slow"
        r = run("status")
        assert r.returncode == 0 and "scale" in r.stdout and "control path" in r.stdout
        r = run("infer", "nope", "--input", f"x={tmp_path / 'x.npy'}")
        assert r.returncode == 2 and "unknown model 'nope'" in r.stderr
        r = run("infer", "slow", "--input", "x")
        assert r.returncode == 2 and "NAME=FILE.npy" in r.stderr
        # what the model needs, said with its shape and datatype; --random fills it
        r = run("infer", "slow")
        assert r.returncode == 2 and "model slow needs 1 more input" in r.stderr, r.stderr
        assert "x  FP32  [-1]" in r.stderr, r.stderr
        assert "--random" in r.stderr
        r = run("infer", "slow", "--random", "--json")
        assert r.returncode == 0, r.stderr
        (y,) = json.loads(r.stdout)["outputs"]["y"]  # one element: the dynamic dim took 1
        assert 0.0 <= y < 2.0
        np.save(tmp_path / "x64.npy", np.arange(4, dtype=np.float64))
        r = run("infer", "slow", "--input", f"x={tmp_path / 'x64.npy'}")
        assert r.returncode == 2 and "was given float64 [4]" in r.stderr
        assert "astype(np.float32)" in r.stderr
        r = run("undeploy", "slow")
        assert r.returncode == 0
        assert Client(sock).models() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_client_commands_without_a_service_say_what_to_do(tmp_path: Path) -> None:
    r = subprocess.run(
        [*INFSCALER, "status", "--socket", str(tmp_path / "none.sock")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "cannot connect" in r.stderr and "infscaler serve" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_a_bad_pipeline_before_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "stages": [{"name": "s", "function": "x"}]}))
    r = subprocess.run(
        [*INFSCALER, "serve", "--socket", str(tmp_path / "s.sock"), str(bad)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "stages[0] (s)" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s.sock").exists()
