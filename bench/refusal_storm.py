"""A closed loop that retries at once against ``serve --slo --autoscale``: served/s,
refusals/s and the service's CPU per attempt, two builds side by side.

SqueezeNet (the onnx wheel's, with a batch dim: ``vs_triton.batchable``) is served by two
``infscaler serve --slo X --autoscale`` processes at once, one per arm (``--arms``:
``name=path of an infscaler executable``; default ``before`` the main checkout's install,
``after`` this tree's; ``--fixed 2x1``: a fixed configuration with the SLO in its
pipeline.yaml and no autoscale, so every arm serves the same deployment and only
admission differs), SLO ``--slo-x`` x L0 (L0: one single-thread run, median). After
a warm-up, ``--rounds`` rounds, the arms in alternating order (ABBA...), per protocol
(``tritonclient.grpc``; httpx with binary tensors, as ``vs_triton.py``) ``--concurrency``
clients that send again as soon as they are answered or refused, ``--settle-s``
unmeasured then ``--duration-s`` measured: answered and refused per second, the share
within the SLO, the serving process's CPU ms per attempt (``/proc``) and, fitted over
every measured run of a protocol and arm, its CPU ms per answered and per refused
request (least squares on ``cpu = a x answered + b x refused``; None when the runs do not
tell them apart). CPU per attempt is the loaded host's fair measure; the wall-clock
rates are a loaded host's. Output: bench/results/refusal_storm.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_triton as vt  # noqa: E402
from harness.host import environment  # noqa: E402
from harness.result import write_json  # noqa: E402


class FixedSut(vt.Sut):
    """Ours at a fixed ``instances`` x ``threads`` with the pipeline's ``slo`` set and no
    autoscale: admission on, the same deployment in every arm (``--fixed``)."""

    slo_ms: float = 0.0

    def _pipeline_yaml(self, model: vt.Model) -> Path:
        import yaml

        path = super()._pipeline_yaml(model)
        doc = yaml.safe_load(path.read_text())
        doc["slo"] = f"{self.slo_ms:.1f}ms"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


def fit_costs(runs: list[dict]) -> dict[str, float | None]:
    """CPU ms per answered and per refused request of the serving process, least squares
    over ``runs`` (``answered``, ``refused``, ``server_cpu_s``); None when fewer than 2
    runs or the mixes are collinear."""
    if len(runs) < 2:
        return {"per_answered_ms": None, "per_refused_ms": None}
    a = np.array([[r["answered"], r["refused"]] for r in runs], dtype=float)
    y = np.array([r["server_cpu_s"] * 1e3 for r in runs])
    if np.linalg.matrix_rank(a) < 2 or np.linalg.cond(a) > 1e3:
        return {"per_answered_ms": None, "per_refused_ms": None}
    (pa, pr), *_ = np.linalg.lstsq(a, y, rcond=None)
    return {"per_answered_ms": round(float(pa), 3), "per_refused_ms": round(float(pr), 3)}


def one_run(sut: vt.Sut, model: vt.Model, x: np.ndarray, proto: str, args, slo_ms: float) -> dict:  # noqa: ANN001
    def make() -> Any:
        return vt.CLIENTS[proto](sut, model, x)

    if args.settle_s > 0:
        vt.closed_loop(make, args.concurrency, args.settle_s, slo_ms)
    res = vt._cpu(sut, lambda: vt.closed_loop(make, args.concurrency, args.duration_s, slo_ms))
    n = res["answered"] + res["refused"]
    wall = res["wall_s"]
    return {
        "answered": res["answered"],
        "refused": res["refused"],
        "served_rps": round(res["answered"] / wall, 2),
        "refused_rps": round(res["refused"] / wall, 2),
        "goodput_rps": res["goodput_rps"],
        "p99_ms": res["p99_ms"],
        "server_cpu_s": round(res["server_cpu_ms_per_request"] * n / 1e3, 4),
        "server_cpu_ms_per_attempt": res["server_cpu_ms_per_request"],
        "model_procs_cpu_ms_per_attempt": res["model_procs_cpu_ms_per_request"],
        "other_processes_cores": res["other_processes_cores"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(sys.executable).parent / "infscaler"
    ap.add_argument(
        "--arms",
        default=f"this={here}",
        help="NAME=PATH/TO/infscaler,...: the installs to compare, alternating (A/B: before=OTHER/.venv/bin/infscaler,after=...)",
    )
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument(
        "--fixed",
        default="",
        help="INSTANCESxTHREADS: serve that fixed configuration with the SLO and no "
        "autoscale (admission alone, the same deployment in every arm)",
    )
    ap.add_argument("--out", default=str(vt.RESULTS_DIR / "refusal_storm.json"))
    args = ap.parse_args(argv)
    arms = dict(a.split("=", 1) for a in args.arms.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="refusal-storm-"))
    model = vt.batchable(args.model, tmp)
    x = np.random.default_rng(0).standard_normal(model.shape).astype(np.float32)
    model.l0_ms = vt.single_thread_ms(model, x, n=50)
    slo_ms = args.slo_x * model.l0_ms
    print(f"L0 {model.l0_ms:.2f} ms, SLO {slo_ms:.1f} ms", flush=True)
    if args.fixed:
        inst, threads = (int(v) for v in args.fixed.lower().split("x"))
        suts: dict[str, vt.Sut] = {}
        for name, exe in arms.items():
            sut = FixedSut(name, "ours", inst, threads, exe=Path(exe))
            sut.slo_ms = slo_ms
            suts[name] = sut
    else:
        suts = {n: vt.Sut(n, "ours", auto=True, exe=Path(e)) for n, e in arms.items()}
    protos = args.protocols.split(",")
    out: dict[str, Any] = {
        "environment": environment(),
        "args": vars(args),
        "l0_ms": model.l0_ms,
        "slo_ms": slo_ms,
        "runs": [],
    }
    try:
        for name, sut in suts.items():
            sut.start(model, slo_ms, "", tmp / f"state-{name}")
        for sut in suts.values():  # both planned and deployed: warm both up
            for proto in protos:
                make = lambda s=sut, p=proto: vt.CLIENTS[p](s, model, x)  # noqa: E731
                vt.closed_loop(make, args.concurrency, args.warmup_s / len(protos), slo_ms)
        order = list(suts)
        for rnd in range(args.rounds):
            for name in order if rnd % 2 == 0 else order[::-1]:
                for proto in protos:
                    row = {"round": rnd, "arm": name, "protocol": proto}
                    row |= one_run(suts[name], model, x, proto, args, slo_ms)
                    out["runs"].append(row)
                    print(row, flush=True)
        for name, sut in suts.items():
            out.setdefault("decisions", {})[name] = vt.scaler_decisions(sut)
            out.setdefault("planned", {})[name] = sut.planned()
    finally:
        for sut in suts.values():
            sut.stop(keep_logs=True)
    summary = []
    for name in suts:
        for proto in protos:
            rs = [r for r in out["runs"] if r["arm"] == name and r["protocol"] == proto]
            if not rs:
                continue
            summary.append(
                {
                    "arm": name,
                    "protocol": proto,
                    "served_rps": [r["served_rps"] for r in rs],
                    "refused_rps": [r["refused_rps"] for r in rs],
                    "goodput_rps": [r["goodput_rps"] for r in rs],
                    "server_cpu_ms_per_attempt": [r["server_cpu_ms_per_attempt"] for r in rs],
                    **fit_costs(rs),
                }
            )
    out["summary"] = summary
    for s in summary:
        print(s, flush=True)
    write_json(Path(args.out), out)
    print("->", args.out, "logs:", ", ".join(s.tmp for s in suts.values()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
