"""Requests pending per client uid over both sockets (runtime.serving.admission's
``admit_pending``): uid 65534 in the socket's group holds its share of requests pending
(two over HTTP and one over gRPC, held in a stage until the test releases them); its next
request is refused at once over both protocols (503 with Retry-After / UNAVAILABLE, the
quota named), while another uid and root are admitted; once the held requests are
answered no count is left. And a request's timeout never passes its pipeline's
``request_timeout_s``, over HTTP and gRPC."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.base.config import load_pipeline  # noqa: E402
from infscaler.base.security import SecurityPolicy  # noqa: E402
from infscaler.service.service import Service  # noqa: E402
from tests import TESTS_DIR  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.integration.api.grpc_attacks import run_as  # noqa: E402
from tests.integration.api.test_security import GROUP, OTHER_UID, call  # noqa: E402

NOBODY = 65534
PENDING_PER_UID = 3
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}


def _pipeline(name: str, last: dict, **over) -> dict:
    return {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["y"],
        "stages": [
            {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
            {"inputs": ["y"], "outputs": ["y"], **last},
        ],
        **over,
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """``held`` (its second stage waits for the file ``release``), ``fast`` and ``short``
    (request_timeout_s 1, a 5-s stage) on an HTTP and a gRPC socket of group GROUP, with
    PENDING_PER_UID requests pending per uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the clients run as uids 65534 / 65533 in the socket's group")
    tmp = tmp_path_factory.mktemp("pending")
    public = Path(tempfile.mkdtemp(prefix="isc-pend-"))
    public.chmod(0o711)
    release = public / "release"
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{TESTS_DIR}{os.pathsep}{old}" if old else str(TESTS_DIR)
    sys.path.insert(0, str(TESTS_DIR))
    hold = {"name": "hold", "function": "stagefuncs:hold", "params": {"path": str(release)}}
    slow = {"name": "slow", "function": "stagefuncs:slow", "params": {"ms": 5000}}
    try:
        with Service(
            state_dir=tmp / "state",
            control_path="userspace",
            pool_mb=64,
            pending_per_uid=PENDING_PER_UID,
            operator_pending=2,
        ) as svc:
            svc.deploy(load_pipeline(_pipeline("held", hold)))
            fast = _pipeline("fast", hold)
            del fast["stages"][1]
            svc.deploy(load_pipeline(fast))
            svc.deploy(load_pipeline(_pipeline("short", slow, request_timeout_s=1)))
            http_sock, grpc_sock = str(public / "api.sock"), str(public / "api-grpc.sock")
            with ServerThread(
                svc,
                http_sock,
                security=SecurityPolicy.create(allow_functions=["stagefuncs"]),
                socket_group=GROUP,
                grpc_socket=grpc_sock,
            ):
                yield {"http": http_sock, "grpc": grpc_sock, "svc": svc, "release": release}
    finally:
        release.touch()
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(TESTS_DIR))


# the client as uid 65534: imports as root (the venv is root's), then drops to nobody
_HOLDER = r"""
import http.client, json, os, socket, sys, threading
import numpy as np
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException
os.setgroups([int(sys.argv[3])])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
http_sock, grpc_sock = sys.argv[1], sys.argv[2]
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                               "data": [1.0] * 4}]}).encode()
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(http_sock)
def post(model):
    c = Unix("infscaler", timeout=120)
    try:
        c.request("POST", f"/v2/models/{model}/infer", body=BODY,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return [r.status, json.loads(r.read()).get("error", ""), r.getheader("Retry-After")]
    finally:
        c.close()
g = tg.InferenceServerClient(url="unix:" + grpc_sock)
def ginfer(model):
    i = tg.InferInput("x", [1, 4], "FP32"); i.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        g.infer(model, [i], client_timeout=120)
        return ["OK", ""]
    except InferenceServerException as e:
        return [e.status().removeprefix("StatusCode."), e.message()]
held = {}
ts = [threading.Thread(target=lambda k=k: held.__setitem__(k, post("held"))) for k in "ab"]
ts.append(threading.Thread(target=lambda: held.__setitem__("grpc", ginfer("held"))))
for t in ts: t.start()
sys.stdin.readline()  # the parent saw them pending
out = {}
for proto, fn in (("grpc", ginfer), ("http", post)):
    out[proto] = [*fn("fast"), sorted(held)]
print(json.dumps(out), flush=True)
for t in ts: t.join(120)
print(json.dumps(held), flush=True)
"""


def _status(sock: str) -> dict:
    status, body = call(sock, "GET", "/v2/infscaler/status")
    assert status == 200, body
    return body["frontend"]  # type: ignore[index]


def test_a_uid_holds_its_share_of_pending_requests_over_http_and_grpc(served) -> None:
    svc, frontend = served["svc"], served["svc"].frontend
    before = dict(frontend.counters)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, served["http"], served["grpc"], str(GROUP)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: frontend.pending_by_uid() == {NOBODY: PENDING_PER_UID},
            60,
            f"uid {NOBODY}'s {PENDING_PER_UID} requests pending",
        )
        st = _status(served["http"])
        assert (st["pending"], st["pending_uids"], st["pending_uid_max"]) == (3, 1, 3), st
        proc.stdin.write("go\n")
        proc.stdin.flush()
        refused = json.loads(proc.stdout.readline() or "null")
        assert refused is not None, proc.stderr.read()[-2000:]
        # another uid in the group, and root, are admitted meanwhile (other pipeline)
        # (a fresh interpreter, not a fork: this process runs the gRPC server's threads)
        other = run_as("http_infer", served["http"], "fast", uid=OTHER_UID, group=GROUP)
        root = call(served["http"], "POST", "/v2/models/fast/infer", X)
        assert frontend.pending_by_uid() == {NOBODY: PENDING_PER_UID}  # still held
        assert not served["release"].exists()
    finally:
        served["release"].touch()
    held_out, err = proc.communicate(timeout=120)
    served["release"].unlink()
    assert proc.returncode == 0, err[-2000:]
    held = json.loads(held_out.strip().splitlines()[-1])
    # refused at once: while its 3 requests were all still held, the quota named
    code, message, done = refused["grpc"]
    assert code == "UNAVAILABLE" and "--max-pending-per-uid" in message, refused
    assert "at most 3 per user" in message and "retry after 1 s" in message, refused
    status, error, retry_after, done_http = refused["http"]
    assert status == 503 and "too many requests pending from your uid" in error, refused
    assert retry_after is not None and float(retry_after) >= 1, refused
    assert done == done_http == [], refused  # none of the held had been answered
    assert other[0] == 200 and root[0] == 200, (other, root)
    assert held == {"a": [200, "", None], "b": [200, "", None], "grpc": ["OK", ""]}, held
    # every count came back; each refusal counted under its reason
    wait_for(lambda: frontend.pending_by_uid() == {}, 30, "no request pending per uid")
    st = _status(served["http"])
    assert (st["pending"], st["pending_uids"], st["pending_uid_max"]) == (0, 0, 0), st
    assert frontend.counters["uid_quota"] - before.get("uid_quota", 0) == 2
    assert svc.deployment("fast").route.refusals["uid_quota"] == 2
    assert st["uid_quota"] >= 2


def _timeout_s(message: str) -> float:
    """The timeout an expiry message names, s."""
    m = re.search(r"no result within its timeout \(([0-9.]+) s\)", message)
    assert m, message
    return float(m.group(1))


def test_a_requests_timeout_never_passes_its_pipelines(served) -> None:
    """``short`` allows 1 s and its stage takes 5: a request asking for an hour
    (``timeout_ms`` over HTTP, the call's deadline over gRPC) times out with 503 /
    UNAVAILABLE at the pipeline's second; with the hour it would have been answered."""
    body = {**X, "parameters": {"timeout_ms": 3_600_000}}
    status, out = call(served["http"], "POST", "/v2/models/short/infer", body)
    assert status == 503 and "request timed out" in out["error"], out  # type: ignore[index]
    assert 0.5 < _timeout_s(out["error"]) <= 1.0, out  # type: ignore[index]
    c = tg.InferenceServerClient(url="unix:" + served["grpc"])
    try:
        i = tg.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as exc:
            c.infer("short", [i], client_timeout=3600)
    finally:
        c.close()
    assert exc.value.status() == "StatusCode.UNAVAILABLE", exc.value
    assert 0.5 < _timeout_s(exc.value.message()) <= 1.0, exc.value
    wait_for(lambda: served["svc"].frontend.pending() == 0, 30, "nothing pending")
