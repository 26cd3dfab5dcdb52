"""What one more instance costs, before and after the fork server (issue 14).

(a) the idle PSS / USS of ``--instances`` instances serving a one-operator model,
spawned (a fresh interpreter) and forked from the zygote; (b) ``Supervisor.start`` to
ready for a ResNet-50 partition, ``--starts`` times each way. PSS, not USS, is the
figure: forked instances share the zygote's pages. Target (a): <= 15 MB PSS forked.
More: bench/HISTORY.md, "Instance overhead".
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

WAYS = ("spawned", "forked")


def relu_model(path: Path) -> Path:
    """The one-operator model: y = Relu(x), x FP32 [1, 4]."""
    from onnx import helper

    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    return harness.models.save_model(path, [relu], {"x": [1, 4]}, {"y": [1, 4]}, name="relu")


def _mem(pid: int) -> dict[str, float]:
    from infscaler.runtime.scaling.telemetry import process_memory

    m = process_memory(pid)
    return {"pss_mb": m.pss_mb or 0.0, "uss_mb": m.uss_mb, "rss_mb": m.rss_mb}


def _summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for k in ("pss_mb", "uss_mb", "rss_mb"):
        vals = [r[k] for r in rows]
        out[k] = [round(v, 2) for v in vals]
        out[f"mean_{k}"] = round(float(np.mean(vals)), 2)
    return out


def idle_memory(way: str, n: int, work: Path) -> dict[str, Any]:
    """(a) for one way: a fresh service, ``n`` instances of the Relu model, idle."""
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service

    os.environ["INFSCALER_ZYGOTE"] = "0" if way == "spawned" else "1"
    state = work / f"mem-{way}"
    state.mkdir()
    model = relu_model(state / "relu.onnx")
    raw = {"name": "relu", "stages": [{"name": "relu", "model": str(model), "instances": n}]}
    with Service(state_dir=state, control_path="userspace", pool_mb=64) as svc:
        t0 = time.perf_counter()
        svc.deploy(load_pipeline(raw))
        deploy_s = time.perf_counter() - t0
        x = np.array([[-1, 0, 1, 2]], np.float32)
        np.testing.assert_allclose(svc.infer("relu", {"x": x}).outputs["y"], np.maximum(x, 0))
        time.sleep(2.0)
        handles = svc.supervisor.handles()
        got = svc.supervisor.started_by[way]
        if got != n:
            raise RuntimeError(f"{way}: {got} of {n} instances started that way")
        rows = [_mem(h.pid) for h in handles]
        zy = svc.supervisor.zygote.pid if svc.supervisor.zygote is not None else None
        out = _summary(rows)
        out["deploy_s"] = round(deploy_s, 2)
        out["zygote"] = {k: round(v, 2) for k, v in _mem(zy).items()} if zy else None
        out["total_pss_mb"] = round(
            sum(r["pss_mb"] for r in rows) + (out["zygote"]["pss_mb"] if zy else 0.0), 2
        )
    os.environ.pop("INFSCALER_ZYGOTE", None)
    return out


def startup_times(starts: int, work: Path) -> dict[str, Any]:
    """(b): one service with its zygote, ResNet-50 in K=2; ``starts`` starts of partition
    0 per way, interleaved."""
    from infscaler.base.config import load_pipeline, pipeline_for_model
    from infscaler.base.models import MODELS
    from infscaler.runtime.processes.zygote import ForkedProcess
    from infscaler.service.service import Service

    os.environ["INFSCALER_ZYGOTE"] = "1"
    cfg = pipeline_for_model(
        "resnet50", name="r50", partitions=2, shapes=MODELS["resnet50"].shapes
    ).model_dump(exclude_none=True)
    cfg["stages"][0]["max_instances"] = 4
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    fell_back = 0
    with Service(state_dir=work / "r50", control_path="userspace", pool_mb=256) as svc:
        t0 = time.perf_counter()
        dep = svc.deploy(load_pipeline(cfg))
        deploy_s = time.perf_counter() - t0
        u = dep.pipeline.units[0]
        sid = dep.route.stage_ids[0]
        nxt = dep.pipeline.next_unit(0)
        next_stage = 0 if nxt is None else dep.route.stage_ids[nxt]
        for i in range(starts * 2):
            way = WAYS[i % 2]
            cores = svc._cores(u.threads)
            t = time.perf_counter()
            h = svc.supervisor.start(
                (dep.name, 0), u, sid, next_stage, cores, spawn=way == "spawned"
            )
            svc.supervisor.wait_ready([h], 300)
            ms = (time.perf_counter() - t) * 1e3
            if way == "forked" and not isinstance(h.proc, ForkedProcess):
                fell_back += 1  # the zygote was down: not a forked start
            else:
                times[way].append(ms)
            svc.supervisor.stop(h)
    os.environ.pop("INFSCALER_ZYGOTE", None)
    out: dict[str, Any] = {
        "model": "resnet50 (onnx wheel's light model, random weights)",
        "partitions": 2,
        "unit": u.name,
        "deploy_s": round(deploy_s, 2),
        "forked_fell_back": fell_back,
    }
    for w in WAYS:
        v = np.array(times[w])
        out[w] = {
            "ms": [round(float(x), 1) for x in v],
            **harness.percentiles(v, qs=(50, 90), digits=1, extra=("mean",)),
        }
    out["p50_ratio_spawned_over_forked"] = round(
        out["spawned"]["p50_ms"] / out["forked"]["p50_ms"], 2
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("--instances", type=int, default=8, help="idle instances per way")
    ap.add_argument("--starts", type=int, default=20, help="starts per way (>= 20)")

    def quick(a: Any) -> None:
        a.instances, a.starts = 4, 6

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("instance_overhead", a)
    with tempfile.TemporaryDirectory(prefix="isc-overhead-") as tmp:
        mem = {w: idle_memory(w, a.instances, Path(tmp)) for w in WAYS}
        st = startup_times(a.starts, Path(tmp))
    for w in WAYS:
        res.add(way=w, **{f"idle_{k}": v for k, v in mem[w].items()},
                **{f"start_{k}": v for k, v in st[w].items()})  # fmt: skip
    res.summary.update(
        startup={k: v for k, v in st.items() if k not in WAYS},
        pss_ratio_spawned_over_forked=round(
            mem["spawned"]["mean_pss_mb"] / mem["forked"]["mean_pss_mb"], 2
        ),
        p50_ratio_spawned_over_forked=st["p50_ratio_spawned_over_forked"],
    )
    harness.cli.finish(res, a, plot)
    harness.print_table(["way", "instances", "PSS MB", "USS MB", "start P50 ms", "start P90 ms"],
                        [[p["way"], p["idle_n"], p["idle_mean_pss_mb"], p["idle_mean_uss_mb"],
                          p["start_p50_ms"], p["start_p90_ms"]] for p in res.points])  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Idle PSS / USS per instance (MB) and start-to-ready P50 / P90 (ms), spawned (0) and
    forked (1), with the 15 MB target."""
    mb, ms = ("idle_mean_pss_mb", "idle_mean_uss_mb"), ("start_p50_ms", "start_p90_ms")
    pts = [{"panel": unit, "i": WAYS.index(p["way"]), **{k: p[k] for k in keys}}
           for p in data["points"] for unit, keys in (("MB", mb), ("ms", ms))]  # fmt: skip
    harness.plot(pts, path, x="i", y=[*mb, *ms], panel="panel", hlines={"15 MB": 15.0},
                 xlabel="0: spawned, 1: forked", ylabel="MB per idle instance; ms to ready")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
