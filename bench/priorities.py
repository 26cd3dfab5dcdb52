"""A priority-1 pipeline's SLO while a lower one is flooded, with CPU by priority and without.

One ``infscaler serve`` with two pipelines from their YAMLs, both ``autoscale`` with an SLO:
``hi`` (priority 1, SLO ``--slo-x`` x its L0, default ResNet-50) and ``lo`` (priority 2,
SLO 1 s, default SqueezeNet). ``hi`` gets Poisson arrivals at ``--hi-load`` x one core's
ideal rate (1000 / L0); ``lo`` is either idle or flooded by ``--flood`` closed-loop clients
that send again at once. Arms, each a fresh service, alternating over ``--rounds``:

- ``on``: CPU by priority as shipped (``lo``'s instances at a higher nice value);
- ``off``: ``INFSCALER_CPU_PRIORITY=off`` (every instance at the service's value).

Per window: ``hi``'s attainment (answers within its SLO / requests sent), P99 and
refusals, and ``lo``'s answers per second. The figure the priority exists for is
``hi`` attainment flooded / alone (target >= 0.95) with the lower pipeline still served.
Clients: the httpx binary-tensor client of ``vs_triton.py`` over the Unix socket.
Writes ``results/priorities.json`` / ``.png`` (``_quick`` with --quick).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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
    process_cpu_seconds,
    wait_for_quiet,
    write_json,
)
from vs_triton import INFSCALER, HttpClient, Model, closed_loop, open_loop, single_thread_ms  # noqa: E402


def model_of(alias: str) -> Model:
    import onnx

    from infscaler.base.models import resolve_model

    path = resolve_model(alias)
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    first = next(i for i in g.input if i.name not in inits)
    dims = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
    return Model(alias, path, first.name, g.output[0].name, dims)


def pipeline_yaml(path: Path, name: str, m: Model, priority: int, slo_ms: float) -> Path:
    import yaml

    doc = {
        "name": name,
        "priority": priority,
        "slo": f"{slo_ms:.0f}ms",
        "autoscale": True,
        "inputs": [{"name": m.input, "datatype": "FP32", "shape": m.shape}],
        "outputs": [m.output],
        "stages": [
            {
                "name": "model",
                "model": str(m.path),
                "inputs": {m.input: m.input},
                "outputs": {m.output: m.output},
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Served:
    """``infscaler serve hi.yaml lo.yaml`` on a temporary socket, CPU priority on or off."""

    def __init__(self, yamls: list[Path], cpu_priority: bool, state: Path) -> None:
        self.tmp = tempfile.mkdtemp(prefix="isc-prio-")
        self.http = {"uds": f"{self.tmp}/isc.sock", "base": "http://isc"}
        env = {**os.environ, "INFSCALER_CPU_PRIORITY": "on" if cpu_priority else "off"}
        cmd = [str(INFSCALER), "serve", "--socket", self.http["uds"], "--no-grpc"]
        cmd += ["--state-dir", str(state), *map(str, yamls)]
        self.log = open(Path(self.tmp) / "serve.log", "w")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        import httpx

        deadline = time.monotonic() + 900
        with httpx.Client(transport=httpx.HTTPTransport(uds=self.http["uds"]), timeout=5) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {self.log.name}")
                try:
                    if all(
                        c.get(f"http://isc/v2/models/{n}/ready").status_code == 200
                        for n in ("hi", "lo")
                    ):
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"not ready in 900 s: {self.log.name}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def window(
    served: Served, hi: Model, lo: Model, a: argparse.Namespace, flood: bool, seed: int
) -> dict:
    x_hi = np.random.default_rng(0).standard_normal(hi.shape).astype(np.float32)
    x_lo = np.random.default_rng(1).standard_normal(lo.shape).astype(np.float32)
    rate = a.hi_load * 1000.0 / hi.l0_ms
    lo_res: dict[str, Any] = {}
    flooder = None
    if flood:

        def run_flood() -> None:
            lo_res.update(
                closed_loop(
                    lambda: HttpClient(served, lo, x_lo, name="lo"),
                    a.flood,
                    a.duration_s + 2 * a.settle_s,
                    1000.0,
                )
            )

        flooder = threading.Thread(target=run_flood)
        flooder.start()
        time.sleep(a.settle_s)
    fl = ForeignLoad(lambda: process_cpu_seconds([os.getpid(), served.proc.pid]))
    res = open_loop(
        lambda: HttpClient(served, hi, x_hi, name="hi"), rate, a.duration_s, a.slo_ms, seed
    )
    res["attainment"] = round(res["within_slo"] / max(1, res["sent"]), 4)
    res["other_processes_cores"] = fl.cores()
    if flooder is not None:
        flooder.join()
    return {
        "hi": res,
        "lo": {k: lo_res.get(k) for k in ("answered", "throughput_rps", "refused", "p99_ms")},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hi-model", default="resnet50")
    ap.add_argument("--lo-model", default="squeezenet")
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--hi-load", type=float, default=0.3, help="x one core's ideal rate")
    ap.add_argument("--flood", type=int, default=6, help="closed-loop clients on lo")
    ap.add_argument("--duration-s", type=float, default=40.0)
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.duration_s, a.settle_s, a.rounds = 10.0, 4.0, 1
    default_cache_dir()
    hi, lo = model_of(a.hi_model), model_of(a.lo_model)
    x = np.random.default_rng(0).standard_normal(hi.shape).astype(np.float32)
    hi.l0_ms = single_thread_ms(hi, x)
    a.slo_ms = a.slo_x * hi.l0_ms
    quiet = wait_for_quiet(60)
    work = Path(tempfile.mkdtemp(prefix="isc-prio-yaml-"))
    yamls = [
        pipeline_yaml(work / "hi.yaml", "hi", hi, 1, a.slo_ms),
        pipeline_yaml(work / "lo.yaml", "lo", lo, 2, 1000.0),
    ]
    state = Path(os.environ.get("INFSCALER_CACHE_DIR", "/tmp/isc-cache")) / "priorities_state"
    runs: list[dict] = []
    for r in range(a.rounds):
        for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
            served = Served(yamls, arm == "on", state)
            try:
                alone = window(served, hi, lo, a, False, seed=r)
                flooded = window(served, hi, lo, a, True, seed=r)
            finally:
                served.stop()
            runs.append({"round": r, "arm": arm, "alone": alone, "flooded": flooded})
            print(
                f"round {r} {arm}: hi alone {alone['hi']['attainment']:.3f} "
                f"flooded {flooded['hi']['attainment']:.3f} (P99 {flooded['hi']['p99_ms']} ms), "
                f"lo {flooded['lo']['throughput_rps']}/s",
                flush=True,
            )
    summary = {}
    for arm in ("on", "off"):
        mine = [x for x in runs if x["arm"] == arm]
        ratio = [
            x["flooded"]["hi"]["attainment"] / max(1e-9, x["alone"]["hi"]["attainment"])
            for x in mine
        ]
        summary[arm] = {
            "hi_attainment_alone": [x["alone"]["hi"]["attainment"] for x in mine],
            "hi_attainment_flooded": [x["flooded"]["hi"]["attainment"] for x in mine],
            "flooded_over_alone": [round(v, 3) for v in ratio],
            "flooded_over_alone_median": round(float(np.median(ratio)), 3),
            "lo_rps_flooded": [x["flooded"]["lo"]["throughput_rps"] for x in mine],
        }
    data = {
        "environment": environment(),
        "quiet_before": quiet,
        "settings": {**vars(a), "hi_l0_ms": round(hi.l0_ms, 2)},
        "runs": runs,
        "summary": summary,
    }
    name = "priorities_quick" if a.quick else "priorities"
    write_json(RESULTS_DIR / f"{name}.json", data)
    plot(summary, RESULTS_DIR / f"{name}.png", a)
    shutil.rmtree(work, ignore_errors=True)
    for arm, s in summary.items():
        print(arm, s)
    return 0


def plot(summary: dict, path: Path, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, arm in enumerate(("on", "off")):
        s = summary[arm]
        ax.scatter(
            [i - 0.1] * len(s["hi_attainment_alone"]),
            s["hi_attainment_alone"],
            marker="o",
            label=f"{arm}: alone",
        )
        ax.scatter(
            [i + 0.1] * len(s["hi_attainment_flooded"]),
            s["hi_attainment_flooded"],
            marker="x",
            label=f"{arm}: lo flooded",
        )
        bx.scatter([i] * len(s["lo_rps_flooded"]), s["lo_rps_flooded"])
    for x in (ax, bx):
        x.set_xticks([0, 1], ["CPU priority on", "off"])
    ax.set_ylabel(f"hi within its SLO ({a.slo_ms:.0f} ms)")
    ax.axhline(0.95, ls=":", c="grey")
    ax.legend(fontsize=7)
    bx.set_ylabel("lo answered / s while flooded")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
