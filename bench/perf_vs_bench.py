"""``infscaler perf`` against the benchmarks' own client loops, on one service in one run.

Writes ``results/perf_vs_bench.json`` and ``.png`` (``_quick`` with ``--quick``: 2
rounds of 3 s, a smoke test on whatever host it runs).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/perf_vs_bench.py`".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    default_cache_dir,
    environment,
    print_table,
    process_cpu_seconds,
    wait_for_quiet,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("throughput", "p50", "p99")


def children_cpu_s() -> float:
    """CPU seconds of this process's children that exited and were waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Host:
    """CPU accounting around one measurement: ours, the service's process tree, and the
    rest of the host."""

    def __init__(self, svc_pid: int) -> None:
        self.svc_pid = svc_pid

    def ours(self) -> float:
        from overload import children

        tree = [os.getpid(), self.svc_pid, *children(self.svc_pid)]
        return process_cpu_seconds(tree) + children_cpu_s()

    def start(self) -> tuple[ForeignLoad, float, float]:
        return ForeignLoad(self.ours), process_cpu_seconds([os.getpid()]), children_cpu_s()

    @staticmethod
    def stop(mark: tuple[ForeignLoad, float, float], subprocess_side: bool) -> dict[str, float]:
        fl, me, kids = mark
        client = (
            children_cpu_s() - kids if subprocess_side else process_cpu_seconds([os.getpid()]) - me
        )
        return {"other_processes_cores": fl.cores(), "client_cpu_s": round(client, 3)}


def startup_cpu_s() -> float:
    """CPU seconds a fresh interpreter spends importing what ``infscaler perf`` imports
    (the CLI, the load generator, the client, aiohttp): the perf subprocess's fixed cost,
    subtracted from its CPU for ``client_cpu_ms_per_request_net``. Median of 3."""
    code = (
        "import aiohttp, numpy, rich.progress, infscaler.cli, infscaler.cli.perf, "
        "infscaler.api.loadgen, infscaler.api.client"
    )
    runs = []
    for _ in range(3):
        k = children_cpu_s()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        runs.append(children_cpu_s() - k)
    return round(float(np.median(runs)), 3)


def nearest_rank(values: list[float], q: float) -> float | None:
    from infscaler.api.loadgen import percentile

    v = percentile(values, q)
    return None if v is None else round(v, 2)


def bench_closed(sock: str, name: str, x: np.ndarray, c: int, dur: float, ref: np.ndarray) -> dict:
    """(a) closed loop: ``serve_det.drive`` as it is (C threads, ``duration_s``)."""
    from serve_det import drive

    r = drive(sock, name, x, c, 10**9, dur, ref)
    return {
        "throughput": r["throughput_rps"],
        "p50": r["p50_ms"],
        "p99": r["p99_ms"],
        "answers": r["n"],
        "errors": r["errors"],
        "max_abs_error": r["max_abs_error_vs_session"],
    }


def bench_open(sock: str, name: str, feeds: dict, rate: float, dur: float, seed: int) -> dict:
    """(a) open loop: ``overload.open_loop`` as it is (Poisson, a connection each)."""
    from overload import open_loop

    from infscaler.api.codec import encode_infer_request

    body, headers = encode_infer_request(feeds, binary=True, binary_output=True)
    rows = asyncio.run(open_loop(sock, name, body, dict(headers), rate, dur, seed))
    ok = [r["ms"] for r in rows if r["outcome"] == "ok"]
    return {
        "throughput": round(len(ok) / dur, 3),
        "p50": round(float(np.percentile(ok, 50)), 2) if ok else None,
        "p99": round(float(np.percentile(ok, 99)), 2) if ok else None,
        "p50_nearest_rank": nearest_rank(ok, 50),
        "p99_nearest_rank": nearest_rank(ok, 99),
        "sent": len(rows),
        "answers": len(ok),
        "errors": len(rows) - len(ok),
    }


def perf_run(sock: str, name: str, load: list[str], dur: float, data_dir: Path, seed: int) -> dict:
    """(b) ``infscaler perf`` in a subprocess at COLUMNS=80: 3 windows of ``dur / 3``."""
    out = data_dir / "perf.json"
    cmd = [
        sys.executable,
        "-m",
        "infscaler",
        "perf",
        name,
        "--socket",
        sock,
        *load,
        "--input-data",
        str(data_dir),
        "-p",
        f"{dur * 1000 / 3:.0f}",
        "--max-trials",
        "3",
        "--seed",
        str(seed),
        "--json",
        str(out),
    ]
    env = {**os.environ, "COLUMNS": "80"}
    t0 = time.monotonic()
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=dur * 4 + 120
    )
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"infscaler perf exited {p.returncode}: {p.stderr[-2000:]}")
    pt = json.loads(out.read_text())["points"][0]
    lat = pt["latency_ms"]
    return {
        "throughput": round(pt["throughput"], 3),
        "p50": lat["p50"] and round(lat["p50"], 2),
        "p99": lat["p99"] and round(lat["p99"], 2),
        "answers": sum(w["ok"] for w in pt["windows"][-3:]),
        "errors": pt["totals"]["errors"],
        "refused": pt["totals"]["refused"],
        "sent": pt["totals"]["sent"],
        "stable": pt["stable"],
        "server": pt["server"],
        "wall_s": round(wall, 2),
        "stdout": p.stdout,
        "command": " ".join(cmd[2:]),
    }


def measure(side: str, point: dict, ctx: dict, seed: int) -> dict:
    host: Host = ctx["host"]
    mark = host.start()
    if side == "bench":
        if point["mode"] == "closed":
            r = bench_closed(ctx["sock"], ctx["name"], ctx["x"], point["c"], ctx["dur"], ctx["ref"])
        else:
            r = bench_open(ctx["sock"], ctx["name"], ctx["feeds"], point["rate"], ctx["dur"], seed)
    else:
        load = (
            ["--concurrency-range", str(point["c"])]
            if point["mode"] == "closed"
            else [
                "--request-rate-range",
                f"{point['rate']:.3f}",
                "--request-distribution",
                "poisson",
            ]
        )
        r = perf_run(ctx["sock"], ctx["name"], load, ctx["dur"], ctx["data_dir"], seed)
    r.update(host.stop(mark, side == "perf"))
    n = r.get("sent") or r["answers"]
    r["client_cpu_ms_per_request"] = round(r["client_cpu_s"] * 1e3 / n, 2) if n else None
    fixed = ctx["startup_cpu_s"] if side == "perf" else 0.0
    net = max(0.0, r["client_cpu_s"] - fixed)
    r["client_cpu_ms_per_request_net"] = round(net * 1e3 / n, 2) if n else None
    return r


def spread(values: list[float]) -> float | None:
    v = [x for x in values if x]
    if len(v) < 2:
        return None
    return round((max(v) - min(v)) / float(np.median(v)), 4)


def compare(rounds: list[dict]) -> dict:
    """Per figure: each round's ratio perf / bench, their median, each side's spread."""
    out: dict[str, Any] = {}
    for f in FIGURES:
        a = [r["bench"][f] for r in rounds]
        b = [r["perf"][f] for r in rounds]
        ratios = [round(y / x, 4) if x and y else None for x, y in zip(a, b, strict=True)]
        good = [r for r in ratios if r is not None]
        med = round(float(np.median(good)), 4) if good else None
        noise = max([s for s in (spread(a), spread(b)) if s is not None], default=None)
        out[f] = {
            "bench": a,
            "perf": b,
            "ratio_per_round": ratios,
            "ratio_median": med,
            "bench_spread": spread(a),
            "perf_spread": spread(b),
            "noise": noise,
            "within_noise": None if med is None or noise is None else abs(med - 1) <= noise,
        }
    return out


def run_model(model: str, a: argparse.Namespace, tmp: Path) -> dict:
    from overload import Service
    from scaling import model_inputs

    from infscaler.api.client import Client

    feeds = model_inputs(model)
    sock = str(tmp / f"{model}.sock")
    args = ["--control-path", a.control_path, "--drain-timeout", "5"]
    svc = Service(model, args, sock, tmp / f"{model}.log")
    res: dict[str, Any] = {"model": model, "serve": " ".join(svc.cmd[2:])}
    try:
        svc.wait_ready(600)
        with Client(sock) as c:
            name = c.repository_index()[0]["name"]
            ref = next(iter(c.infer(name, feeds).outputs.values()))
        data_dir = tmp / f"{model}-inputs"
        data_dir.mkdir()
        for k, v in feeds.items():  # ResNet-50's input is gpu_0/data_0
            (data_dir / f"{k}.npy").parent.mkdir(parents=True, exist_ok=True)
            np.save(data_dir / f"{k}.npy", v)
        ctx = {
            "sock": sock,
            "name": name,
            "feeds": feeds,
            "x": next(iter(feeds.values())),
            "ref": ref,
            "dur": a.duration_s,
            "data_dir": data_dir,
            "host": Host(svc.proc.pid),
            "startup_cpu_s": startup_cpu_s(),
        }
        res["perf_startup_cpu_s"] = ctx["startup_cpu_s"]
        points: list[dict] = []
        if set(feeds) == {"x"}:  # serve_det.drive sends {"x": ...}
            points.append({"mode": "closed", "c": a.concurrency})
            calib = bench_closed(sock, name, ctx["x"], a.concurrency, a.duration_s, ref)
        else:  # no closed loop of the bench's for this input: the rate from one at a time
            with Client(sock) as c:
                t0 = time.perf_counter()
                for _ in range(8):
                    c.infer(name, feeds)
                calib = {"throughput": round(8 / (time.perf_counter() - t0), 3)}
        rate = round(a.load * calib["throughput"], 3)
        points.append({"mode": "open", "rate": rate})
        res.update(calibration=calib, rate_rps=rate, points=[])
        for point in points:
            rounds = []
            for i in range(a.rounds):
                order = ("bench", "perf") if i % 2 == 0 else ("perf", "bench")
                rnd: dict[str, Any] = {"round": i, "order": list(order)}
                for side in order:
                    rnd[side] = measure(side, point, ctx, a.seed + i)
                    print(f"{model} {point} round {i} {side}: {_brief(rnd[side])}", flush=True)
                rounds.append(rnd)
            res["points"].append({**point, "rounds": rounds, "compare": compare(rounds)})
        shown = res["points"][0]["rounds"][0]["perf"]
        res["perf_output_80_columns"] = shown["stdout"]
        res["perf_output_command"] = shown["command"]
        for p in res["points"]:
            for r in p["rounds"]:
                r["perf"].pop("stdout")
    finally:
        res["stop"] = svc.stop()
    return res


def _brief(r: dict) -> str:
    return (
        f"{r['throughput']:.2f}/s P50 {r['p50']} P99 {r['p99']} ms, "
        f"client {r['client_cpu_ms_per_request_net']} ms CPU/req, others {r['other_processes_cores']} cores"
    )


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m["model"], p) for m in data["models"] for p in m["points"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (model, p) in zip(axes[0], panels, strict=True):
        label = f"C = {p['c']}" if p["mode"] == "closed" else f"{p['rate']:g} req/s Poisson"
        for j, f in enumerate(FIGURES):
            cmp = p["compare"][f]
            ys = [r for r in cmp["ratio_per_round"] if r is not None]
            ax.scatter([j] * len(ys), ys, color="C0", zorder=3)
            if cmp["ratio_median"] is not None:
                ax.hlines(cmp["ratio_median"], j - 0.3, j + 0.3, color="C1")
            if cmp["noise"] is not None:
                ax.fill_between(
                    [j - 0.3, j + 0.3], 1 - cmp["noise"], 1 + cmp["noise"], alpha=0.2, color="grey"
                )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(FIGURES)), ["infer/s", "P50", "P99"])
        ax.set_title(f"{model}, {p['mode']} loop, {label}", fontsize=9)
        ax.set_ylabel("infscaler perf / bench (dots: rounds; grey: 1 ± noise)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 3 s: a smoke test")
    p.add_argument("--models", default="ppocrv4-det,resnet50")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--load", type=float, default=0.6, help="open-loop rate / closed capacity")
    p.add_argument("--control-path", default="auto")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration_s, a.models = 2, 3.0, a.models.split(",")[0]
    default_cache_dir()
    data: dict[str, Any] = {"environment": environment(), "settings": vars(a)}
    data["quiet_before"] = wait_for_quiet(10 if a.quick else 60)
    with tempfile.TemporaryDirectory(prefix="isc-perfvb-") as tmp:
        data["models"] = [run_model(m, a, Path(tmp)) for m in a.models.split(",")]
    data["environment"]["load_average_at_end"] = list(os.getloadavg())
    name = "perf_vs_bench_quick" if a.quick else "perf_vs_bench"
    write_json(RESULTS_DIR / f"{name}.json", data)
    plot(data, RESULTS_DIR / f"{name}.png")
    rows = []
    for m in data["models"]:
        for pt in m["points"]:
            load = f"C={pt['c']}" if pt["mode"] == "closed" else f"{pt['rate']:g}/s"
            for f in FIGURES:
                c = pt["compare"][f]
                rows.append([m["model"], load, f, c["ratio_median"], c["noise"], c["within_noise"]])
    print_table(["model", "load", "figure", "perf/bench", "noise", "within"], rows)
    print(data["models"][0]["perf_output_80_columns"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
