"""Two pipelines on one device under one cap: does the arbitration between pipelines
(priorities, ``runtime/scaling/arbitration.py``) keep the high-priority pipeline's SLO
through a step in its load, and at what cost to the low-priority one?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``arbitration.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import overload_slo as ov  # noqa: E402
import scaling as sc  # noqa: E402
import slotbound as sb  # noqa: E402
from arbitration_summary import (  # noqa: E402
    AUTO_ARMS,
    HIGH,
    LOW,
    VERSUS,
    plot_rounds,
    ratios,
    round_moves,
    spread,
    versus,
)
from harness.host import (  # noqa: E402
    ForeignLoad,
    default_cache_dir,
    environment,
    own_cpu_seconds,
    wait_for_quiet,
)
from harness.result import print_table  # noqa: E402

#: attainment a 1-s window must keep, from the recovery on
RECOVERED = 0.95


# -- configurations --------------------------------------------------------------------------


def device_yaml(slots: int, path: Path, memory_cap_mb: float | None = None) -> Path:
    """The host profile with ``slots`` cpu instance slots (the shared cap), as a YAML;
    with ``memory_cap_mb``, that memory cap too (the cap of :mod:`slotbound`'s stand-in
    stages: engine slots count model instances only)."""
    from infscaler.base.device import host_profile

    p = host_profile()
    if memory_cap_mb is not None:
        p = p.model_copy(update={"memory_cap_mb": int(memory_cap_mb)})
    why = f"bench/arbitration.py: the shared cap, {slots} cpu instances for both pipelines"
    acc = [
        a.model_copy(
            update={"max_instances": slots, "sources": {**a.sources, "max_instances": why}}
        )
        for a in p.accelerators
    ]
    p = p.model_copy(update={"name": "cpu-host-arbitration", "accelerators": acc})
    path.write_text(yaml.safe_dump(p.model_dump(mode="json", exclude_none=True)))
    return path


def auto_pipeline(model: str, name: str, slo_ms: float, priority: int, slots: int) -> dict:
    """The whole model, single-thread instances, autoscaled (1 to ``slots`` - 1)
    (``slot:MS``: :mod:`slotbound`'s stand-in stage; ``MODEL+slot:MS``: the model with
    its fused ``hold`` stage)."""
    auto = {**sc.AUTOSCALE, "oversubscribe": True}
    ms = sb.parse(model)
    if ms is not None:
        return sb.pipeline(name, ms, slo_ms, priority, 1, auto, slots - 1)
    model, hold = sb.split(model)
    cfg = sc.pipeline(model, name, 1, 1, slo_ms, auto, max_instances=slots - 1, whole=True)
    raw = cfg.model_dump(mode="json", exclude_none=True)
    raw["priority"] = priority
    return sb.with_hold(raw, hold, model)


def static_pipeline(model: str, name: str, slo_ms: float | None, priority: int, n: int) -> dict:
    """The whole model at ``n`` fixed single-thread instances, SLO (None: none) for
    admission only (``slot:MS``, ``MODEL+slot:MS``: as :func:`auto_pipeline`)."""
    ms = sb.parse(model)
    if ms is not None:
        return sb.pipeline(name, ms, slo_ms, priority, n)
    model, hold = sb.split(model)
    raw = harness.models.hand_pipeline(model, name, 1, n, slo_ms).model_dump(
        mode="json", exclude_none=True
    )
    raw["priority"] = priority
    return sb.with_hold(raw, hold, model)


def served(pipes: list[dict], device: Path, env: dict) -> harness.Sut:
    """The two pipelines in one ``infscaler serve`` on ``device`` (``env``: extra
    environment), ``status`` polled every second (:meth:`harness.Sut.watch`)."""
    args = ["--device", str(device), "--drain-timeout", "5"]
    return harness.Sut(pipes, args, env=env, ready_timeout_s=600).__enter__().watch(1.0)


# -- load ------------------------------------------------------------------------------------


def replay(sock: str, model: str, feeds: dict, times: np.ndarray) -> list[dict]:
    """One request per arrival time (s from now) through ``LoadGenerator.replay``
    (persistent connections); rows ``{"t_s", "outcome", "ms", ...}`` (latency from the
    send)."""
    from infscaler.api.loadgen import LoadGenerator

    return LoadGenerator(sock, model, feeds).replay(times)


def replay_all(sock: str, feeds: dict, times: dict[str, np.ndarray]) -> dict[str, list[dict]]:
    """:func:`replay` of each pipeline's arrivals at once (a thread each)."""
    with ThreadPoolExecutor(len(times)) as ex:
        futs = {n: ex.submit(replay, sock, n, feeds[n], t) for n, t in times.items()}
        return {n: f.result() for n, f in futs.items()}


def step_times(c_high: float, c_low: float, a: argparse.Namespace) -> dict[str, np.ndarray]:
    """The step scenario's arrival times per pipeline (the method, step 3)."""
    high = two_rates(a.before * c_high, a.pre_s, a.after * c_high, a.post_s, a.seed)
    rest = a.pre_s + a.post_s - a.low_burst_s
    low = two_rates(a.low_burst * c_low, a.low_burst_s, a.low_load * c_low, rest, a.seed + 2)
    return {HIGH: high, LOW: low}


def two_rates(rate1: float, dur1_s: float, rate2: float, dur2_s: float, seed: int) -> np.ndarray:
    """Poisson arrival times (s) at ``rate1``/s for ``dur1_s``, then at ``rate2``/s for
    ``dur2_s`` (seeds ``seed`` and ``seed`` + 1)."""
    from infscaler.api.loadgen import arrival_times

    first = arrival_times("poisson", rate1, dur1_s, seed)
    then = arrival_times("poisson", rate2, dur2_s, seed + 1) + dur1_s
    return np.concatenate([first, then])


def busiest_functions(n: int = 2) -> list[str]:
    """Hashes of the ``n`` functions with the most invocations in the Azure trace."""
    from infscaler.runtime.planning import arrivals

    p = arrivals._trace_file(None, arrivals.AZURE_FUNCTIONS_FILE)
    with arrivals._open_text(p) as f:
        reader = csv.reader(f)
        header = next(reader)
        h, col0 = header.index("HashFunction"), header.index("Trigger") + 1
        totals = sorted(((sum(map(int, r[col0:])), r[h]) for r in reader if r), reverse=True)
    return [fn for _, fn in totals[:n]]


def trace_times(fn: str, mean_rps: float, a: argparse.Namespace, seed: int) -> np.ndarray:
    """Function ``fn``'s minutes, each replayed in ``--minute-s`` s, at ``mean_rps``."""
    from infscaler.runtime.planning import arrivals

    t = arrivals.azure_functions(
        function=fn, start_min=a.trace_start, minutes=a.trace_minutes, seed=seed
    )
    t = t * (a.minute_s / 60.0)
    window = a.trace_minutes * a.minute_s
    if t.size == 0:
        return t
    keep = int(round(mean_rps * window))  # thin or repeat to the target mean
    rng = np.random.default_rng(seed)
    idx = rng.choice(t.size, size=keep, replace=keep > t.size)
    return np.sort(t[idx] + (rng.random(keep) * 1e-3 if keep > t.size else 0.0))


def at_step(polls: list[tuple[float, Any]], step_s: float) -> Any:
    """The last poll's value at or before ``step_s`` (None: no poll by then)."""
    before = [n for t, n in polls if t <= step_s]
    return before[-1] if before else None


# -- outcomes --------------------------------------------------------------------------------


def within_slo(rows: list[dict], slo_ms: float) -> list[bool]:
    return [r["outcome"] == "ok" and r["ms"] <= slo_ms for r in rows]


def attainment(rows: list[dict], slo_ms: float) -> float | None:
    """Fraction of ``rows`` answered with 200 within ``slo_ms`` (None: no rows)."""
    ok = within_slo(rows, slo_ms)
    return round(sum(ok) / len(ok), 4) if ok else None


def recovery_s(rows: list[dict], slo_ms: float, step_s: float, end_s: float) -> float | None:
    """Seconds from ``step_s`` to the start of the first 1-s window (by send time) after
    which every window up to ``end_s`` has attainment >= :data:`RECOVERED` (None: never)."""
    n = int(math.floor(end_s - step_s))
    att = []
    for w in range(n):
        lo, hi = step_s + w, step_s + w + 1
        att.append(attainment([r for r in rows if lo <= r["t_s"] < hi], slo_ms))
    for w in range(n):
        if all(x is None or x >= RECOVERED for x in att[w:]):
            return float(w)
    return None


def outcomes(
    rows: dict[str, list], slo: dict[str, float], step_s: float | None, end_s: float
) -> dict[str, Any]:
    """Per pipeline: sent, attainment (before / after ``step_s`` when given), goodput,
    outcomes; for the high one, the recovery time after the step."""
    out: dict[str, Any] = {}
    for name, rs in rows.items():
        ok = within_slo(rs, slo[name])
        e: dict[str, Any] = {
            "sent": len(rs),
            "attainment": attainment(rs, slo[name]),
            "goodput_rps": round(sum(ok) / end_s, 3),
            "outcomes": {o: sum(r["outcome"] == o for r in rs) for o in {r["outcome"] for r in rs}},
        }
        if step_s is not None:
            e["attainment_before"] = attainment([r for r in rs if r["t_s"] < step_s], slo[name])
            e["attainment_after"] = attainment([r for r in rs if r["t_s"] >= step_s], slo[name])
            if name == HIGH:
                e["recovery_s"] = recovery_s(rs, slo[name], step_s, end_s)
        out[name] = e
    return out


def run_window(
    sut: harness.Sut, feeds: dict, times: dict[str, np.ndarray], slo: dict, step_s: float | None
) -> dict[str, Any]:
    """Both pipelines' arrivals at once on ``sut``; outcomes, moves and decisions."""
    end_s = max(float(t[-1]) for t in times.values() if t.size) + 1e-9
    wall0 = time.time()
    rows = replay_all(sut.sock, feeds, {n: times[n] for n in (HIGH, LOW)})
    time.sleep(1.5)  # the last status poll
    decisions, polls = sut.since(wall0)
    moves = [
        {k: d.get(k) for k in ("t_s", "pipeline", "action", "kind", "giver", "taker")}
        for d in decisions
        if d.get("action") in ("arbitrate_give", "arbitrate_take")
    ]
    return {
        "instances_at_step": None if step_s is None else at_step(polls, step_s),
        "instances": polls,
        "outcomes": outcomes(rows, slo, step_s, end_s),
        "moves": moves,
        "decisions": [
            {k: d.get(k) for k in ("t_s", "pipeline", "action", "unit")} for d in decisions
        ],
        "requests": rows,
    }


# -- the run ---------------------------------------------------------------------------------


def closed_loop(sock: str, model: str, feeds: dict, clients: int, n: int) -> dict:
    """``clients`` requests in flight over one window of ``n`` answers
    (``overload_slo.closed_loop``: ``infscaler.api.loadgen``'s concurrency mode)."""
    from infscaler.api.codec import encode_infer_request

    body, headers = encode_infer_request(feeds)
    return asyncio.run(ov.closed_loop(sock, model, body, headers, clients, n))


def served_l0(sock: str, model: str, feeds: dict, n: int = 15) -> float:
    """The pipeline's served latency at no load, ms: the P50 of ``n`` sequential requests
    (:func:`closed_loop` of 1) after 3 unmeasured ones."""
    closed_loop(sock, model, feeds, 1, 3)
    return closed_loop(sock, model, feeds, 1, n)["p50_ms"]


def capacities(
    a: argparse.Namespace, device: Path, feeds: dict, session_l0: dict[str, float]
) -> dict:
    """C_high and C_low, closed loop on a static service, and each pipeline's served L0
    (:func:`served_l0`, before the closed loops); with ``--capacity slo``, the high
    pipeline's SLO capacity beside the low load (:func:`slo_capacity`) (module
    docstring, step 2). ``session_l0``: step 1's L0 per pipeline, ms (``--l0 session``)."""
    pipes = [
        static_pipeline(a.high, HIGH, None, 1, a.slots - 1),  # no SLO: nothing refused
        static_pipeline(a.low, LOW, None, 2, 1),
    ]
    s = served(pipes, device, {})
    try:
        out = {}
        for name, clients in ((HIGH, a.slots - 1), (LOW, 1)):
            l0 = served_l0(s.sock, name, feeds[name])
            out[name] = closed_loop(s.sock, name, feeds[name], clients, a.capacity_requests)
            out[name]["served_l0_ms"] = l0
        out["high_beside_low"] = high_beside_low(s.sock, a, feeds, out)
        out["memory"] = memory_now(s.sock)
        if a.capacity == "slo":
            l0 = out[HIGH]["served_l0_ms"] if a.l0 == "served" else session_l0[HIGH]
            out["high_slo"] = slo_capacity(
                s.sock,
                a,
                feeds,
                out[LOW]["throughput_rps"],
                a.high_slo_x * l0,
                out["high_beside_low"]["throughput_rps"],
            )
    finally:
        s.__exit__(None, None, None)
        out["stop"] = s.stopped
    return out


def memory_now(sock: str) -> dict[str, float]:
    """The service's memory as its scaler counts it (``status``: the instances' PSS plus
    the pool's mapped MB) and the mean PSS of one instance, MB."""
    from infscaler.api.client import Client

    with Client(sock, timeout=10) as c:
        st = c.status()
    pss = [
        float(i.get("pss_mb") or i.get("rss_mb") or 0.0)
        for p in st.get("pipelines", [])
        for u in p.get("units", [])
        for i in u.get("instances", [])
    ]
    return {
        "used_mb": float(st["resources"]["memory_used_mb"]),
        "instance_mb": float(np.mean(pss)) if pss else 0.0,
    }


def high_beside_low(sock: str, a: argparse.Namespace, feeds: dict, cap: dict) -> dict:
    """C_high as the step scenario leaves it to the high pipeline: its closed loop (as
    in :func:`capacities`) while the low pipeline gets its constant load, Poisson at
    ``--low-load`` x C_low, beside it (on 2 cores the CPU, not the slots, is what the two
    share; the high pipeline alone on both cores is a capacity the scenario cannot
    give it). The low load starts 2 s before the closed loop and lasts twice the closed
    loop's time alone (``cap``: :func:`capacities`' figures so far) plus 5 s."""
    from infscaler.api.loadgen import arrival_times

    span_s = 7.0 + 2 * a.capacity_requests / max(cap[HIGH]["throughput_rps"], 0.1)
    low_times = arrival_times(
        "poisson", a.low_load * cap[LOW]["throughput_rps"], span_s, a.seed + 7
    )
    with ThreadPoolExecutor(1) as ex:
        low = ex.submit(replay, sock, LOW, feeds[LOW], low_times)
        time.sleep(2.0)  # the low load under way
        out = closed_loop(sock, HIGH, feeds[HIGH], a.slots - 1, a.capacity_requests)
        low.result()
    return out


def slo_capacity(
    sock: str, a: argparse.Namespace, feeds: dict, c_low: float, slo_ms: float, top: float
) -> dict:
    """The high pipeline's SLO capacity: the largest Poisson rate (requests/s) at which
    its ``--slots`` - 1 instances answer >= ``--slo-target`` (0.95) of the requests within
    ``slo_ms``, beside the low pipeline's constant load (``--low-load`` x ``c_low``), as
    in :func:`high_beside_low`. Bisection between 0.1 and 1 x ``top`` (the closed-loop
    throughput beside the low load) in ``--slo-probes`` (6) probes of ``--probe-s`` (20 s)
    each; the requests of a probe's first 2 s are not counted.

    Raises:
        SystemExit: no probe met the target (the bisection's floor, 0.1 x ``top``, was
            never probed: it is no capacity).

    Source: InferLine §4's capacity ("the maximum throughput at which the configuration
    meets the latency SLO"); why not the closed loop's: HISTORY.md, "The scripts'
    methods", ``arbitration.py``."""
    from infscaler.api.loadgen import arrival_times

    lo, hi = 0.1 * top, top
    probes = []
    for i in range(a.slo_probes):
        rate = (lo + hi) / 2.0
        high_t = arrival_times("poisson", rate, a.probe_s, a.seed + 11 + i)
        low_t = arrival_times("poisson", a.low_load * c_low, a.probe_s + 2.0, a.seed + 31 + i)
        rows = replay_all(sock, feeds, {HIGH: high_t, LOW: low_t})[HIGH]
        rows = [r for r in rows if r["t_s"] >= 2.0]
        att = attainment(rows, slo_ms) or 0.0
        ok = att >= a.slo_target
        probes.append({"rate_rps": round(rate, 3), "attainment": att, "requests": len(rows)})
        print(f"    SLO capacity probe {rate:.2f}/s: attainment {att:.3f}", flush=True)
        lo, hi = (rate, hi) if ok else (lo, rate)
    if not any(p["attainment"] >= a.slo_target for p in probes):
        raise SystemExit(
            f"no SLO capacity: the high pipeline kept fewer than {a.slo_target} of its "
            f"requests within {slo_ms:.0f} ms at every probe down to {lo:.2f}/s "
            f"({probes}); raise --slo-x, lower --slo-target, or give it more --slots"
        )
    return {
        "throughput_rps": round(lo, 3),
        "slo_ms": round(slo_ms, 2),
        "target": a.slo_target,
        "probes": probes,
    }


def arm(tag: str, pipes: list[dict], env: dict, device: Path, windows: list[tuple]) -> dict:
    """Each of ``windows`` ((name, feeds, times, slo, step_s)) on a fresh service of its
    own (a loan or a scale-out of one window does not carry into the next); the other
    processes' CPU over the windows, cores (the service's tree and this process not
    counted)."""
    out: dict[str, Any] = {"pipelines": pipes, "env": env, "other_cores": {}, "stop": {}}
    for name, feeds, times, slo, step_s in windows:
        s = served(pipes, device, env)
        foreign = ForeignLoad(lambda s=s: own_cpu_seconds(s.processes()))
        try:
            print(f"  {tag}: {name} window", flush=True)
            out[name] = run_window(s, feeds, times, slo, step_s)
        finally:
            out["other_cores"][name] = foreign.cores()
            s.__exit__(None, None, None)
            out["stop"][name] = s.stopped
    out["other_processes_cores"] = round(float(np.mean(list(out["other_cores"].values()))), 3)
    return out


def step_rounds(
    a: argparse.Namespace,
    auto: list[dict],
    static_pipes: dict[str, list[dict]],
    device: Path,
    windows: list[tuple],
) -> dict[str, list[dict]]:
    """The step scenario's arms over ``a.rounds`` rounds, the order of the arms reversed
    every other round (a drift of the host's load falls on every arm alike), a fresh
    service per arm and round: ``{tag: [arm() per round]}`` with tags ``arbitration``,
    ``lend-only`` (no warm spares), ``per-pipeline`` and ``static H+L`` per split, those
    of ``a.arms`` only (``static``: every split). The trace windows (``windows[1:]``)
    run in the first round only, for the auto arms."""
    off = {"INFSCALER_ARBITRATION": "off"}
    plan: dict[str, tuple[list[dict], dict]] = {
        "arbitration": (auto, {}),
        "lend-only": (auto, {"INFSCALER_ARBITRATION": "lend-only"}),
        "per-pipeline": (auto, off),
        **{f"static {k}": (pipes, {}) for k, pipes in static_pipes.items()},
    }
    plan = {t: v for t, v in plan.items() if t.split()[0] in a.arms.split(",")}
    per: dict[str, list[dict]] = {tag: [] for tag in plan}
    for r in range(a.rounds):
        for tag in list(plan) if r % 2 == 0 else list(plan)[::-1]:
            pipes, env = plan[tag]
            wins = windows if r == 0 and not tag.startswith("static") else windows[:1]
            label = f"{tag.replace(' ', '-')}-r{r}"
            per[tag].append(arm(label, pipes, env, device, wins))
    return per


def main(argv: list[str] | None = None) -> int:
    p = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    p.set_defaults(seed=1)
    p.add_argument("--high", default="ppocrv4-det")
    p.add_argument("--low", default="resnet50")
    p.add_argument("--l0", choices=("served", "session"), default="served")
    p.add_argument("--capacity", choices=("slo", "beside-low", "alone"), default="slo")
    p.add_argument("--slo-target", type=float, default=0.95)
    p.add_argument("--slo-probes", type=int, default=6)
    p.add_argument("--probe-s", type=float, default=20.0)
    p.add_argument("--high-slo-x", type=float, default=2.0)
    p.add_argument("--low-slo-x", type=float, default=5.0)
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--before", type=float, default=0.3)
    p.add_argument("--after", type=float, default=0.8)
    p.add_argument("--low-load", type=float, default=0.4)
    p.add_argument("--low-burst", type=float, default=2.0)
    p.add_argument("--low-burst-s", type=float, default=25.0)
    p.add_argument("--pre-s", type=float, default=35.0)
    p.add_argument("--post-s", type=float, default=90.0)
    p.add_argument("--capacity-requests", type=int, default=60)
    p.add_argument("--trace-start", type=int, default=60)
    p.add_argument("--trace-minutes", type=int, default=20)
    p.add_argument("--minute-s", type=float, default=15.0)
    p.add_argument("--trace-load", type=float, default=0.55)
    p.add_argument("--no-trace", action="store_true")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the step scenario's arms")
    arms = "arbitration,lend-only,per-pipeline,static"
    p.add_argument("--arms", default=arms, help=f"step arms to run, of {arms} (static: each split)")
    p.add_argument("--tag", default="", help="results/arbitration[_quick]_TAG.json / .png")

    def quick(a: argparse.Namespace) -> None:
        a.pre_s, a.post_s, a.capacity_requests = 25.0, 25.0, 16
        a.trace_minutes, a.minute_s, a.quiet_wait_s = 6, 5.0, 5.0
        a.slo_probes, a.probe_s = 2, 8.0

    a = harness.cli.parse(p, argv, quick)
    if not {"static"} < set(a.arms.split(",")) <= set(arms.split(",")):
        p.error(f"--arms: static and one or more of {arms}, comma-separated; got {a.arms!r}")
    if a.slots < 2:
        p.error(f"--slots must be >= 2 (one instance per pipeline at least), got {a.slots}")
    default_cache_dir()
    quiet = wait_for_quiet(a.quiet_wait_s)
    data: dict[str, Any] = {
        "environment": environment(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "quiet_before": quiet,
    }
    models = {HIGH: a.high, LOW: a.low}
    slot_ms = {n: sb.parse(m) for n, m in models.items()}
    # the stand-in / hold stages' module (unused by plain models)
    here = str(sb.write_module(Path(tempfile.mkdtemp(prefix="isc-slotbound-"))).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (here, os.environ.get("PYTHONPATH")) if x)
    base = {n: sb.split(m) for n, m in models.items()}  # (model, hold ms) of MODEL+slot:MS
    feeds = {n: sb.feeds() if slot_ms[n] else sc.model_inputs(base[n][0]) for n in models}
    cal = {
        n: {"l0_ms": slot_ms[n]}
        if slot_ms[n]
        else sb.held_l0(sc.calibrate(base[n][0], feeds[n], 10 if a.quick else 20), base[n][1])
        for n in models
    }
    tmp = Path(tempfile.mkdtemp(prefix="isc-arbitration-"))
    device = device_yaml(a.slots, tmp / "device.yaml")
    cap = capacities(a, device, feeds, {n: cal[n]["l0_ms"] for n in cal})
    if any(v is not None for v in slot_ms.values()):
        # stand-in stages do not count against engine slots: memory is their cap, what
        # the capacity service's --slots instances used (each holding its ballast) with
        # room for half of one more: the scaler counts a new instance at one's PSS
        mem = cap["memory"]
        cap["memory_cap_mb"] = round(mem["used_mb"] + 0.5 * mem["instance_mb"], 1)
        device = device_yaml(a.slots, tmp / "device-memory.yaml", cap["memory_cap_mb"])
    c = {n: cap[n]["throughput_rps"] for n in (HIGH, LOW)}
    if a.capacity == "beside-low":
        c[HIGH] = cap["high_beside_low"]["throughput_rps"]
    elif a.capacity == "slo":
        c[HIGH] = cap["high_slo"]["throughput_rps"]
    if not min(c.values()) > 0:
        raise SystemExit(f"a capacity is 0 (nothing answered): {cap}")
    l0 = {n: cap[n]["served_l0_ms"] if a.l0 == "served" else cal[n]["l0_ms"] for n in c}
    slo = {HIGH: a.high_slo_x * l0[HIGH], LOW: a.low_slo_x * l0[LOW]}
    data.update(calibration=cal, l0_ms=l0, slo_ms={n: round(v, 2) for n, v in slo.items()})
    data["capacity"] = cap
    print(
        f"== L0 ({a.l0}) {l0[HIGH]:.1f} / {l0[LOW]:.1f} ms (session {cal[HIGH]['l0_ms']} / "
        f"{cal[LOW]['l0_ms']}), SLO {slo}; capacity high {c[HIGH]}/s, low {c[LOW]}/s",
        flush=True,
    )
    step = step_times(c[HIGH], c[LOW], a)
    windows = [("step", feeds, step, slo, a.pre_s)]
    if not a.no_trace:
        fns = busiest_functions(2)
        tr = {
            n: trace_times(fn, a.trace_load * c[n], a, a.seed + i)
            for i, (n, fn) in enumerate(zip((HIGH, LOW), fns, strict=True))
        }
        data["trace"] = {"functions": dict(zip((HIGH, LOW), fns, strict=True))}
        windows.append(("trace", feeds, tr, slo, None))
    auto = [
        auto_pipeline(a.high, HIGH, slo[HIGH], 1, a.slots),
        auto_pipeline(a.low, LOW, slo[LOW], 2, a.slots),
    ]
    static_pipes = {
        f"{h}+{a.slots - h}": [
            static_pipeline(a.high, HIGH, slo[HIGH], 1, h),
            static_pipeline(a.low, LOW, slo[LOW], 2, a.slots - h),
        ]
        for h in range(1, a.slots)
    }
    per = step_rounds(a, auto, static_pipes, device, windows)
    summary = {tag: spread(runs, a.slots) for tag, runs in per.items()}
    static = [t for t in per if t.startswith("static ")]
    best = max(static, key=lambda t: (summary[t]["high_attainment_after"]["median"] or 0.0,
                                      summary[t]["total_goodput_rps"]["median"]))  # fmt: skip
    arms = {tag: per[tag][0] for tag in AUTO_ARMS if tag in per}
    arms["static"] = {**per[best][0], "split": best.split()[1]}
    data["static_tried"] = {t: per[t][0]["step"]["outcomes"] for t in static}
    data["step_rounds"] = {t: [e["step"]["outcomes"] for e in runs] for t, runs in per.items()}
    data["step_round_moves"] = {
        t: [round_moves(e["step"]) for e in runs] for t, runs in per.items()
    }
    data["step_summary"] = summary
    data["auto_vs_best_static"] = versus(summary, best)
    data["arms"] = arms
    data["ratios_vs_per_pipeline"] = {s: ratios(arms, s) for s in ("step", "trace")}
    data["environment"]["load_average_at_end"] = list(os.getloadavg())
    name = "arbitration" + ("_quick" if a.quick else "") + (f"_{a.tag}" if a.tag else "")
    harness.write_json(a.out / f"{name}.json", data)
    plot(data, a.out / f"{name}.png")
    plot_rounds(data, a.out / f"{name}_rounds.png")
    report(data)
    return 0


def report(data: dict[str, Any]) -> None:
    """The compact tables on stdout."""
    rows = [
        [
            tag,
            f"{e['high_attainment_after']['median']} [{e['high_attainment_after']['min']}, "
            f"{e['high_attainment_after']['max']}]",
            f"{e['total_goodput_rps']['median']} [{e['total_goodput_rps']['min']}, "
            f"{e['total_goodput_rps']['max']}]",
            e["rounds"],
            e.get("cap_bound_rounds"),
            e.get("over_cap_rounds"),
        ]
        for tag, e in data.get("step_summary", {}).items()
    ]
    if rows:
        print_table(
            ["step arm", "high att. after [min, max]", "total goodput/s", "rounds", "cap bound"]
            + ["over cap"],
            rows,
        )
        vs = data["auto_vs_best_static"]
        rows = []
        for tag in (t for t in AUTO_ARMS if t in vs):
            for k in VERSUS:
                r = vs[tag][k]
                q = r["rounds"]
                rows.append([tag, k, r["ratio"], f"{q['median']} [{q['min']}, {q['max']}]"])
        print(f"auto / best static ({vs['best_static']}):")
        print_table(["arm", "metric", "ratio of medians", "per round [min, max]"], rows)
    rows = []
    for tag, e in data["arms"].items():
        o = e["step"]["outcomes"]
        rows.append(
            [
                tag + (f" ({e['split']})" if "split" in e else ""),
                o[HIGH]["attainment_before"],
                o[HIGH]["attainment_after"],
                o[HIGH]["recovery_s"],
                o[LOW]["goodput_rps"],
                len(e["step"]["moves"]),
                (e["step"].get("instances_at_step") or {}).get(LOW),
                e["other_processes_cores"],
            ]
        )
    print_table(
        [
            "step arm",
            "high att. before",
            "after",
            "recovery s",
            "low goodput/s",
            "moves",
            "low inst. at step",
            "other cores",
        ],
        rows,
    )
    rows = [
        [
            tag,
            e["trace"]["outcomes"][HIGH]["goodput_rps"],
            e["trace"]["outcomes"][LOW]["goodput_rps"],
            e["trace"]["outcomes"][HIGH]["attainment"],
            len(e["trace"]["moves"]),
        ]
        for tag, e in data["arms"].items()
        if "trace" in e
    ]
    if rows:
        print_table(["trace arm", "high goodput/s", "low goodput/s", "high att.", "moves"], rows)


def plot(data: dict[str, Any], path: Path) -> None:
    """Step scenario per arm: each pipeline's attainment per 1-s window (the step at
    ``pre_s``; the moves are in the JSON's ``arms``), one panel per pipeline."""
    pts = []
    for tag, e in data["arms"].items():
        label = tag + (f" {e['split']}" if "split" in e else "")
        for name in (HIGH, LOW):
            rs = e["step"]["requests"][name]
            for w in range(int(max((r["t_s"] for r in rs), default=0)) + 1):
                y = attainment([r for r in rs if w <= r["t_s"] < w + 1], data["slo_ms"][name])
                pts.append({"pipeline": name, "arm": label, "t_s": w, "attainment": y})
    st = data["settings"]
    harness.plot(pts, path, x="t_s", y="attainment", by="arm", panel="pipeline",
                 title=f"{st['high']} (priority 1) step {st['before']} -> {st['after']} x C at "
                 f"{st['pre_s']} s; {st['low']} (priority 2) constant",
                 xlabel="s since the window started", ylabel="attainment per 1 s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
