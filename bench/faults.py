"""Fault injection: kill -9 an instance again and again under steady load, then kill the
whole service and restart it on the same state dir.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``faults.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def pipeline_raw(model: str, partitions: int) -> dict[str, Any]:
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import MODELS

    cfg = pipeline_for_model(
        model,
        name="faults",
        partitions=partitions if partitions > 1 else None,
        shapes=MODELS[model].shapes,
    )
    raw = cfg.model_dump(exclude_none=True)
    raw["request_timeout_s"] = 60.0
    return raw


def _input(svc: Any, name: str) -> dict[str, np.ndarray]:
    dep = svc.deployment(name)
    out = {}
    for spec in dep.pipeline.inputs:
        shape = [1 if d < 0 else d for d in spec.shape]
        out[spec.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
    return out


def phase_kills(args: Any, state: Path) -> dict[str, Any]:
    from infscaler.base.config import load_pipeline
    from infscaler.runtime.serving.frontend import RequestError
    from infscaler.service.service import Service

    raw = pipeline_raw(args.model, args.partitions)
    with Service(state_dir=state, control_path=args.control_path, pool_mb=256) as svc:
        t_deploy = time.monotonic()
        dep = svc.deploy(load_pipeline(raw))
        deploy_s = time.monotonic() - t_deploy
        served = dep.pipeline.served_units()
        victim_unit = served[len(served) // 2]
        key = (dep.name, victim_unit.index)
        x = _input(svc, dep.name)
        svc.infer(dep.name, x)  # warm
        t0 = time.monotonic()
        records: list[dict[str, Any]] = []
        lock = threading.Lock()
        stop = threading.Event()

        def record(t_sub: float, outcome: str, reason: str | None = None, **kw: Any) -> None:
            ms = (time.monotonic() - t_sub) * 1e3
            rec = {"t": t_sub - t0, "ms": ms, "outcome": outcome, **kw}
            if reason is not None:
                rec["reason"] = reason[:160]
            with lock:
                records.append(rec)

        def failed(exc: RequestError) -> str:
            return "503" if exc.status == 503 else f"error {exc.status}"

        def on_done(t_sub: float, fut: Any) -> None:
            try:
                fut.result()
                record(t_sub, "ok")
            except RequestError as exc:
                record(t_sub, failed(exc), str(exc))
            except Exception as exc:  # noqa: BLE001 - recorded, never hidden
                record(t_sub, "exception", f"{type(exc).__name__}: {exc}")

        futures: list[Any] = []

        def load() -> None:
            period = 1.0 / args.rate
            nxt = time.monotonic()
            while not stop.is_set():
                t_sub = time.monotonic()
                try:
                    fut = svc.submit(dep.name, x)
                except RequestError as exc:  # refused at once (degraded / overloaded)
                    record(t_sub, failed(exc), str(exc), refused=True)
                else:
                    futures.append(fut)
                    fut.add_done_callback(lambda f, ts=t_sub: on_done(ts, f))
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(1.0)
        kills = []
        for i in range(args.kills):
            h = next((h for h in svc.supervisor.handles(key) if h.state == "ready"), None)
            if h is None:
                kills.append({"kill": i, "skipped": "no ready instance to kill"})
                continue
            t_kill = time.monotonic()
            os.kill(h.pid, signal.SIGKILL)
            back = delay = None
            degraded_seen = False
            deadline = t_kill + 60.0
            while time.monotonic() < deadline:
                pend = svc.supervisor.pending_restarts(key)
                if pend and delay is None:
                    delay = max(0.0, pend[0].due - t_kill)
                if svc.degraded(dep.name):
                    degraded_seen = True
                if any(n.state == "ready" and n.pid != h.pid for n in svc.supervisor.handles(key)):
                    back = time.monotonic() - t_kill
                    break
                time.sleep(0.005)
            kills.append(
                {
                    "kill": i,
                    "t": t_kill - t0,
                    "pid": h.pid,
                    "back_s": None if back is None else round(back, 3),
                    "restart_delay_s": None if delay is None else round(delay, 3),
                    "degraded_seen": degraded_seen,
                }
            )
            print(
                f"kill {i + 1}/{args.kills}: unit {victim_unit.name} back in "
                f"{'never' if back is None else f'{back:.2f} s'}",
                flush=True,
            )
            time.sleep(max(0.0, t_kill + args.interval - time.monotonic()))
        time.sleep(1.0)
        stop.set()
        loader.join(10)
        unanswered = 0
        for f in futures:
            try:
                f.exception(timeout=70)
            except Exception:  # noqa: BLE001 - a future that never completes
                unanswered += 1
        time.sleep(0.5)
        mgr = svc.manager.stats()["manager"]
        live = {i for i, v in mgr["instances"].items() if v["state"] == "live"}
        leaked = sum(v["slots"] for i, v in mgr["instances"].items() if i not in live)
        audit = svc.manager.audit()
        status = svc.status()
        t_end = time.monotonic() - t0
    with lock:
        recs = sorted(records, key=lambda r: r["t"])
    outcomes: dict[str, int] = {}
    for r in recs:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    backs = [k["back_s"] for k in kills if k.get("back_s") is not None]
    ok_ms = [r["ms"] for r in recs if r["outcome"] == "ok"]
    fails = [r["ms"] for r in recs if r["outcome"] != "ok"]
    return {
        "pipeline": {
            "model": args.model,
            "partitions": args.partitions,
            "victim_unit": victim_unit.name,
            "deploy_s": round(deploy_s, 2),
        },
        "rate_rps": args.rate,
        "interval_s": args.interval,
        "duration_s": round(t_end, 2),
        "kills": kills,
        "back_s": {
            "max": max(backs) if backs else None,
            "mean": round(float(np.mean(backs)), 3) if backs else None,
            "under_2s": sum(1 for b in backs if b < 2.0),
            "of": len(kills),
        },
        "requests": {
            "submitted": len(recs) + unanswered,
            "outcomes": outcomes,
            "unanswered": unanswered,
            "ok_p50_ms": round(float(np.percentile(ok_ms, 50)), 1) if ok_ms else None,
            "ok_p99_ms": round(float(np.percentile(ok_ms, 99)), 1) if ok_ms else None,
            "failed_max_ms": round(max(fails), 1) if fails else None,
        },
        "leaked_slots": leaked,
        "audit_problems": audit,
        "restarts": status["restarts"],
        "records": recs,
    }


_SERVE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service
    svc = Service(state_dir=sys.argv[1], control_path=sys.argv[3], pool_mb=256).start()
    dep = svc.deploy(load_pipeline(json.loads(sys.argv[2])))
    spec = dep.pipeline.inputs[0]
    x = np.random.default_rng(0).random([1 if d < 0 else d for d in spec.shape], dtype=np.float32)
    for _ in range(5):
        svc.infer(dep.name, {spec.name: x})
    print(svc.pool.service_id, flush=True)
    sys.stdin.read()
    """
)


def _slabs(service_id: str) -> list[Path]:
    return sorted(Path("/dev/shm").glob(f"isc-{service_id}-*"))


def phase_service_kill(args: Any, state: Path) -> dict[str, Any]:
    from infscaler.service.service import Service

    raw = pipeline_raw(args.model, args.partitions)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(state), json.dumps(raw), args.control_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sid = (proc.stdout.readline() if proc.stdout else "").strip()
        before = _slabs(sid) if sid else []
        mb = sum(p.stat().st_size for p in before) / 2**20
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    if not sid:
        return {"error": "the first service did not start"}
    left_after_kill = _slabs(sid)
    t = time.monotonic()
    with Service(state_dir=state, control_path=args.control_path, pool_mb=64):
        start_s = time.monotonic() - t
        left_after_restart = _slabs(sid)
    return {
        "first_run_service_id": sid,
        "slabs_mapped_before_kill": len(before),
        "slab_mb_before_kill": round(mb, 1),
        "slabs_left_after_kill_9": len(left_after_kill),
        "slabs_left_after_restart": len(left_after_restart),
        "restart_start_s": round(start_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between kills")
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second")
    ap.add_argument("--control-path", default="auto")
    ap.add_argument("--state-dir", type=Path, default=None)

    def quick(a: Any) -> None:
        a.kills, a.partitions, a.rate = 3, 2, 4.0

    args = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("faults", args)
    cache = Path(os.environ["INFSCALER_CACHE_DIR"])
    state = args.state_dir or cache / "bench-state" / f"faults-{args.model}-{args.partitions}"
    state.mkdir(parents=True, exist_ok=True)
    k = phase_kills(args, state)
    for r in k["records"]:
        res.add(**r)
    res.summary.update(kills_phase={x: v for x, v in k.items() if x != "records"},
                       service_kill_phase=phase_service_kill(args, state))  # fmt: skip
    harness.cli.finish(res, args, plot)
    print(json.dumps({"kills": len(k["kills"]), "back_s": k["back_s"], "requests": k["requests"],
                      "leaked_slots": k["leaked_slots"], "audit_problems": len(k["audit_problems"]),
                      "service_kill": res.summary["service_kill_phase"]}, indent=1))  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Each request's latency (ms, log) against its send time, by outcome; the kills'
    times are in the summary (``kills_phase.kills``)."""
    harness.plot(data["points"], path, x="t", y="ms", by="outcome", logy=True,
                 xlabel="s (kills: summary.kills_phase.kills)", ylabel="latency, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
