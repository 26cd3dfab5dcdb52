"""Refusals carry a stable reason code beside their message: the HTTP error JSON's
``code``, gRPC's ``infscaler-code`` trailing metadata; the service counts them by code
(``refused_by_code`` in the statistics), and the load generator groups what it was
answered by that code, never by the message."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from infscaler.api.client import Client, InferenceServerError
from infscaler.api.codec import encode_infer_request
from infscaler.api.loadgen import LoadGenerator, LoadSpec, MeasureConfig
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.proto import grpc_service_pb2 as pb
from infscaler.service.service import Service
from tests.helpers import chain_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = np.ones((1, 4), np.float32)


def _grpc_infer(sock: str) -> grpc.RpcError:
    req = pb.ModelInferRequest(model_name="chain")
    t = req.inputs.add(name="x", datatype="FP32")
    t.shape.extend([1, 4])
    req.raw_input_contents.append(X.tobytes())
    with grpc.insecure_channel("unix:" + sock) as ch:
        call = ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as e:
            call(req, timeout=30)
    return e.value


def test_a_refusal_says_its_code_over_http_grpc_and_to_the_load_generator(
    tmp_path: Path,
) -> None:
    sock, gsock = str(tmp_path / "api.sock"), str(tmp_path / "api-grpc.sock")
    with (
        Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as svc,
        ServerThread(svc, sock, grpc_socket=gsock),
    ):
        svc.deploy(load_pipeline(chain_pipeline(2)))
        dep = svc.deployment("chain")
        # the device's cap reached: the scaler's load shedding bound, at 0
        svc.set_queue_limit(dep, 0, "shed by the test (1 of 2 bounds)")
        body, headers = encode_infer_request({"x": X}, binary=True)
        transport = httpx.HTTPTransport(uds=sock)
        with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
            r = h.post("/v2/models/chain/infer", content=body, headers=headers)
            assert r.status_code == 503
            doc = r.json()
            assert doc["code"] == "shed" and "shed by the test" in doc["error"]
            with Client(sock) as c, pytest.raises(InferenceServerError) as ce:
                c.infer("chain", {"x": X})
            assert ce.value.code == "shed" and ce.value.status == 503
            err = _grpc_infer(gsock)
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert ("infscaler-code", "shed") in tuple(err.trailing_metadata() or ())
            gen = LoadGenerator(sock, "chain", {"x": X})
            cfg = MeasureConfig(interval_ms=200, max_trials=3, timeout_s=30)
            (point,) = gen.run([LoadSpec("concurrency", 2)], cfg)
            # a request without a code (bad input) is grouped by its status
            bad = h.post("/v2/models/chain/infer", json={"inputs": []})
            stats = h.get("/v2/models/chain/stats").json()["model_stats"][0]
    assert bad.status_code == 400 and "code" not in bad.json()
    s = point.summary
    assert point.totals["refused"] > 0 and point.totals["ok"] == 0
    assert set(s["refused_by_code"]) == {"shed"}, s["refused_by_code"]
    # the service counted every refusal under the same code
    assert stats["refused_by_code"]["shed"] == point.totals["refused"] + 3
