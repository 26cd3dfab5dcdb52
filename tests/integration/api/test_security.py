"""The Unix socket as a security boundary (infscaler.base.security): attacks run from a client
process that is *not* root: a forked child that drops to uid/gid 65534 (nobody) with
only the socket's group as a supplementary group, talking HTTP with the standard
library. The service runs as root, as the outside tester's did.

What is shown: the socket's mode is 0660 from the moment its path exists; a group member
may infer but not load (a ``subprocess:Popen`` stage: 403, and the command never runs),
not register a root-owned 0600 shm object, not see / use / unregister another user's
region, and sees no paths in the status; the owner's API loads are held to the function
allow-list and the model repositories (symlinks resolved)."""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import socket
import stat
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from infscaler.api.server import ServerThread
from infscaler.api.sysshm import SharedMemoryRegion
from infscaler.base.config import load_pipeline
from infscaler.base.security import (
    SecurityPolicy,
)
from infscaler.service.service import Service
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py
NOBODY = 65534
GROUP = 4242  # the socket's group (no /etc/group entry needed: root may chown to any gid)
OTHER_UID = 65533  # a second unprivileged user in the same group

CHAIN = {
    "name": "chain",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}


# -- a stdlib HTTP client over a Unix socket, run as another user ------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("infscaler", timeout=60)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(self._path)
        self.sock = s


def call(sock: str, method: str, path: str, body: object = None) -> tuple[int, object]:
    """(status, parsed JSON) of one request."""
    conn = _UnixConnection(sock)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode(errors="replace")
    finally:
        conn.close()


def as_user(fn, *args, uid: int = NOBODY, groups: tuple[int, ...] = (GROUP,)):
    """``fn(*args)`` in a forked child running as ``uid`` (gid 65534, supplementary
    ``groups``): its JSON-able return value, or ``{"raised": repr}``."""
    r, w = os.pipe()
    # the parent's garbage is collected here, where gRPC's threads run: a gRPC object
    # that an earlier test left to the collector, collected in the child, waits for
    # threads the fork did not copy and spins for ever (seen in CI: the child at 100 %
    # CPU inside grpc's dealloc under gc_collect, the test's join timing out); the child
    # collects nothing of the parent's
    gc.collect()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, then run the attack
        gc.disable()
        code = 0
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(uid, uid, uid)
            out = {"value": fn(*args)}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"raised": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(w, json.dumps(out).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(b"".join(chunks) or b'{"raised": "no output"}')
    if "raised" in out:
        raise AssertionError(f"the client as uid {uid} failed: {out['raised']}")
    return out["value"]


def _whoami() -> list[int]:
    return [os.getuid(), os.geteuid(), os.getgid(), *os.getgroups()]


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A root service serving `chain`; its socket in a directory nobody may traverse,
    group GROUP; the API allows stagefuncs functions and one model repository. Tests
    using it skip where not root (they switch the client to another uid / gid)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the client is switched to uid 65534 and the socket chown-ed")
    tmp = tmp_path_factory.mktemp("sec")
    public = Path(tempfile.mkdtemp(prefix="isc-sec-"))
    public.chmod(0o711)
    repo = tmp / "repo"
    repo.mkdir()
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    sys.path.insert(0, str(HERE))
    sock = str(public / "api.sock")
    policy = SecurityPolicy.create(allow_functions=["stagefuncs"], model_repositories=[repo])
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            with ServerThread(svc, sock, security=policy, socket_group=GROUP):
                yield {"sock": sock, "tmp": tmp, "repo": repo, "svc": svc, "public": public}
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(HERE))
        with contextlib.suppress(OSError):
            os.rmdir(public)


@pytest.fixture
def shm_keys():
    made: list[str] = []
    yield made
    for k in made:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm/" + k.lstrip("/"))


def _key() -> str:
    return f"isc_sec_{os.getpid()}_{uuid.uuid4().hex[:8]}"


# -- the socket ---------------------------------------------------------------------------


def test_the_client_really_runs_as_another_user(world) -> None:
    uid, euid, gid, *groups = as_user(_whoami)
    assert (uid, euid, gid, groups) == (NOBODY, NOBODY, NOBODY, [GROUP])


def test_socket_mode_and_group_and_who_can_connect(world) -> None:
    st = os.lstat(world["sock"])
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == GROUP
    # a group member may infer
    x = [[1.0, 2.0, 3.0, 4.0]]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x}]}
    status, res = as_user(call, world["sock"], "POST", "/v2/models/chain/infer", body)
    assert status == 200, res
    assert res["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
    status, meta = as_user(call, world["sock"], "GET", "/v2/models/chain")
    assert status == 200 and meta["inputs"][0]["name"] == "x"
    # the same user outside the group cannot even connect
    msg = as_user(_connect_error, world["sock"], groups=())
    assert "Permission denied" in msg, msg
    # the bind directory is gone: nothing but the socket is left next to it
    assert os.listdir(world["public"]) == ["api.sock"]


def _connect_error(sock: str) -> str:
    try:
        call(sock, "GET", "/v2/health/live")
    except OSError as exc:
        return str(exc)
    return "connected"


def test_the_socket_is_never_wider_than_0660(world, tmp_path: Path) -> None:
    """With the most permissive umask (0), a thread watches the path in a tight loop
    while a server starts: every mode it sees is 0660 (the old chmod-after-listen left
    the socket 0777 for a moment)."""
    path = str(world["public"] / "race.sock")
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.add(stat.S_IMODE(os.lstat(path).st_mode))

    old = os.umask(0)
    t = threading.Thread(target=watch)
    t.start()
    try:
        with ServerThread(world["svc"], path):  # returns once the socket accepts
            for _ in range(5000):  # let the watcher see the live socket too
                if seen:
                    break
                threading.Event().wait(0.001)
    finally:
        stop.set()
        t.join()
        os.umask(old)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    assert seen == {0o660}, [oct(m) for m in seen]


def test_the_socket_appears_only_once_final(world, monkeypatch) -> None:
    """The code path, deterministically (a watcher catches a short window only now and
    then): the socket is bound inside a directory only its owner may enter, and when it
    is renamed to its path (the moment it appears there) its mode and group are final."""
    import infscaler.api.server as server

    path = str(world["public"] / "final.sock")
    renames: list[tuple[int, int, int, bool]] = []
    real_rename = os.rename

    def rename(src, dst):
        if os.fspath(dst) != path:  # another thread's rename
            return real_rename(src, dst)
        st = os.lstat(src)
        parent = os.stat(os.path.dirname(src))
        renames.append(
            (stat.S_IMODE(st.st_mode), st.st_gid, stat.S_IMODE(parent.st_mode), os.path.exists(dst))
        )
        return real_rename(src, dst)

    monkeypatch.setattr(server.os, "rename", rename)
    old = os.umask(0)
    try:
        with ServerThread(world["svc"], path, socket_group=GROUP):
            st = os.lstat(path)
    finally:
        os.umask(old)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    assert renames == [(0o660, GROUP, 0o700, False)]
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == GROUP


# -- repository endpoints and function stages --------------------------------------------


def _load_body(cfg: dict) -> dict:
    return {"parameters": {"config": json.dumps(cfg)}}


def _popen_pipeline(marker: Path, function: str = "subprocess:Popen", params=None) -> dict:
    return {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["y"],
        "stages": [
            {
                "name": "pwn",
                "function": function,
                "params": params
                if params is not None
                else {"args": f"touch {marker}", "shell": True},
                "inputs": ["x"],
                "outputs": ["y"],
            }
        ],
    }


def test_a_group_member_may_not_load_unload_or_index(world) -> None:
    marker = world["public"] / f"pwned-{uuid.uuid4().hex[:6]}"
    sock = world["sock"]
    status, res = as_user(
        call, sock, "POST", "/v2/repository/models/pwn/load", _load_body(_popen_pipeline(marker))
    )
    assert status == 403, res
    assert "reserved to the service's own user" in res["error"] and "uid 65534" in res["error"]
    for path in ("/v2/repository/index", "/v2/repository/models/chain/unload"):
        status, res = as_user(call, sock, "POST", path)
        assert status == 403 and "reserved" in res["error"], (path, res)
    # nothing ran, nothing was deployed or removed
    assert not marker.exists()
    status, models = call(sock, "GET", "/v2/models")
    assert [m["name"] for m in models["models"]] == ["chain"]


@pytest.mark.parametrize(
    "function, fragment",
    [
        ("subprocess:Popen", "only from the modules infscaler.pipelines, stagefuncs"),
        ("os:system", "only from the modules"),
        ("builtins:exec", "only from the modules"),
        ("stagefuncs:_private", "private name"),
    ],
)
def test_the_owner_is_held_to_the_function_allow_list(world, function: str, fragment) -> None:
    marker = world["public"] / f"pwned-{uuid.uuid4().hex[:6]}"
    params = {} if function.startswith("stagefuncs") else None
    status, res = call(
        world["sock"],
        "POST",
        "/v2/repository/models/pwn/load",
        _load_body(_popen_pipeline(marker, function, params)),
    )
    assert status == 403, res
    assert fragment in res["error"], res["error"]
    if "only from" in fragment:
        assert "--allow-functions" in res["error"]
    assert not marker.exists()


# -- model repositories --------------------------------------------------------------------


def _model_pipeline(**stage) -> dict:
    return {"stages": [{"name": "m", **stage}]}


def test_api_models_come_only_from_the_repositories(world, tmp_path: Path) -> None:
    from tests.helpers import residual_model, save

    repo: Path = world["repo"]
    outside = save(residual_model(), tmp_path / "outside.onnx")
    (repo / "escape.onnx").symlink_to(outside)
    inside = save(residual_model(), repo / "inside.onnx")
    sock = world["sock"]
    for stage, fragment in [
        ({"model": str(outside)}, "is not inside the model repositories"),
        ({"model": str(repo / "escape.onnx")}, "symbolic links are resolved"),
        ({"model": str(repo / ".." / "outside.onnx")}, "is not inside"),
        ({"plan": str(tmp_path)}, "plan directory"),
    ]:
        status, res = call(
            sock, "POST", "/v2/repository/models/m/load", _load_body(_model_pipeline(**stage))
        )
        assert status == 403, (stage, res)
        assert fragment in res["error"] and "--model-repository" in res["error"], res["error"]
    # a path-like function parameter (a file the function would read) is held the same way
    bad = {
        "inputs": [{"name": "p", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["t"],
        "stages": [
            {
                "name": "d",
                "function": "infscaler.pipelines.ocr:decode_line",
                "params": {"rec_model": "/etc/shadow"},
                "inputs": ["p"],
                "outputs": ["t"],
            }
        ],
    }
    status, res = call(sock, "POST", "/v2/repository/models/d/load", _load_body(bad))
    assert status == 403 and "parameter value '/etc/shadow'" in res["error"], res
    # inside the repository: loads and answers
    status, res = call(
        sock, "POST", "/v2/repository/models/m/load", _load_body(_model_pipeline(model=str(inside)))
    )
    assert status == 200, res
    try:
        status, meta = call(sock, "GET", "/v2/models/m")
        assert status == 200 and meta["inputs"][0]["name"] == "x"
    finally:
        assert call(sock, "POST", "/v2/repository/models/m/unload")[0] == 200


# -- system shared memory -----------------------------------------------------------------


def _shm_register(sock: str, name: str, key: str, size: int) -> tuple[int, object]:
    return call(
        sock,
        "POST",
        f"/v2/systemsharedmemory/region/{name}/register",
        {"key": key, "offset": 0, "byte_size": size},
    )


def test_a_root_owned_0600_object_is_refused(world, shm_keys: list[str]) -> None:
    key = _key()
    shm_keys.append(key)
    with SharedMemoryRegion.create(key, 64, mode=0o600) as r:
        r.set(np.full(16, 7, np.float32))
        status, res = as_user(_shm_register, world["sock"], "stolen", key, 64)
        assert status == 403, res
        assert "may not read and write shared memory object" in res["error"], res
        assert "owner uid 0" in res["error"] and "mode 0600" in res["error"]
        # a root-owned object the group may read and write is fine (the peer could open it)
        os.fchown(r._fd, 0, GROUP)
        os.fchmod(r._fd, 0o660)
        status, res = as_user(_shm_register, world["sock"], "granted", key, 64)
        assert status == 200, res
        assert (
            call(world["sock"], "POST", "/v2/systemsharedmemory/region/granted/unregister")[0]
            == 200
        )
    assert call(world["sock"], "GET", "/v2/systemsharedmemory/status")[1] == []


def _owner_registers_and_infers(sock: str, key: str) -> dict:
    """As the owner of region `mine`: create the object (0600), register it, infer
    through it in and out."""
    region = SharedMemoryRegion.create(key, 64)  # stays: the parent unlinks it
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    region.set(x)
    out = {"register": _shm_register(sock, "mine", key, 64)[0]}
    body = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [2, 4],
                "parameters": {"shared_memory_region": "mine", "shared_memory_byte_size": 32},
            }
        ],
        "outputs": [
            {
                "name": "z",
                "parameters": {
                    "shared_memory_region": "mine",
                    "shared_memory_offset": 32,
                    "shared_memory_byte_size": 32,
                },
            }
        ],
    }
    out["infer"] = call(sock, "POST", "/v2/models/chain/infer", body)[0]
    out["z"] = region.get(np.float32, [2, 4], offset=32).tolist()
    out["status"] = call(sock, "GET", "/v2/systemsharedmemory/status")[1]
    return out


def _intruder(sock: str) -> dict:
    body = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [2, 4],
                "parameters": {"shared_memory_region": "mine", "shared_memory_byte_size": 32},
            }
        ]
    }
    return {
        "status_all": call(sock, "GET", "/v2/systemsharedmemory/status"),
        "status_one": call(sock, "GET", "/v2/systemsharedmemory/region/mine/status"),
        "infer": call(sock, "POST", "/v2/models/chain/infer", body),
        "unregister": call(sock, "POST", "/v2/systemsharedmemory/region/mine/unregister"),
        "unregister_all": call(sock, "POST", "/v2/systemsharedmemory/unregister"),
        "service_status": call(sock, "GET", "/v2/infscaler/status"),
    }


def test_regions_belong_to_who_registered_them(world, shm_keys: list[str]) -> None:
    sock = world["sock"]
    key = _key()
    shm_keys.append(key)
    own = as_user(_owner_registers_and_infers, sock, key)
    assert own["register"] == 200 and own["infer"] == 200, own
    assert own["z"] == (np.arange(8, dtype=np.float32) * 2 + 1).reshape(2, 4).tolist()
    assert [r["name"] for r in own["status"]] == ["mine"] and own["status"][0]["key"] == "/" + key
    try:
        seen = as_user(_intruder, sock, uid=OTHER_UID)
        assert seen["status_all"] == [200, []]
        assert seen["status_one"][0] == 403
        assert seen["infer"][0] == 403 and "registered by another user" in seen["infer"][1]["error"]
        assert seen["unregister"][0] == 403
        assert seen["unregister_all"][0] == 200  # removes the intruder's own regions: none
        text = json.dumps(seen["service_status"][1])
        assert seen["service_status"][0] == 200 and key not in text
        # the region is still there and still the owner's
        status, regions = call(sock, "GET", "/v2/systemsharedmemory/status")
        assert [r["name"] for r in regions] == ["mine"]
    finally:
        assert call(sock, "POST", "/v2/systemsharedmemory/unregister")[0] == 200


def test_status_shows_no_paths_to_group_members(world) -> None:
    sock = world["sock"]
    status, mine = call(sock, "GET", "/v2/infscaler/status")
    assert status == 200 and "plans" in mine["pipelines"][0]
    status, theirs = as_user(call, sock, "GET", "/v2/infscaler/status")
    assert status == 200
    assert "plans" not in theirs["pipelines"][0]
    text = json.dumps(theirs)
    assert str(world["tmp"]) not in text and "/" + "dev/shm" not in text
    # the same figures otherwise: a group member may watch the service
    assert theirs["pool"].keys() == mine["pool"].keys()
    assert [p["name"] for p in theirs["pipelines"]] == ["chain"]
    status, stats = as_user(call, sock, "GET", "/v2/models/stats")
    assert status == 200 and stats["model_stats"][0]["name"] == "chain"
    assert str(world["tmp"]) not in json.dumps(stats)


def test_serve_refuses_bad_security_settings(tmp_path: Path) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "infscaler", "serve", "--socket", str(tmp_path / "s.sock")]
    for extra, env, fragment in [
        (["--model-repository", str(tmp_path / "nope")], {}, "is not a directory"),
        ([], {"INFSCALER_ALLOW_FUNCTIONS": "ok.pkg bad-name"}, "'bad-name' is not a Python"),
        (["--socket-group", "no-such-group-xyz"], {}, "no such group"),
    ]:
        r = subprocess.run(
            cmd + extra, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        text = " ".join(r.stderr.split())  # the console wraps long lines
        assert fragment in text and "Traceback" not in text, r.stderr
        assert not (tmp_path / "s.sock").exists()
