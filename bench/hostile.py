"""Hostile clients against a served pipeline, over the HTTP and the gRPC socket: each
attack class, then a soak.

Writes ``bench/results/hostile.json`` (and ``hostile_soak.png`` with a soak).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``hostile.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.host import environment, now_utc  # noqa: E402
from bench.harness.result import write_json  # noqa: E402
from tests.integration.api.grpc_attacks import run_as  # noqa: E402
from tests.integration.api.test_hostile import (  # noqa: E402
    BINARY,
    NOBODY_UID,
    QUOTAS,
    _big_bodies,
    _fds,
    _hold_connections,
    _register_many,
    _rss_mb,
    _shm_reads,
    _shrink_race,
    root_service,
)
from tests.integration.api.test_security import (  # noqa: E402
    CHAIN,
    GROUP,
    OTHER_UID,
    as_user,
    call,
)

RESULTS = ROOT / "bench" / "results"
INFER = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [[1.0, 2.0, 3.0, 4.0]]}]
}


#: a pipeline whose stage sleeps: requests stay pending long enough to be held
SLOW = {
    "name": "slow",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["y"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {
            "name": "wait",
            "function": "stagefuncs:slow",
            "params": {"ms": 200.0},
            "inputs": ["y"],
            "outputs": ["y"],
        },
    ],
}


def shm_objects() -> int:
    return len(os.listdir("/dev/shm"))


def probe(proc: subprocess.Popen) -> dict[str, Any]:
    pid = proc.pid
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {
        "alive": proc.poll() is None,
        "rss_mb": round(_rss_mb(pid), 1),
        "fds": _fds(pid),
        "threads": threads,
        "shm_objects": shm_objects(),
    }


def grpc_socket(sock: str) -> str:
    from infscaler.api.grpc import default_grpc_socket

    return default_grpc_socket(sock)


def grpc_as(attack: str, *args: Any, uid: int = NOBODY_UID) -> Any:
    return run_as(attack, *args, uid=uid, group=GROUP)


def valid_from_another_user(sock: str) -> bool:
    status, res = as_user(call, sock, "POST", "/v2/models/chain/infer", INFER, uid=OTHER_UID)
    return status == 200 and res["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]


def root_checks(sock: str) -> dict[str, Any]:
    """Root's inference and health over HTTP (timed here) and gRPC (timed in its client)."""
    t0 = time.monotonic()
    infer, _ = call(sock, "POST", "/v2/models/chain/infer", INFER)
    t1 = time.monotonic()
    health, _ = call(sock, "GET", "/v2/health/ready")
    t2 = time.monotonic()
    g = grpc_as("root_probe", grpc_socket(sock), uid=0)
    return {
        "http_infer": [infer, round(t1 - t0, 3)],
        "http_health": [health, round(t2 - t1, 3)],
        "grpc_infer": g["infer"],
        "grpc_health": g["health"],
        "within_1s": infer == 200 and health == 200 and max(t1 - t0, t2 - t1) <= 1.0
        and g["infer"][0] == "OK" and g["health"][0] == "OK"
        and max(g["infer"][1], g["health"][1]) <= 1.0,
    }  # fmt: skip


# -- the attack classes -------------------------------------------------------------------


def attack_shrink(sock: str, rounds: int) -> dict[str, Any]:
    statuses = as_user(_shrink_race, sock, rounds)
    return {"statuses": statuses, "reads": rounds, "writes": rounds // 2}


def attack_regions(sock: str) -> dict[str, Any]:
    try:
        mine = as_user(_register_many, sock, 50)
        return {"registered": mine.count(200), "refused_429": mine.count(429), "of": 50}
    finally:
        call(sock, "POST", "/v2/systemsharedmemory/unregister")


def attack_connections(sock: str) -> dict[str, Any]:
    return as_user(_hold_connections, sock, 60, 2.0)


def attack_bodies(sock: str) -> dict[str, Any]:
    reg = as_user(_big_bodies, sock, 6, "/v2/systemsharedmemory/region/x/register", 60 << 20,
                  1 << 20, 0.0)  # fmt: skip
    inf = as_user(_big_bodies, sock, 4, "/v2/models/chain/infer", 3 << 20, 1 << 20, 2.0, BINARY)
    js = as_user(_big_bodies, sock, 4, "/v2/models/chain/infer", 2 << 20, 0, 0.0)
    return {"register_60mb": reg, "infer_3mb_binary_third_sent": inf, "infer_2mb_json": js}


#: FP32 [n, 4] rows of the shared memory inputs: 1.2 GB (over the pool), 6 MB (12 MB
#: reserved, over the uid's 8 MB), 1 MB (served)
SHM_ROWS = [75_264_000, 393_216, 65_536]


def attack_shm_oversized(sock: str) -> dict[str, Any]:
    return {"statuses": [st for st, _ in as_user(_shm_reads, sock, SHM_ROWS)], "rows": SHM_ROWS}


def attack_grpc_shrink(sock: str, rounds: int) -> dict[str, Any]:
    return {"codes": grpc_as("shrink", grpc_socket(sock), rounds), "reads": rounds}


def attack_grpc_regions(sock: str) -> dict[str, Any]:
    try:
        return {"codes": grpc_as("regions", grpc_socket(sock), 50), "of": 50}
    finally:
        grpc_as("unregister_all", grpc_socket(sock))


def attack_grpc_connections(sock: str) -> dict[str, Any]:
    return grpc_as("connections", grpc_socket(sock), 60, 2.0)


def attack_grpc_messages(sock: str) -> dict[str, Any]:
    g = grpc_socket(sock)
    return {
        "register_2mb_name": grpc_as("big_register", g, 2.0)[0],
        "infer_3mb_raw_x4": grpc_as("concurrent_infers", g, 4, 196_608),
        "infer_3mb_typed_x4": grpc_as("concurrent_infers", g, 4, 196_608, True),
    }


def attack_grpc_shm_oversized(sock: str) -> dict[str, Any]:
    codes = [c for c, _ in grpc_as("shm_oversized", grpc_socket(sock), SHM_ROWS)]
    return {"codes": codes, "rows": SHM_ROWS}


ATTACKS = {
    "regions": attack_regions,
    "connections": attack_connections,
    "bodies": attack_bodies,
    "shm_oversized": attack_shm_oversized,
    "grpc_regions": attack_grpc_regions,
    "grpc_connections": attack_grpc_connections,
    "grpc_messages": attack_grpc_messages,
    "grpc_shm_oversized": attack_grpc_shm_oversized,
}


def _latencies(sock: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        status, _ = call(sock, "POST", "/v2/models/chain/infer", INFER)
        if status == 200:
            out.append((time.monotonic() - t0) * 1e3)
    return out


def attack_pending(sock: str, n_root: int = 300) -> dict[str, Any]:
    """A uid holds its whole share of pending requests on ``slow`` (and more: the rest
    must be refused at once) while root's P99 on the idle ``chain`` is measured against
    its quiet P99, each over ``n_root`` requests."""
    quiet = _latencies(sock, n_root)
    held: dict[str, Any] = {}
    share = int(QUOTAS.get("--max-pending-per-uid", 64))
    t = threading.Thread(
        target=lambda: held.update(
            grpc_as("hold_pending", grpc_socket(sock), "slow", share + 32, 120.0)
        ),
        daemon=True,
    )
    t.start()
    time.sleep(3.0)  # the calls are in
    loaded = _latencies(sock, n_root)
    t.join(180)
    p99q, p99l = float(np.percentile(quiet, 99)), float(np.percentile(loaded, 99))
    return {
        "share": share,
        "sent": share + 32,
        "held_codes": held,
        "root_quiet_p99_ms": round(p99q, 2),
        "root_held_p99_ms": round(p99l, 2),
        "p99_ratio": round(p99l / p99q, 2),
        "root_requests": [len(quiet), len(loaded)],
    }


def run_class(name: str, fn: Any, proc: subprocess.Popen, sock: str) -> dict[str, Any]:
    before = probe(proc)
    peak = dict(before)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            with contextlib.suppress(OSError, StopIteration):
                now = probe(proc)
                peak.update({k: max(peak[k], now[k]) for k in ("rss_mb", "fds", "threads")})

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        result = fn()
    finally:
        stop.set()
        sampler.join(5)
    after = probe(proc)
    root = root_checks(sock)
    ok = valid_from_another_user(sock)
    out = {
        "class": name,
        "seconds": round(time.monotonic() - t0, 1),
        "result": result,
        "before": before,
        "during_max": {k: peak[k] for k in ("rss_mb", "fds", "threads")},
        "after": after,
        "root": root,
        "pid_unchanged": proc.poll() is None,
        "valid_request_after": ok,
    }
    print(f"{name}: {result} pid ok={out['pid_unchanged']} root<1s={root['within_1s']} "
          f"valid after={ok} rss {before['rss_mb']}->{peak['rss_mb']}->{after['rss_mb']} MB "
          f"fds {before['fds']}->{peak['fds']}->{after['fds']}", flush=True)  # fmt: skip
    return out


def instance_pids(sock: str) -> list[int]:
    status, res = call(sock, "GET", "/v2/infscaler/status")
    pids: list[int] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "instances" and isinstance(x, list):
                    pids.extend(i["pid"] for i in x if isinstance(i, dict) and i.get("pid"))
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(res)
    return pids


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 3:
        return float("nan")
    return float(np.polyfit(np.array(ts) / 3600.0, np.array(ys, dtype=float), 1)[0])


def soak(proc: subprocess.Popen, sock: str, minutes: float) -> dict[str, Any]:
    stop = threading.Event()
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def load() -> None:
        while not stop.is_set():
            try:
                status, _ = call(sock, "POST", "/v2/models/chain/infer", INFER)
                key = str(status)
            except OSError as exc:
                key = f"no answer: {type(exc).__name__}"
            with lock:
                outcomes[key] = outcomes.get(key, 0) + 1
            time.sleep(0.01)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    samples: list[dict[str, Any]] = []
    kills = attacks = 0
    t0 = time.monotonic()
    end = t0 + minutes * 60
    next_sample = next_kill = t0
    names = ["shrink", "grpc_shrink", *ATTACKS]
    rng = random.Random(0)
    while time.monotonic() < end and proc.poll() is None:
        now = time.monotonic()
        if now >= next_sample:
            samples.append({"t_s": round(now - t0, 1), **probe(proc)})
            next_sample += 10.0
        if now >= next_kill:
            pids = instance_pids(sock)
            if pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
            next_kill += 60.0
        name = names[attacks % len(names)]
        if name == "shrink":
            as_user(_shrink_race, sock, 100)
        elif name == "grpc_shrink":
            attack_grpc_shrink(sock, 100)
        else:
            ATTACKS[name](sock)
        attacks += 1
        time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(30)
    samples.append({"t_s": round(time.monotonic() - t0, 1), **probe(proc)})
    warm = [s for s in samples if s["t_s"] >= minutes * 60 / 5]
    ts = [s["t_s"] for s in warm]
    slopes = {
        k: round(slope_per_hour(ts, [s[k] for s in warm]), 2)
        for k in ("rss_mb", "fds", "threads", "shm_objects")
    }
    return {
        "minutes": minutes,
        "attacks": attacks,
        "instance_kills": kills,
        "valid_requests": outcomes,
        "alive_at_end": proc.poll() is None,
        "slope_per_hour_after_warmup": slopes,
        "samples": samples,
    }


def plot(soak_result: dict[str, Any], path: Path) -> None:
    """RSS, fds, threads and shm objects against the soak's minutes, one panel each, its
    slope after the warm-up in the panel's name (``harness.plot``)."""
    from bench.harness import plot as draw

    slopes = soak_result["slope_per_hour_after_warmup"]
    pts = [{"metric": f"{k}: {slopes[k]:+.2f} / h after warm-up", "min": x["t_s"] / 60, "v": x[k]}
           for x in soak_result["samples"] for k in ("rss_mb", "fds", "threads", "shm_objects")]  # fmt: skip
    draw(pts, path, x="min", y="v", panel="metric", ylabel="the panel's metric",
         xlabel="minutes (valid load, attacks in turn, kill -9 of an instance a minute)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shrink-rounds", type=int, default=2000)
    ap.add_argument("--soak-min", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "hostile.json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the attackers are switched to uid 65534 / 65533")
    RESULTS.mkdir(parents=True, exist_ok=True)
    flags = [str(x) for kv in QUOTAS.items() for x in kv]
    with (
        tempfile.TemporaryDirectory(prefix="isc-hostile-bench-") as td,
        root_service(Path(td), [CHAIN, SLOW], flags) as served,
    ):
        proc, sock, log = served["proc"], served["sock"], served["log"]
        pid = proc.pid
        classes = [
            run_class("shrink", lambda: attack_shrink(sock, a.shrink_rounds), proc, sock),
            run_class("grpc_shrink", lambda: attack_grpc_shrink(sock, a.shrink_rounds), proc, sock),
        ]
        classes += [run_class(n, lambda f=f: f(sock), proc, sock) for n, f in ATTACKS.items()]
        classes.append(run_class("pending", lambda: attack_pending(sock), proc, sock))
        result: dict[str, Any] = {
            "when": now_utc(),
            "environment": environment(),
            "quotas": QUOTAS,
            "classes": classes,
            "crashes": sum(not c["pid_unchanged"] for c in classes),
            "root_within_1s_after_every_class": all(c["root"]["within_1s"] for c in classes),
        }
        if a.soak_min > 0:
            result["soak"] = soak(proc, sock, a.soak_min)
            plot(result["soak"], a.out.with_name(a.out.stem + "_soak.png"))
        result["service_pid_unchanged"] = proc.poll() is None and proc.pid == pid
        log_text = log.read_text()
        result["log_lines"] = log_text.count("\n")
        result["log_bytes"] = len(log_text)
    write_json(a.out, result)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
