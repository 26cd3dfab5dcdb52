"""The client commands start without the heavy imports: ``infscaler status``,
``infer``, ``probe`` and ``undeploy`` answered by a small HTTP server on a Unix socket (in
this process) import none of pydantic, onnx, onnxruntime, aiohttp (``python -X
importtime`` in a subprocess; httpx and numpy are the client's), and print what the service
answered."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from infscaler.api.codec import decode_infer_request, encode_infer_response

HEAVY = ("pydantic", "onnx", "onnxruntime", "aiohttp")
META = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}]}


def _reply(conn: socket.socket) -> None:
    f = conn.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += f.readline()
    lines = head.decode().split("\r\n")
    hdr = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = f.read(int(hdr.get("content-length", 0)))
    target = lines[0].split()[1]
    extra: dict[str, str] = {}
    if target == "/v2/models/m":
        out = json.dumps(META).encode()
    elif target == "/v2/models/m/infer":
        req = decode_infer_request(body, header_length=int(hdr["inference-header-content-length"]))
        out, extra = encode_infer_response(
            model_name="m",
            request_id=None,
            outputs={"y": req.inputs["x"] * 0 + 7},
            requested=None,
            binary_default=True,
            parameters={"latency_ms": 1.0},
        )
    elif target == "/v2/infscaler/status":
        out = b'{"pipelines": [], "fake": true}'
    else:
        out = b""
    # one request per connection, said so: without ``Connection: close`` the client may
    # send its next request on this connection before it sees the close (reset by peer)
    head_out = f"HTTP/1.1 200 OK\r\nContent-Length: {len(out)}\r\nConnection: close\r\n"
    head_out += "".join(f"{k}: {v}\r\n" for k, v in extra.items())
    conn.sendall(head_out.encode() + b"\r\n" + out)
    conn.close()


@pytest.fixture(scope="module")
def sock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = str(tmp_path_factory.mktemp("fast") / "api.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            _reply(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield path
    srv.close()


def _run(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "infscaler", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    mods = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln}
    return proc, mods


def test_status_imports_nothing_heavy(sock: str) -> None:
    proc, mods = _run("status", "--json", "--socket", sock)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"pipelines": [], "fake": True}
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_infer_imports_nothing_heavy(sock: str) -> None:
    proc, mods = _run("infer", "m", "--random", "--json", "--socket", sock)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["outputs"] == {"y": [[7.0, 7.0, 7.0, 7.0]]}
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_infer_input_file_and_bad_float(sock: str, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    proc, mods = _run("infer", "m", "-i", f"x={tmp_path / 'x.npy'}", "--socket", sock)
    assert proc.returncode == 0 and "y: [[7. 7. 7. 7.]]" in proc.stdout, proc.stderr[-2000:]
    assert not mods & set(HEAVY)
    proc, _ = _run("infer", "--task", "t", "--latency-ms", "abc", "--socket", sock)
    assert proc.returncode == 2 and "'abc' is not a valid float" in proc.stderr


def test_probe_and_undeploy(sock: str, tmp_path: Path) -> None:
    proc, mods = _run("probe", "live", "--socket", sock)
    assert proc.returncode == 0 and proc.stdout.strip() == "live", proc.stderr[-2000:]
    assert not mods & set(HEAVY)
    proc, _ = _run("probe", "ready", "--socket", str(tmp_path / "none.sock"))
    assert proc.returncode == 1 and "no socket there" in proc.stderr
    proc, mods = _run("undeploy", "m", "--socket", sock)
    assert proc.returncode == 0 and "undeployed m" in proc.stdout
    assert not mods & set(HEAVY)
