"""The Jetson telemetry of a live service on a host without jtop (x86, or a Jetson
without jetson-stats): ``GET /metrics`` has ``infscaler_telemetry_info`` with
``available="false"`` and the reason, and no ``nv_gpu_*`` / ``nv_energy_*`` /
``infscaler_jetson_*`` family; ``/v2/infscaler/status`` and ``infscaler status`` say the
same reason."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infscaler.api.client import Client
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.runtime.scaling.telemetry import jetson_sampler
from infscaler.service.service import Service
from tests import TESTS_DIR
from tests.integration.api.test_metrics import CHAIN


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    st = jetson_sampler().state()
    if st.available:
        pytest.skip("jtop is read on this host: the absent-with-reason path does not apply")
    tmp = tmp_path_factory.mktemp("jetson")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{TESTS_DIR}{os.pathsep}{old}" if old else str(TESTS_DIR)
    sys.path.insert(0, str(TESTS_DIR))  # the deploy loads the function stages here too
    sock = tmp / "api.sock"
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            with ServerThread(svc, sock, max_body_mb=1):
                yield str(sock), st.reason
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(TESTS_DIR))


def test_metrics_say_why_there_are_no_jetson_gauges(served):
    sock, reason = served
    with Client(sock) as c:
        c.infer("chain", {"x": np.ones((1, 4), np.float32)})
    transport = httpx.HTTPTransport(uds=sock)
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=30) as h:
        text = h.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (info,) = fams["infscaler_telemetry_info"].samples
    assert info.value == 1
    assert info.labels == {"source": "jtop", "available": "false", "reason": reason}
    assert reason  # says why: not a Jetson, jetson-stats missing, service down
    assert not [n for n in fams if n.startswith(("nv_gpu_", "nv_energy", "infscaler_jetson_"))]
    assert "nv_inference_request_success" in fams  # the service's own metrics are there


def test_status_says_the_same_reason(served):
    sock, reason = served
    with Client(sock) as c:
        st = c.status()
    assert st["telemetry"] == {"source": "jtop", "available": False, "reason": reason}
    cli = subprocess.run(
        [sys.executable, "-m", "infscaler", "status", "--socket", sock],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert cli.returncode == 0, cli.stderr
    assert f"telemetry (jtop): not read: {reason}" in " ".join(cli.stdout.split())


def test_jtop_gauges_on_a_jetson():
    """On a Jetson with jetson-stats and its service: the sampler reads within a few
    updates and the gauges are there (skipped elsewhere, with the reason)."""
    from infscaler.api.metrics import exposition, make_registry
    from infscaler.runtime.scaling.telemetry import JetsonSampler

    sampler = JetsonSampler()
    st = sampler.state()
    if not st.available and "not reachable" not in st.reason and "not read yet" not in st.reason:
        pytest.skip(st.reason)
    try:
        deadline = time.monotonic() + 10.0
        while not (st := sampler.state()).available and time.monotonic() < deadline:
            time.sleep(0.2)
        assert st.available, st.reason
        text = exposition(make_registry(object(), process=False, jetson=sampler)).decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        (info,) = fams["infscaler_telemetry_info"].samples
        assert info.labels["available"] == "true"
        assert "nv_gpu_memory_total_bytes" in fams and "infscaler_jetson_frequency_hz" in fams
        if "nv_gpu_utilization" in fams:
            assert all(0.0 <= s.value <= 1.0 for s in fams["nv_gpu_utilization"].samples)
    finally:
        sampler.close()
