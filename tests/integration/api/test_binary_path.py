"""The binary tensor data path without extra copies: the client sends a large body in
zero-copy pieces with a Content-Length, the server reads it into one buffer of that
length and decodes the inputs as views of it; limits and broken bodies fail alone."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from infscaler.api.client import Client, InferenceServerError
from infscaler.api.codec import (
    HEADER_LENGTH,
    encode_infer_request,
)
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py

CHAIN = {
    "name": "chain",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("binary")
    old = os.environ.get("PYTHONPATH", "")
    sock = tmp / "api.sock"
    # tests/ on the instances' PYTHONPATH and on this process's path (the service
    # imports the stage functions to check them), as conftest's stagefuncs_on_path does
    # for one test
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{old}" if old else str(HERE))
        mp.syspath_prepend(str(HERE))
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            with ServerThread(svc, sock, max_body_mb=4):
                yield svc, str(sock)


def test_large_binary_round_trip(served) -> None:
    _, sock = served
    x = np.random.default_rng(2).random((1, 3, 320, 320), dtype=np.float32)  # 1.2 MB
    with Client(sock) as c:
        for _ in range(3):
            res = c.infer("chain", {"x": x})
            np.testing.assert_array_equal(res.outputs["z"], x * 2 + 1)
        small = np.ones((1, 3, 2, 2), np.float32)
        np.testing.assert_array_equal(c.infer("chain", {"x": small}).outputs["z"], small * 3)


def test_body_over_the_limit_is_refused_before_reading(served) -> None:
    _, sock = served
    x = np.zeros((1, 3, 640, 640), np.float32)  # 4.9 MB > 4 MB
    with Client(sock) as c:
        with pytest.raises(InferenceServerError) as e:
            c.infer("chain", {"x": x})
        assert e.value.status == 413 and "4 MB" in str(e.value)
        assert c.infer("chain", {"x": np.ones((1, 3, 2, 2), np.float32)}).outputs["z"].shape


def test_truncated_body_fails_alone(served) -> None:
    _, sock = served
    x = np.ones((1, 3, 64, 64), np.float32)
    body, headers = encode_infer_request({"x": x})
    head = (
        "POST /v2/models/chain/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(body)}\r\n{HEADER_LENGTH}: {headers[HEADER_LENGTH]}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(sock)
        s.sendall(head + body[: len(body) // 2])
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    except OSError:
        answer = b""
    finally:
        s.close()
    # either a 400 naming the short body or a closed connection; never a 200
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]
    with Client(sock) as c:
        np.testing.assert_array_equal(c.infer("chain", {"x": x}).outputs["z"], x * 3)
