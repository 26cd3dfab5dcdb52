"""Closed-loop clients past capacity against SLO admission, on a running service over
HTTP and gRPC (tritonclient.grpc): a refused request is judged before its body is
decoded and answered only after its hold, so clients that send again at once are not
turned into a refusal storm (refusals per answered request bounded), and every answer is
a result or a 503 / UNAVAILABLE refusal.

Margins are wide (a loaded 2-core host): the slow stage sleeps, so its service time
does not depend on the cores; the bound on refusals per answer is several times what the
holds allow, and far below what clients sending again at once make (hundreds)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from infscaler.api.codec import encode_infer_request
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests.helpers import chain_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

SLOW_MS = 80.0  # the slow stage's sleep: one instance answers ~12 requests a second
SLO = "120ms"  # one request fits (80 ms), one behind it does not (160 ms)
CLIENTS = 2  # closed loop: 2 x capacity
RUN_S = 3.0
MAX_REFUSED_PER_ANSWER = 8.0
X = np.ones(64 * 1024, np.float32)  # 256 KB a request


@pytest.fixture
def served(tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as svc:
        cfg = load_pipeline(chain_pipeline(SLOW_MS, x_shape=(-1,)))
        svc.deploy(cfg.model_copy(update={"slo": SLO}))
        http, grpc = str(tmp_path / "api.sock"), str(tmp_path / "api-grpc.sock")
        with ServerThread(svc, http, grpc_socket=grpc) as st:
            yield {"svc": svc, "http": http, "grpc": grpc, "gate": st._grpc.gate}


def closed_loop(one) -> dict[str, list[float]]:
    """``CLIENTS`` threads each calling ``one()`` (-> "ok" / "refused" / another
    outcome) back to back for ``RUN_S`` s; the latencies (s) by outcome."""
    out: dict[str, list[float]] = {}
    lock = threading.Lock()
    end = time.monotonic() + RUN_S

    def worker() -> None:
        call = one()
        while time.monotonic() < end:
            t0 = time.monotonic()
            kind = call()
            with lock:
                out.setdefault(kind, []).append(time.monotonic() - t0)

    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S + 60)
    return out


def check(out: dict[str, list[float]], svc: Service) -> None:
    assert set(out) <= {"ok", "refused"}, {k: len(v) for k, v in out.items()}
    ok, refused = len(out.get("ok", [])), len(out.get("refused", []))
    assert ok >= 3, out.keys()
    assert refused <= MAX_REFUSED_PER_ANSWER * ok, (ok, refused)
    if refused:  # each held for a while (>= the shortest back-off, 50 ms), never at once
        assert sorted(out["refused"])[len(out["refused"]) // 2] >= 0.04
        assert svc.frontend.counters["slo_refused"] >= refused


def test_http_closed_loop_past_capacity_is_not_a_refusal_storm(served) -> None:
    body, headers = encode_infer_request({"x": X})

    def one():
        client = httpx.Client(
            transport=httpx.HTTPTransport(uds=served["http"]), base_url="http://x", timeout=30
        )

        def call() -> str:
            r = client.post("/v2/models/chain/infer", content=body, headers=headers)
            if r.status_code == 503:
                assert float(r.headers["Retry-After"]) > 0 and "SLO" in r.json()["error"]
                return "refused"
            return "ok" if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"

        return call

    check(closed_loop(one), served["svc"])


def test_grpc_closed_loop_past_capacity_is_not_a_refusal_storm(served) -> None:
    tg = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    def one():
        client = tg.InferenceServerClient(url="unix:" + served["grpc"])
        inp = tg.InferInput("x", list(X.shape), "FP32")
        inp.set_data_from_numpy(X)

        def call() -> str:
            try:
                client.infer("chain", [inp])
            except InferenceServerException as exc:
                if exc.status() == "StatusCode.UNAVAILABLE" and "SLO" in str(exc):
                    return "refused"
                return f"{exc.status()}: {exc}"[:200]
            return "ok"

        return call

    out = closed_loop(one)
    check(out, served["svc"])
    # refused at the message prefix, before grpcio read the message (most of them: a
    # request can still be refused once decoded, when the queue grew in between)
    assert served["gate"].calls_refused >= len(out.get("refused", [])) // 2


def test_http_refusal_is_judged_on_the_headers_before_the_body_is_read(served) -> None:
    svc = served["svc"]
    cfg = chain_pipeline(1000, x_shape=(-1,))
    cfg["name"] = "slowchain"
    svc.deploy(load_pipeline(cfg).model_copy(update={"slo": "1500ms"}))
    # before a measurement a request is assumed to take half the SLO, one at a time:
    # two in flight are admitted (750 + 750 ms), a third would take 2250 ms
    futs = [svc.submit("slowchain", {"x": np.ones(4, np.float32)}) for _ in range(2)]
    transport = httpx.HTTPTransport(uds=served["http"])
    with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
        # not a valid body: decoded, it would be a 400; judged first, it is a 503
        r = h.post("/v2/models/slowchain/infer", content=b"#" * 100_000)
        assert r.status_code == 503, r.text
        assert "refuses the request at arrival" in r.json()["error"]
        assert r.json()["code"] == "slo"  # the reason code, as a refusal once decoded
        assert float(r.headers["Retry-After"]) > 0
        # the connection still serves (the body was read and dropped)
        assert h.get("/v2/health/live").status_code == 200
    for f in futs:
        f.result(timeout=30)
    assert svc.frontend.counters["slo_refused"] >= 1
