"""Wall-clock time of ``partition_model`` per model (issue "Must show": partitioning time).

For each model: resolve it (materialising a light model's weights once; not timed), count
its ONNX nodes and Eq. 1 operators (``OperatorGraph.num_operators``; not timed), then time
one ``partition_model(...)`` call with a fresh profile (``use_cache=False``: no cached
operator profile or boundary overhead is read or written), ``slo=None``, a fixed K, and
per-phase times taken from the progress callback's timestamps. The target is <= 15 s per
model; each model gets pass / fail against it.

The synthetic model (``synthetic-chain``) is a 250-block Conv-BN-Relu-Add residual chain
built with onnx.helper (1000 operators), so that the >= 800-operator target is exercised;
it is labelled synthetic everywhere.

Usage::

    .venv/bin/python bench/partition_time.py [--quick] [--models resnet50,vgg19]

Writes ``bench/results/partition_time.json`` and ``.png`` (``--quick`` writes
``partition_time_quick.*`` so it never overwrites a full run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import _common

_common.default_cache_dir()

from infscaler.base.errors import VerificationError  # noqa: E402
from infscaler.base.models import MODELS, resolve_model  # noqa: E402
from infscaler.partitioner.api import partition_model  # noqa: E402
from infscaler.partitioner.graph import OperatorGraph  # noqa: E402
from infscaler.partitioner.loader import load_model  # noqa: E402

SYNTHETIC = "synthetic-chain"
FULL = [
    "ppocrv4-det",
    "ppocrv4-rec",
    "resnet50",
    "vgg19",
    "shufflenet",
    "inception-v1",
    "inception-v2",
    "densenet121",
    SYNTHETIC,
]
QUICK = ["ppocrv4-rec", "resnet50", "shufflenet", SYNTHETIC]

#: progress message prefix -> phase key (see partitioner/api.py).
PHASES = [
    ("loading and checking", "load"),
    ("computing operator costs", "costs"),
    ("profiling operators on", "profile"),
    ("measuring the partition boundary", "boundary_t_p"),
    ("searching cut points", "search"),
    ("extracting", "extract"),
    ("verifying the chain", "verify"),
    ("measuring partition latency", "partition_latency"),
    ("writing the plan", "write"),
]


def phase_key(message: str) -> str:
    for prefix, key in PHASES:
        if message.startswith(prefix):
            return key
    return message


def timed_partition(path: Path, shapes: str | None, settings: dict, rtol: float) -> dict:
    """One partition_model call; wall time and per-phase times (progress timestamps)."""
    marks: list[tuple[float, str]] = []

    def progress(msg: str) -> None:
        marks.append((time.perf_counter(), msg))

    t0 = time.perf_counter()
    error = None
    plan = None
    try:
        plan = partition_model(
            path,
            shapes=shapes,
            slo=None,
            num_partitions=settings["num_partitions"],
            warmup=settings["warmup"],
            repeats=settings["repeats"],
            use_cache=False,
            out_dir=None,
            rtol=rtol,
            progress=progress,
        )
    except VerificationError as exc:
        error = exc
    t1 = time.perf_counter()
    phases: dict[str, float] = {}
    ends = [m[0] for m in marks[1:]] + [t1]
    if marks:
        phases["before_first_phase"] = round(marks[0][0] - t0, 4)
    for (start, msg), end in zip(marks, ends, strict=True):
        key = phase_key(msg)
        phases[key] = round(phases.get(key, 0.0) + end - start, 4)
    return {"seconds": t1 - t0, "phases": phases, "plan": plan, "error": error}


def bench_model(name: str, settings: dict, tmp: Path) -> dict:
    if name == SYNTHETIC:
        t = time.perf_counter()
        path = _common.synthetic_chain(tmp / "synthetic_chain.onnx", blocks=settings["blocks"])
        prep_s = time.perf_counter() - t
        shapes = None
        kind = f"synthetic ({settings['blocks']} x Conv-BN-Relu-Add, 1x16x16x16, random weights)"
    else:
        t = time.perf_counter()
        path = resolve_model(name)
        prep_s = time.perf_counter() - t
        shapes = MODELS[name].shapes
        kind = MODELS[name].description
    loaded = load_model(path, shapes)
    nodes = len(loaded.model.graph.node)
    operators = OperatorGraph.from_loaded(loaded).num_operators
    del loaded

    run = timed_partition(path, shapes, settings, settings["rtol"])
    row: dict = {
        "model": name,
        "synthetic": name == SYNTHETIC,
        "description": kind,
        "shapes": shapes,
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "resolve_seconds_not_timed": round(prep_s, 3),
        "onnx_nodes": nodes,
        "operators": operators,
        "rtol": settings["rtol"],
    }
    if run["error"] is not None:
        # Record the failure at the default tolerance, then time a run that can finish.
        row["verification_failed_at_default_rtol"] = {
            "message": str(run["error"]).splitlines()[0],
            "seconds_until_failure": round(run["seconds"], 3),
        }
        run = timed_partition(path, shapes, settings, _common.FALLBACK_RTOL)
        row["rtol"] = _common.FALLBACK_RTOL
        if run["error"] is not None:
            raise run["error"]
    plan = run["plan"]
    s = plan.summary
    seconds = run["seconds"]
    row.update(
        {
            "seconds": round(seconds, 3),
            "phases_seconds": run["phases"],
            "K": s["objective"]["num_partitions"],
            "cuts": [c["after_operator"] for c in s["cuts"]],
            "cut_nodes": [c["node"] for c in s["cuts"]],
            "plan_operators": s["model"]["operators"],
            "t_o_ms": s["timing"]["t_o_ms"],
            "verification_max_rel": s["verification"].get("max_rel"),
            "target_seconds": settings["target_seconds"],
            "pass": seconds <= settings["target_seconds"],
        }
    )
    return row


def plot(rows: list[dict], target: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for _, k in PHASES if any(k in r.get("phases_seconds", {}) for r in rows)]
    if any(r["phases_seconds"].get("before_first_phase", 0) > 0.05 for r in rows):
        keys = ["before_first_phase", *keys]
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 2.2))
    labels = []
    for i, r in enumerate(rows):
        left = 0.0
        for j, k in enumerate(keys):
            v = r["phases_seconds"].get(k, 0.0)
            ax.barh(i, v, left=left, color=colors[j % 10], label=k if i == 0 else None)
            left += v
        mark = "pass" if r["pass"] else "FAIL"
        ax.text(r["seconds"] + 0.15, i, f"{r['seconds']:.1f} s  {mark}", va="center", fontsize=9)
        syn = " [synthetic]" if r["synthetic"] else ""
        labels.append(f"{r['model']}{syn}\n{r['onnx_nodes']} nodes / {r['operators']} ops")
    ax.axvline(target, color="red", linestyle="--", linewidth=1.5, label=f"target {target:g} s")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("partition_model wall-clock time (s), stacked by phase")
    ax.set_xlim(0, max(target, max(r["seconds"] for r in rows)) * 1.25)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--models", help="comma-separated subset (aliases or synthetic-chain)")
    ap.add_argument("--num-partitions", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=250, help="synthetic chain blocks (4 ops each)")
    ap.add_argument("--target", type=float, default=15.0, help="target seconds per model")
    ap.add_argument("--out", type=Path, default=_common.RESULTS_DIR)
    args = ap.parse_args(argv)

    models = args.models.split(",") if args.models else (QUICK if args.quick else FULL)
    settings = {
        "num_partitions": args.num_partitions,
        "slo": None,
        "measure": "flops",
        "warmup": 1,
        "repeats": 3,
        "use_cache": False,
        "threads": "default (all usable cores)",
        "out_dir": None,
        "rtol": 1e-4,
        "fallback_rtol_if_verification_fails": _common.FALLBACK_RTOL,
        "blocks": args.blocks,
        "target_seconds": args.target,
        "timed": "one partition_model() call per model, after model resolution and "
        "node / operator counting (those are not timed)",
    }
    env = _common.environment()
    rows = []
    errors = []
    with tempfile.TemporaryDirectory(prefix="isc-bench-") as tmp:
        for name in models:
            print(f"[partition_time] {name} ...", file=sys.stderr, flush=True)
            try:
                rows.append(bench_model(name, settings, Path(tmp)))
            except Exception as exc:
                traceback.print_exc()
                errors.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})

    suffix = "_quick" if args.quick else ""
    out = {
        "benchmark": "partition_time",
        "what": "wall-clock seconds of partition_model() with a fresh profile (no cache)",
        **env,
        "settings": settings,
        "load_average_at_end": list(os.getloadavg()),
        "models": rows,
        "errors": errors,
        "all_pass": bool(rows) and not errors and all(r["pass"] for r in rows),
    }
    json_path = args.out / f"partition_time{suffix}.json"
    _common.write_json(json_path, out)
    if rows:
        host = env["host"]
        title = (
            f"partition_model time, K={args.num_partitions}, warmup=1 repeats=3, no cache\n"
            f"{host['cpu_model']}, {env['usable_cores']} cores, onnxruntime {env['onnxruntime']}"
            f" ({env['date_utc'][:10]})"
        )
        plot(rows, args.target, args.out / f"partition_time{suffix}.png", title)

    table = [
        [
            r["model"] + (" (synthetic)" if r["synthetic"] else ""),
            r["onnx_nodes"],
            r["operators"],
            r["K"],
            ",".join(map(str, r["cuts"])),
            f"{r['seconds']:.2f}",
            f"{r['phases_seconds'].get('profile', 0):.2f}",
            f"{r['phases_seconds'].get('verify', 0):.2f}",
            "pass" if r["pass"] else "FAIL",
            "" if "verification_failed_at_default_rtol" not in r else f"rtol {r['rtol']:g}*",
        ]
        for r in rows
    ]
    print(f"\npartition_model time (target <= {args.target:g} s), {env['host']['cpu_model']}")
    _common.print_table(
        ["model", "nodes", "ops", "K", "cuts", "total s", "profile s", "verify s", "target", ""],
        table,
    )
    if any("verification_failed_at_default_rtol" in r for r in rows):
        print("* failed verification at rtol 1e-4; timed again at the fallback rtol (see JSON)")
    for e in errors:
        print(f"ERROR {e['model']}: {e['error']}")
    print(f"\nwrote {json_path}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
