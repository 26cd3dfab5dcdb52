"""The API's edge under malformed input (issue 13): request validation with v2 error
JSON, HTTP-level hardening (garbage, slow and half-sent requests, the connection cap),
the declared function-stage input error (400), v2 version routes, output metadata and
Triton's statistics fields, and a hypothesis fuzz run of every kind of malformed request
(``tests/api_edge_cases.py``) against a live service
serving a small ONNX model (``tests/api_edge.py``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from infscaler.api.common import error_response
from infscaler.api.server import HttpLimits, ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py, api_edge.py (not a package path: instances import it)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import api_edge  # noqa: E402
from api_edge_cases import KINDS, STRATEGIES  # noqa: E402

LIMITS = HttpLimits(header_timeout_s=2.0, body_timeout_s=2.0, max_connections=40)

SPLIT = {
    "name": "split",
    "inputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
    "outputs": ["sums"],
    "stages": [
        {
            "name": "split",
            "function": "stagefuncs:split_rows",
            "fan_out": True,
            "inputs": ["y"],
            "outputs": ["row"],
        },
        {"name": "sum", "function": "stagefuncs:row_sum", "inputs": ["row"], "outputs": ["s"]},
        {
            "name": "gather",
            "function": "stagefuncs:gather_strict",
            "fan_in": True,
            "inputs": ["s"],
            "outputs": ["sums"],
        },
    ],
}
CHECKED = {
    "name": "checked",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["y"],
    "stages": [
        {
            "name": "check",
            "function": "stagefuncs:bad_input_check",
            "inputs": ["x"],
            "outputs": ["y"],
        }
    ],
}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory):
    """A service serving the fuzz target (function stage + ONNX model) and two function
    pipelines, behind a server with short read timeouts and a small connection cap."""
    tmp = tmp_path_factory.mktemp("edge")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    sys.path.insert(0, str(HERE))
    sock = str(tmp / "api.sock")
    model = api_edge.small_model(tmp / "small.onnx")
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(api_edge.fuzz_pipeline(model)))
            svc.deploy(load_pipeline(SPLIT))
            svc.deploy(load_pipeline(CHECKED))
            with ServerThread(svc, sock, max_body_mb=2, limits=LIMITS):
                yield svc, sock
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(HERE))


def post(sock: str, path: str, body: bytes | str, headers: dict | None = None) -> api_edge.Answer:
    if isinstance(body, str):
        body = body.encode()
    return api_edge.send(sock, api_edge.http("POST", path, body, headers))


def get(sock: str, path: str) -> api_edge.Answer:
    return api_edge.send(sock, api_edge.http("GET", path))


def error_of(a: api_edge.Answer) -> str:
    assert a.headers.get("content-type", "").startswith("application/json"), a
    return json.loads(a.body)["error"]


def infer_doc(data="[1, 2, 3, 4]", shape="[1, 4]", params: str | None = None) -> str:
    p = f'"parameters": {{"timeout_ms": {params}}}, ' if params is not None else ""
    return (
        f'{{{p}"inputs": [{{"name": "x", "datatype": "FP32", "shape": {shape}, "data": {data}}}]}}'
    )


def still_serves(sock: str) -> None:
    assert api_edge.check_valid(sock) is None


def slots_back_to(svc: Service, baseline: int, deadline_s: float = 20.0) -> int:
    end = time.monotonic() + deadline_s
    while True:
        n = svc.status()["pool"]["slots_in_use"]
        if n <= baseline or time.monotonic() > end:
            return n
        time.sleep(0.05)


# -- parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        '"inf"',
        '"nan"',
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        str(10**30),
        "0",
        "-1",
        "3600001",
        "true",
        '"100"',
        "null",
        "[]",
    ],
)
def test_timeout_ms_must_be_a_finite_number_in_range(edge, value: str) -> None:
    sock = edge[1]
    a = post(sock, "/v2/models/edge/infer", infer_doc(params=value))
    assert a.status == 400, a
    err = error_of(a)
    assert "timeout_ms" in err and ("0 < timeout_ms <= 3600000" in err or "finite" in err), err
    still_serves(sock)  # the front end thread lives on


def test_a_valid_timeout_is_accepted(edge) -> None:
    a = post(edge[1], "/v2/models/edge/infer", infer_doc(params="30000"))
    assert a.status == 200, a


# -- JSON ---------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_deep_nesting_is_refused_before_parsing(edge, depth: int) -> None:
    body = infer_doc(data="[" * depth + "1" + "]" * depth)
    a = post(edge[1], "/v2/models/edge/infer", body)
    assert a.status == 400 and "nested" in error_of(a) and "64" in error_of(a), a
    still_serves(edge[1])


def test_nesting_within_the_limit_is_fine(edge) -> None:
    a = post(edge[1], "/v2/models/edge/infer", infer_doc(data="[[1, 2, 3, 4]]"))
    assert a.status == 200, a


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-16-le"])
def test_bodies_must_be_utf8(edge, encoding: str) -> None:
    a = post(edge[1], "/v2/models/edge/infer", infer_doc().encode(encoding))
    assert a.status == 400 and "UTF-8" in error_of(a), a


@pytest.mark.parametrize(
    "data, shape",
    [
        ("[[1, 2, 3, 4], [5, 6, 7]]", "[2, 4]"),
        ("[[1, 2], [3, 4], [5, 6], [7, 8]]", "[2, 4]"),
        ("[[1, 2, 3, [4]]]", "[1, 4]"),
        ("[1, 2, 3]", "[1, 4]"),
    ],
)
def test_ragged_or_misshaped_data_is_refused(edge, data: str, shape: str) -> None:
    a = post(edge[1], "/v2/models/edge/infer", infer_doc(data=data, shape=shape))
    assert a.status == 400, a
    assert "shape" in error_of(a), error_of(a)


@pytest.mark.parametrize(
    "value, status",
    [("-1", 400), ("99999", 400), ("1.5", 400), ("+10", 400), ("1_0", 400), ("abc", 400)],
)
def test_binary_header_length_is_checked(edge, value: str, status: int) -> None:
    a = post(
        edge[1], "/v2/models/edge/infer", infer_doc(), {"Inference-Header-Content-Length": value}
    )
    assert a.status == status and "Inference-Header-Content-Length" in error_of(a), a


# -- HTTP level ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        b"GET /v2 HTTP/9.9\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n",
        b"POST /v2/models/edge/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    ],
)
def test_http_garbage_gets_json_400(edge, raw: bytes) -> None:
    a = api_edge.send(edge[1], raw)
    assert a.status == 400, a
    assert "malformed HTTP request" in error_of(a)
    still_serves(edge[1])


def test_unknown_routes_and_methods_get_json(edge) -> None:
    a = get(edge[1], "/v3/nothing")
    assert a.status == 404 and "/v2" in error_of(a)
    a = api_edge.send(edge[1], api_edge.http("DELETE", "/v2/models/edge"))
    assert a.status == 405 and "GET" in error_of(a)


def test_half_sent_requests_are_closed_after_the_header_timeout(edge) -> None:
    """Slowloris: connections that send part of a request line / headers, then stall,
    get 408 JSON and are closed after header_timeout_s (2 s here), all of them."""
    socks = []
    for i in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(edge[1])
        s.sendall(b"POST /v2/models/edge/infer HTTP/1.1\r\nHost: x\r\n"[: 10 + i])
        socks.append(s)
    t0 = time.monotonic()
    answers = []
    for s in socks:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        answers.append(api_edge.parse_answer(data))
        s.close()
    waited = time.monotonic() - t0
    assert all(a.status == 408 for a in answers), answers[:2]
    assert "headers not received" in error_of(answers[0])
    assert waited >= 1.0  # not before the timeout (2 s from connecting)
    still_serves(edge[1])


def test_a_stalled_body_gets_408(edge) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(edge[1])
    s.sendall(api_edge.http("POST", "/v2/models/edge/infer", b'{"inputs": [', content_length=500))
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    a = api_edge.parse_answer(data)
    assert a.status == 408 and "body not received" in error_of(a), a
    still_serves(edge[1])


def test_connections_beyond_the_cap_get_503_with_retry_after(edge) -> None:
    idle = []
    try:
        for _ in range(LIMITS.max_connections + 5):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(edge[1])
            idle.append(s)
        time.sleep(0.3)  # the server accepts them (the cap counts accepted connections)
        a = get(edge[1], "/v2/health/live")
        assert a.status == 503, a
        assert a.headers.get("retry-after") == "1" and "too many connections" in error_of(a)
    finally:
        for s in idle:
            s.close()
    # once they are gone, the service answers again
    end = time.monotonic() + 20
    while get(edge[1], "/v2/health/live").status != 200:
        assert time.monotonic() < end
        time.sleep(0.1)


def test_retry_after_comes_from_the_exception(edge) -> None:
    from aiohttp.test_utils import make_mocked_request

    from infscaler.api.server import create_app, errors_middleware
    from infscaler.runtime.serving.frontend import RequestError

    assert error_response("busy", 503, 2.2).headers["Retry-After"] == "3"
    assert error_response("busy", 503, 0.0).headers["Retry-After"] == "1"
    assert "Retry-After" not in error_response("busy", 503, math.inf).headers
    assert "Retry-After" not in error_response("busy", 503, None).headers

    exc = RequestError("over the byte budget", 429)
    exc.retry_after_s = 0.4  # the agreed interface: status + retry_after_s

    async def handler(_request):
        raise exc

    import asyncio

    app = create_app(edge[0])
    req = make_mocked_request("POST", "/v2/models/edge/infer", app=app)
    resp = asyncio.run(errors_middleware(req, handler))
    assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert json.loads(resp.body)["error"] == "over the byte budget"


# -- stages: the declared input error ------------------------------------------------------


def test_stage_input_error_is_400_other_failures_500(edge) -> None:
    sock = edge[1]
    a = post(sock, "/v2/models/checked/infer", infer_doc(data="[]", shape="[0, 4]"))
    assert a.status == 400 and "x is empty" in error_of(a), a
    a = post(sock, "/v2/models/checked/infer", infer_doc(data="[-1, 2, 3, 4]"))
    assert a.status == 500 and "negative input" in error_of(a), a
    a = post(sock, "/v2/models/edge/infer", infer_doc(data="[]", shape="[0, 4]"))
    assert a.status == 400 and "no rows" in error_of(a), a
    still_serves(sock)


def test_fan_in_input_error_is_400(edge) -> None:
    body = '{"inputs": [{"name": "y", "datatype": "FP32", "shape": [0, 3], "data": []}]}'
    a = post(edge[1], "/v2/models/split/infer", body)
    assert a.status == 400 and "no rows to gather" in error_of(a), a
    body = '{"inputs": [{"name": "y", "datatype": "FP32", "shape": [2, 3], "data": [1,2,3,4,5,6]}]}'
    a = post(edge[1], "/v2/models/split/infer", body)
    assert a.status == 200 and json.loads(a.body)["outputs"][0]["data"] == [6, 15], a


# -- v2 conformance -----------------------------------------------------------------------


def test_version_routes(edge) -> None:
    sock = edge[1]
    md = json.loads(get(sock, "/v2/models/edge/versions/1").body)
    assert md["name"] == "edge" and md["versions"] == ["1"]
    assert get(sock, "/v2/models/edge/versions/1/ready").status == 200
    assert get(sock, "/v2/models/edge/versions/1/stats").status == 200
    a = post(sock, "/v2/models/edge/versions/1/infer", infer_doc())
    assert a.status == 200, a
    for path in ("", "/ready", "/stats"):
        a = get(sock, f"/v2/models/edge/versions/2{path}")
        assert a.status == 404 and "only version 1 exists" in error_of(a), a
    a = post(sock, "/v2/models/edge/versions/latest/infer", infer_doc())
    assert a.status == 404 and "no version 'latest'" in error_of(a), a
    a = get(sock, "/v2/models/nope/versions/1")
    assert a.status == 404 and "nope" in error_of(a)


def test_output_metadata_has_real_datatypes_and_shapes(edge) -> None:
    md = json.loads(get(edge[1], "/v2/models/edge").body)
    assert md["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    md = json.loads(get(edge[1], "/v2/models/split").body)
    assert md["outputs"][0]["datatype"] in ("FP32", "UNKNOWN")  # gather_strict declares none


def test_statistics_have_tritons_fields(edge) -> None:
    post(edge[1], "/v2/models/edge/infer", infer_doc())
    st = json.loads(get(edge[1], "/v2/models/edge/stats").body)["model_stats"][0]
    for k in (
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
    ):
        assert k in st, k
    assert st["version"] == "1" and st["last_inference"] > 1.6e12  # ms since the epoch
    assert abs(st["last_inference"] / 1e3 - time.time()) < 3600
    stats = st["inference_stats"]
    for k in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        assert set(stats[k]) == {"count", "ns"}, k
    assert stats["success"]["count"] >= 1 and stats["success"]["ns"] > 0


# -- the fuzz run -------------------------------------------------------------------------


def test_fuzz_malformed_requests(edge) -> None:
    """35 malformed requests of each kind, drawn by hypothesis (derandomized: the same
    draw every run; a failure is shrunk to the smallest case): all 4xx JSON, no 5xx;
    the service still serves, no pool slot leaks, bounded RSS."""
    svc, sock = edge
    import psutil

    proc = psutil.Process()
    still_serves(sock)
    baseline = svc.status()["pool"]["slots_in_use"]  # after a completed request
    rss0 = proc.memory_info().rss / 2**20
    sent: dict[str, int] = {}

    fuzz = settings(
        max_examples=35,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )

    def one(case: api_edge.Case) -> None:
        a = api_edge.send(sock, case.raw, shut_write=case.shut_write)
        sent[case.kind] = sent.get(case.kind, 0) + 1
        assert a.status is None or a.status < 500, (case.kind, case.note, a.status, a.body[:200])
        assert api_edge.judge(case, a) is None, (case.kind, case.note, api_edge.judge(case, a))

    for kind in KINDS:
        fuzz(given(case=STRATEGIES[kind])(one))()
    assert set(sent) == set(KINDS), sent
    still_serves(sock)
    assert slots_back_to(svc, baseline) == baseline
    rss1 = proc.memory_info().rss / 2**20
    assert rss1 - rss0 < 200, (rss0, rss1)  # MB; generous: no per-request leak


def test_half_closed_requests(edge, caplog) -> None:
    """The client shuts its write side: mid-headers and mid-body that is a truncated
    request (400 JSON); after a complete request the client counts as gone (it cannot
    be told from one that closed its socket): the request is cancelled, no answer comes,
    and the service goes on serving."""
    sock = edge[1]
    raw, x = api_edge.valid_request()
    head = raw.index(b"\r\n\r\n") + 4
    a = api_edge.send(sock, raw[: head - 10], shut_write=True)
    assert a.status == 400 and "before the request line and headers" in error_of(a), a
    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        a = api_edge.send(sock, raw[: head + 5], shut_write=True)
        time.sleep(0.2)  # aiohttp's lingering read of the rest runs after the answer
    assert a.status == 400 and "before the body was complete" in error_of(a), a
    # answered: nothing logged as an error (a client cannot fill the journal with these)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    a = api_edge.send(sock, raw, shut_write=True)
    assert a.status is None, a
    a = api_edge.send(sock, raw)
    assert a.status == 200, a
    y = np.array(json.loads(a.body)["outputs"][0]["data"], np.float32).reshape(x.shape)
    np.testing.assert_allclose(y, api_edge.expected_y(x), rtol=1e-5)
