"""The cpu cap that counts demand against the one that counts pinned threads, on a
3-partition model with one heavy partition under closed-loop load.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``demand_cap.py``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness.host import ForeignLoad, TreeCpu  # noqa: E402

HEAVY = "m/1"  # the heavy partition's unit name
RELUS = 10  # cheap steps on each side of the heavy convolution


def k3_model(path: Path, size: int = 128) -> Path:
    """Write the 3-convolution chain (the method) to ``path``: input ``x`` FP32
    ``[1, 8, size, size]``, output ``y`` FP32 ``[1, 8, size, size]``."""
    from onnx import helper

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def conv(src: str, wt: str, out: str, name: str, k: int = 3) -> Any:
        pad = [k // 2] * 4
        return helper.make_node("Conv", [src, wt], [out], name=name, pads=pad)

    def relus(src: str, tag: str, n: int) -> list[Any]:
        # cheap elementwise steps: they lower the mean operator cost, so the two light
        # convolutions are representative operators too (Eq. 1 needs one per partition)
        names = [src] + [f"{tag}{i}" for i in range(n)]
        return [
            helper.make_node("Relu", [names[i]], [names[i + 1]], name=names[i + 1])
            for i in range(n)
        ]

    nodes = [
        conv("x", "w1", "c1", "light_in"),
        *relus("c1", "a", RELUS),
        conv(f"a{RELUS - 1}", "w2", "c2", "heavy", k=9),
        *relus("c2", "b", RELUS),
        conv(f"b{RELUS - 1}", "w3", "y", "light_out"),
    ]
    inits = {"w1": w(16, 8, 3, 3), "w2": w(16, 16, 9, 9), "w3": w(8, 16, 3, 3)}
    shape = [1, 8, size, size]
    return harness.models.save_model(path, nodes, {"x": shape}, {"y": shape}, inits, "k3")


def whole_ms(path: Path, size: int, n: int = 20) -> float:
    """Median latency of the whole model on one single-thread session, ms."""
    from infscaler.engines.onnxrt.loader import load_session

    x = {"x": np.ones((1, 8, size, size), np.float32)}
    return harness.models.median_ms(load_session(path, threads=1), x, n, warmup=1)


def pipeline(model: Path, slo_ms: float, size: int) -> dict[str, Any]:
    """The pipeline ``k3``: ``model`` in 3 partitions, one instance each (2 at most)."""
    return {
        "name": "k3",
        "slo": f"{slo_ms:.0f}ms",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8, size, size]}],
        "outputs": ["y"],
        "stages": [
            {
                "name": "m",
                "model": str(model),
                "partitions": 3,
                "instances": 1,
                "max_instances": 2,
                "threads": 1,
                "inputs": {"x": "x"},
                "outputs": {"y": "y"},
            }
        ],
        "autoscale": {
            "interval_s": 0.5,
            "window_s": 2.0,
            "cooldown_s": 1.0,
            "hold_s": 600.0,  # no scale-in within a run: the trial's revert is the only one
            "settle_s": 1.0,
            "sustain_s": 1.0,
        },
    }


def heavy_instances(svc: Any) -> int:
    st = svc.pipeline_status(svc.deployment("k3"))
    return next(len(u["instances"]) for u in st["units"] if u["unit"] == HEAVY)


def look(svc: Any) -> dict[str, Any]:
    """The heavy partition's instances, and what the scaler read at its last look: the
    demand (cores busy, all instances), each unit's busy cores, the served rate."""
    out: dict[str, Any] = {"heavy": heavy_instances(svc)}
    view = svc.autoscaler._views.get("k3")  # the last snapshot the scaler decided on
    if view is not None:
        s = view.snapshot
        out["cores_demand"] = None if s.cores_demand is None else round(s.cores_demand, 3)
        out["busy"] = {u.name: None if u.busy is None else round(u.busy, 3) for u in s.units}
        out["served_rps"] = None if s.served_rate is None else round(s.served_rate, 2)
        out["cores_busy"] = None if s.cores_busy is None else round(s.cores_busy, 3)
    st = svc.autoscaler.state("k3")
    if st is not None and st.waiting:
        out["waiting"] = st.waiting
    return out


def run_arm(
    cap: str, model: Path, slo_ms: float, size: int, clients: int, seconds: float, tmp: Path
) -> dict[str, Any]:
    """One arm on a fresh service (see the method)."""
    from infscaler.base.config import load_pipeline
    from infscaler.runtime.serving.frontend import RequestError
    from infscaler.service.service import Service

    os.environ["INFSCALER_CORE_CAP"] = cap
    answered, refused, errors = [0], [0], []
    x = np.ones((1, 8, size, size), np.float32)
    demand: list[dict[str, Any]] = []
    with Service(state_dir=tmp / cap, control_path="userspace", pool_mb=128) as svc:
        svc.deploy(load_pipeline(pipeline(model, slo_ms, size)))
        svc.infer("k3", {"x": x}, timeout_s=60)  # warm
        # this process and its instances, the tree read anew (instances started or
        # swapped during the arm count: a fixed pid list missed them)
        tree = TreeCpu(os.getpid(), [os.getpid()])
        fl = ForeignLoad(lambda: sum(tree.total()))
        stop = time.monotonic() + seconds
        peak = [1]

        def client() -> None:
            while time.monotonic() < stop:
                try:
                    svc.infer("k3", {"x": x}, timeout_s=30)
                    answered[0] += 1
                except RequestError as exc:
                    if exc.status == 503 and str(exc):
                        # refused with a reason (at arrival for the SLO, or shed at the
                        # cap): retried after its Retry-After (a shed has none: 10 ms)
                        refused[0] += 1
                        time.sleep(exc.retry_after_s or 0.01)
                        continue
                    errors.append(str(exc))
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while time.monotonic() < stop:
            time.sleep(1.0)
            peak[0] = max(peak[0], heavy_instances(svc))
            demand.append({"t_s": round(time.monotonic() - t0, 1)} | look(svc))
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        other = fl.cores()
        cpu = sum(tree.stop())
        decisions = [
            {k: d.get(k) for k in ("action", "unit", "reason")}
            | {"t_s": round(d["time"] - (time.time() - (time.monotonic() - t0)), 1)}
            for d in svc.autoscaler.decisions("k3")
        ]
    return {
        "cap": cap,
        "seconds": round(wall, 1),
        "answered": answered[0],
        "answered_per_s": round(answered[0] / wall, 2),
        "refused": refused[0],
        "refused_per_s": round(refused[0] / wall, 2),
        "errors": len(errors),
        "error_samples": errors[:3],
        "heavy_peak_instances": peak[0],
        "cpu_s_per_answered": round(cpu / answered[0], 4) if answered[0] else None,
        "other_processes_cores": other,
        "decisions": decisions,
        "timeline": demand,
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=60.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--size", type=int, default=128, help="the feature map's side")
    ap.add_argument("--slo-x", type=float, default=2.0, help="SLO / the whole model's L0")

    def quick(a: Any) -> None:
        a.duration_s = 20.0

    a = harness.cli.parse(ap, argv, quick)
    if a.clients < 1 or a.size < 8 or a.slo_x <= 0:
        ap.error("need --clients >= 1, --size >= 8 and --slo-x > 0")
    res = harness.cli.start("demand_cap", a)
    with tempfile.TemporaryDirectory() as d:
        model = k3_model(Path(d) / "k3.onnx", a.size)
        l0 = whole_ms(model, a.size)
        for cap in ("threads", "demand"):
            res.add(**run_arm(cap, model, a.slo_x * l0, a.size, a.clients, a.duration_s, Path(d)))
    base, new = res.points

    def ratio(k: str) -> float | None:
        return round(new[k] / base[k], 3) if base[k] else None

    res.summary.update(whole_l0_ms=round(l0, 2), slo_ms=round(a.slo_x * l0, 1),
                       ratios_demand_over_threads={k: ratio(k) for k in ("answered_per_s", "refused_per_s")})  # fmt: skip
    harness.cli.finish(res, a, plot)
    harness.print_table(
        ["cap", "answered/s", "refused/s", "errors", f"{HEAVY} peak", "CPU s/req", "other cores"],
        [[x["cap"], x["answered_per_s"], x["refused_per_s"], x["errors"],
          x["heavy_peak_instances"], x["cpu_s_per_answered"], x["other_processes_cores"]]
         for x in res.points],
    )  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """The heavy partition's instances over time, one line per cap."""
    pts = [{"cap": arm["cap"], **r} for arm in data["points"] for r in arm["timeline"]]
    harness.plot(pts, path, x="t_s", y="heavy", by="cap", xlabel="s",
                 ylabel=f"{HEAVY} instances")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
