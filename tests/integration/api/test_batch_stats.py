"""Dynamic batching made visible as Triton shows it: concurrent requests batched by one
instance, and the counts add up over HTTP (/v2/models/M/stats), gRPC (ModelStatistics,
tritonclient.grpc), Prometheus (nv_inference_count / nv_inference_exec_count) and the
status: items = requests x batch dim, executions <= items, batch_stats sizes x counts
= items."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infscaler.api.client import Client
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests.helpers import residual_model, save

REQUESTS = 12
ROWS = 2  # every request's batch dim


def _pipeline(path: Path) -> dict[str, Any]:
    return {
        "name": "bx",
        "stages": [
            {
                "name": "block",
                "model": str(path),
                "batching": {"max_batch": 8, "max_delay_ms": 50, "policy": "fixed"},
            }
        ],
    }


def _stats_when(c: Client, items: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """The model's statistics once they count ``items`` (instances report when idle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = c.stats("bx")["model_stats"][0]
        if st["inference_count"] >= items or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("batchstats")
    path = save(residual_model(batch="N"), tmp / "block.onnx")
    sock, gsock = str(tmp / "api.sock"), str(tmp / "api-grpc.sock")
    with Service(state_dir=tmp / "s", control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(_pipeline(path)))
        with ServerThread(svc, sock, grpc_socket=gsock):
            yield {"svc": svc, "http": sock, "grpc": gsock}


def test_concurrent_requests_are_batched_and_counted_as_triton_counts(served) -> None:
    svc = served["svc"]
    rng = np.random.default_rng(0)
    xs = [rng.random((ROWS, 4, 8, 8), dtype=np.float32) for _ in range(REQUESTS)]
    futs = [svc.submit("bx", {"x": x}) for x in xs]  # all queued at once: batches form
    for f in futs:
        assert f.result(timeout=60).outputs["y"].shape == (ROWS, 2, 8, 8)
    items = REQUESTS * ROWS
    with Client(served["http"]) as c:
        st = _stats_when(c, items)
    assert st["inference_count"] == items  # a request of batch dim 2 counts 2
    assert 1 <= st["execution_count"] < REQUESTS  # some requests shared one execution
    sizes = {b["batch_size"]: b for b in st["batch_stats"]}
    assert sum(b * s["compute_infer"]["count"] for b, s in sizes.items()) == items
    assert sum(s["compute_infer"]["count"] for s in sizes.values()) == st["execution_count"]
    assert max(sizes) > ROWS  # at least one batch stacked two requests or more
    assert all(s["compute_infer"]["ns"] > 0 for s in sizes.values())
    for s in sizes.values():  # every phase counts the same runs
        assert s["compute_input"]["count"] == s["compute_output"]["count"]
        assert s["compute_input"]["count"] == s["compute_infer"]["count"]

    # the same counts over gRPC (Triton's ModelStatistics) and Prometheus, and the status
    tg = pytest.importorskip("tritonclient.grpc")
    g = tg.InferenceServerClient(url=f"unix:{served['grpc']}")
    try:
        gs = g.get_inference_statistics("bx", as_json=True)["model_stats"][0]
    finally:
        g.close()
    assert int(gs["inference_count"]) == items
    assert int(gs["execution_count"]) == st["execution_count"]
    gsizes = {int(b["batch_size"]): b for b in gs["batch_stats"]}
    assert sorted(gsizes) == sorted(sizes)
    for b, s in sizes.items():
        assert int(gsizes[b]["compute_infer"]["count"]) == s["compute_infer"]["count"]
        assert int(gsizes[b]["compute_infer"]["ns"]) == s["compute_infer"]["ns"]

    from tests.integration.api.test_metrics import scrape, value

    _resp, fams = scrape(served["http"])
    assert value(fams, "nv_inference_count", model="bx") == items
    assert value(fams, "nv_inference_exec_count", model="bx") == st["execution_count"]

    (unit,) = svc.pipeline_status(svc.deployment("bx"))["units"]
    ex = unit["exec"]
    assert ex["items"] == items and ex["executions"] == st["execution_count"]
    assert ex["mean_batch"] == pytest.approx(items / st["execution_count"], abs=1e-3)
    assert ex["mean_batch"] > ROWS and ex["batch"] == 8


def test_a_request_alone_counts_its_batch_dim(served) -> None:
    with Client(served["http"]) as c:
        before = c.stats("bx")["model_stats"][0]
        c.infer("bx", {"x": np.ones((4, 4, 8, 8), np.float32)})
        st = _stats_when(c, before["inference_count"] + 4)
    assert st["inference_count"] == before["inference_count"] + 4
    assert st["execution_count"] == before["execution_count"] + 1
