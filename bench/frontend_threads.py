"""``frontend_cpu.py --threads``: the service process's CPU per request, split by thread.

A service (:class:`~infscaler.service.service.Service` and
:class:`~infscaler.api.server.ServerThread` with its gRPC socket) runs in a child
process and serves, per input size, a one-stage function pipeline that returns its
input's first element (its instance is another process, not counted; it sleeps
``--stage-ms`` first: a model's compute that costs the service no CPU, so requests
queue as they would for a model). This process drives it in a closed loop,
``--concurrency`` client threads each sending its next request when the last is
answered (the package's HTTP client with binary tensor data; ``tritonclient.grpc`` over
``unix:``), and reads the child's CPU from ``/proc/PID/task/*/stat`` (utime + stime,
clock ticks, and ``comm``: the OS thread name) before and after the timed requests. The
Python thread name of each OS thread comes from the child (``threading.enumerate()``'s
``native_id``); threads with none are grpc's own. Time of threads that ended in between,
and per-thread tick rounding, is ``(exited, rounding)``: the process's own total
(``/proc/PID/stat``) less its live threads. Then ``--idle-s`` seconds without requests:
the service's CPU per second while idle. ``--loop uvloop``: the service's event loop is
uvloop's (installed by hand: an experiment, not a dependency).

CPU time per request is a fair measure on a busy host (wall-clock throughput is not): the
host's load average is recorded beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SERVER = """
import json, sys, threading
from pathlib import Path
from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
import asyncio, os
if os.environ.get("FRONTEND_CPU_LOOP") == "uvloop":  # --loop uvloop (not a dependency)
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
state, sock, gsock, shapes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
with Service(state_dir=state, pool_mb=256) as svc, ServerThread(
    svc, sock, max_body_mb=64, grpc_socket=gsock
):
    for i, shape in enumerate(shapes):
        svc.deploy(load_pipeline({
            "name": f"fe{i}",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": shape}],
            "outputs": ["y"],
            "stages": [{"name": "first", "function": "frontend_cpu:first",
                        "inputs": ["x"], "outputs": ["y"]}],
        }))
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "threads":
            names = {t.native_id: t.name for t in threading.enumerate()}
            print(json.dumps(names), flush=True)
        else:
            break
"""

_TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def _stat_ticks(path: str) -> tuple[str, int]:
    """``comm`` and utime + stime (clock ticks) of a ``/proc/.../stat`` file."""
    with open(path) as f:
        text = f.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[11]) + int(fields[12])


def sample(pid: int) -> dict[str, Any]:
    """The process's total ticks and each live thread's ``(comm, ticks)`` by tid."""
    tasks: dict[int, tuple[str, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            tasks[int(tid)] = _stat_ticks(f"/proc/{pid}/task/{tid}/stat")
        except (OSError, ValueError):
            continue  # it ended meanwhile: counted in (exited)
    return {"total": _stat_ticks(f"/proc/{pid}/stat")[1], "tasks": tasks}


def per_thread(a: dict, b: dict, names: dict[int, str]) -> dict[str, int]:
    """Ticks spent between samples ``a`` and ``b`` per ``comm / python name``."""
    out: dict[str, int] = {}
    for tid, (comm, ticks) in b["tasks"].items():
        spent = ticks - a["tasks"].get(tid, (comm, 0))[1]
        key = f"{comm} / {names.get(tid, '(native)')}"
        out[key] = out.get(key, 0) + spent
    live = sum(out.values())
    out["(exited, rounding)"] = max(0, b["total"] - a["total"] - live)
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


class Server:
    """The service process (:data:`SERVER`); ``names()`` asks it its thread names."""

    def __init__(self, tmp: str, shapes: list[list[int]]) -> None:
        self.sock, self.gsock = f"{tmp}/h.sock", f"{tmp}/g.sock"
        state = Path(os.environ["INFSCALER_CACHE_DIR"]) / "bench-state-threads"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(state), self.sock, self.gsock, json.dumps(shapes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the service process did not start (see its stderr above)")

    def names(self) -> dict[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("threads\n")
        self.proc.stdin.flush()
        return {int(k): v for k, v in json.loads(self.proc.stdout.readline()).items()}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def _callers(protocol: str, server: Server, model: str, x: np.ndarray, c: int) -> list:
    """``c`` callables that each send one request (and check its answer)."""
    want = float(x.reshape(-1)[0])
    calls = []
    for _ in range(c):
        if protocol == "http":
            from infscaler.api.client import Client

            client = Client(server.sock)

            def call(client=client) -> None:
                out = client.infer(model, {"x": x})
                if float(out.as_numpy("y").reshape(-1)[0]) != want:
                    raise RuntimeError(f"wrong answer: {out}")

        else:
            import tritonclient.grpc as tg

            client = tg.InferenceServerClient(url=f"unix:{server.gsock}")
            inp = tg.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)

            def call(client=client, inp=inp) -> None:
                out = client.infer(model, [inp]).as_numpy("y")
                if float(out.reshape(-1)[0]) != want:
                    raise RuntimeError(f"wrong answer: {out}")

        calls.append(call)
    return calls


def closed_loop(calls: list, n: int) -> tuple[float, list[BaseException]]:
    """Each callable in its own thread, ``n`` calls in all; wall seconds and errors."""
    errors: list[BaseException] = []
    per = [n // len(calls) + (i < n % len(calls)) for i in range(len(calls))]

    def body(call, k: int) -> None:
        try:
            for _ in range(k):
                call()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=a) for a in zip(calls, per, strict=True)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, errors


def spy_start(py_spy: str | None, pid: int, out: Path) -> subprocess.Popen | None:
    """``py-spy record`` of ``pid`` (its threads, samples holding the GIL: Python at work,
    not waiting; raw collapsed stacks, 250 Hz, without
    pausing it) into ``out``; None without ``py_spy`` (the py-spy executable)."""
    if not py_spy:
        return None
    cmd = [py_spy, "record", "-p", str(pid), "-t", "-g", "-f", "raw", "-r", "250", "--nonblocking"]
    return subprocess.Popen(
        [*cmd, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def spy_summary(spy: subprocess.Popen | None, out: Path, top: int = 8) -> dict | None:
    """Stop ``spy`` (SIGINT: py-spy writes its file) and summarise ``out``: per thread,
    the share of its samples and its ``top`` functions by self samples (the innermost
    frame of each stack) and its ``3 * top`` by inclusive samples (anywhere in the stack),
    as fractions of all samples."""
    if spy is None:
        return None
    import signal

    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    if not out.exists():
        return {"error": "py-spy wrote nothing (ptrace not permitted?)"}
    threads: dict[str, dict[str, int]] = {}
    inclusive: dict[str, dict[str, int]] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        fns = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] for f in frames[1:]]
        if not fns:
            continue
        row = threads.setdefault(frames[0], {})
        row[fns[-1]] = row.get(fns[-1], 0) + int(count)
        inc = inclusive.setdefault(frames[0], {})
        for fn in set(fns):
            inc[fn] = inc.get(fn, 0) + int(count)
        total += int(count)
    summary = {}
    for thread, row in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        own = sorted(row.items(), key=lambda kv: -kv[1])[:top]
        inc = sorted(inclusive[thread].items(), key=lambda kv: -kv[1])[: 3 * top]
        summary[thread] = {
            "share": round(sum(row.values()) / max(total, 1), 3),
            "self": {k: round(v / max(total, 1), 3) for k, v in own},
            "inclusive": {k: round(v / max(total, 1), 3) for k, v in inc},
        }
    return summary


def measure(
    server: Server,
    protocol: str,
    i: int,
    shape: list[int],
    n: int,
    c: int,
    py_spy: str | None = None,
) -> dict:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    calls = _callers(protocol, server, f"fe{i}", x, c)
    _, errors = closed_loop(calls, 5 * c)  # warm up
    if errors:
        raise errors[0]
    load0 = os.getloadavg()[0]
    raw = Path(server.sock).parent / f"spy-{protocol}-{i}.txt"
    spy = spy_start(py_spy, server.proc.pid, raw)
    a = sample(server.proc.pid)
    wall_s, errors = closed_loop(calls, n)
    b = sample(server.proc.pid)
    profile = spy_summary(spy, raw)
    if errors:
        raise errors[0]
    names = server.names()
    threads = per_thread(a, b, names)
    return {
        "protocol": protocol,
        "shape": shape,
        "input_bytes": int(x.nbytes),
        "requests": n,
        "concurrency": c,
        "stage_ms": float(os.environ.get("FRONTEND_CPU_STAGE_MS", "0")),
        "cpu_ms_per_request": round((b["total"] - a["total"]) * _TICK_MS / n, 3),
        "threads_ms_per_request": {k: round(v * _TICK_MS / n, 3) for k, v in threads.items()},
        "wall_s": round(wall_s, 3),
        "load_average_1m": [load0, os.getloadavg()[0]],
        **({"py_spy": profile} if profile is not None else {}),
    }


def idle(server: Server, seconds: float) -> dict:
    time.sleep(1.0)
    a = sample(server.proc.pid)
    time.sleep(seconds)
    b = sample(server.proc.pid)
    threads = per_thread(a, b, server.names())
    return {
        "seconds": seconds,
        "cpu_ms_per_s": round((b["total"] - a["total"]) * _TICK_MS / seconds, 3),
        "threads_ms_per_s": {k: round(v * _TICK_MS / seconds, 3) for k, v in threads.items()},
    }


def plot(data: dict, path: Path) -> None:
    """The service process's CPU per request against the input size, in all and per
    thread, one panel per protocol (``harness.plot``)."""
    pts = [{"protocol": r["protocol"], "input_mb": round(r["input_bytes"] / 1e6, 2), "thread": k, "ms": v}
           for r in data["points"]
           for k, v in {"total": r["cpu_ms_per_request"], **r["threads_ms_per_request"]}.items()]  # fmt: skip
    harness.plot(pts, path, x="input_mb", y="ms", by="thread", panel="protocol",
                 xlabel="input, MB", ylabel="service process CPU, ms / request")  # fmt: skip


def run_threads(args: Any) -> int:
    """``--threads`` (module docstring): writes ``frontend_cpu_threads[_quick][_TAG]``."""
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{here}{os.pathsep}{old}" if old else here
    shapes = [[int(v) for v in s.split("x")] for s in args.sizes.split(",")]
    protocols = [p.strip() for p in args.protocols.split(",")]
    for p in protocols:
        if p not in ("http", "grpc"):
            raise SystemExit(f"--protocols: {p!r} is neither http nor grpc")
    os.environ["FRONTEND_CPU_STAGE_MS"] = str(args.stage_ms)
    os.environ["FRONTEND_CPU_LOOP"] = args.loop
    res = harness.cli.start("frontend_cpu_threads", args)
    res.name += f"_{args.tag}" if args.tag else ""
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(tmp, shapes)
        res.own_pids[:] = [server.proc.pid]
        try:
            for protocol in protocols:
                for i, shape in enumerate(shapes):
                    big = int(np.prod(shape)) * 4 > 2 << 20
                    n = args.n or ((60 if big else 300) if args.quick else (300 if big else 2000))
                    r = res.add(
                        **measure(server, protocol, i, shape, n, args.concurrency, args.py_spy)
                    )
                    print(f"{protocol:4} {r['input_bytes'] / 1e6:5.2f} MB: {r['cpu_ms_per_request']:.3f} "
                          f"ms CPU/request  {r['threads_ms_per_request']}")  # fmt: skip
            quiet = res.summary["idle"] = idle(server, args.idle_s)
            print(f"idle: {quiet['cpu_ms_per_s']:.3f} ms CPU/s  {quiet['threads_ms_per_s']}")
        finally:
            server.close()
    harness.cli.finish(res, args, plot)
    return 0


#: Python thread names before the service named its threads ``isc-*``: the same roles
_OLD_NAMES = {
    "infscaler-api": "isc-api",
    "infscaler-frontend": "isc-frontend",
    "infscaler-token-router": "isc-router",
    "infscaler-sharing-manager": "isc-shm-manager",
    "infscaler-autoscaler": "isc-autoscaler",
    "asyncio_0": "isc-api-exec_0",
    "asyncio_1": "isc-api-exec_1",
}


def _role(key: str) -> str:
    name = key.split(" / ")[-1]
    return _OLD_NAMES.get(name, name)


def _means(stems: list[str], out: Path) -> dict[str, dict[str, float]]:
    """Per ``protocol size``: the mean CPU ms per request over the runs ``stems`` (in
    ``out``: harness results, or the former files' ``runs``), in all (``total``) and per
    thread role."""
    acc: dict[str, dict[str, list[float]]] = {}
    for stem in stems:
        doc = json.loads((Path(out) / f"{stem}.json").read_text())
        for r in doc.get("points") or doc["runs"]:
            row = acc.setdefault(f"{r['protocol']} {r['input_bytes'] / 1e6:.1f} MB", {})
            row.setdefault("total", []).append(r["cpu_ms_per_request"])
            roles: dict[str, float] = {}
            for k, v in r["threads_ms_per_request"].items():
                roles[_role(k)] = roles.get(_role(k), 0.0) + v
            for k, v in roles.items():
                row.setdefault(k, []).append(v)
    n = len(stems)
    return {
        case: {k: round(sum(v) / n, 3) for k, v in sorted(row.items())} for case, row in acc.items()
    }


def compare(spec: str, out_stem: str, out: Path = harness.cli.RESULTS_DIR) -> int:
    """``A1,A2:B1,B2`` (results stems, alternating runs of a baseline A and B): the mean
    CPU per request of each and B / A, in all and per thread role; writes
    ``<out>/{out_stem}.json``."""
    try:
        a_spec, b_spec = spec.split(":")
    except ValueError:
        raise SystemExit(
            f"--compare wants BASE1,BASE2:NEW1,NEW2 (results stems), got {spec!r}"
        ) from None
    a, b = _means(a_spec.split(","), out), _means(b_spec.split(","), out)
    cases = {}
    for case in a:
        ratio = {
            k: round(b[case][k] / a[case][k], 3)
            for k in a[case]
            if k in b.get(case, {}) and a[case][k] > 0
        }
        cases[case] = {"baseline": a[case], "new": b.get(case, {}), "new_over_baseline": ratio}
        print(
            f"{case}: {a[case]['total']:.3f} -> {b[case]['total']:.3f} ms ({ratio['total']:.2f}x)"
        )
    harness.write_json(
        Path(out) / f"{out_stem}.json",
        {"baseline_runs": a_spec.split(","), "new_runs": b_spec.split(","), "cases": cases},
    )
    return 0
