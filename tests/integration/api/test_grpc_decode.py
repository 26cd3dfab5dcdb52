"""gRPC messages bounded before protobuf inflates them (infscaler.api.grpc.wire and the
handlers), end to end against ``infscaler serve`` in its own process (so its RSS is
its own), attacked by uid 65534 in the socket's group over a raw grpc channel: a
64 MB-class typed INT8 message (1-byte varints: 8x parsed) and 100 k empty inputs are
refused with the service's peak RSS growth bounded, a 2 MB SystemSharedMemoryRegister
is RESOURCE_EXHAUSTED; root is served after each; and while a large typed-contents
decode of uid 65534 runs, root's HTTP /v2/health/ready keeps answering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from tests.helpers import wait_for  # noqa: E402
from tests.integration.api.test_hostile import _rss_mb, root_service  # noqa: E402
from tests.integration.api.test_security import CHAIN, GROUP, call  # noqa: E402

MAX_BODY_MB = 64

_CLIENT = r"""
import json, os, sys, time
import grpc
import grpc._channel, grpc._utilities, copy  # noqa: E401,F401 - before root's 0700 home hides them
os.setgroups([int(sys.argv[2])])  # imported as root (the venv is root's), now nobody
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)

def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)

def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload

def infer(contents, datatype, shape):
    dims = b"".join(varint(d) for d in shape)
    tensor = field(1, b"x") + field(2, datatype) + field(3, dims) + field(5, contents)
    return field(1, b"chain") + field(5, tensor)

kind, n = sys.argv[3], int(sys.argv[4])
method = "ModelInfer"
if kind == "int8":  # typed INT8 of 1-byte varints
    message = infer(field(2, b"\x01" * n), b"INT8", [n])
elif kind == "fp32":  # typed FP32, packed: n x 4 values
    message = infer(field(6, b"\x00\x00\x80\x3f" * (4 * n)), b"FP32", [n, 4])
elif kind == "inputs":
    message = field(1, b"chain") + field(5, b"") * n
elif kind == "register":
    method = "SystemSharedMemoryRegister"
    message = field(1, b"r" * n) + field(2, b"/isc_nokey") + b"\x20\x40"
opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
with grpc.insecure_channel("unix:" + sys.argv[1], options=opts) as ch:
    call = ch.unary_unary("/inference.GRPCInferenceService/" + method)
    t0 = time.monotonic()
    print("sending", flush=True)
    try:
        reply = call(message, timeout=120)
        out = ["OK", len(reply)]
    except grpc.RpcError as e:
        out = [e.code().name, e.details()]
print(json.dumps(out + [time.monotonic() - t0, len(message)]), flush=True)
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.skip("needs root: the clients are switched to uid 65534")
    args = ["--max-inflight-mb", "512", "--max-body-mb", str(MAX_BODY_MB)]
    tmp = tmp_path_factory.mktemp("grpc-decode")
    with root_service(tmp, [CHAIN], args, pool_mb=256) as served:
        wait_for(lambda: os.path.exists(served["grpc"]), 60, "the gRPC socket")
        yield served


def _attack(svc: dict, kind: str, n: int) -> tuple[list, float]:
    """uid 65534's call ``kind`` of size ``n``: ``([code, detail, seconds, message
    bytes], growth of the service's peak RSS, MB)``."""
    pid = svc["proc"].pid
    before = _rss_mb(pid)
    with open(f"/proc/{pid}/clear_refs", "w") as f:  # VmHWM := VmRSS
        f.write("5")
    proc = subprocess.run(
        [sys.executable, "-c", _CLIENT, svc["grpc"], str(GROUP), kind, str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out, _hwm_mb(pid) - before


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _root_is_served(svc: dict) -> None:
    assert svc["proc"].poll() is None, svc["log"].read_text()[-3000:]
    assert call(svc["sock"], "GET", "/v2/health/ready")[0] == 200
    c = tg.InferenceServerClient(url="unix:" + svc["grpc"])
    try:
        i = tg.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert c.infer("chain", [i]).as_numpy("z").tolist() == [[3.0, 3.0, 3.0, 3.0]]
    finally:
        c.close()


def test_a_64_mb_typed_int8_message_is_refused_with_rss_bounded(svc) -> None:
    """60 M 1-byte varints: upb alone would hold 256 MB (int32 elements, doubled);
    refused by the scan before anything is parsed. What the service holds at its peak
    is the message (grpc's buffers and its bytes object), not its parse: < 5x."""
    n = 60 << 20
    (code, detail, _, size), growth = _attack(svc, "int8", n)
    assert code == "RESOURCE_EXHAUSTED", detail
    assert "more than twice the message" in detail and "raw_input_contents" in detail
    assert growth < 5 * size / 2**20, (growth, size)  # measured: ~3x
    _root_is_served(svc)


def test_100k_empty_inputs_are_refused(svc) -> None:
    (code, detail, _, size), growth = _attack(svc, "inputs", 100_000)
    assert code == "INVALID_ARGUMENT" and "more than 1024 inputs" in detail, detail
    assert growth < 64, growth  # 200 KB on the wire; parsed it would be ~9 MB
    _root_is_served(svc)


def test_a_2_mb_register_message_is_refused_unparsed(svc) -> None:
    (code, detail, _, size), _ = _attack(svc, "register", 2 << 20)
    assert code == "RESOURCE_EXHAUSTED", detail
    assert f"{size} bytes; at most 1024 KB" in detail
    _root_is_served(svc)


def test_http_health_answers_while_a_large_typed_decode_runs(svc) -> None:
    """uid 65534's 16 MB typed FP32 message (4 M values: within twice the message) is
    decoded in a worker thread; root's health requests meanwhile each answer in < 1 s
    (a wide bound: the decode takes ~0.2 s on one core; that it leaves the event loop
    is tests/unit/api/test_grpc_handlers.py's)."""
    rows = 1 << 20
    lat: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            assert call(svc["sock"], "GET", "/v2/health/ready")[0] == 200
            lat.append(time.monotonic() - t0)
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        (code, detail, seconds, _), _ = _attack(svc, "fp32", rows)
    finally:
        done.set()
        t.join(30)
    assert code == "OK", detail
    assert lat and max(lat) < 1.0, (max(lat), seconds)
    assert len(lat) >= 3, lat
    _root_is_served(svc)
