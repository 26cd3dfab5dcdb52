"""A pipeline's statistics across a switch of configuration, under load: its new
configuration (another instance count, as the scaler or the live check deploys it,
make-before-break) goes on counting where the old one was, over HTTP, gRPC, Prometheus
and the status, and the old configuration's answers while it drains count too."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg

from infscaler.api.common import model_stats
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, wait_for
from tests.load import ClosedLoop

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = {"x": np.ones((1, 4), np.float32)}


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + '{model="chain"'))
    return float(line.rsplit(" ", 1)[1])


def test_counts_go_on_across_a_switch_of_configuration(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as svc:
        svc.deploy(load_pipeline(chain_pipeline(20)))

        def retry(exc: RequestError) -> float | None:
            return 0.0 if exc.status in (429, 503) else None

        def send() -> None:
            svc.infer("chain", X, timeout_s=30)

        load = ClosedLoop(send, 3, retry=retry).start()
        try:
            wait_for(lambda: load.answered >= 10, 60, "10 answers before the switch")
            before = svc.deployment("chain")
            # another configuration, deployed in its place while requests run
            svc.deploy(load_pipeline(chain_pipeline(20, instances=2)), replace=True)
            assert svc.deployment("chain") is not before
            at_switch = load.answered
            wait_for(lambda: load.answered >= at_switch + 10, 60, "10 answers after it")
        finally:
            load.stop(60)
        assert not load.errors, load.errors[:3]
        ok = load.answered
        answered = {"ok": ok, "refused": len(load.refused)}
        dep = svc.deployment("chain")
        assert dep.route.instances == [1, 2]
        # the instances report what they ran when idle (or every second): wait for it
        wait_for(
            lambda: model_stats(svc, svc.deployment("chain"))["inference_count"] == ok,
            30,
            f"inference_count to reach the {ok} answers",
        )
        sock, gsock = str(tmp_path / "api.sock"), str(tmp_path / "api-grpc.sock")
        with ServerThread(svc, sock, grpc_socket=gsock):
            transport = httpx.HTTPTransport(uds=sock)
            with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
                st = h.get("/v2/models/chain/stats").json()["model_stats"][0]
                text = h.get("/metrics").text
                status = h.get("/v2/infscaler/status").json()
            g = tg.InferenceServerClient(url="unix:" + gsock)
            try:
                gst = g.get_inference_statistics("chain", as_json=True)["model_stats"][0]
            finally:
                g.close()
    inf = st["inference_stats"]
    assert st["inference_count"] == ok, (st["inference_count"], answered)
    assert inf["success"]["count"] == ok
    assert inf["success"]["ns"] > 0
    # each answer ran both units once: queue and compute count every run
    assert inf["compute_infer"]["count"] == 2 * ok and inf["queue"]["count"] == 2 * ok
    assert st["configurations"] == 2
    assert st["rejected"] + sum(st["fail_by_status"].values()) <= answered["refused"]
    assert int(gst["inference_count"]) == ok
    assert int(gst["inference_stats"]["success"]["count"]) == ok
    assert _metric(text, "nv_inference_request_success") == ok
    assert _metric(text, "nv_inference_count") == ok
    pipe = next(p for p in status["pipelines"] if p["name"] == "chain")
    assert pipe["requests"]["success"] == ok
