"""``GET /metrics``: a live service scraped after known requests, parsed with
prometheus-client's own parser; the ``--metrics-port`` listener on 127.0.0.1 only."""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infscaler.api.client import Client, InferenceServerError
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py

CHAIN = {
    "name": "chain",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}
PICKY = {
    "name": "picky",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["y"],
    "stages": [
        {
            "name": "check",
            "function": "stagefuncs:fail_on_negative",
            "inputs": ["x"],
            "outputs": ["y"],
        }
    ],
}

TRITON = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("metrics")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    # the service (this process) imports the stage functions too, not only its instances
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    sock = tmp / "api.sock"
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            svc.deploy(load_pipeline(PICKY))
            with ServerThread(svc, sock, max_body_mb=1, metrics_port=0) as server:
                yield svc, str(sock), server
    finally:
        os.environ["PYTHONPATH"] = old


def scrape(sock: str) -> tuple[httpx.Response, dict[str, object]]:
    transport = httpx.HTTPTransport(uds=sock)
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=30) as h:
        resp = h.get("/metrics")
    assert resp.status_code == 200, resp.text
    return resp, {f.name: f for f in text_string_to_metric_families(resp.text)}


def value(families: dict, name: str, **labels: str) -> float:
    """The one sample of family ``name`` whose labels include ``labels``."""
    fam = families[name]
    hits = [
        s.value
        for s in fam.samples
        if all(s.labels.get(k) == v for k, v in labels.items())
        and not s.name.endswith(("_created", "_count", "_sum"))
    ]
    assert len(hits) == 1, (name, labels, fam.samples)
    return hits[0]


def sample(families: dict, name: str, suffix: str, **labels: str) -> float:
    fam = families[name]
    hits = [
        s.value
        for s in fam.samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(hits) == 1, (name, suffix, labels, fam.samples)
    return hits[0]


def test_counters_equal_the_requests_made(served) -> None:
    svc, sock, _ = served
    _, before = scrape(sock)
    ok = {m: value(before, "nv_inference_request_success", model=m) for m in ("chain", "picky")}
    backend = value(before, "nv_inference_request_failure", model="picky", reason="BACKEND")
    rejected = value(before, "nv_inference_request_failure", model="chain", reason="REJECTED")
    items = value(before, "nv_inference_count", model="chain")
    execs = value(before, "nv_inference_exec_count", model="picky")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with Client(sock) as c:
        for _ in range(5):
            c.infer("chain", {"x": x})
        for _ in range(3):
            c.infer("picky", {"x": x})
        for _ in range(2):
            with pytest.raises(InferenceServerError) as e:
                c.infer("picky", {"x": -x})
            assert e.value.status == 500
        with pytest.raises(InferenceServerError):  # a bad request never reaches a pipeline
            c.infer("chain", {"x": np.zeros((2, 3), np.float32)})
        dep = svc.deployment("chain")
        svc.set_queue_limit(dep, 0, "test bound")
        try:
            with pytest.raises(InferenceServerError) as e:
                c.infer("chain", {"x": x})
            assert e.value.status == 503
        finally:
            svc.set_queue_limit(dep, None)
    from tests.helpers import wait_for

    def counted() -> tuple | None:  # instances report their executions when idle
        resp, fams = scrape(sock)
        done = value(fams, "nv_inference_count", model="chain") >= items + 5 and (
            value(fams, "nv_inference_exec_count", model="picky") >= execs + 3
        )
        return (resp, fams) if done else None

    resp, fams = wait_for(counted, 20.0, "the executions counted")
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in TRITON:
        assert fams[name].type == "counter", name
        # Triton's spelling: no _total suffix on the wire
        assert f"# TYPE {name} counter" in resp.text
    assert (
        value(fams, "nv_inference_request_success", model="chain", version="1") == ok["chain"] + 5
    )
    assert value(fams, "nv_inference_request_success", model="picky") == ok["picky"] + 3
    # a function stage's call is one execution of one item; picky's 2 failures run none
    assert value(fams, "nv_inference_count", model="chain") == items + 5
    assert value(fams, "nv_inference_exec_count", model="picky") == execs + 3
    assert (
        value(fams, "nv_inference_request_failure", model="picky", reason="BACKEND") == backend + 2
    )
    assert (
        value(fams, "nv_inference_request_failure", model="chain", reason="REJECTED")
        == rejected + 1
    )
    assert value(fams, "nv_inference_request_failure", model="chain", reason="BACKEND") == 0
    assert {
        s.labels["reason"]
        for s in fams["nv_inference_request_failure"].samples
        if s.labels["model"] == "chain"
    } == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
    assert value(fams, "infscaler_requests_rejected", model="chain") >= 1
    assert value(fams, "infscaler_requests_shed") >= 1
    # durations: positive, and the end-to-end total covers the units' compute
    dur = value(fams, "nv_inference_request_duration_us", model="chain")
    comp = value(fams, "nv_inference_compute_infer_duration_us", model="chain")
    assert dur > 0 and 0 < comp <= dur
    assert value(fams, "nv_inference_queue_duration_us", model="chain") >= 0
    n_scale = sample(
        fams, "infscaler_unit_compute_duration_us", "_count", model="chain", unit="scale"
    )
    assert n_scale == value(fams, "nv_inference_request_success", model="chain")
    assert (
        sample(fams, "infscaler_unit_queue_duration_us", "_count", model="chain", unit="add")
        == n_scale
    )
    # instances, pool, control path
    assert value(fams, "infscaler_instances", model="chain", unit="scale", state="ready") == 1
    assert value(fams, "infscaler_instances", model="picky", unit="check", engine="cpu") == 1
    assert value(fams, "infscaler_pool_cap_bytes") == 64 << 20
    assert value(fams, "infscaler_pool_mapped_bytes") >= value(fams, "infscaler_pool_in_use_bytes")
    assert value(fams, "infscaler_manager_tokens", kind="grant") > 0
    assert value(fams, "infscaler_channel_delivered_tokens", path="userspace") > 0
    assert "infscaler_scaler_decisions" in fams and "process_resident_memory_bytes" in fams


def test_metrics_carry_no_paths(served) -> None:
    svc, sock, _ = served
    resp, _ = scrape(sock)
    for secret in (str(svc.state_dir), sock, str(Path(sock).parent)):
        assert secret not in resp.text


def test_metrics_port_is_loopback_only(served) -> None:
    svc, sock, server = served
    port = server.metrics_port
    assert isinstance(port, int) and port > 0
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(resp.text)}
    assert "nv_inference_request_success" in fams
    # only /metrics there: the inference API stays on the socket
    assert httpx.get(f"http://127.0.0.1:{port}/v2/models", timeout=30).status_code == 404
    # bound to 127.0.0.1, not 0.0.0.0: another loopback address finds nobody
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        code = s.connect_ex(("127.0.0.2", port))
    finally:
        s.close()
    assert code == errno.ECONNREFUSED


def test_scaler_decisions_are_counted(served) -> None:
    svc, sock, _ = served
    _, before = scrape(sock)
    assert not [s for s in before["infscaler_scaler_decisions"].samples if s.labels["model"] == "x"]
    with svc.autoscaler._lock:  # what Autoscaler.step does for each decision it applies
        svc.autoscaler.counts[("x", "scale_out")] += 2
    _, fams = scrape(sock)
    assert value(fams, "infscaler_scaler_decisions", model="x", action="scale_out") == 2


def test_serve_metrics_port_flag(tmp_path: Path) -> None:
    """`infscaler serve --metrics-port 0`: a real process; it prints the port it bound,
    answers there, and stops cleanly on SIGTERM."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    env = dict(os.environ, INFSCALER_STATE_DIR=str(tmp_path / "state"))
    sock = tmp_path / "isc.sock"
    cmd = [sys.executable, "-m", "infscaler", "serve", "--socket", str(sock)]
    proc = subprocess.Popen(
        [*cmd, "--control-path", "userspace", "--metrics-port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            hit = [ln for ln in list(lines) if "metrics on http://127.0.0.1:" in ln]
            if hit:
                port = int(hit[0].rsplit(":", 1)[1].split("/")[0])
            time.sleep(0.1)
        assert port, "".join(lines)
        resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert resp.status_code == 200 and "infscaler_pool_cap_bytes" in resp.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines)
    # a port that is not one: a clear error, no traceback
    bad = subprocess.run(
        [*cmd, "--control-path", "userspace", "--metrics-port", "70000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "not a TCP port" in bad.stderr
    assert "Traceback" not in bad.stderr
