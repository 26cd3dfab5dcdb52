"""Throughput at SLO (InfScaler §V, Fig. 5): the runtime's own choice against whole-model
replication and one session, at P99 <= k x L0 (MLPerf LoadGen's server scenario).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``scaling.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import (  # noqa: E402, F401 - pipeline, session: for the tests
    AUTOSCALE,
    MODEL_SETTINGS,
    auto_pipeline,
    calibrate,
    model_inputs,
    pipeline,
    session,
)
from harness.scenarios import SERVER  # noqa: E402

NAME = "m"
CONFIGS = ("auto", "replication", "one-session", "eq1")
BASELINES = ("replication", "one-session")


def config_pipeline(config: str, model: str, slo_ms: float, cores: int) -> dict[str, Any]:
    """The pipeline dict a configuration deploys (see the method).

    Raises:
        ValueError: an unknown configuration.
    """
    if config in ("auto", "eq1"):
        cfg = auto_pipeline(model, NAME, slo_ms)
    elif config == "replication":
        cfg = pipeline(model, NAME, 1, 1, slo_ms, AUTOSCALE, max_instances=cores)
    elif config == "one-session":
        cfg = pipeline(model, NAME, 1, cores, None, None, whole=True)
    else:
        raise ValueError(f"unknown configuration {config!r}: use one of {CONFIGS}")
    # unset fields stay unset: a default written into the YAML would be a choice made for
    # the runtime (auto must leave K, threads and instances to it)
    return cfg.model_dump(mode="json", exclude_none=True, exclude_unset=True)


def measure_cap(model: str, feeds: dict) -> dict[str, Any]:
    """The former script's memory cap (``harness.models.cap_rule``) from the PSS of one
    1-thread instance of the whole model and of each Eq. 1 partition (K from
    ``MODEL_SETTINGS``), each served fresh after 3 requests."""
    out = {}
    for label, k in (("whole", 1), ("plan", MODEL_SETTINGS.get(model, {}).get("k", 2))):
        pipe = pipeline(model, NAME, k, 1, whole=k == 1).model_dump(mode="json", exclude_none=True)
        with harness.Sut([pipe]) as s:
            harness.scenarios.run(s.sock, NAME, feeds, "single_stream", duration_s=1.5)
            time.sleep(2.5)  # instances report their memory every second
            st = s.status()
        us = next(p for p in st["pipelines"] if p["name"] == NAME)["units"]
        us = [u for u in us if u["instances"]]
        out[label] = {"pss_mb": [u["instances"][0]["pss_mb"] for u in us],
                      "bottleneck": [u.get("bottleneck") or 0.0 for u in us],
                      "pool_mb": st["pool"]["mapped_mb"]}  # fmt: skip
    plan = out["plan"]
    b = max(range(len(plan["pss_mb"])), key=lambda i: plan["bottleneck"][i])
    pool = max(out["whole"]["pool_mb"], plan["pool_mb"])
    return harness.models.cap_rule(out["whole"]["pss_mb"][0], plan["pss_mb"], b, pool)


def units(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The served pipeline's units from ``status``, scalar fields only."""
    pipes = [p for p in status.get("pipelines", []) if p.get("name") == NAME]
    return [
        {k: v for k, v in u.items() if isinstance(v, (int, float, str, bool))}
        for p in pipes
        for u in p.get("units", [])
    ]


def cell_summary(rates: dict[str, float], ceiling_rps: float) -> dict[str, Any]:
    """One cell's comparison: ``rates`` (configuration -> max rate at SLO, /s) ->
    ``best_baseline`` (name and rate, None without a baseline), ``auto_vs_best`` and
    ``auto_vs_ceiling`` (None where a divisor is 0 or missing)."""
    base = {c: r for c, r in rates.items() if c in BASELINES}
    best = max(base, key=lambda c: base[c]) if base else None
    best_rps = base[best] if best else None
    auto = rates.get("auto")

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {**{f"{c}_rps": r for c, r in rates.items()}, "best_baseline": best,
            "best_baseline_rps": best_rps, "auto_vs_best": ratio(auto, best_rps),
            "ceiling_rps": ceiling_rps, "auto_vs_ceiling": ratio(auto, ceiling_rps)}  # fmt: skip


def run_cell(
    a: Any, res: harness.Result, model: str, feeds: dict, cal: dict, slo_x: float
) -> dict[str, Any]:
    """Every configuration's max rate at SLO = ``slo_x`` x L0 (one bisection each, the
    steps added to ``res``), and the cell's :func:`cell_summary`."""
    import slo_bound

    slo_ms = round(slo_x * cal["l0_ms"], 1)
    rates = {}
    for config in a.configs.split(","):
        pipe = config_pipeline(config, model, slo_ms, cal["cores"])
        args = [*a.sut_args, *(["--objective", "eq1"] if config == "eq1" else [])]

        def step(rate: float, pipe: dict = pipe, config: str = config, args: list = args) -> dict:
            with harness.Sut([pipe], args=args) as s:
                res.own_pids[:] = [s.pid]
                p = harness.scenarios.run(
                    s.sock, NAME, feeds, SERVER, rate, duration_s=a.duration_s,
                    warmup_s=a.warmup_s, bound_ms=slo_ms, seed=a.seed, shared_memory=a.shm,
                )  # fmt: skip
                p["units"] = units(s.status())
            verdict = "pass" if p["passed"] else "fail"
            print(f"  {config} {slo_x}x {rate:.2f}/s: P99 {p['p99_all_ms']} ms -> {verdict}")
            return p

        ideal = cal["ideal_rps"]
        found = harness.search.max_rate_at_slo(step, 1.1 * ideal, a.steps, first_rps=0.55 * ideal)
        rates[config] = found["max_rps"]
        for p in found["points"]:
            res.add(model=model, slo_x=slo_x, slo_ms=slo_ms, config=config, cap_mb=a.cap, **p)
    ceiling = round(slo_bound.mdc_max_rate(cal["cores"], cal["l0_ms"], slo_ms), 3)
    return {"model": model, "slo_x": slo_x, "cap_mb": a.cap, **cell_summary(rates, ceiling)}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=12.0)
    ap.add_argument("--models", default="resnet50", help="comma-separated model aliases")
    ap.add_argument("--slos", default=None, help="SLOs as multiples of L0 (1.5,2,3)")
    ap.add_argument("--configs", default="auto,replication,one-session", help=f"of {CONFIGS}")
    ap.add_argument("--steps", type=int, default=5, help="bisection steps per configuration")
    ap.add_argument("--warmup-s", type=float, default=6.0)
    ap.add_argument("--shm", action="store_true", help="inputs in a shared memory region")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an `infscaler serve` option for every step (--serve-arg=--cpu-wake-latency-us=0)")  # fmt: skip
    ap.add_argument("--cap-mb", default=None,
                    help="serve under a memory cap: MB, or 'rule' (measured, per model)")  # fmt: skip

    def quick(a: Any) -> None:
        a.models, a.steps, a.warmup_s = a.models.split(",")[0], 2, 2.0
        a.slos = a.slos or "3"

    a = harness.cli.parse(ap, argv, quick)
    a.slos = a.slos or "1.5,2,3"
    if bad := set(a.configs.split(",")) - set(CONFIGS):
        ap.error(f"--configs: unknown {sorted(bad)}; choose from {','.join(CONFIGS)}")
    if a.cap_mb not in (None, "rule"):
        try:
            float(a.cap_mb)
        except ValueError:
            ap.error(f"--cap-mb: MB or 'rule', got {a.cap_mb!r}")
    res = harness.cli.start("scaling", a)
    for model in a.models.split(","):
        feeds = model_inputs(model)
        cal = calibrate(
            model, feeds, 8 if a.quick else MODEL_SETTINGS.get(model, {}).get("n_l0", 15)
        )
        res.summary.setdefault("calibration", {})[model] = cal
        print(f"== {model}: L0 {cal['l0_ms']} ms, ideal {cal['ideal_rps']}/s", flush=True)
        a.cap, a.sut_args = None, list(a.serve_arg)
        if a.cap_mb is not None:
            cap = measure_cap(model, feeds) if a.cap_mb == "rule" else {"cap_mb": float(a.cap_mb)}
            res.summary.setdefault("caps", {})[model] = cap
            dev = Path(tempfile.mkdtemp(prefix="isc-scaling-")) / "device.yaml"
            a.cap = cap["cap_mb"]
            a.sut_args += ["--device", str(harness.models.capped_device(a.cap, dev))]
            print(f"   memory cap {a.cap} MB: {cap}", flush=True)
        for slo_x in map(float, a.slos.split(",")):
            res.summary.setdefault("cells", []).append(run_cell(a, res, model, feeds, cal, slo_x))
    harness.cli.finish(res, a, plot)
    rows = [[c["model"], c["cap_mb"], c["slo_x"], *(c.get(f"{k}_rps") for k in CONFIGS),
             c["auto_vs_best"], c["ceiling_rps"]] for c in res.summary["cells"]]  # fmt: skip
    harness.print_table(["model", "cap MB", "SLO x", *CONFIGS, "auto/best", "ceiling"], rows)
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Each configuration's steps: P99 (failures as late) against the offered rate, one
    panel per model and SLO, the SLO as a line."""
    pts = [{**p, "cell": f"{p['model']} {p['slo_x']}x"} for p in data["points"]]
    harness.plot(pts, path, x="rate_rps", y="p99_all_ms", by="config", panel="cell",
                 hline_key="slo_ms", xlabel="Poisson rate, /s", ylabel="P99, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
