"""Binary tensor data over HTTP is read straight into the request's first pool slot (one
of the front end's idle out-tokens, no copy at the hand-over), on the eBPF / user-space
control path alike; a client that sends less than it declared, or a request refused
after its body was read, gives the slot back: the front end holds the same out-tokens
afterwards, the manager's audit is clean and the next request is answered."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.api.client import Client
from infscaler.api.codec import HEADER_LENGTH, encode_infer_request
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = np.arange(64 * 1024, dtype=np.float32).reshape(-1, 4)  # 256 KB


@pytest.fixture(params=["userspace", "auto"])
def served(request, tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path=request.param, pool_mb=32) as svc:
        sock = str(tmp_path / "api.sock")
        with ServerThread(svc, sock, max_body_mb=4):
            svc.deploy(load_pipeline(chain_pipeline(1)))
            yield svc, sock


def _raw(sock: str, head: bytes, body: bytes, *, declared: int, close: bool = True) -> bytes:
    """One HTTP request on a new connection: ``body`` sent, ``declared`` as its
    Content-Length; then a half-close and whatever the server answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(sock)
    s.sendall(head.replace(b"{LEN}", str(declared).encode()) + body)
    if close:
        s.shutdown(socket.SHUT_WR)
    out = b""
    with s:
        while chunk := s.recv(65536):
            out += chunk
    return out


def _idle(svc: Service) -> None:
    wait_for(lambda: svc.frontend.pending() == 0, 10, "no request pending")
    time.sleep(0.1)  # the last answers' receipts and keeps


def test_inputs_are_read_into_the_slot_and_every_way_out_gives_it_back(served) -> None:
    svc, sock = served
    client = svc.frontend.client
    with Client(sock) as c:
        for _ in range(5):  # the front end keeps result slots: inputs then fit in them
            np.testing.assert_array_equal(c.infer("chain", {"x": X}).outputs["y"], X * 2)
    _idle(svc)
    assert client.out_tokens(), "the front end keeps result slots as out-tokens"
    faults, hits = client.counters["faults"], client.counters["out_token_hits"]
    lent: list[tuple] = []
    hand_over_lent = client.hand_over_lent
    client.hand_over_lent = lambda *a: (lent.append(a), hand_over_lent(*a))[1]  # type: ignore[method-assign]
    with Client(sock) as c:
        for i in range(5):
            np.testing.assert_array_equal(c.infer("chain", {"x": X + i}).outputs["y"], (X + i) * 2)
    _idle(svc)
    # each input went into a kept slot; none was faulted for
    assert client.counters["faults"] == faults
    assert client.counters["out_token_hits"] - hits >= 5
    assert len(lent) == 5  # every one read into its slot, handed over as it was
    held = sorted((t.slab, t.slot) for t in client.out_tokens())

    body, headers = encode_infer_request({"x": X})
    hl = int(headers[HEADER_LENGTH])
    head = (
        b"POST /v2/models/chain/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/octet-stream\r\n" + f"{HEADER_LENGTH}: {hl}\r\n".encode()
    ) + b"Content-Length: {LEN}\r\nConnection: close\r\n\r\n"
    # less than declared, then the client goes away: 400 (or the connection closed)
    answer = _raw(sock, head, body[: hl + 1000], declared=len(body))
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    # read in full, refused after: a timeout parameter that is not a number
    bad = json.loads(body[:hl])
    bad["parameters"] = {"timeout_ms": "soon"}
    bad_head = json.dumps(bad).encode()
    bad_body = bad_head + body[hl:]
    bad_hdr = head.replace(
        f"{HEADER_LENGTH}: {hl}".encode(), f"{HEADER_LENGTH}: {len(bad_head)}".encode()
    )
    answer = _raw(sock, bad_hdr, bad_body, declared=len(bad_body))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    _idle(svc)
    assert sorted((t.slab, t.slot) for t in client.out_tokens()) == held
    assert svc.manager.audit() == []
    with Client(sock) as c:
        np.testing.assert_array_equal(c.infer("chain", {"x": X}).outputs["y"], X * 2)
    assert svc.manager.audit() == []


def test_concurrent_clients_find_a_slot_idle_for_their_inputs(served) -> None:
    # a closed loop of 4 clients: each answer's slot is kept before the answer is sent,
    # and a request read without one makes the front end fault a spare, so most readers
    # find a slot idle; every answer right, the audit clean
    svc, sock = served
    client = svc.frontend.client
    lent: list[tuple] = []
    hand_over_lent = client.hand_over_lent
    client.hand_over_lent = lambda *a: (lent.append(a), hand_over_lent(*a))[1]  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def loop(k: int) -> None:
        try:
            with Client(sock) as c:
                for i in range(12):
                    y = c.infer("chain", {"x": X + k + i}).outputs["y"]
                    np.testing.assert_array_equal(y, (X + k + i) * 2)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(lent) >= 24, f"{len(lent)} of 48 requests were read into a lent slot"
    _idle(svc)
    assert svc.manager.audit() == []
