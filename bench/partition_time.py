"""Wall-clock time of ``partition_model`` per model (issue "Must show": partitioning time).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``partition_time.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import harness

harness.host.default_cache_dir()

from infscaler.base.errors import VerificationError  # noqa: E402
from infscaler.base.models import MODELS, resolve_model  # noqa: E402
from infscaler.partitioner.api import partition_model  # noqa: E402
from infscaler.partitioner.graph import OperatorGraph  # noqa: E402
from infscaler.partitioner.loader import load_model  # noqa: E402

SYNTHETIC = "synthetic-chain"
FULL = ["ppocrv4-det", "ppocrv4-rec", "resnet50", "vgg19", "shufflenet", "inception-v1",
        "inception-v2", "densenet121", SYNTHETIC]  # fmt: skip
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
        plan = partition_model(path, shapes=shapes, slo=None, num_partitions=settings["num_partitions"],
                               warmup=settings["warmup"], repeats=settings["repeats"], use_cache=False,
                               out_dir=None, rtol=rtol, progress=progress)  # fmt: skip
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
        path = harness.models.synthetic_chain(tmp / "synthetic_chain.onnx", settings["blocks"])
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
        run = timed_partition(path, shapes, settings, harness.models.FALLBACK_RTOL)
        row["rtol"] = harness.models.FALLBACK_RTOL
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


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--models", default=",".join(FULL), help="aliases or synthetic-chain")
    ap.add_argument("--num-partitions", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=250, help="synthetic chain blocks (4 ops each)")
    ap.add_argument("--target", type=float, default=15.0, help="target seconds per model")

    def quick(a: Any) -> None:
        a.models = ",".join(QUICK) if a.models == ",".join(FULL) else a.models

    a = harness.cli.parse(ap, argv, quick)
    settings = {"num_partitions": a.num_partitions, "slo": None, "measure": "flops",
                "warmup": 1, "repeats": 3, "use_cache": False, "out_dir": None, "rtol": 1e-4,
                "blocks": a.blocks, "target_seconds": a.target}  # fmt: skip
    res = harness.cli.start("partition_time", a)
    res.summary.update(settings=settings, errors=[])
    with tempfile.TemporaryDirectory(prefix="isc-bench-") as tmp:
        for name in a.models.split(","):
            print(f"[partition_time] {name} ...", file=sys.stderr, flush=True)
            try:
                row = bench_model(name, settings, Path(tmp))
                res.add(**row, **{f"{k}_s": v for k, v in row["phases_seconds"].items()})
            except Exception as exc:
                traceback.print_exc()
                res.summary["errors"].append(
                    {"model": name, "error": f"{type(exc).__name__}: {exc}"}
                )
    res.summary["all_pass"] = (
        bool(res.points) and not res.summary["errors"] and all(r["pass"] for r in res.points)
    )
    harness.cli.finish(res, a, plot if res.points else None)
    harness.print_table(
        ["model", "nodes", "ops", "K", "cuts", "total s", "profile s", "verify s", "target", "rtol"],
        [[r["model"], r["onnx_nodes"], r["operators"], r["K"], ",".join(map(str, r["cuts"])),
          r["seconds"], r["phases_seconds"].get("profile"), r["phases_seconds"].get("verify"),
          "pass" if r["pass"] else "FAIL", r["rtol"]] for r in res.points],
    )  # fmt: skip
    for e in res.summary["errors"]:
        print(f"ERROR {e['model']}: {e['error']}")
    return 0 if not res.summary["errors"] else 1


def plot(data: dict, path: Path) -> None:
    """Total and per-phase seconds against the model's operators (log), the target as a
    line."""
    phases = [f"{k}_s" for _, k in PHASES if any(f"{k}_s" in p for p in data["points"])]
    harness.plot(data["points"], path, x="operators", y=["seconds", *phases], logx=True,
                 hlines={"target": data["summary"]["settings"]["target_seconds"]},
                 xlabel="Eq. 1 operators", ylabel="partition_model, s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
