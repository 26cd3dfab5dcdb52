"""The gRPC gate (infscaler.api.grpc.gate) against uid 65534 in the socket's group, with
small quotas: a call's bytes held from its message prefix (a raw HTTP/2 client's
over-budget call refused before the rest of its message is sent; tritonclient gets the
same status, then its connection serves the next call), partial messages bounded by the
uid's budget and closed after the body timeout, unread responses holding the uid's
budget until it closes, the per-uid stream quota; and root served throughout."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from infscaler.api.client import Client  # noqa: E402
from infscaler.api.http import HttpLimits  # noqa: E402
from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.base.config import load_pipeline  # noqa: E402
from infscaler.base.quotas import PeerQuotas  # noqa: E402
from infscaler.base.security import SecurityPolicy  # noqa: E402
from infscaler.service.service import Service  # noqa: E402
from tests import TESTS_DIR  # noqa: E402
from tests.helpers import chain_pipeline, wait_for  # noqa: E402
from tests.integration.api.test_grpc import _NOBODY, GROUP, _as_nobody  # noqa: E402

BUDGET_MB = 2.5  # the uid's in-flight budget (1e6 bytes a MB)
BODY_TIMEOUT_S = 5.0
KEEPALIVE_S = 10.0  # grpcio closes a connection with no call open after it
STREAMS = 4  # calls one uid may have open
ROWS = 37_500  # 600 KB of FP32: 1.2 MB reserved a call

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: clients run as 65534")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("gate")
    public = Path(tempfile.mkdtemp(prefix="isc-gate-t-"))
    public.chmod(0o711)
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{TESTS_DIR}{os.pathsep}{old}" if old else str(TESTS_DIR)
    sys.path.insert(0, str(TESTS_DIR))
    limits = HttpLimits(
        header_timeout_s=BODY_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        keepalive_timeout_s=KEEPALIVE_S,
        quotas=PeerQuotas(streams_per_uid=STREAMS),
    )
    try:
        with Service(
            state_dir=tmp / "state",
            control_path="userspace",
            pool_mb=64,
            max_inflight_mb_per_uid=BUDGET_MB,
        ) as svc:
            svc.deploy(load_pipeline(chain_pipeline(ms=50)))
            http, grpc_sock = str(public / "api.sock"), str(public / "api-grpc.sock")
            with ServerThread(
                svc,
                http,
                security=SecurityPolicy.create(allow_functions=["stagefuncs"]),
                socket_group=GROUP,
                grpc_socket=grpc_sock,
                limits=limits,
            ) as st:
                yield {"http": http, "grpc": grpc_sock, "svc": svc, "gate": st._grpc.gate}
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(TESTS_DIR))


def _held(served) -> int:
    with Client(served["http"]) as h:
        return h.status()["inflight"]["inflight_bytes"]


def _line(proc) -> object:
    """The next JSON line the client prints; its stderr if it printed none."""
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(
            f"the client printed nothing: {proc.communicate(timeout=30)[1][-3000:]}"
        )
    return json.loads(line)


def _root_is_served(served) -> None:
    c = tg.InferenceServerClient(url="unix:" + served["grpc"])
    try:
        x = np.ones((1, 4), np.float32)
        i = tg.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        assert c.infer("chain", [i]).as_numpy("y").tolist() == [[2.0] * 4]
    finally:
        c.close()


#: a hand-made HTTP/2 client (RFC 9113 frames; header fields as HPACK literals)
_RAW = (
    _NOBODY
    + r"""
import socket, time
from infscaler.api.grpc import h2frames as h2
from infscaler.proto import grpc_service_pb2 as pb
PATH = "/inference.GRPCInferenceService/ModelInfer"
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
    frames(s, lambda f: f[0] == h2.SETTINGS and not f[1] & h2.ACK)
    s.sendall(h2.frame(h2.SETTINGS, h2.ACK, 0))  # grpcio's windows (4 MiB) hold from now
    return s
def call(s, stream, end=False):
    block = b"".join(h2.hpack_literal(k, v) for k, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH.encode()),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")])
    s.sendall(h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0), stream, block))
def data(s, stream, payload, end=False):
    s.sendall(h2.frame(h2.DATA, h2.END_STREAM if end else 0, stream, payload))
def prefix(n):
    return b"\0" + n.to_bytes(4, "big")
BUF = {}  # socket -> bytes read and not yet parsed
def frames(s, until, timeout=30.0):
    # frames read until ``until(frame)`` is true (or EOF / timeout): [(type, flags, stream, payload)]
    s.settimeout(timeout)
    out = []
    while True:
        buf = BUF.get(s, b"")
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            f = (buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n])
            buf = BUF[s] = buf[9 + n:]
            out.append(f)
            if until(f):
                return out, "ok"
        try:
            d = s.recv(65536)
        except socket.timeout:
            return out, "timeout"
        if not d:
            return out, "eof"
        BUF[s] = buf + d
def status(block):
    # grpc-status and grpc-message of a block of raw literals (the gate's own)
    out, i = {}, 0
    while i < len(block):
        n = block[i + 1]; name = block[i + 2:i + 2 + n]; i += 2 + n
        m = block[i]; i += 1
        if m == 0x7F:
            m, sh = 0x7F, 0
            while True:
                b = block[i]; i += 1; m += (b & 0x7F) << sh; sh += 7
                if not b & 0x80: break
        out[name.decode()] = block[i:i + m].decode(); i += m
    return [int(out["grpc-status"]), out["grpc-message"]]
def ends(stream):
    return lambda f: f[2] == stream and f[0] == h2.HEADERS and f[1] & h2.END_STREAM
def trickle(s, stream):  # a byte of the message every 0.5 s: never quiet for long
    import threading
    def run():
        try:
            while True:
                time.sleep(0.5); data(s, stream, b"\0")
        except OSError:
            pass
    threading.Thread(target=run, daemon=True).start()
def say(obj):
    print(json.dumps(obj), flush=True)
"""
)

_OVER_BUDGET = (
    _RAW
    + r"""
s = connect()
call(s, 1); data(s, 1, prefix(1_200_000) + b"\0" * 1000)  # holds 2.4 MB, partial
trickle(s, 1)
call(s, 3); data(s, 3, prefix(600_000) + b"\0" * 1000)  # 1.2 MB more: over 2.5 MB
got, how = frames(s, ends(3))
more, _ = frames(s, lambda f: f[0] == h2.WINDOW_UPDATE and f[3] == (1005).to_bytes(4, "big"), 10)
say({"how": how, "status": status(got[-1][3]) if how == "ok" else None,
     "window_updates": [int.from_bytes(f[3], "big") for f in got + more if f[0] == h2.WINDOW_UPDATE and f[2] == 0]})
sys.stdin.readline()
s.close()
"""
)


def test_a_call_over_the_budget_is_refused_at_its_prefix(served) -> None:
    """A raw client holds 2.4 MB with a partial message, then declares 0.6 MB more on a
    second call with its first 1000 bytes: that call is refused (UNAVAILABLE, the
    budget's reason) without the rest being sent, its dropped bytes given back to the
    connection window; root is served meanwhile; once the client closes, nothing is
    held."""
    before = _held(served)
    proc = _as_nobody(_OVER_BUDGET, served["grpc"], "", str(GROUP))
    try:
        got = _line(proc)
        assert got and got["how"] == "ok", got
        code, message = got["status"]
        assert code == 14 and "in-flight memory budget" in message, got
        assert "budget of one user" in message and "retry after" in message
        assert 1000 + 5 in got["window_updates"], got
        assert _held(served) - before == 2_400_000
        _root_is_served(served)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    wait_for(lambda: _held(served) == before, 30, "the gate to release the closed call")


_PARTIALS = (
    _RAW
    + r"""
conns = [connect() for _ in range(3)]
for s in conns:  # each declares 0.6 MB (1.2 MB held) and sends 10 bytes of it
    call(s, 1); data(s, 1, prefix(600_000) + b"\0" * 10)
time.sleep(0.5)
say("sent")
t0 = time.monotonic()
out = []
for s in conns:
    got, how = frames(s, ends(1), timeout=60)
    if how == "ok":  # refused: the budget holds two
        out.append(["refused", status(got[-1][3])[0]])
        got, how = frames(s, lambda f: False, timeout=60)
    out.append([how, round(time.monotonic() - t0, 1)])
say(out)
"""
)


def test_partial_messages_hold_at_most_the_budget_and_are_closed_after_the_body_timeout(
    served,
) -> None:
    before = _held(served)
    proc = _as_nobody(_PARTIALS, served["grpc"], "", str(GROUP))
    try:
        assert _line(proc) == "sent"
        held = _held(served) - before
        assert held == 2_400_000, held  # two of three: 2.4 MB of the 2.5 MB budget
        _root_is_served(served)
        out = _line(proc)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert out.count(["refused", 14]) == 1, out
    closes = [o for o in out if o[0] != "refused"]
    assert [o[0] for o in closes] == ["eof"] * 3, out
    # closed by the gate (the partial ones, body timeout) or grpcio (the refused one,
    # idle), not by the client's 60-s wait
    assert all(o[1] < 45 for o in closes), out
    wait_for(lambda: _held(served) == before, 30, "the gate to release the closed calls")


_UNREAD = (
    _RAW
    + r"""
x = np.ones((int(sys.argv[4]), 4), np.float32)
req = pb.ModelInferRequest(model_name="chain")
inp = req.inputs.add(); inp.name = "x"; inp.datatype = "FP32"; inp.shape.extend(x.shape)
req.raw_input_contents.append(x.tobytes())
msg = req.SerializeToString()
s = connect()
call(s, 1)
for k in range(0, len(msg) + 5, 16384):  # the whole call, then its response is not read
    chunk = (prefix(len(msg)) + msg)[k:k + 16384]
    data(s, 1, chunk, end=k + 16384 >= len(msg) + 5)
got, how = frames(s, lambda f: f[2] == 1 and (f[0] == h2.DATA or f[1] & h2.END_STREAM))
say({"first": [how, got[-1][0] if got else None]})  # its first bytes came
sys.stdin.readline()
call(s, 3); data(s, 3, prefix(len(msg)) + msg[:1000])
got, how = frames(s, ends(3))
say({"how": how, "status": status(got[-1][3]) if how == "ok" else None})
sys.stdin.readline()
s.close()
"""
)


def test_a_client_that_does_not_read_its_responses_holds_its_own_budget(served) -> None:
    """A raw client that never gives the server flow-control window (does not read its
    responses): its response's length is charged to its uid while it waits, so its next
    call is refused; the bytes come back when it closes."""
    before = _held(served)
    proc = _as_nobody(_UNREAD, served["grpc"], "", str(GROUP), str(ROWS))
    try:
        first = _line(proc)
        assert first == {"first": ["ok", 0]}, first
        # the request (2 x 0.6 MB) and the unread response (0.6 MB) are the uid's
        assert wait_for(lambda: _held(served) - before >= 1_800_000, 30, "the charge")
        proc.stdin.write("next\n")
        proc.stdin.flush()
        got = _line(proc)
        assert got and got["how"] == "ok" and got["status"][0] == 14, got
        assert "in-flight memory budget" in got["status"][1]
        _root_is_served(served)
        proc.stdin.write("close\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    wait_for(lambda: _held(served) == before, 30, "the unread response's bytes back")


_STREAMS = (
    _RAW
    + r"""
s = connect()
for k in range(int(sys.argv[4])):  # calls opened and left waiting for their message
    call(s, 2 * k + 1)
call(s, 2 * int(sys.argv[4]) + 1)
got, how = frames(s, ends(2 * int(sys.argv[4]) + 1))
say({"how": how, "status": status(got[-1][3]) if how == "ok" else None})
"""
)


def test_the_stream_quota_refuses_a_call_past_it(served) -> None:
    proc = _as_nobody(_STREAMS, served["grpc"], "", str(GROUP), str(STREAMS))
    try:
        got = _line(proc)
        assert got and got["how"] == "ok"
        code, message = got["status"]
        assert code == 8 and f"at most {STREAMS} per user" in message, got
        assert served["gate"].streams.get(65534) == STREAMS
        _root_is_served(served)  # root is not counted
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    wait_for(lambda: 65534 not in served["gate"].streams, 30, "the calls released")


_TRITON_AFTER_REFUSAL = (
    _RAW
    + r"""
from tritonclient.utils import InferenceServerException
hold = connect()
call(hold, 1); data(hold, 1, prefix(1_200_000) + b"\0")  # 2.4 MB held, kept alive
trickle(hold, 1)
c = tg.InferenceServerClient(url="unix:" + sys.argv[1])
x = np.ones((int(sys.argv[4]), 4), np.float32)
i = tg.InferInput("x", list(x.shape), "FP32"); i.set_data_from_numpy(x)
out = {}
try:
    c.infer("chain", [i])
    out["first"] = ["OK", ""]
except InferenceServerException as e:
    out["first"] = [e.status(), e.message()]
say(out)
sys.stdin.readline()  # the test counted connections
hold.close()
time.sleep(0.5)
r = c.infer("chain", [i])
say({"second": float(r.as_numpy("y").sum())})
sys.stdin.readline()
"""
)


def test_tritonclient_gets_the_refusal_and_its_connection_serves_the_next_call(served) -> None:
    gate = served["gate"]
    proc = _as_nobody(_TRITON_AFTER_REFUSAL, served["grpc"], "", str(GROUP), str(ROWS))
    try:
        got = _line(proc)
        assert got
        code, message = got["first"]
        assert code == "StatusCode.UNAVAILABLE" and "in-flight memory budget" in message, got
        accepted = gate.accepted
        proc.stdin.write("go\n")
        proc.stdin.flush()
        second = _line(proc)
        assert second == {"second": 2.0 * ROWS * 4}
        assert gate.accepted == accepted  # the same connection
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


_SILENT = (
    _RAW
    + r"""
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
t0 = time.monotonic()
got, how = frames(s, lambda f: False, timeout=60)
say([how, time.monotonic() - t0])
"""
)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(served) -> None:
    proc = _as_nobody(_SILENT, served["grpc"], "", str(GROUP))
    stdout, stderr = proc.communicate(timeout=90)
    how, after = json.loads(stdout.strip().splitlines()[-1] if stdout.strip() else "null")
    assert how == "eof" and BODY_TIMEOUT_S / 2 < after < 45, (how, after, stderr[-2000:])


def test_a_client_that_sends_its_preface_and_closes_at_once_is_let_go(served) -> None:
    """The client's EOF can reach the gate before it relays (while it connects to
    grpcio): the connection still ends then, not when grpcio's keep-alive runs out."""
    import socket
    import time

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(served["grpc"])
        # the HTTP/2 preface and an empty SETTINGS frame, then the write side closed
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(3 * KEEPALIVE_S)
        t0 = time.monotonic()
        while sock.recv(65536):
            pass
        after = time.monotonic() - t0
    finally:
        sock.close()
    assert after < KEEPALIVE_S / 2, f"the connection ended {after:.1f} s after the client's EOF"
