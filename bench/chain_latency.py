"""One-request latency of the partitioned chain vs the whole model (issue "Must show").

Usage::

    .venv/bin/python bench/chain_latency.py [--quick] [--repeats 30] [--spin]

Writes ``bench/results/chain_latency.json`` and ``.png`` (``--quick``:
``chain_latency_quick.*``; ``--spin``: ``chain_latency_spin.*``).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/chain_latency.py`".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import _common
import numpy as np

_common.default_cache_dir()

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
    kwargs = {
        "shapes": shapes,
        "slo": None,
        "num_partitions": k,
        # profiling settings do not change the cuts (measure="flops", no SLO); keep the
        # (untimed) plan building short
        "warmup": 0,
        "repeats": 1,
        "out_dir": None,
    }
    try:
        return partition_model(path, **kwargs), None
    except VerificationError as exc:
        note = {
            "verification_failed_at_default_rtol": str(exc).splitlines()[0],
            "rebuilt_with_rtol": _common.FALLBACK_RTOL,
        }
        return partition_model(path, rtol=_common.FALLBACK_RTOL, **kwargs), note


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
    return {
        "parts_ms": [round(statistics.median(t), 3) for t in t_parts],
        "parts_sum_ms": round(statistics.median(sums), 3),
        "chain_minus_whole_ms": round(
            statistics.median(c - w for c, w in zip(t_chain, t_whole, strict=True)), 3
        ),
        "parts_minus_whole_ms": round(
            statistics.median(p - w for p, w in zip(sums, t_whole, strict=True)), 3
        ),
        "chain_minus_parts_ms": round(
            statistics.median(c - p for c, p in zip(t_chain, sums, strict=True)), 3
        ),
    }


def fixed_run_us(so, n: int = 2000) -> float:
    """Median µs of one ``session.run`` of a 1-element Identity model with these session
    options: the fixed cost of one more run per partition boundary."""
    from infscaler.partitioner.profiler import identity_model

    sess = onnxrt.load_session(identity_model(1), options=so)
    x = {"x": np.zeros(1, np.float32)}
    for _ in range(100):
        sess.run(None, x)
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        sess.run(None, x)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return round(statistics.median(times), 1)


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


def _whole_range(rows: list[dict], model: str) -> str:
    """The whole model's median ms over the K runs, as 'a' or 'a-b'."""
    meds = [r["whole"]["median_ms"] for r in rows if r["model"] == model]
    lo, hi = min(meds), max(meds)
    return f"{lo:.1f}" if hi - lo < 0.05 * lo else f"{lo:.1f}-{hi:.1f}"


def plot(rows: list[dict], ks: list[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["K"]): r for r in rows}
    width = 0.8 / len(ks)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(max(7, 1.9 * len(models) + 2), 4.8))
    top = TARGET
    for j, k in enumerate(ks):
        xs, ys = [], []
        for i, m in enumerate(models):
            if (m, k) in by:
                xs.append(i + (j - (len(ks) - 1) / 2) * width)
                ys.append(by[(m, k)]["ratio_median"])
        ax.bar(xs, ys, width * 0.95, color=colors[j], label=f"K = {k}")
        for x, y in zip(xs, ys, strict=True):
            ax.text(x, y + 0.004, f"{y:.3f}", ha="center", va="bottom", fontsize=7)
        top = max(top, *ys) if ys else top
    ax.axhline(TARGET, color="red", linestyle="--", linewidth=1.5, label=f"target {TARGET:.2f}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{m}\nwhole {_whole_range(rows, m)} ms" for m in models], fontsize=8)
    ax.set_ylabel("median(chain) / median(whole)")
    low = min(0.9, min(r["ratio_median"] for r in rows) - 0.05)
    ax.set_ylim(low, top + 0.08)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper right", ncol=len(ks) + 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _title(data: dict, spin: bool) -> str:
    return (
        f"Chain vs whole model, one request, in-process handoff (target <= {TARGET:.2f})\n"
        f"{data['host']['cpu_model']}, {data['settings']['intra_op_num_threads']} threads, "
        f"onnxruntime {data['onnxruntime']}, CPU EP, ORT_ENABLE_ALL, "
        f"spinning {'default (on)' if spin else 'off'} ({data['date_utc'][:10]})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="no vgg19, fewer repeats")
    ap.add_argument("--models", help="comma-separated subset of aliases")
    ap.add_argument("--ks", default="2,3,4", help="partition counts (default 2,3,4)")
    ap.add_argument("--repeats", type=int, help="timed requests per side (default 30; quick 12)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--spin",
        action="store_true",
        help="keep onnxruntime's default intra-op spinning on both sides "
        "(default: session.intra_op.allow_spinning=0 on both sides)",
    )
    ap.add_argument("--out", type=Path, default=_common.RESULTS_DIR)
    ap.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="only redraw the PNG beside JSON from its recorded results (no measurement)",
    )
    args = ap.parse_args(argv)
    if args.replot:
        data = json.loads(args.replot.read_text())
        plot(
            data["results"],
            data["settings"]["ks"],
            args.replot.with_suffix(".png"),
            _title(data, data["settings"]["allow_spinning"] != "0"),
        )
        return 0

    models = args.models.split(",") if args.models else (QUICK if args.quick else FULL)
    ks = [int(k) for k in args.ks.split(",")]
    repeats = args.repeats or (12 if args.quick else 30)
    threads = usable_cores()
    so = session_options(threads, spin=args.spin)
    env = _common.environment()
    foreign = _common.ForeignLoad(lambda: _common.process_cpu_seconds([os.getpid()]))
    fixed_us = fixed_run_us(so)
    rows, errors = [], []
    for name in models:
        n = min(repeats, REPEATS_OVERRIDE.get(name, repeats))
        try:
            rows.extend(bench_model(name, ks, n, args.warmup, so))
        except Exception as exc:
            traceback.print_exc()
            errors.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})

    suffix = ("_quick" if args.quick else "") + ("_spin" if args.spin else "")
    out = {
        "benchmark": "chain_latency",
        "what": "one-request latency, partitioned chain vs whole model, same process",
        "note": "The chain runs in one process: in-process handoff of numpy arrays between "
        "the parts' sessions, no shared memory yet. The ratio is the overhead of the "
        "partition boundaries themselves (an extra session.run per part + tensor handoff "
        "+ optimisations a boundary prevents), not of inter-process transport.",
        **env,
        "settings": {
            "execution_provider": "CPUExecutionProvider",
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_num_threads": threads,
            "inter_op_num_threads": 1,
            "execution_mode": "ORT_SEQUENTIAL",
            "allow_spinning": "onnxruntime default (on)" if args.spin else "0",
            "same_session_options_for_whole_and_chain": True,
            "order": "interleaved: whole, chain, whole, chain, ...",
            "ks": ks,
            "repeats": repeats,
            "repeats_override": {m: v for m, v in REPEATS_OVERRIDE.items() if m in models},
            "warmup": args.warmup,
            "inputs": "random_feeds(seed=0) at the model's default shapes",
            "whole_model": "load_model(...).model (canonical, concrete input shapes) in one "
            "InferenceSession",
            "plan": "partition_model(num_partitions=K, slo=None, measure='flops', warmup=0, "
            "repeats=1, "
            "out_dir=None), profile cache allowed (plan building is not timed here)",
            "target_ratio": TARGET,
        },
        "load_average_at_end": list(os.getloadavg()),
        "other_processes_cores": foreign.cores(),
        "fixed_run_us": fixed_us,
        "results": rows,
        "errors": errors,
        "all_pass": bool(rows) and not errors and all(r["pass"] for r in rows),
    }
    json_path = args.out / f"chain_latency{suffix}.json"
    _common.write_json(json_path, out)
    if rows:
        plot(rows, ks, args.out / f"chain_latency{suffix}.png", _title(out, args.spin))

    print(f"\nchain vs whole, one request (target ratio <= {TARGET:.2f}), {threads} threads")
    _common.print_table(
        [
            "model",
            "K",
            "n",
            "whole med",
            "whole p90",
            "chain med",
            "chain p90",
            "ratio",
            "paired",
            "us/boundary",
            "parts-whole ms",
            "chain-parts ms",
            "target",
        ],
        [
            [
                r["model"],
                r["K"],
                r["repeats"],
                f"{r['whole']['median_ms']:.2f}",
                f"{r['whole']['p90_ms']:.2f}",
                f"{r['chain']['median_ms']:.2f}",
                f"{r['chain']['p90_ms']:.2f}",
                f"{r['ratio_median']:.3f}",
                f"{r['ratio_paired_median']:.3f}",
                f"{r['overhead_us_per_boundary']:.0f}",
                f"{r['breakdown']['parts_minus_whole_ms']:.2f}",
                f"{r['breakdown']['chain_minus_parts_ms']:.2f}",
                "pass" if r["pass"] else "FAIL",
            ]
            for r in rows
        ],
    )
    print(
        f"fixed cost of one session.run (1-element Identity): {fixed_us:.1f} us; "
        f"other processes used {out['other_processes_cores']:.2f} cores on average"
    )
    for e in errors:
        print(f"ERROR {e['model']}: {e['error']}")
    print(f"\nwrote {json_path}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
