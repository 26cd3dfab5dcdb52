"""Hostile clients of the gRPC socket, run as another user in a fresh interpreter.

gRPC's core does not survive a fork of a process that already used it, so these
attacks do not run in :func:`tests.integration.api.test_security.as_user`'s forked
child: :func:`run_as` starts ``python -m tests.integration.api.grpc_attacks NAME ARGS``
as the given uid in the socket's group, and each attack prints one JSON line. They use
Triton's own client (``tritonclient.grpc``) where it can say the attack, raw sockets
where it cannot. The HTTP twins are in ``test_hostile.py``; ``bench/hostile.py`` runs
both.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from tests import REPO_ROOT

#: the model every attack targets (``test_security.CHAIN``: x FP32 [-1, 4] -> z)
MODEL = "chain"


def run_as(attack: str, *args: Any, uid: int, group: int, timeout_s: float = 300) -> Any:
    """Run attack ``attack(*args)`` as ``uid`` (gid 65534, supplementary ``group``); its
    JSON result.

    Raises:
        AssertionError: the attack's interpreter failed or printed no JSON.
    """
    env = dict(os.environ, PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'tests'}")
    argv = [sys.executable, "-m", "tests.integration.api.grpc_attacks", attack, json.dumps(args)]
    proc = subprocess.run(
        [*argv, str(uid), str(group)],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _client(sock: str) -> Any:
    import tritonclient.grpc as tg

    return tg.InferenceServerClient(url="unix:" + sock)


def _code(fn: Any) -> str:
    """``OK`` or the gRPC status code name of what ``fn()`` raised."""
    from tritonclient.utils import InferenceServerException

    try:
        fn()
        return "OK"
    except InferenceServerException as exc:
        return (exc.status() or "UNKNOWN").removeprefix("StatusCode.")


def _coded(fn: Any) -> tuple[str, str]:
    """(code, message) of ``fn()``."""
    from tritonclient.utils import InferenceServerException

    try:
        fn()
        return "OK", ""
    except InferenceServerException as exc:
        return (exc.status() or "UNKNOWN").removeprefix("StatusCode."), exc.message() or ""


def _x(n: int = 1) -> Any:
    import numpy as np

    return np.tile(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), (n, 1))


def _shm_input(region: str, rows: int, offset: int = 0) -> Any:
    import tritonclient.grpc as tg

    i = tg.InferInput("x", [rows, 4], "FP32")
    i.set_shared_memory(region, rows * 16, offset)
    return i


def _key() -> str:
    return f"isc_grpc_attack_{os.getpid()}_{secrets.token_hex(4)}"


# -- the attacks --------------------------------------------------------------------------


def shrink_loop(key: str, size: int, data: bytes, stop: threading.Event) -> None:
    """Shrink shm object ``key`` to 0 and grow it back to ``size`` with ``data`` at its
    start, every ~0.5 ms, until ``stop`` (the shrinking-region attack of both sockets)."""
    fd = os.open("/dev/shm/" + key, os.O_RDWR)
    try:
        while not stop.is_set():
            os.ftruncate(fd, 0)
            time.sleep(0.0005)
            os.ftruncate(fd, size)
            os.pwrite(fd, data, 0)
            time.sleep(0.0005)
    finally:
        os.close(fd)


def shrink(sock: str, rounds: int) -> dict[str, int]:
    """A registered object shrunk to 0 and back while ModelInfer reads its input from it
    (every call) and writes its output to it (every other call): codes counted; a served
    input read is whole (``OK-wrong`` would count a torn one)."""
    import tritonclient.grpc as tg

    from infscaler.api.sysshm import SharedMemoryRegion

    c = _client(sock)
    key, size = _key(), 4096
    region = SharedMemoryRegion.create(key, size, group=True)
    region.set(_x())
    stop = threading.Event()
    counts: Counter[str] = Counter()
    try:
        c.register_system_shared_memory("gin", "/" + key, 2048, 0)
        c.register_system_shared_memory("gout", "/" + key, 2048, 2048)
        t = threading.Thread(
            target=shrink_loop, args=(key, size, _x().tobytes(), stop), daemon=True
        )
        t.start()
        for i in range(rounds):
            outputs = None
            if i % 2:
                o = tg.InferRequestedOutput("z")
                o.set_shared_memory("gout", 16)
                outputs = [o]
            got: list[Any] = []
            code = _code(
                lambda o=outputs, g=got: g.append(c.infer(MODEL, [_shm_input("gin", 1)], outputs=o))
            )
            if code == "OK" and outputs is None:
                z = got[0].as_numpy("z").tolist()
                ok = z in ([[3.0, 5.0, 7.0, 9.0]], [[1.0, 1.0, 1.0, 1.0]])
                code = "OK" if ok else "OK-wrong"
            counts[code] += 1
    finally:
        stop.set()
        c.unregister_system_shared_memory()
        region.close()
        c.close()
    return dict(counts)


def regions(sock: str, n: int) -> dict[str, int]:
    """Register ``n`` regions of one object: codes counted."""
    from infscaler.api.sysshm import SharedMemoryRegion

    c = _client(sock)
    key = _key()
    region = SharedMemoryRegion.create(key, 4096, group=True)
    try:
        codes = Counter(
            _code(lambda i=i: c.register_system_shared_memory(f"g{os.getuid()}_{i}", "/" + key, 64))
            for i in range(n)
        )
    finally:
        region.close()  # the registered fds keep the object alive in the service
        c.close()
    return dict(codes)


def unregister_all(sock: str) -> str:
    c = _client(sock)
    try:
        return _code(lambda: c.unregister_system_shared_memory())
    finally:
        c.close()


def connections(sock: str, n: int, hold_s: float) -> dict[str, int]:
    """Open ``n`` connections to the gRPC socket, each with HTTP/2's preface and an empty
    SETTINGS frame, and hold them: those the gate closes within 2 s are refused, the
    rest held ``hold_s`` seconds."""
    import select

    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.sendall(preface)
        conns.append(s)
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + 2.0
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([s for s in conns if s not in closed], [], [], left)
        for s in ready:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                closed.add(s)
    time.sleep(hold_s)
    for s in conns:
        s.close()
    return {"refused": len(closed), "held": n - len(closed)}


def big_register(sock: str, name_mb: float) -> tuple[str, str]:
    """SystemSharedMemoryRegister with a region name of ``name_mb`` MB."""
    c = _client(sock)
    try:
        name = "n" * int(name_mb * (1 << 20))
        return _coded(lambda: c.register_system_shared_memory(name, "/nothing", 64))
    finally:
        c.close()


def concurrent_infers(sock: str, n: int, rows: int, typed: bool = False) -> dict[str, int]:
    """``n`` concurrent ModelInfer of ``rows`` x 4 FP32 (raw_input_contents, or typed
    ``fp32_contents`` with ``typed``), one connection each: codes counted."""
    import tritonclient.grpc as tg

    codes: Counter[str] = Counter()
    lock = threading.Lock()
    x = _x(rows)

    def one() -> None:
        c = _client(sock)
        try:
            if typed:
                code = _code(lambda: _typed_infer(sock, x))
            else:
                i = tg.InferInput("x", list(x.shape), "FP32")
                i.set_data_from_numpy(x)
                code = _code(lambda: c.infer(MODEL, [i]))
        finally:
            c.close()
        with lock:
            codes[code] += 1

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return dict(codes)


def _typed_infer(sock: str, x: Any) -> Any:
    """ModelInfer with the tensor in ``fp32_contents`` (tritonclient sends raw bytes
    only, so the message is built and sent with grpcio itself)."""
    import grpc

    from infscaler.proto import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name=MODEL)
    t = req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(
        "unix:" + sock, options=[("grpc.max_send_message_length", 1 << 30)]
    ) as ch:
        call = ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            return call(req, timeout=120)
        except grpc.RpcError as exc:
            from tritonclient.utils import InferenceServerException

            raise InferenceServerException(exc.details(), str(exc.code())) from None


def shm_oversized(sock: str, rows: list[int]) -> list[tuple[str, str]]:
    """A sparse 1.2 GB object (free to its creator) registered, then ModelInfer of
    ``rows[i]`` x 4 FP32 read from it: (code, message) each."""
    c = _client(sock)
    key = _key()
    size = 2000 * 224 * 224 * 3 * 4
    fd = os.open("/dev/shm/" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        c.register_system_shared_memory("gbig", "/" + key, size)
        return [_coded(lambda n=n: c.infer(MODEL, [_shm_input("gbig", n)])) for n in rows]
    finally:
        c.unregister_system_shared_memory("gbig")
        os.close(fd)
        os.unlink("/dev/shm/" + key)
        c.close()


def hold_pending(sock: str, model: str, n: int, hold_s: float) -> dict[str, int]:
    """``n`` concurrent ModelInfer on ``model`` (a slow pipeline) from 8 connections,
    held while they run; codes counted once all answered (or after ``hold_s``)."""
    import tritonclient.grpc as tg

    clients = [_client(sock) for _ in range(8)]
    codes: Counter[str] = Counter()
    done = threading.Semaphore(0)
    lock = threading.Lock()

    def callback(result: Any, error: Any) -> None:
        code = "OK" if error is None else (error.status() or "UNKNOWN").removeprefix("StatusCode.")
        with lock:
            codes[code] += 1
        done.release()

    for k in range(n):
        i = tg.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(_x())
        clients[k % len(clients)].async_infer(model, [i], callback)
    end = time.monotonic() + hold_s
    for _ in range(n):
        if not done.acquire(timeout=max(0.0, end - time.monotonic())):
            break
    for c in clients:
        c.close()
    return dict(codes)


def http_infer(sock: str, model: str) -> list[Any]:
    """One HTTP inference of ``model`` (x FP32 [1, 4]): [status, body]. For a client
    that must not be forked from a process running gRPC (a service in the test's own
    process): as an attack, it starts in a fresh interpreter."""
    from tests.integration.api.test_security import call

    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    return list(call(sock, "POST", f"/v2/models/{model}/infer", body))


def root_probe(sock: str) -> dict[str, list[Any]]:
    """The operator's view: ServerReady and a ModelInfer, each [code, seconds]."""
    import tritonclient.grpc as tg

    c = _client(sock)
    try:
        t0 = time.monotonic()
        health = _code(lambda: c.is_server_ready())
        t1 = time.monotonic()
        i = tg.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(_x())
        infer = _code(lambda: c.infer(MODEL, [i]))
        t2 = time.monotonic()
    finally:
        c.close()
    return {"health": [health, round(t1 - t0, 3)], "infer": [infer, round(t2 - t1, 3)]}


ATTACKS = {
    f.__name__: f
    for f in (
        shrink,
        regions,
        unregister_all,
        connections,
        big_register,
        concurrent_infers,
        shm_oversized,
        hold_pending,
        root_probe,
        http_infer,
    )
}

if __name__ == "__main__":
    # imported as root (the interpreter and venv are root's), then switched to the
    # attacker before any connection is made
    import grpc  # noqa: F401
    import numpy  # noqa: F401
    import tritonclient.grpc  # noqa: F401

    import infscaler.api.sysshm  # noqa: F401
    import infscaler.proto.grpc_service_pb2  # noqa: F401
    import tests.integration.api.test_security  # noqa: F401

    name, raw, uid, group = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.setgroups([group])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(uid, uid, uid)
    print(json.dumps(ATTACKS[name](*json.loads(raw))))
