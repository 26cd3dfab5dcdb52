"""A priority-1 pipeline's SLO while lower ones are flooded, with CPU by priority and without.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``priorities.py``.
``--arms`` on / off / cores (``INFSCALER_CPU_PRIORITY``: nice values, none, nice plus core sets).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import ForeignLoad, process_cpu_seconds  # noqa: E402
from vs_triton import HttpClient, Model, closed_loop, open_loop, single_thread_ms  # noqa: E402


def model_of(alias: str) -> Model:
    import onnx

    from infscaler.base.models import resolve_model

    path = resolve_model(alias)
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    first = next(i for i in g.input if i.name not in inits)
    dims = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
    return Model(alias, path, first.name, g.output[0].name, dims)


def pipeline(name: str, m: Model, priority: int, slo_ms: float, fixed: bool = False) -> dict:
    """The pipeline: autoscaled, or (``fixed``) one single-thread instance, no autoscale
    (three autoscaled pipelines do not fit a 2-core host's thread slots)."""
    stage = {"name": "model", "model": str(m.path), "inputs": {m.input: m.input},
             "outputs": {m.output: m.output}, **({"instances": 1, "threads": 1} if fixed else {})}  # fmt: skip
    return {"name": name, "priority": priority, "slo": f"{slo_ms:.0f}ms", "autoscale": not fixed,
            "inputs": [{"name": m.input, "datatype": "FP32", "shape": m.shape}],
            "outputs": [m.output], "stages": [stage]}  # fmt: skip


def served(pipes: list[dict], arm: str, state: Path) -> harness.Sut:
    """``infscaler serve`` of ``pipes`` (HTTP only) with ``INFSCALER_CPU_PRIORITY`` set to
    the arm (``on``, ``off`` or ``cores``); ``.http`` for ``vs_triton.HttpClient``."""
    env = {"INFSCALER_CPU_PRIORITY": arm}
    s = harness.Sut(pipes, args=["--no-grpc", "--state-dir", str(state)], env=env)
    s.http = {"uds": s.sock, "base": "http://isc"}
    return s


LOWER = (("lo", 2), ("lo3", 3))


def window(sut: harness.Sut, hi: Model, lo: Model, a: Any, lower: list[str], seed: int) -> dict:
    """One measuring window: ``hi`` open-loop, each pipeline in ``lower`` flooded."""
    x_hi = np.random.default_rng(0).standard_normal(hi.shape).astype(np.float32)
    x_lo = np.random.default_rng(1).standard_normal(lo.shape).astype(np.float32)
    rate = a.hi_load * 1000.0 / hi.l0_ms
    lo_res: dict[str, dict[str, Any]] = {n: {} for n in lower}

    def run_flood(name: str) -> None:
        lo_res[name].update(
            closed_loop(
                lambda: HttpClient(sut, lo, x_lo, name=name),
                a.flood,
                a.duration_s + 2 * a.settle_s,
                1000.0,
            )
        )

    flooders = [threading.Thread(target=run_flood, args=(n,)) for n in lower]
    for t in flooders:
        t.start()
    if flooders:
        time.sleep(a.settle_s)
    fl = ForeignLoad(lambda: process_cpu_seconds([os.getpid(), sut.pid]))
    res = open_loop(
        lambda: HttpClient(sut, hi, x_hi, name="hi"), rate, a.duration_s, a.slo_ms, seed
    )
    res["attainment"] = round(res["within_slo"] / max(1, res["sent"]), 4)
    res["other_processes_cores"] = fl.cores()
    for t in flooders:
        t.join()
    keys = ("answered", "throughput_rps", "goodput_rps", "refused", "refused_by", "p99_ms")
    # the service's CPU priority after the window (mode cores: repins so far, who is kept)
    res["cpu_priority"] = sut.status().get("cpu_priority")
    return {"hi": res, **{n: {k: r.get(k) for k in keys} for n, r in lo_res.items()}}


def summarize(runs: list[dict], lower: list[str], arms: tuple[str, ...] = ("on", "off")) -> dict:
    """Per arm: ``hi``'s attainment alone and flooded, their ratio (median over rounds)
    and each lower pipeline's goodput while flooded."""
    summary = {}
    for arm in arms:
        mine = [x for x in runs if x["arm"] == arm]
        if not mine:
            continue
        ratio = [
            x["flooded"]["hi"]["attainment"] / max(1e-9, x["alone"]["hi"]["attainment"])
            for x in mine
        ]
        summary[arm] = {
            "hi_attainment_alone": [x["alone"]["hi"]["attainment"] for x in mine],
            "hi_attainment_flooded": [x["flooded"]["hi"]["attainment"] for x in mine],
            "flooded_over_alone": [round(v, 3) for v in ratio],
            "flooded_over_alone_median": round(float(np.median(ratio)), 3),
            **{
                f"{n}_goodput_rps_flooded": [x["flooded"][n]["goodput_rps"] for x in mine]
                for n in lower
            },
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=40.0)
    ap.add_argument("--hi-model", default="resnet50")
    ap.add_argument("--lo-model", default="squeezenet")
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--hi-load", type=float, default=0.3, help="x one core's ideal rate")
    ap.add_argument("--flood", type=int, default=6, help="closed-loop clients on lo")
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="2,3", help="pipeline counts to run: 2, 3 or 2,3")
    ap.add_argument("--arms", default="on,off", help="of on, off, cores (see above)")
    ap.add_argument("--fixed", action="store_true", help="one instance each, no autoscale (3 pipelines: always)")  # fmt: skip

    def quick(a: Any) -> None:
        a.duration_s, a.settle_s, a.rounds = 10.0, 4.0, 1

    a = harness.cli.parse(ap, argv, quick)
    arms = tuple(x.strip() for x in a.arms.split(",") if x.strip())
    if not arms or set(arms) - {"on", "off", "cores"}:
        ap.error(f"--arms: {a.arms!r}? give some of on, off, cores")
    harness.host.default_cache_dir()
    hi, lo = model_of(a.hi_model), model_of(a.lo_model)
    x = np.random.default_rng(0).standard_normal(hi.shape).astype(np.float32)
    hi.l0_ms = single_thread_ms(hi, x)
    a.slo_ms = a.slo_x * hi.l0_ms
    res = harness.cli.start("priorities", a)
    res.summary.update(hi_l0_ms=round(hi.l0_ms, 2), cases={})
    state = Path(os.environ.get("INFSCALER_CACHE_DIR", "/tmp/isc-cache")) / "priorities_state"
    for n in sorted({int(c) for c in a.cases.split(",")}):
        if n not in (2, 3):
            ap.error(f"--cases: {n} pipelines? give 2 and/or 3")
        lower = [name for name, _ in LOWER[: n - 1]]
        fixed = a.fixed or n > 2
        pipes = [pipeline("hi", hi, 1, a.slo_ms, fixed)]
        pipes += [pipeline(m, lo, p, 1000.0, fixed) for m, p in LOWER[: n - 1]]
        runs: list[dict] = []
        for r in range(a.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                with served(pipes, arm, state) as s:
                    res.own_pids[:] = s.processes()
                    alone = window(s, hi, lo, a, [], seed=r)
                    flooded = window(s, hi, lo, a, lower, seed=r)
                runs.append(
                    res.add(case=f"{n}_pipelines", round=r, arm=arm, alone=alone, flooded=flooded)
                )
                cpu = flooded["hi"].get("cpu_priority") or {}
                print(f"{n} pipelines, round {r} {arm} ({cpu.get('mode')}, repins "
                      f"{cpu.get('repins', '-')}): hi alone {alone['hi']['attainment']:.3f} "
                      f"flooded {flooded['hi']['attainment']:.3f} (P99 {flooded['hi']['p99_ms']} ms), "
                      + ", ".join(f"{m} {flooded[m]['goodput_rps']}/s" for m in lower), flush=True)  # fmt: skip
        res.summary["cases"][f"{n}_pipelines"] = summarize(runs, lower, arms)
    harness.cli.finish(res, a, plot)
    for case, c in res.summary["cases"].items():
        for arm, sm in c.items():
            print(case, arm, sm)
    return 0


def plot(data: dict, path: Path) -> None:
    """``hi``'s attainment alone and with the lower pipelines flooded per round, per arm
    (CPU priority on, off, core sets), one panel per case, the 0.95 target as a line."""
    pts = [{"case": x["case"].replace("_", " "), "series": f"{x['arm']}: {kind}", "round": x["round"],
            "attainment": x[kind]["hi"]["attainment"]}
           for x in data["points"] for kind in ("alone", "flooded")]  # fmt: skip
    harness.plot(pts, path, x="round", y="attainment", by="series", panel="case",
                 hlines={"target 0.95": 0.95}, ylabel="hi within its SLO")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
