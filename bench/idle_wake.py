"""How much slower a model runs after the host sat idle: in-process against served
(issue 15: why the planner leaves ``EngineProfile.idle`` out by default).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``idle_wake.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import MODEL_SETTINGS, PIPELINE_CASES, hand_pipeline, model_inputs  # noqa: E402
from harness.scenarios import poisson_times  # noqa: E402

#: Idle-gap bins of the served requests, s (the first is the served base).
BINS_S = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 60.0)


def window(
    svc: Any, name: str, feeds: dict[str, np.ndarray], rate: float, n: int, warm_s: float
) -> list[dict[str, Any]]:
    """One window at ``rate`` requests/s through ``svc.submit`` (Poisson, seed 1, the
    first ``warm_s`` s unmeasured): per measured request answered, its compute start and
    end (s) and compute time (ms, summed over its units) from the request's trace."""
    times = poisson_times(rate, warm_s + 1.5 * n / rate + 10.0, seed=1)
    measured = [i for i, t in enumerate(times) if t >= warm_s][:n]
    futs: dict[int, Any] = {}
    t0 = time.perf_counter()
    for i, t in enumerate(times[: measured[-1] + 1]):
        while (left := t0 + t - time.perf_counter()) > 0:
            time.sleep(min(left, 0.05))
        try:
            futs[i] = svc.submit(name, feeds)
        except Exception:  # noqa: BLE001 - a 503 at admission: no compute to time
            continue
    rows = []
    for i in measured:
        try:
            trace = futs[i].result(timeout=60.0).trace
        except Exception:  # noqa: BLE001 - refused, failed or unanswered
            continue
        start, stop = int(trace[:, 2].min()), int(trace[:, 3].max())
        rows.append({"start_s": start / 1e9 - t0, "end_s": stop / 1e9 - t0,
                     "compute_ms": float((trace[:, 3] - trace[:, 2]).sum()) / 1e6})  # fmt: skip
    return rows


def served_bins(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per :data:`BINS_S` bin of the idle gap before a request's compute: requests,
    median compute ms, and that over the first bin's median (the factor).

    >>> rows = [{"start_s": s, "end_s": s + 0.01, "compute_ms": c}
    ...         for s, c in [(0.0, 10), (0.02, 10), (0.5, 20)]]
    >>> [(b["requests"], b["factor"]) for b in served_bins(rows)]
    [(1, 1.0), (0, None), (0, None), (0, None), (1, 2.0), (0, None)]
    """
    done = sorted((r for r in rows if "start_s" in r), key=lambda r: r["start_s"])
    gaps = np.array([b["start_s"] - a["end_s"] for a, b in zip(done, done[1:], strict=False)])
    comp = np.array([b["compute_ms"] for b in done[1:]])
    out, base = [], None
    for lo, hi in zip(BINS_S, BINS_S[1:], strict=False):
        m = (gaps >= lo) & (gaps < hi)
        med = float(np.median(comp[m])) if m.any() else None
        if base is None:
            base = med
        out.append({"gap_s": [lo, hi], "requests": int(m.sum()),
                    "compute_p50_ms": None if med is None else round(med, 2),
                    "compute_p90_ms": round(float(np.percentile(comp[m], 90)), 2) if m.any() else None,
                    "factor": None if med is None or not base else round(med / base, 3)})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="resnet50", choices=sorted(MODEL_SETTINGS))
    ap.add_argument("--threads", default="1,2", help="in-process thread counts")
    ap.add_argument("--gaps", default="0.05,0.1,0.25,0.5", help="in-process idle gaps, s")
    ap.add_argument("--repeats", type=int, default=10, help="in-process runs per gap")
    ap.add_argument("--rates", default="4,10", help="served Poisson rates, requests/s")
    ap.add_argument("--requests", type=int, default=400, help="measured per served rate")

    def quick(a: Any) -> None:
        a.threads, a.gaps, a.repeats, a.rates, a.requests = "2", "0.1,0.5", 3, "4", 40

    a = harness.cli.parse(ap, argv, quick)
    if a.model in PIPELINE_CASES:
        ap.error("choose a model, not a pipeline case")
    from infscaler.base.models import resolve_model
    from infscaler.partitioner import profiler
    from infscaler.service.service import Service

    res = harness.cli.start("idle_wake", a)
    threads = sorted({int(t) for t in a.threads.split(",")})
    feeds = model_inputs(a.model)
    for t in threads:
        pts = profiler.measure_idle(resolve_model(a.model), feeds, threads=t,
                                    gaps_s=tuple(map(float, a.gaps.split(","))), repeats=a.repeats)  # fmt: skip
        for g, f in pts:
            res.add(kind="in-process", series=f"in-process {t} thread(s)", gap_s=g,
                    factor=round(f, 3))  # fmt: skip
        print(f"in-process {t} thread(s): " + ", ".join(f"{g:g} s {f:.2f}x" for g, f in pts))
    with Service(state_dir=Path("/tmp/isc-idle-wake-state"), pool_mb=256) as svc:
        for rate in map(float, a.rates.split(",")):
            name = f"idle-{int(rate * 10)}"
            svc.deploy(hand_pipeline(a.model, name, threads[-1], 1, None))
            time.sleep(2.0)
            rows = window(svc, name, feeds, rate, a.requests, 5.0)
            svc.undeploy(name)
            for b in served_bins(rows):
                mid = float(np.mean(b["gap_s"])) if b["gap_s"][1] < 10 else 1.0
                res.add(kind="served", series=f"served {threads[-1]} threads {rate:g}/s",
                        gap_s=mid, **{k: v for k, v in b.items() if k != "gap_s"}, bin_s=b["gap_s"])  # fmt: skip
    res.summary["served_threads"] = threads[-1]
    harness.cli.finish(res, a, plot)
    harness.print_table(["series", "idle gap s", "requests", "compute P50 ms", "factor"],
                        [[p["series"], p.get("bin_s", p["gap_s"]), p.get("requests"),
                          p.get("compute_p50_ms"), p["factor"]] for p in res.points])  # fmt: skip
    return 0


def plot(data: dict[str, Any], png: Path) -> None:
    """Median time after idle / back-to-back median against the idle gap: in-process per
    thread count, served per rate (bin centre; > 0.8 s drawn at 1 s)."""
    harness.plot(data["points"], png, x="gap_s", y="factor", by="series", hlines={"1x": 1.0},
                 xlabel="idle gap before the run, s", ylabel="slowdown after idle")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
