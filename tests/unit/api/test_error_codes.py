"""A refusal's reason code in the API's error answers: what counts as a code, the
error JSON with and without one, and the connection-level refusal's raw answer."""

from __future__ import annotations

import json

from infscaler.api.common import error_code, error_response
from infscaler.api.http import raw_error
from infscaler.runtime.serving.requests import RequestError


def test_only_a_short_lower_case_word_is_a_code() -> None:
    assert error_code(RequestError("over the SLO", code="slo")) == "slo"
    assert error_code(RequestError("full", code="queue_full")) == "queue_full"
    assert error_code(RequestError("no code")) is None
    assert error_code(RequestError("x", code="Queue Full")) is None
    assert error_code(RequestError("x", code="a" * 33)) is None
    assert error_code(ValueError("x")) is None


def test_the_error_json_carries_the_code_beside_the_message() -> None:
    r = error_response("over the SLO: 812 ms > 100 ms", 503, 0.2, "slo")
    assert json.loads(r.body) == {"error": "over the SLO: 812 ms > 100 ms", "code": "slo"}
    assert r.status == 503 and r.headers["Retry-After"] == "1"
    assert json.loads(error_response("bad", 400).body) == {"error": "bad"}


def test_a_refused_connection_says_its_code() -> None:
    raw = raw_error(503, "Service Unavailable", "too many connections", "", "connections")
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert body == {"error": "too many connections", "code": "connections"}


def test_the_python_client_error_carries_the_code() -> None:
    from infscaler.api.client import InferenceServerError

    e = InferenceServerError.from_body(503, "x", b'{"error": "queue full", "code": "queue_full"}')
    assert e.status == 503 and e.code == "queue_full" and e.message == "queue full"
    assert InferenceServerError.from_body(400, "x", b'{"error": "bad"}').code is None
    assert InferenceServerError.from_body(502, "Bad Gateway", b"<html>").code is None
