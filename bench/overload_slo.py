"""Overload at a multiple of capacity, the load generator on the same cores: does
admission keep the SLO it admits to, and does it keep the goodput?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``overload_slo.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import busy_cpu_seconds, process_cpu_seconds  # noqa: E402
from harness.scenarios import OFFLINE, SERVER  # noqa: E402

CONFIGS = ("replicas", "one-session", "auto")
NAME = "m"


def config_pipeline(model: str, config: str, slo_ms: float, cores: int) -> dict[str, Any]:
    """The served configuration (the method) with the SLO."""
    if config == "auto":
        import scaling

        cfg = scaling.auto_pipeline(model, NAME, slo_ms)
        raw = cfg.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        return {**raw, "autoscale": {}}  # the scaler's own defaults, as a user writes it
    threads, inst = (1, cores) if config == "replicas" else (cores, 1)
    return harness.models.static_pipeline(model, NAME, threads, inst, slo_ms)


def checks(point: dict[str, Any], slo_ms: float, sustained: float, a: Any) -> dict[str, bool]:
    """The overload checks of one point (the method)."""
    p99 = point["p99_ms"]
    return {
        "no_error_but_refusals": not point["errors_by_code"],
        "admitted_p99_within": p99 is not None and p99 <= a.p99_x * slo_ms,
        "goodput_within": sustained > 0 and (point["goodput_rps"] or 0) >= a.goodput_x * sustained,
    }


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (psutil ``children(recursive=True)``): its instances,
    whether spawned (its children) or forked by the zygote (the zygote's children).
    Direct children alone missed every forked instance, and their CPU was read as other
    processes' (about 1 core in every run since the zygote)."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Sampler:
    """RSS and CPU of the service, its instances and the rest of the host, every
    ``period_s`` (a thread)."""

    def __init__(self, pid: int, period_s: float) -> None:
        self.pid, self.period_s = pid, period_s
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> Sampler:
        self._t.start()
        return self

    def _run(self) -> None:
        me = os.getpid()
        prev = None
        while not self._stop.wait(self.period_s):
            kids = children(self.pid)
            now = time.monotonic()
            svc, inst, mine, busy = (
                process_cpu_seconds([self.pid]),
                process_cpu_seconds(kids),
                process_cpu_seconds([me]),
                busy_cpu_seconds(),
            )
            if prev is not None:
                dt = now - prev[0]
                d_svc, d_inst, d_me, d_busy = (
                    svc - prev[1],
                    max(0.0, inst - prev[2]),
                    mine - prev[3],
                    busy - prev[4],
                )
                self.rows.append(
                    {
                        "t_s": round(now - self.t0, 3),
                        "rss_mb": rss_mb(self.pid),
                        "service_cores": round(d_svc / dt, 3),
                        "instances_cores": round(d_inst / dt, 3),
                        "loadgen_cores": round(d_me / dt, 3),
                        "other_cores": round(max(0.0, d_busy - d_svc - d_inst - d_me) / dt, 3),
                    }
                )
            prev = (now, svc, inst, mine, busy)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._t.join()
        return self.rows


def _json_error(body: bytes) -> bool:
    """True when ``body`` is a JSON object with an ``error`` (the v2 protocol's error
    body)."""
    try:
        return "error" in json.loads(body)
    except (ValueError, TypeError):
        return False


async def one(
    sock: str, model: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[str, float, float | None]:
    """One request on its own connection: (outcome, latency ms, Retry-After s)."""
    import aiohttp

    t0 = time.perf_counter()
    conn = aiohttp.UnixConnector(path=sock, force_close=True, limit=0)
    try:
        async with (
            aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as s,
            s.post(f"http://x/v2/models/{model}/infer", data=body, headers=headers) as r,
        ):
            data = await r.read()
            ms = (time.perf_counter() - t0) * 1e3
            ra = r.headers.get("Retry-After")
            retry = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
            if r.status == 200:
                return "ok", ms, None
            if r.status in (429, 503):
                return ("refused" if _json_error(data) else "refused_not_json"), ms, retry
            return f"status_{r.status}", ms, None
    except TimeoutError:
        return "unanswered", (time.perf_counter() - t0) * 1e3, None
    except (aiohttp.ClientConnectionError, ConnectionError, OSError) as exc:
        return f"conn:{type(exc).__name__}", (time.perf_counter() - t0) * 1e3, None
    finally:
        await conn.close()


async def closed_loop(sock: str, model: str, body: bytes, headers: dict, clients: int, n: int):
    """Capacity: ``clients`` requests in flight, each sent when the one before it is
    answered (``infscaler.api.loadgen``, perf_analyzer's concurrency mode, on persistent
    connections), measured over one window of ``n`` answers (its ``count_windows``)."""
    from infscaler.api.loadgen import LoadGenerator, LoadSpec, MeasureConfig, open_session

    gen = LoadGenerator(sock, model, {})
    cfg = MeasureConfig(max_trials=1, request_count=n, timeout_s=120.0)
    async with open_session(sock, cfg.timeout_s) as session:
        point = await gen.measure(session, LoadSpec("concurrency", clients), cfg, body, headers)
    p50 = point.summary["latency_ms"]["p50"]
    return {
        "requests": point.totals["sent"],
        "completed": point.totals["ok"],
        "throughput_rps": round(point.summary["throughput"], 3),
        "p50_ms": round(p50, 2) if p50 is not None else None,
    }


async def poisson_send(
    sock: str,
    model: str,
    body: bytes,
    headers: dict,
    rate: float,
    until_s: float,
    seed: int,
    stop: Any = None,
) -> list[dict[str, Any]]:
    """Poisson arrivals at ``rate``, each request on its own connection (:func:`one`), for
    ``until_s`` s or until ``stop(rows)`` is true at a send: per request its index, send
    time (s), outcome, latency (ms) and Retry-After (s)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    tasks = []
    t0, t_next = time.perf_counter(), 0.0

    async def fire(i: int, t_send: float) -> None:
        out, ms, retry = await one(sock, model, body, headers, 60)
        rows.append({"i": i, "t_s": round(t_send, 4), "outcome": out, "ms": round(ms, 2),
                     "retry": retry})  # fmt: skip

    while t_next < until_s:
        if (delay := t0 + t_next - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if stop is not None and stop(rows):
            break
        tasks.append(asyncio.ensure_future(fire(len(tasks), t_next)))
        t_next += rng.exponential(1.0 / rate)
    await asyncio.gather(*tasks)
    return rows


def recovered_at(probes: list[dict[str, Any]], bound_ms: float, window: int) -> float | None:
    """The send time (s) of the first of ``window`` consecutive probes, in send order,
    answered within ``bound_ms``; None before such a run."""
    run: list[dict[str, Any]] = []
    for p in sorted(probes, key=lambda p: p["i"]):
        run = [*run, p] if p["outcome"] == "ok" and p["ms"] <= bound_ms else []
        if len(run) >= window:
            return run[0]["t_s"]
    return None


def summarize(rows: list[dict[str, Any]], duration_s: float, bound_ms: float) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    ok = [r["ms"] for r in rows if r["outcome"] == "ok"]
    refused = [r["ms"] for r in rows if r["outcome"] == "refused"]
    conn = sum(v for k, v in outcomes.items() if k.startswith("conn:"))
    return {
        "offered": len(rows),
        "offered_rps": round(len(rows) / duration_s, 2),
        "outcomes": outcomes,
        "admitted": len(ok),
        "admitted_rps": round(len(ok) / duration_s, 2),
        "refused": len(refused),
        "connection_errors": conn,
        "unanswered": outcomes.get("unanswered", 0),
        "admitted_p50_ms": round(float(np.percentile(ok, 50)), 2) if ok else None,
        "admitted_p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "admitted_within_bound": round(sum(x <= bound_ms for x in ok) / len(ok), 4) if ok else None,
        "refusal_p99_ms": round(float(np.percentile(refused, 99)), 2) if refused else None,
        "with_retry_after": sum(1 for r in rows if r["retry"] is not None),
    }


def run_mode(name: str, target: str, serve_args: list[str], feeds: dict[str, np.ndarray], a: Any,
             slo_ms: float | None, capacity: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """One mode of ``--per-connection`` on a fresh service (:func:`main_per_connection`)."""
    from infscaler.api.codec import encode_infer_request

    svc = harness.Sut([target], args=serve_args)
    res: dict[str, Any] = {"mode": name, "serve": [target, *serve_args], "slo_ms": slo_ms}
    try:
        svc.__enter__()
        sock, model = svc.sock, target
        bound_ms = slo_ms if slo_ms is not None else 2000.0
        body, headers = encode_infer_request(
            feeds, parameters={"timeout_ms": round(bound_ms * a.timeout_fraction, 1)}
        )
        if capacity is None:
            single = asyncio.run(closed_loop(sock, model, body, headers, 1, 8))
            cap = asyncio.run(closed_loop(sock, model, body, headers, a.clients, a.calibrate))
            cap["single_p50_ms"] = single["p50_ms"]
        else:  # measured without an SLO (the SLO admission would refuse calibration load)
            cap = {**capacity, "from": "the no-SLO run"}
            asyncio.run(closed_loop(sock, model, body, headers, 1, 4))  # warm
        rate = max(0.5, cap["throughput_rps"] * a.factor)
        base_rss = rss_mb(svc.proc.pid)
        sampler = Sampler(svc.proc.pid, a.sample_s).start()
        t_over = time.monotonic() - sampler.t0
        rows = asyncio.run(poisson_send(sock, model, body, headers, rate, a.duration_s, a.seed))
        t_rec = time.monotonic() - sampler.t0
        probe_rps = max(0.2, cap["throughput_rps"] * a.probe_load)
        probes = asyncio.run(poisson_send(
            sock, model, body, headers, probe_rps, a.recovery_max_s, a.seed + 1,
            stop=lambda done: recovered_at(done, bound_ms, a.probe_window) is not None,
        ))  # fmt: skip
        rec = {"recovery_s": recovered_at(probes, bound_ms, a.probe_window), "probes": probes}
        samples = sampler.stop()
        over = summarize(rows, a.duration_s, bound_ms)
        rss = [s["rss_mb"] for s in samples if s["rss_mb"] is not None]
        budget = None if base_rss is None else base_rss + 3 * a.max_inflight_mb
        res.update(capacity=cap, factor=a.factor, rate_rps=round(rate, 2), bound_ms=bound_ms,
                   overload=over, recovery_s=rec["recovery_s"], probes=rec["probes"],
                   rss_before_mb=base_rss, rss_peak_mb=round(max(rss), 1) if rss else None,
                   rss_end_mb=round(rss[-1], 1) if rss else None,
                   rss_budget_mb=round(budget, 1) if budget else None, samples=samples,
                   overload_window_s=[round(t_over, 3), round(t_rec, 3)], requests=rows)  # fmt: skip
        res["checks"] = {
            "every_request_answered": over["unanswered"] == 0,
            "no_connection_errors": over["connection_errors"] == 0,
            "admitted_p99_within_bound": over["admitted_p99_ms"] is not None
            and over["admitted_p99_ms"] <= bound_ms,
            "recovery_within_5s": rec["recovery_s"] is not None and rec["recovery_s"] <= 5.0,
            "rss_within_budget": bool(rss) and budget is not None and max(rss) <= budget,
        }
        res["passed"] = all(res["checks"].values())
    except Exception as exc:  # noqa: BLE001 - recorded; the other mode still runs
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["passed"] = False
    finally:
        svc.__exit__(None, None, None)
        res["stop"] = svc.stopped
    return res


def main_per_connection(a: Any) -> int:
    """``--per-connection``: per model of ``--model`` and mode of ``--modes`` (``noslo``,
    ``slo``), a fresh service (:func:`run_mode`); ``passed`` per mode. The method:
    bench/README.md, "`overload_slo.py --per-connection`". Writes ``results/overload[_quick]``."""

    from infscaler.base.slo import slo_ms as parse_slo

    res = harness.cli.start("overload", a)
    for model in a.model.split(","):
        if model == "ocr":
            from skimage import data as skdata

            target, feeds, base = "ocr", {"image": skdata.astronaut()}, []
        else:
            target, feeds, base = model, harness.models.model_inputs(model), ["-k", "3"]
        common = [*base, "--control-path", a.control_path, "--max-inflight-mb",
                  str(a.max_inflight_mb), "--drain-timeout", "5"]  # fmt: skip
        cap = None
        for mode in a.modes.split(","):
            slo, args = None, list(common)
            if mode == "slo":  # 3x one request's P50 (one client) from the no-SLO run
                p50 = (cap or {}).get("single_p50_ms")
                slo = parse_slo(a.slo) if a.slo else max(100.0, 3 * (p50 or 100.0))
                args += ["--slo", f"{slo:g}ms", "--autoscale"]
            r = res.add(model=model, **run_mode(mode, target, args, feeds, a, slo, cap))
            cap = cap or r.get("capacity")
    harness.cli.finish(res, a, plot_per_connection)
    harness.print_table(
        ["model", "mode", "slo ms", "cap rps", "offered rps", "ok", "refused", "conn err",
         "unanswered", "ok P99 ms", "recovery s", "RSS peak / bound MB", "passed", "error"],
        [[r["model"], r["mode"], r.get("slo_ms"), (r.get("capacity") or {}).get("throughput_rps"),
          r.get("rate_rps"), *(r.get("overload", {}).get(k) for k in
          ("admitted", "refused", "connection_errors", "unanswered", "admitted_p99_ms")),
          r.get("recovery_s"), f"{r.get('rss_peak_mb')} / {r.get('rss_budget_mb')}",
          r.get("passed"), r.get("error", "")] for r in res.points],
    )  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=20.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--config", default="replicas", choices=CONFIGS)
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--factors", default="2,5")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--bisect-steps", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--p99-x", type=float, default=1.25)
    ap.add_argument("--goodput-x", type=float, default=0.8)
    ap.add_argument("--per-connection", action="store_true", help="10x, a connection each")
    ap.add_argument("--modes", default="noslo,slo", help="--per-connection: noslo,slo")
    ap.add_argument("--slo", default=None, help="--per-connection: the slo mode's SLO")
    ap.add_argument("--factor", type=float, default=10.0, help="--per-connection: x C")
    ap.add_argument("--calibrate", type=int, default=60, help="answers in the capacity window")
    ap.add_argument("--max-inflight-mb", type=float, default=256)
    ap.add_argument("--timeout-fraction", type=float, default=0.8)
    ap.add_argument("--probe-load", type=float, default=0.5)
    ap.add_argument("--probe-window", type=int, default=5)
    ap.add_argument("--recovery-max-s", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=0.25)
    ap.add_argument("--control-path", default="auto")

    def quick(a: Any) -> None:
        a.bisect_steps = 3
        if a.per_connection:
            a.duration_s, a.calibrate, a.recovery_max_s = 8.0, 16, 15.0

    a = harness.cli.parse(ap, argv, quick)
    if a.per_connection:
        return main_per_connection(a)
    name = "overload_slo" + ("" if a.config == "replicas" else f"_{a.config}")
    res = harness.cli.start(name + ("" if a.slo_x == 3.0 else f"_slo{a.slo_x:g}x"), a)
    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 20)
    slo_ms = round(a.slo_x * cal["l0_ms"], 2)
    pipe = config_pipeline(a.model, a.config, slo_ms, cal["cores"])
    res.summary.update(calibration=cal, slo_ms=slo_ms, pipeline=pipe)
    print(f"== {a.model} {a.config}: L0 {cal['l0_ms']} ms, SLO {slo_ms} ms", flush=True)
    with harness.Sut([pipe], args=["--drain-timeout", "5"]) as s:
        res.own_pids[:] = [s.pid]

        def run(scenario: str, value: float, phase: str, **kw: Any) -> dict[str, Any]:
            p = harness.scenarios.run(s.sock, NAME, feeds, scenario, value, bound_ms=slo_ms,
                                      duration_s=a.duration_s, warmup_s=a.warmup_s, seed=a.seed)  # fmt: skip
            return res.add(phase=phase, **kw, **p) if phase != "bisection" else p

        c = run(OFFLINE, a.clients, "capacity")["throughput_rps"]
        print(f"  capacity {c}/s (closed loop, {a.clients} clients)", flush=True)
        found = harness.search.max_rate_at_slo(
            lambda r: run(SERVER, r, "bisection"), 1.1 * c, a.bisect_steps, low_rps=0.2 * c
        )
        for p in found["points"]:
            res.add(phase="bisection", **p)
        passed = [p for p in found["points"] if p["passed"]]
        sustained = max((p["goodput_rps"] or 0.0 for p in passed), default=0.0)
        res.summary.update(
            capacity_rps=c, sustained_rps=found["max_rps"], sustained_goodput_rps=sustained
        )
        print(f"  sustained within the SLO: {found['max_rps']}/s", flush=True)
        for f in (float(x) for x in a.factors.split(",")):
            p = run(SERVER, f * c, "overload", factor=f)
            p["checks"] = checks(p, slo_ms, sustained, a)
            p["passed_all"] = all(p["checks"].values())
            p["admitted_p99_over_slo"] = round(p["p99_ms"] / slo_ms, 3) if p["p99_ms"] else None
            p["goodput_over_sustained"] = (
                round((p["goodput_rps"] or 0) / sustained, 3) if sustained else None
            )
    harness.cli.finish(res, a, plot)
    cols = ["factor", "value", "ok", "failed", "p99_ms", "admitted_p99_over_slo", "goodput_rps",
            "goodput_over_sustained", "passed_all"]  # fmt: skip
    harness.print_table(
        cols, [[p.get(k) for k in cols] for p in res.points if p["phase"] == "overload"]
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Admitted P99 and goodput against the offered rate, bisection and overload points."""
    harness.plot(data["points"], path, x="value", y=["p99_ms", "goodput_rps"], by="phase",
                 hline_key="bound_ms", xlabel="offered, /s (capacity: clients)")  # fmt: skip


def plot_per_connection(data: dict[str, Any], path: Path) -> None:
    """Each request's latency against its send time (s since the overload started), one
    panel per model and mode, the bound as a line."""
    pts = [{"cell": f"{r['model']} {r['mode']}", "outcome": q["outcome"], "t_s": q["t_s"],
            "ms": q["ms"], "bound_ms": r.get("bound_ms")}
           for r in data["points"] for q in r.get("requests", [])]  # fmt: skip
    if pts:
        harness.plot(pts, path, x="t_s", y="ms", by="outcome", panel="cell", hline_key="bound_ms",
                     logy=True, xlabel="s since the overload started", ylabel="latency, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
