"""How well the planner's simulator predicts a served pipeline (issue 5: "its prediction
error against measured runs is reported").

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``plan_accuracy.py``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import replay_summary  # noqa: E402


def serve(served: dict, x: dict, times: np.ndarray, res: harness.Result) -> dict[str, Any]:
    """A fresh service of ``served``, warmed, sent ``times``: measured figures."""
    from infscaler.api.loadgen import LoadGenerator

    with harness.Sut([served]) as s:
        res.own_pids[:] = [s.pid]
        harness.scenarios.run(s.sock, "r50", x, harness.scenarios.SINGLE_STREAM, duration_s=2.0)
        rows = LoadGenerator(s.sock, "r50", x).replay(times, timeout_s=120.0)
    span = max(r["sent_s"] for r in rows) + max(r["ms"] for r in rows) / 1e3
    m = replay_summary(rows, 1e12, span)
    return {**m, "throughput_rps": round(m["answered"] / span, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=30.0, quiet_wait_s=120.0)

    def quick(a: Any) -> None:
        a.duration_s = 15.0

    args = harness.cli.parse(ap, argv, quick)
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import resolve_model
    from infscaler.runtime.planning.arrivals import poisson
    from infscaler.runtime.planning.planner import predict
    from infscaler.runtime.planning.simulator import UnitConfig
    from infscaler.runtime.planning.unitprofile import profile_pipeline
    from infscaler.runtime.serving.pipeline import compile_pipeline

    res = harness.cli.start("plan_accuracy", args)
    state = Path(tempfile.gettempdir()) / "isc-bench-state"
    cfg = pipeline_for_model(resolve_model("resnet50"), name="r50", partitions=2)
    compiled = compile_pipeline(cfg, state_dir=state)
    arr = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    x = {compiled.inputs[0].name: arr}
    prof = profile_pipeline(compiled, x, repeats=20, warmup=3)
    units = list(prof.units)
    per_unit = [u.fastest().mean_ms for u in units]
    configs = [[1, 1], [2, 1] if per_unit[0] >= per_unit[1] else [1, 2]]
    fractions = [0.5, 0.85]
    if args.quick:
        configs, fractions = configs[:1], [0.6]
    res.summary["unit_profile"] = prof.to_dict()
    ncores = len(os.sched_getaffinity(0))  # the simulator's contention model shares these
    for inst in configs:
        capacity = min(n * 1000.0 / ms for n, ms in zip(inst, per_unit, strict=True))
        served = cfg.model_dump(mode="json", exclude_none=True)
        served["stages"][0]["instances"] = inst
        for frac in fractions:
            rate = frac * capacity
            times = poisson(rate, args.duration_s, seed=1)
            preds = {label: predict(units, [UnitConfig({"cpu": n}) for n in inst], times,
                                    handover_ms=0.1, seed=1, cpu_cores=cores)
                     for label, cores in (("predicted", None), ("predicted_contention", ncores))}  # fmt: skip
            meas = serve(served, x, times, res)
            row = {"instances": inst, "offered_rps": round(rate, 2), "fraction_of_capacity": frac,
                   "measured": meas}  # fmt: skip
            for label, pred in preds.items():
                p = {"throughput_rps": round(pred.throughput_rps, 3),
                     "p50_ms": None if pred.p50_ms is None else round(pred.p50_ms, 2),
                     "p99_ms": None if pred.p99_ms is None else round(pred.p99_ms, 2)}  # fmt: skip
                row[label] = p
                row["error" if label == "predicted" else "error_contention"] = {
                    k: round((p[k] - meas[k]) / meas[k], 4)
                    for k in p
                    if p[k] is not None and meas.get(k)
                }
            res.add(config=str(inst), p99_error=row["error"].get("p99_ms"),
                    p99_error_contention=row["error_contention"].get("p99_ms"),
                    throughput_error=row["error"].get("throughput_rps"), **row)  # fmt: skip
            print(f"instances {inst} at {rate:.1f}/s: P99 predicted {row['predicted']['p99_ms']} "
                  f"ms, measured {meas['p99_ms']} ms (error {row['error'].get('p99_ms')})", flush=True)  # fmt: skip
    harness.cli.finish(res, args, plot)
    return 0


def plot(data: dict, path: Path) -> None:
    """The P99 and throughput errors (predicted - measured) / measured against the offered
    rate, one line per configuration."""
    harness.plot(data["points"], path, x="offered_rps",
                 y=["p99_error", "p99_error_contention", "throughput_error"], by="config",
                 hlines={"exact": 0.0}, xlabel="offered rate, /s",
                 ylabel="(predicted - measured) / measured")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
