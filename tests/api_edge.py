"""The v2 API's edge under malformed requests: the target pipeline and the raw transport,
for ``tests/{unit,integration}/.../test_reliability_edge.py``;
the malformed requests themselves are hypothesis strategies (``tests/api_edge_cases.py``).

The target is :func:`fuzz_pipeline`: ``x`` FP32 [-1, 4] -> function stage ``check``
(:func:`check_rows`: the declared :class:`StageInputError` for an empty or non-finite
``x``) -> a small ONNX model (:func:`small_model`: ``y = relu(x W)``, W 4x4) -> ``y``.
Requests are raw bytes on a fresh Unix-socket connection (``Connection: close``:
:func:`http`, :func:`send`), so HTTP-level garbage and truncated requests travel as a
hostile client would send them; :func:`judge` says whether an answer is 4xx v2 error
JSON (``{"error": str}``, ``Content-Type: application/json``).
"""

from __future__ import annotations

import json
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "edge"


# -- the target ---------------------------------------------------------------------------


def check_rows(tensors: Any) -> dict[str, np.ndarray]:
    """Function stage ``check``: ``x2 = x`` (FP32 [N, 4]).

    Raises:
        StageInputError: (400) ``x`` has no rows or holds NaN / infinity.
    """
    from infscaler.runtime.serving.instance import StageInputError

    x = np.asarray(tensors["x"], dtype=np.float32)
    if x.shape[0] == 0:
        raise StageInputError("x has no rows; send at least one row of 4 values")
    if not np.isfinite(x).all():
        raise StageInputError("x holds NaN or infinity; send finite values")
    return {"x2": np.array(x)}


check_rows.outputs_spec = {"x2": {"datatype": "FP32", "shape": [-1, 4]}}  # type: ignore[attr-defined]


def small_model(path: str | Path) -> Path:
    """Write the ONNX model ``y = relu(x W)`` (x FP32 [N, 4], W 4x4 fixed) to ``path``."""
    from onnx import helper

    from tests.helpers import f32, make_model, save

    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16.0
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]  # fmt: skip
    return save(make_model(nodes, [f32("x", ["N", 4])], [f32("y", ["N", 4])], {"w": w}), Path(path))


def expected_y(x: np.ndarray) -> np.ndarray:
    """What the pipeline answers for ``x`` (numpy reference of :func:`small_model`)."""
    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16.0
    return np.maximum(np.asarray(x, np.float32) @ w, 0)


def fuzz_pipeline(model_path: str | Path) -> dict[str, Any]:
    """The pipeline config (for ``load_pipeline``); ``api_edge`` must be importable by the
    instance processes (this directory on their ``PYTHONPATH``)."""
    return {"name": MODEL, "description": "fuzz target: check rows, then y = relu(x W)",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": ["y"],
            "stages": [{"name": "check", "function": "api_edge:check_rows", "inputs": ["x"],
                        "outputs": ["x2"]},
                       {"name": "model", "model": str(model_path), "inputs": {"x": "x2"},
                        "outputs": {"y": "y"}, "engine": "cpu", "instances": 1}]}  # fmt: skip


# -- requests and answers ------------------------------------------------------------------


@dataclass
class Case:
    """One malformed request: ``raw`` is the bytes sent; ``shut_write`` half-closes the
    connection after sending (the request is cut off)."""

    kind: str
    raw: bytes
    expect: str = "4xx"
    shut_write: bool = False
    note: str = ""


def http(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    content_length: int | None = None,
) -> bytes:
    """An HTTP/1.1 request's bytes (``Connection: close``; ``Content-Length`` of the body
    unless ``content_length`` overrides it)."""
    h = {"Host": "infscaler", "Connection": "close", **(headers or {})}
    if body or content_length is not None or method == "POST":
        h["Content-Length"] = str(len(body) if content_length is None else content_length)
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return head.encode("latin-1") + b"\r\n" + body


def infer_request(body: bytes, headers: dict[str, str] | None = None, model: str = MODEL) -> bytes:
    """``POST /v2/models/{model}/infer`` with ``body`` (see :func:`http`)."""
    return http("POST", f"/v2/models/{model}/infer", body, headers)


def valid_doc(rng: random.Random) -> dict[str, Any]:
    """A valid request document drawn from ``rng``: 1..3 rows of 4 values in [-2, 2]."""
    n, rid = rng.randint(1, 3), f"r{rng.randint(0, 999)}"
    x = {"name": "x", "datatype": "FP32", "shape": [n, 4],
         "data": [round(rng.uniform(-2, 2), 3) for _ in range(4 * n)]}  # fmt: skip
    return {"id": rid, "inputs": [x]}


# -- sending ------------------------------------------------------------------------------


@dataclass
class Answer:
    """What came back: ``status`` (None: the connection closed without an answer),
    the headers (lower-case names) and the body."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    seconds: float


def send(
    socket_path: str, raw: bytes, *, shut_write: bool = False, timeout: float = 30.0
) -> Answer:
    """Send ``raw`` on a new connection to ``socket_path`` and read until the server
    closes it (the requests say ``Connection: close``)."""
    t0 = time.perf_counter()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    chunks: list[bytes] = []
    try:
        s.connect(socket_path)
        try:
            s.sendall(raw)
            if shut_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        s.close()
    return parse_answer(b"".join(chunks), time.perf_counter() - t0)


def parse_answer(data: bytes, seconds: float = 0.0) -> Answer:
    """An :class:`Answer` from a raw HTTP/1.1 response (status None when empty)."""
    if not data:
        return Answer(None, {}, b"", seconds)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Answer(status, headers, body, seconds)


def judge(case: Case, answer: Answer) -> str | None:
    """None when ``answer`` is what ``case`` expects, else what is wrong."""
    if answer.status is None:
        return None if case.expect == "4xx_or_closed" else "closed without an answer"
    if not 400 <= answer.status <= 499:
        return f"status {answer.status}: {answer.body[:200]!r}"
    if not answer.headers.get("content-type", "").startswith("application/json"):
        return f"content-type {answer.headers.get('content-type')!r}: {answer.body[:100]!r}"
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return f"body is not JSON: {answer.body[:100]!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str) or not doc["error"]:
        return f"body is not v2 error JSON: {answer.body[:100]!r}"
    return None


def valid_request(rng: random.Random | None = None) -> tuple[bytes, np.ndarray]:
    """A valid infer request and the ``x`` it sends."""
    rng = rng or random.Random(0)
    doc = valid_doc(rng)
    x = np.array(doc["inputs"][0]["data"], np.float32).reshape(doc["inputs"][0]["shape"])
    return infer_request(json.dumps(doc).encode()), x


def check_valid(socket_path: str, rng: random.Random | None = None) -> str | None:
    """Send a valid request; None when the answer is 200 with the right ``y``."""
    raw, x = valid_request(rng)
    a = send(socket_path, raw)
    if a.status != 200:
        return f"valid request got {a.status}: {a.body[:200]!r}"
    doc = json.loads(a.body)
    y = np.array(doc["outputs"][0]["data"], np.float32).reshape(x.shape)
    if not np.allclose(y, expected_y(x), rtol=1e-5, atol=1e-5):
        return "valid request got a wrong y"
    return None
