"""One-request latency of the partitioned chain vs the whole model (issue "Must show").

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``chain_latency.py``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import harness
import numpy as np

harness.host.default_cache_dir()

import onnxruntime as ort  # noqa: E402

from infscaler.base.errors import VerificationError  # noqa: E402
from infscaler.base.models import MODELS, resolve_model  # noqa: E402
from infscaler.engines.onnxrt import loader as onnxrt  # noqa: E402
from infscaler.partitioner.api import partition_model  # noqa: E402
from infscaler.partitioner.extract import Chain  # noqa: E402
from infscaler.partitioner.loader import load_model, random_feeds  # noqa: E402
from infscaler.partitioner.profiler import usable_cores  # noqa: E402

FULL = ["ppocrv4-det", "resnet50", "shufflenet", "inception-v1", "vgg19"]
QUICK = ["ppocrv4-det", "resnet50", "shufflenet", "inception-v1"]
#: fewer timed requests for the slowest model (vgg19: ~0.5 GB of weights, slow per run).
REPEATS_OVERRIDE = {"vgg19": 12}
TARGET = 1.10


def session_options(threads: int, spin: bool) -> ort.SessionOptions:
    """The engine layer's options (``ORT_ENABLE_ALL``, sequential, ``threads``); spinning
    off, or onnxruntime's default (on) when ``spin``."""
    return onnxrt.session_options(threads, spinning=None if spin else False)


def stats(ms: list[float]) -> dict:
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "min_ms": round(min(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def build_plan(path: Path, shapes: str | None, k: int) -> tuple:
    """The plan for K=k; on a verification failure at the API default rtol, record it and
    build it again at the fallback rtol (both in the results)."""
    # profiling settings do not change the cuts (measure="flops", no SLO); keep the
    # (untimed) plan building short
    kwargs = {"shapes": shapes, "slo": None, "num_partitions": k, "warmup": 0, "repeats": 1,
              "out_dir": None}  # fmt: skip
    try:
        return partition_model(path, **kwargs), None
    except VerificationError as exc:
        note = {"verification_failed_at_default_rtol": str(exc).splitlines()[0],
                "rebuilt_with_rtol": harness.models.FALLBACK_RTOL}  # fmt: skip
        return partition_model(path, rtol=harness.models.FALLBACK_RTOL, **kwargs), note


def part_inputs(chain: Chain, feeds: dict) -> list[dict]:
    """Each part's inputs in one run of the chain (to run the parts alone)."""
    env = dict(feeds)
    inputs = []
    for sess, ins, outs in zip(chain.sessions, chain.part_inputs, chain.part_outputs, strict=True):
        inputs.append({n: env[n] for n in ins})
        env.update(zip(outs, sess.run(outs, inputs[-1]), strict=True))
    return inputs


def breakdown(t_whole: list[float], t_chain: list[float], t_parts: list[list[float]]) -> dict:
    """Where the chain's extra time goes, from the same rounds (paired medians, ms).

    ``parts_minus_whole_ms``: median over rounds of (sum of the parts run alone on their
    recorded inputs - whole model): the parts' own extra work (one more ``session.run``
    each, and graph fusions / layout conversions a cut prevents). ``chain_minus_parts_ms``:
    median of (chain - sum of the parts alone): the handoff between parts in
    ``Chain.run``. ``chain_minus_whole_ms``: median of (chain - whole).
    """
    sums = [sum(r) for r in zip(*t_parts, strict=True)]

    def minus(a: list[float], b: list[float]) -> float:  # median of the paired differences
        return round(statistics.median(x - y for x, y in zip(a, b, strict=True)), 3)

    return {"parts_ms": [round(statistics.median(t), 3) for t in t_parts],
            "parts_sum_ms": round(statistics.median(sums), 3),
            "chain_minus_whole_ms": minus(t_chain, t_whole),
            "parts_minus_whole_ms": minus(sums, t_whole),
            "chain_minus_parts_ms": minus(t_chain, sums)}  # fmt: skip


def fixed_run_us(so, n: int = 2000) -> float:
    """Median µs of one ``session.run`` of a 1-element Identity model with these session
    options: the fixed cost of one more run per partition boundary."""
    from infscaler.partitioner.profiler import identity_model

    sess = onnxrt.load_session(identity_model(1), options=so)
    x = {"x": np.zeros(1, np.float32)}
    return round(1e3 * harness.models.median_ms(sess, x, n, warmup=100), 1)


def bench_model(name: str, ks: list[int], repeats: int, warmup: int, so) -> list[dict]:
    path = resolve_model(name)
    shapes = MODELS[name].shapes
    loaded = load_model(path, shapes)
    feeds = random_feeds({n: loaded.tensors[n] for n in loaded.graph_inputs}, seed=0)
    out_names = list(loaded.graph_outputs)
    # The canonical model with the concrete input shapes, as the parts have them.
    whole = onnxrt.load_session(loaded.model, options=so)
    del loaded
    rows = []
    for k in ks:
        print(f"[chain_latency] {name} K={k} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        plan, note = build_plan(path, shapes, k)
        plan_s = time.perf_counter() - t
        chain = Chain(plan.parts, session_options=so)
        for _ in range(warmup):
            ref = whole.run(out_names, feeds)
            got = chain.run(feeds)
        # same inputs, same outputs? (normalised max error, informational)
        err = 0.0
        for n, r in zip(out_names, ref, strict=True):
            scale = float(np.max(np.abs(r))) or 1.0
            err = max(err, float(np.max(np.abs(np.asarray(got[n]) - r))) / scale)
        inputs = part_inputs(chain, feeds)
        t_whole, t_chain = [], []
        t_parts: list[list[float]] = [[] for _ in inputs]
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            whole.run(out_names, feeds)
            t1 = time.perf_counter_ns()
            chain.run(feeds)
            t2 = time.perf_counter_ns()
            t_whole.append((t1 - t0) / 1e6)
            t_chain.append((t2 - t1) / 1e6)
            # then each part alone on its recorded inputs (for the breakdown only)
            for times, sess, outs, part_feeds in zip(
                t_parts, chain.sessions, chain.part_outputs, inputs, strict=True
            ):
                t3 = time.perf_counter_ns()
                sess.run(outs, part_feeds)
                times.append((time.perf_counter_ns() - t3) / 1e6)
        sw, sc = stats(t_whole), stats(t_chain)
        ratio = sc["median_ms"] / sw["median_ms"]
        split = breakdown(t_whole, t_chain, t_parts)
        summ = plan.summary
        row = {
            "model": name,
            "K": k,
            "cuts": [c["after_operator"] for c in summ["cuts"]],
            "operators": summ["model"]["operators"],
            "crossing_mb": [round(c["crossing_bytes"] / 1e6, 3) for c in summ["cuts"]],
            "repeats": repeats,
            "warmup": warmup,
            "whole": sw,
            "chain": sc,
            "ratio_median": round(ratio, 4),
            "ratio_p90": round(sc["p90_ms"] / sw["p90_ms"], 4),
            # median over the N (whole, chain) pairs of chain / whole: less sensitive to
            # host noise that lasts longer than one pair (informational)
            "ratio_paired_median": round(
                statistics.median(c / w for w, c in zip(t_whole, t_chain, strict=True)), 4
            ),
            "overhead_ms_median": round(sc["median_ms"] - sw["median_ms"], 3),
            # paired: median over rounds of (chain - whole), per boundary
            "overhead_us_per_boundary": round(
                1000 * split["chain_minus_whole_ms"] / max(k - 1, 1), 1
            ),
            "breakdown": split,
            "target_ratio": TARGET,
            "pass": ratio <= TARGET,
            "chain_vs_whole_max_rel_error": err,
            "plan_predicted": {
                "t_o_ms": summ["timing"]["t_o_ms"],
                "t_p_ms": summ["timing"]["t_p_ms"],
                "predicted_chain_ms": summ["timing"]["predicted_chain_ms"],
            },
            "plan_build_seconds_not_timed": round(plan_s, 2),
            "raw_ms": {
                "whole": [round(x, 3) for x in t_whole],
                "chain": [round(x, 3) for x in t_chain],
            },
        }
        if note:
            row["note"] = note
        rows.append(row)
        del chain, plan
        gc.collect()
    del whole
    gc.collect()
    return rows


def served_hops(svc: Any, model: str, k: int, feeds: dict[str, np.ndarray], n: int) -> dict:
    """``--served``: one model at K partitions in the in-process ``Service`` (its ``infer``
    returns each unit's compute start / end), one request at a time: head (front end to
    the first compute), between (per cut, with its crossing MB) and tail percentiles, ms."""
    import yaml

    name = f"hop-{k}"
    dep = svc.deploy(harness.models.pipeline(model, name, k, threads=1, whole=k == 1))
    try:
        plans = list(dep.pipeline.plans.values())
        cuts = yaml.safe_load((Path(plans[0]) / "plan.yaml").read_text()).get("cuts") if plans and k > 1 else []  # fmt: skip
        mb = [float(c["crossing_bytes"]) / 1e6 for c in cuts or []]
        for _ in range(5):
            svc.infer(name, feeds)
        head, tail, between = [], [], [[] for _ in range(k - 1)]
        for _ in range(n):
            t0 = time.monotonic_ns()
            r = svc.infer(name, feeds)
            t1 = time.monotonic_ns()
            tr = r.trace[np.argsort(r.trace[:, 2])]
            head.append((tr[0, 2] - t0) / 1e6)
            tail.append((t1 - tr[-1, 3]) / 1e6)
            for i, (a, b) in enumerate(zip(tr[:-1], tr[1:], strict=True)):
                between[i].append((b[2] - a[3]) / 1e6)
            time.sleep(0.02)
    finally:
        svc.undeploy(name)

    def pct(x: list[float]) -> dict[str, float]:
        return harness.percentiles(x, None, (50, 90, 99), 3)

    cuts = [pct(b) | {"crossing_mb": round(m, 3)} for b, m in zip(between, mb, strict=True)]
    return {"model": model, "k": k, "requests": n, "head_ms": pct(head),
            "tail_ms": pct(tail), "between_ms": cuts}  # fmt: skip


def fit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least squares of the between-unit P50 on the crossing MB: ``fixed_ms``, ``per_mb_ms``
    (None with fewer than 2 distinct sizes)."""
    pts = [(b["crossing_mb"], b["p50"]) for r in rows for b in r["between_ms"]]
    if len({round(x, 3) for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts).T
    per_mb, fixed = np.polyfit(x, y, 1)
    return {"fixed_ms": round(float(fixed), 3), "per_mb_ms": round(float(per_mb), 4),
            "points": len(pts)}  # fmt: skip


def run_served(a: Any) -> int:
    """``--served``: the hop between served units (the planner's ``HANDOVER_MS``) at
    ``--ks`` (K = 1 included), ``--repeats`` requests; the between-unit P50 fitted as a
    fixed cost plus a cost per MB and set against the in-process T_p
    (``profiler.measure_boundary_overhead``). Writes ``chain_latency_served[_quick]``."""
    from infscaler.partitioner import profiler
    from infscaler.runtime.planning import planner
    from infscaler.service.service import Service

    res = harness.cli.start("chain_latency_served", a)
    with Service(state_dir=Path(tempfile.mkdtemp(prefix="isc-hop-state-")), pool_mb=256) as svc:
        for model in a.models.split(","):
            feeds = harness.models.model_inputs(model)
            for k in map(int, a.ks.split(",")):
                r = res.add(**served_hops(svc, model, k, feeds, a.repeats))
                print(f"{model} K={k}: head {r['head_ms']['p50']} ms, tail {r['tail_ms']['p50']}"
                      f" ms, between {[(b['crossing_mb'], b['p50']) for b in r['between_ms']]}",
                      flush=True)  # fmt: skip
    tp = profiler.measure_boundary_overhead(engine="cpu")
    tp_fit = {"fixed_ms": round(tp.fixed_ms, 4), "per_mb_ms": round(tp.per_mb_ms, 4)}
    res.summary = {"fit_between_p50": fit(res.points), "in_process_tp": tp_fit,
                   "planner": {"HANDOVER_MS": planner.HANDOVER_MS, "FRONTEND_MS": planner.FRONTEND_MS}}  # fmt: skip
    harness.cli.finish(res, a, plot_served)
    rows = [[r["model"], r["k"], r["head_ms"]["p50"], r["tail_ms"]["p50"],
             ", ".join(f"{b['p50']} ({b['crossing_mb']})" for b in r["between_ms"]) or "-"]
            for r in res.points]  # fmt: skip
    harness.print_table(["model", "K", "head P50", "tail P50", "between P50 (crossing MB)"], rows)
    print(f"fit: {res.summary['fit_between_p50']}; in-process T_p: {tp_fit}")
    return 0


def plot_served(data: dict[str, Any], path: Path) -> None:
    """Between-unit P50 and P90 against the crossing MB per model, with the in-process T_p
    (and the fit) at the same sizes."""
    s, pts = data["summary"], []
    lines = {"T_p in-process": s["in_process_tp"], "fit": s["fit_between_p50"]}
    for r in data["points"]:
        for b in r["between_ms"]:
            x = b["crossing_mb"]
            pts.append({"model": r["model"], "crossing_mb": x, "p50": b["p50"], "p90": b["p90"]})
            pts += [{"model": k, "crossing_mb": x, "p50": f["fixed_ms"] + f["per_mb_ms"] * x}
                    for k, f in lines.items() if f]  # fmt: skip
    harness.plot(pts, path, x="crossing_mb", y=["p50", "p90"], by="model",
                 xlabel="crossing tensor, MB", ylabel="compute end -> next start, ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("--models", default=None, help="comma-separated aliases")
    ap.add_argument("--ks", default=None, help="partition counts (default 2,3,4; --served 1,2,3)")
    ap.add_argument(
        "--repeats", type=int, default=None, help="timed requests per side (30; --served 100)"
    )
    ap.add_argument("--served", action="store_true", help="one hop between served units")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--spin", action="store_true",
                    help="onnxruntime's default intra-op spinning on both sides (default: off)")  # fmt: skip

    def quick(a: Any) -> None:
        a.models = a.models or ("resnet50" if a.served else ",".join(QUICK))
        a.ks, a.repeats = (
            a.ks or ("1,2" if a.served else None),
            a.repeats or (20 if a.served else 12),
        )

    a = harness.cli.parse(ap, argv, quick)
    if a.served:
        a.models, a.ks = a.models or "resnet50,ppocrv4-det", a.ks or "1,2,3"
        a.repeats = a.repeats or 100
        return run_served(a)
    a.models, a.ks, a.repeats = a.models or ",".join(FULL), a.ks or "2,3,4", a.repeats or 30
    ks = [int(k) for k in a.ks.split(",")]
    threads = usable_cores()
    so = session_options(threads, spin=a.spin)
    res = harness.cli.start("chain_latency" + ("_spin" if a.spin and not a.quick else ""), a)
    if a.spin and a.quick:
        res.name += "_spin"
    res.summary.update(intra_op_threads=threads, fixed_run_us=fixed_run_us(so), errors=[])
    for name in a.models.split(","):
        try:
            for row in bench_model(name, ks, min(a.repeats, REPEATS_OVERRIDE.get(name, a.repeats)),
                                   a.warmup, so):  # fmt: skip
                res.add(**row)
        except Exception as exc:
            traceback.print_exc()
            res.summary["errors"].append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
    res.summary["all_pass"] = (
        bool(res.points) and not res.summary["errors"] and all(r["pass"] for r in res.points)
    )
    harness.cli.finish(res, a, plot if res.points else None)
    harness.print_table(
        ["model", "K", "n", "whole med", "chain med", "ratio", "paired", "us/boundary", "target"],
        [[r["model"], r["K"], r["repeats"], r["whole"]["median_ms"], r["chain"]["median_ms"],
          r["ratio_median"], r["ratio_paired_median"], r["overhead_us_per_boundary"],
          "pass" if r["pass"] else "FAIL"] for r in res.points],
    )  # fmt: skip
    for e in res.summary["errors"]:
        print(f"ERROR {e['model']}: {e['error']}")
    return 0 if not res.summary["errors"] else 1


def plot(data: dict, path: Path) -> None:
    """median(chain) / median(whole) against K, one line per model, the target as a line."""
    harness.plot(data["points"], path, x="K", y="ratio_median", by="model",
                 hlines={f"target {TARGET}": TARGET, "1.0": 1.0},
                 ylabel="median(chain) / median(whole)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
