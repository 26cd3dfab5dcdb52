"""Hostile clients of the socket: none can crash, starve or fill the service.

The service runs as root in its own process (``infscaler serve``, so a crash shows as a
dead pid, not a dead test run) with small quotas; every attack runs from a forked child
that drops to uid 65534 (nobody) with only the socket's group, talking HTTP with the
standard library (``tests/integration/api/test_security.py``'s client). After each attack,
the service's pid is unchanged, it answers another user and the operator, and what it
holds (fds, RSS) is bounded.

Classes: shrinking a registered shared memory object under reads and writes (SIGBUS
before), registering regions without end (fds), opening connections without end,
large bodies on the routes that are not inference (memory), and the log flood that
refusals make.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infscaler.api.client import Client
from tests import TESTS_DIR
from tests.helpers import wait_for
from tests.integration.api.grpc_attacks import shrink_loop
from tests.integration.api.test_security import CHAIN, GROUP, OTHER_UID, as_user, call

NOBODY_UID = 65534

HERE = TESTS_DIR
QUOTAS = {
    "--max-regions-per-uid": 4,
    "--max-regions": 6,
    "--max-connections": 40,
    "--max-connections-per-uid": 8,
    "--operator-connections": 4,
    "--max-inflight-mb": 64,
    "--max-inflight-mb-per-uid": 8,
    "--max-body-mb": 4,
    "--max-json-mb": 1,
    "--max-pending-per-uid": 32,
}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.skip("needs root: the clients are switched to uid 65534 / 65533")
    args = [str(a) for kv in QUOTAS.items() for a in kv]
    with root_service(tmp_path_factory.mktemp("hostile"), [CHAIN], args) as served:
        yield served


X = [[1.0, 2.0, 3.0, 4.0]]
INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": X}]}


def _still_whole(svc: dict) -> None:
    """The service did not die or restart, and another user and the operator are served."""
    assert svc["proc"].poll() is None, svc["log"].read_text()[-3000:]
    status, res = as_user(call, svc["sock"], "POST", "/v2/models/chain/infer", INFER, uid=OTHER_UID)
    assert status == 200 and res["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0], res
    status, _ = call(svc["sock"], "GET", "/v2/health/ready")
    assert status == 200


# -- client shared memory that shrinks under the service ----------------------------------


def _shrink_race(sock: str, rounds: int) -> dict[str, int]:
    """Register a region, shrink its object to 0 and back in a loop, and send inferences
    reading their input from it and writing their output to it meanwhile."""
    import numpy as np

    from infscaler.api.sysshm import SharedMemoryRegion

    key = f"isc_hostile_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    size = 4096
    region = SharedMemoryRegion.create(key, size, group=True)
    region.set(np.array(X, np.float32))
    statuses: dict[str, int] = {}
    stop = threading.Event()
    try:
        for name, off in (("in", 0), ("out", 2048)):
            st, res = call(
                sock,
                "POST",
                f"/v2/systemsharedmemory/region/{name}/register",
                {"key": key, "offset": off, "byte_size": 2048},
            )
            assert st == 200, res

        data = np.array(X, np.float32).tobytes()
        t = threading.Thread(target=shrink_loop, args=(key, size, data, stop), daemon=True)
        t.start()
        shm_in = {"shared_memory_region": "in", "shared_memory_byte_size": 16}
        shm_out = {"shared_memory_region": "out", "shared_memory_byte_size": 16}
        for i in range(rounds):
            body: dict = {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": shm_in}]
            }
            if i % 2:
                body["outputs"] = [{"name": "z", "parameters": shm_out}]
            st, res = call(sock, "POST", "/v2/models/chain/infer", body)
            key_ = str(st)
            if st == 200 and i % 2 == 0:
                # served from a whole read: the input as written, never torn
                ok = res["outputs"][0]["data"] in ([3.0, 5.0, 7.0, 9.0], [1.0, 1.0, 1.0, 1.0])
                key_ = "200" if ok else "200-wrong"
            if st == 400:
                assert "shrank" in res["error"] or "beyond" in res["error"], res
            statuses[key_] = statuses.get(key_, 0) + 1
    finally:
        stop.set()
        call(sock, "POST", "/v2/systemsharedmemory/unregister")
        region.close()
    return statuses


def test_a_shrinking_region_under_reads_and_writes_never_crashes_the_service(svc) -> None:
    pid = svc["proc"].pid
    statuses = as_user(_shrink_race, svc["sock"], 300)
    assert set(statuses) <= {"200", "400"}, statuses
    assert sum(statuses.values()) == 300
    assert svc["proc"].pid == pid
    _still_whole(svc)


# -- shared memory inputs larger than the service should hold -------------------------------


def _shm_reads(sock: str, rows: list[int]) -> list[tuple[int, str]]:
    """Register a sparse 1.2 GB object (free to its creator) and infer with an input of
    ``rows`` x 4 FP32 read from it, for each entry of ``rows``: (status, error) each."""
    key = f"isc_hostile_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    size = 2000 * 224 * 224 * 3 * 4  # an FP32 [2000, 224, 224, 3] batch
    fd = os.open("/dev/shm/" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)  # sparse: no page is committed until the service reads it
        st, res = call(
            sock,
            "POST",
            "/v2/systemsharedmemory/region/big/register",
            {"key": key, "offset": 0, "byte_size": size},
        )
        assert st == 200, res
        out = []
        for n in rows:
            params = {"shared_memory_region": "big", "shared_memory_byte_size": n * 16}
            body = {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [n, 4], "parameters": params}
                ],
                "outputs": [{"name": "z", "parameters": {"binary_data": True}}],
            }
            st, res = call(sock, "POST", "/v2/models/chain/infer", body)
            out.append((st, res.get("error", "") if isinstance(res, dict) else ""))
        return out
    finally:
        call(sock, "POST", "/v2/systemsharedmemory/unregister")
        os.close(fd)
        os.unlink("/dev/shm/" + key)


def test_shared_memory_inputs_are_bounded_and_charged_before_they_are_read(svc) -> None:
    """A group member names a 1.2 GB input in its own (sparse) region: 413 naming the
    limit before anything is read; 6 MB (12 MB reserved) is over its 8 MB share: 503 at
    once; 1 MB is served. The service's RSS does not follow the declared sizes, and every
    reservation is given back."""
    pid = svc["proc"].pid
    rss0 = _rss_mb(pid)
    before = _inflight(svc["sock"])
    rows = [75_264_000, 393_216, 65_536]  # 1.2 GB, 6 MB, 1 MB of FP32 [n, 4]
    (huge, huge_err), (over, over_err), (fits, _) = as_user(_shm_reads, svc["sock"], rows)
    assert huge == 413 and "at most" in huge_err and "tensor pool" in huge_err, huge_err
    assert over == 503 and "in-flight" in over_err, over_err
    assert fits == 200
    assert _rss_mb(pid) - rss0 < 40
    assert svc["proc"].pid == pid
    wait_for(
        lambda: _inflight(svc["sock"])["inflight_bytes"] == before["inflight_bytes"],
        30,
        "the reservations to be given back",
    )
    _still_whole(svc)


# -- regions without end: fds ---------------------------------------------------------------


def _register_many(sock: str, n: int) -> list[int]:
    from infscaler.api.sysshm import SharedMemoryRegion

    key = f"isc_hostile_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    region = SharedMemoryRegion.create(key, 4096, group=True)
    try:
        return [
            call(
                sock,
                "POST",
                f"/v2/systemsharedmemory/region/r{os.getuid()}_{i}/register",
                {"key": key, "offset": 0, "byte_size": 64},
            )[0]
            for i in range(n)
        ]
    finally:
        region.close()  # the registered fds keep the object alive in the service


def test_registered_regions_are_held_to_a_quota_per_uid_and_in_all(svc) -> None:
    pid = svc["proc"].pid
    fds0 = _fds(pid)
    try:
        mine = as_user(_register_many, svc["sock"], 20)
        assert mine.count(200) == 4 and mine.count(429) == 16, mine
        theirs = as_user(_register_many, svc["sock"], 5, uid=OTHER_UID)
        assert theirs.count(200) == 2 and theirs.count(429) == 3, theirs  # 6 in all
        assert _fds(pid) <= fds0 + 6 + 4  # one fd a region (a few of the loop's own)
        assert _register_many(svc["sock"], 1) == [200]  # the operator is not held
        _still_whole(svc)
    finally:
        call(svc["sock"], "POST", "/v2/systemsharedmemory/unregister")
    assert _fds(pid) <= fds0 + 4


# -- connections without end --------------------------------------------------------------


def _hold_connections(
    sock: str, n: int, hold_s: float, ready_path: str | None = None
) -> dict[str, int]:
    """Open ``n`` connections and hold them: those the service answers (a 503) are
    refused, those it never answers (no byte in 2 s after the last answer) held; touch
    ``ready_path`` once sorted, then hold ``hold_s`` seconds."""
    import select

    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        conns.append(s)
    answered: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        waiting = [s for s in conns if s not in answered]
        ready, _, _ = select.select(waiting, [], [], 2.0)
        if not ready:
            break  # 2 s without an answer: the rest are held
        for s in ready:
            answered[s] = s.recv(4096)
    refused = sum(data.startswith(b"HTTP/1.1 503") for data in answered.values())
    held = n - len(answered)
    if ready_path is not None:
        open(ready_path, "w").close()
    time.sleep(hold_s)
    for s in conns:
        s.close()
    return {"refused": refused, "held": held}


def test_a_connection_flood_leaves_room_for_other_users_and_the_operator(svc) -> None:
    out: dict = {}
    ready = Path(tempfile.mkdtemp(prefix="isc-hold-")) / "sorted"
    ready.parent.chmod(0o777)  # the holder (uid 65534) says there when it has sorted

    def hold() -> None:
        try:
            out.update(as_user(_hold_connections, svc["sock"], 30, 15.0, str(ready)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = repr(exc)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    wait_for(lambda: ready.exists() or "error" in out, 90, "the holder's connections")
    assert "error" not in out, out
    _still_whole(svc)  # while nobody's 8 are held: another user and the operator get in
    assert t.is_alive(), "the holder let go before the others were served"
    t.join(90)
    assert out == {"refused": 22, "held": 8}, out
    log = svc["log"].read_text()
    # 22 refusals within seconds: one line (two or three if they straddle 10 s windows),
    # the rest counted
    assert 1 <= log.count("refusing connections") <= 3, log[-2000:]
    ready.unlink()
    ready.parent.rmdir()


# -- bodies on the routes that are not inference: memory ----------------------------------


def _big_bodies(
    sock: str, n: int, path: str, declared: int, send: int, hold_s: float, extra: str = ""
) -> list[int]:
    """``n`` connections declaring ``declared`` bytes and sending ``send`` of them; the
    status each got within 3 s (0: none yet), then held ``hold_s`` more seconds."""
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n{extra}\r\n".encode()
        )
        with contextlib.suppress(OSError):
            s.sendall(b" " * send)
        conns.append(s)
    statuses = []
    for s in conns:
        s.settimeout(3.0)
        try:
            head = s.recv(64)
            statuses.append(int(head.split()[1]) if head.startswith(b"HTTP/1.1") else -1)
        except (TimeoutError, ConnectionResetError):
            statuses.append(0)
    time.sleep(hold_s)
    for s in conns:
        s.close()
    return statuses


def _inflight(sock: str) -> dict:
    st, res = call(sock, "GET", "/v2/infscaler/status")
    assert st == 200, res
    return res["inflight"]


def test_large_bodies_are_refused_before_they_are_held(svc) -> None:
    pid = svc["proc"].pid
    rss0 = _rss_mb(pid)
    reg = as_user(
        _big_bodies,
        svc["sock"],
        6,
        "/v2/systemsharedmemory/region/x/register",
        60 << 20,
        1 << 20,
        0.0,
    )
    assert reg == [413] * 6, reg  # over the 1 MB control body limit: refused at once
    assert _rss_mb(pid) - rss0 < 20
    # binary inferences of 3 MB (~6 MB reserved each), a third sent: one uid's 8 MB admits one
    before = _inflight(svc["sock"])
    out: list = []
    t = threading.Thread(
        target=lambda: out.append(
            as_user(
                _big_bodies,
                svc["sock"],
                4,
                "/v2/models/chain/infer",
                3 << 20,
                1 << 20,
                8.0,
                BINARY,
            )
        ),
        daemon=True,
    )
    t.start()

    def three_refused() -> dict | None:
        now = _inflight(svc["sock"])
        return now if now["refused_per_peer"] - before["refused_per_peer"] >= 3 else None

    now = wait_for(three_refused, 30, "three refusals of the uid's byte budget")
    assert now["inflight_bytes"] - before["inflight_bytes"] == 2 * ((3 << 20) - 100) + 20 * 100
    assert now["refused_per_peer"] - before["refused_per_peer"] == 3
    assert _rss_mb(pid) - rss0 < 40
    t.join(60)
    _still_whole(svc)
    wait_for(
        lambda: _inflight(svc["sock"])["inflight_bytes"] == before["inflight_bytes"],
        30,
        "the reservations to be given back",
    )


#: headers of a binary-data inference whose JSON header is 100 bytes
BINARY = "Inference-Header-Content-Length: 100\r\n"


def test_json_beyond_its_limit_is_refused_before_it_is_read(svc) -> None:
    """JSON takes up to 20x its size decoded: more than --max-json-mb (1 MB here) is
    413 at once, whole body or JSON header; within it, served."""
    json_body = as_user(_big_bodies, svc["sock"], 2, "/v2/models/chain/infer", 2 << 20, 0, 0.0)
    assert json_body == [413, 413], json_body
    header = as_user(
        _big_bodies,
        svc["sock"],
        1,
        "/v2/models/chain/infer",
        3 << 20,
        0,
        0.0,
        "Inference-Header-Content-Length: 2000000\r\n",
    )
    assert header == [413], header
    rows = [[1.0, 2.0, 3.0, 4.0]] * 20_000  # ~0.5 MB of JSON
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [20_000, 4], "data": rows}]}
    status, res = as_user(call, svc["sock"], "POST", "/v2/models/chain/infer", body)
    assert status == 200 and res["outputs"][0]["shape"] == [20_000, 4], str(res)[:300]
    _still_whole(svc)


def test_a_chunked_control_body_is_cut_at_the_limit(svc) -> None:
    def chunked(sock: str) -> int:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.sendall(
            b"POST /v2/systemsharedmemory/region/y/register HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b" " * 65536
        with contextlib.suppress(OSError):
            for _ in range(40):  # 2.5 MB
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        s.settimeout(10)
        head = s.recv(256)
        s.close()
        return int(head.split()[1])

    assert as_user(chunked, svc["sock"]) == 413
    _still_whole(svc)


# -- the fd limit: clients can never take the fds the service needs ----------------------


def _open_many(sock: str, n: int, hold_s: float) -> int:
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
        except OSError:
            s.close()
            continue
        conns.append(s)
    time.sleep(hold_s)
    for s in conns:
        s.close()
    return len(conns)


def test_under_a_low_fd_limit_a_flood_leaves_fds_for_instances(tmp_path: Path) -> None:
    """``RLIMIT_NOFILE`` 600 with ``--max-connections 512``: the service lowers its caps
    to fit (with a warning) and, while one client holds every connection it can get, an
    instance killed with SIGKILL is restarted and the operator is served: no EMFILE
    anywhere."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the clients are switched to uid 65534 / 65533")
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))

    args = ["--max-connections", "512", "--max-connections-per-uid", "512"]
    with root_service(tmp_path, [CHAIN], args, preexec_fn=low_limit) as served:
        sock, proc, log_path = served["sock"], served["proc"], served["log"]
        fitted = re.search(r"the fd limit 600 fits (\d+) connections", log_path.read_text())
        assert fitted, log_path.read_text()
        conns = int(fitted.group(1))  # 138 of the 512 asked for, with 256 fds kept
        base = _fds(proc.pid)
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(n=as_user(_open_many, sock, 700, 20.0)), daemon=True
        )
        t.start()
        # the flood holds at most the fitted cap; refused ones come and go on top
        wait_for(lambda: _fds(proc.pid) >= base + conns // 2, 60, "the flood's connections")
        assert _fds(proc.pid) < 600
        st, res = call(sock, "GET", "/v2/infscaler/status")
        assert st == 200, res
        pids = [i["pid"] for p in res["pipelines"] for u in p["units"] for i in u["instances"]]
        restarts = res["restarts"]
        os.kill(pids[0], 9)
        wait_for(
            lambda: call(sock, "GET", "/v2/infscaler/status")[1]["restarts"] > restarts,
            60,
            "the killed instance to be restarted",
        )
        # one client holds every connection it may (it was given the per-uid cap of all):
        # the operator still gets in
        assert proc.poll() is None
        status, res = wait_for(
            lambda: (r := call(sock, "POST", "/v2/models/chain/infer", INFER))[0] == 200 and r,
            60,
            "the replacement to serve",
        )
        assert res["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0], res
        assert t.is_alive(), "the flood let go too early for the test to mean anything"
        t.join(60)
        assert out["n"] > 200
        assert "Too many open files" not in log_path.read_text()


@contextlib.contextmanager
def root_service(
    tmp: Path,
    configs: list[dict],
    args: list[str],
    *,
    pool_mb: int = 64,
    preexec_fn: Any = None,
) -> Iterator[dict]:
    """``infscaler serve`` as root in its own process (a crash shows as a dead pid) on
    ``api.sock`` (and ``api-grpc.sock``) in a fresh directory others may traverse but
    not list, group GROUP, serving the pipelines ``configs`` with the flags ``args``;
    yields ``{"sock", "grpc", "proc", "log", "public"}`` once it is ready, then SIGTERMs
    it and removes its sockets."""
    public = Path(tempfile.mkdtemp(prefix="isc-hostile-"))
    public.chmod(0o711)
    sock = str(public / "api.sock")
    paths = []
    for cfg in configs:
        path = tmp / f"{cfg['name']}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        paths.append(str(path))
    log_path = tmp / "serve.log"
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infscaler", "serve", "--socket", sock, "--socket-group",
             str(GROUP), "--state-dir", str(tmp / "state"), "--control-path", "userspace",
             "--pool-mb", str(pool_mb), *args, *paths],
            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
        )  # fmt: skip
    try:
        wait_for(
            lambda: proc.poll() is not None or _safe_ready(sock), 180, "the service to be ready"
        )
        assert proc.poll() is None, log_path.read_text()
        grpc = str(public / "api-grpc.sock")
        yield {"sock": sock, "grpc": grpc, "proc": proc, "log": log_path, "public": public}
    finally:
        _stop(proc, sock, public)


def _stop(proc: subprocess.Popen, sock: str, public: Path) -> None:
    """SIGTERM the service (SIGKILL after 60 s), remove its socket and directory."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    with contextlib.suppress(OSError):
        os.unlink(sock)
    with contextlib.suppress(OSError):
        os.rmdir(public)


def _safe_ready(sock: str) -> bool:
    try:
        with Client(sock) as c:
            return c.is_ready()
    except Exception:  # noqa: BLE001 - not up yet
        return False


# -- the gRPC socket: the same attacks, the same quotas -------------------------------------


def _grpc(svc: dict) -> str:
    from infscaler.api.grpc import default_grpc_socket

    return default_grpc_socket(svc["sock"])


def _grpc_as(attack: str, *args, uid: int = NOBODY_UID):
    from tests.integration.api.grpc_attacks import run_as

    return run_as(attack, *args, uid=uid, group=GROUP)


def test_grpc_a_shrinking_region_never_crashes_the_service(svc) -> None:
    pid = svc["proc"].pid
    codes = _grpc_as("shrink", _grpc(svc), 200)
    assert set(codes) <= {"OK", "INVALID_ARGUMENT"} and sum(codes.values()) == 200, codes
    assert svc["proc"].pid == pid
    _still_whole(svc)


def test_grpc_registered_regions_share_the_http_quota(svc) -> None:
    pid = svc["proc"].pid
    fds0 = _fds(pid)
    try:
        codes = _grpc_as("regions", _grpc(svc), 20)
        assert codes == {"OK": 4, "RESOURCE_EXHAUSTED": 16}, codes
        mine_over_http = as_user(_register_many, svc["sock"], 2)  # one quota, both sockets
        assert mine_over_http == [429, 429], mine_over_http
        assert _fds(pid) <= fds0 + 4 + 4
        _still_whole(svc)
    finally:
        assert _grpc_as("unregister_all", _grpc(svc)) == "OK"
    assert _fds(pid) <= fds0 + 4


def test_grpc_a_connection_flood_is_held_to_the_uid_s_share(svc) -> None:
    out: dict = {}
    t = threading.Thread(
        target=lambda: out.update(_grpc_as("connections", _grpc(svc), 30, 8.0)), daemon=True
    )
    t.start()
    time.sleep(4.0)  # the flood sorted (2 s) and held
    _still_whole(svc)
    t.join(120)
    assert out == {"refused": 22, "held": 8}, out


def test_grpc_a_huge_register_message_is_refused_before_it_is_parsed(svc) -> None:
    pid = svc["proc"].pid
    rss0 = _rss_mb(pid)
    code, message = _grpc_as("big_register", _grpc(svc), 2.0)  # a 2 MB region name
    assert code == "RESOURCE_EXHAUSTED", message
    assert _rss_mb(pid) - rss0 < 20
    _still_whole(svc)


def test_grpc_shared_memory_inputs_are_bounded_and_charged(svc) -> None:
    pid = svc["proc"].pid
    rss0 = _rss_mb(pid)
    before = _inflight(svc["sock"])
    rows = [75_264_000, 393_216, 65_536]  # 1.2 GB, 6 MB, 1 MB of FP32 [n, 4]
    (huge, huge_msg), (over, over_msg), (fits, _) = _grpc_as("shm_oversized", _grpc(svc), rows)
    assert huge == "RESOURCE_EXHAUSTED" and "tensor pool" in huge_msg, huge_msg
    assert over == "UNAVAILABLE" and "in-flight" in over_msg, over_msg
    assert fits == "OK"
    assert _rss_mb(pid) - rss0 < 40
    wait_for(
        lambda: _inflight(svc["sock"])["inflight_bytes"] == before["inflight_bytes"],
        30,
        "the reservations to be given back",
    )
    _still_whole(svc)


def test_grpc_concurrent_large_messages_are_held_to_the_uid_s_budget(svc) -> None:
    """Four 3 MB messages at once (6 MB reserved each, 8 MB a uid): some refused at once
    with the budget's reason, none lost, every reservation given back."""
    before = _inflight(svc["sock"])
    codes = _grpc_as("concurrent_infers", _grpc(svc), 4, 196_608)
    assert sum(codes.values()) == 4 and set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert codes.get("OK", 0) >= 1
    wait_for(
        lambda: _inflight(svc["sock"])["inflight_bytes"] == before["inflight_bytes"],
        30,
        "the reservations to be given back",
    )
    _still_whole(svc)
