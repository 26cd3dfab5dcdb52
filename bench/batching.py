"""Dynamic batching on vs off, per model, at closed-loop concurrency 1, 4 and 8: CPU ms
per item (the fair measure on a shared host), items/s and client latency.

Models: SqueezeNet 1.0 and ShuffleNet (light models from the onnx wheel's
``backend/test/data/light``, random initializers: ``infscaler.base.models``) and ResNet-50,
each with axis 0 made a dynamic batch dim (:func:`batchable`; outputs checked equal to
batch-1 runs). Per model, one service in this process serves three one-stage pipelines,
one instance each at 1 thread: ``off`` (no batching), ``on`` (``batching: {max_batch: 8,
max_delay_ms: 20, policy: fixed}``: always batching) and ``auto`` (the same with the
default policy, ``mark``: the autoscaler decides from the T_b the instance measured at
load, ``batching.decide_batching``; the bench waits for that decision). Per concurrency
c, the three run back to back, each ``c`` client threads submitting (``Service.submit``)
and waiting, for ``--seconds`` after a warm-up. CPU per item: the instance's, and that
plus the service process's (front end and client threads, alike in every arm), over the
items answered. Ratios are against ``off`` within the same run.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import ForeignLoad, process_cpu_seconds  # noqa: E402

MODELS = {"squeezenet": "SqueezeNet 1.0", "shufflenet": "ShuffleNet", "resnet50": "ResNet-50"}
CONCURRENCY = (1, 4, 8)
MAX_BATCH = 8
#: arm -> its batching policy (None: no batching)
ARMS: dict[str, str | None] = {"off": None, "on": "fixed", "auto": "mark"}


def batchable(src: Path, dst: Path) -> Path:
    """``src`` with axis 0 of every graph input and output a dynamic dim ``N``: shapes
    inferred for batch 1 dropped, and a leading 1 of a constant ``Reshape`` target made 0
    (ONNX: copy that dim from the input). Checked: batch 4 equals four batch-1 runs.

    Raises:
        AssertionError: the batched outputs differ from the batch-1 ones.
    """
    import onnx
    from onnx import numpy_helper

    from infscaler.engines.onnxrt.loader import load_session

    m = onnx.load(str(src))
    inits = {i.name: i for i in m.graph.initializer}
    for v in [*m.graph.input, *m.graph.output]:
        if v.name not in inits:
            d = v.type.tensor_type.shape.dim[0]
            d.ClearField("dim_value")
            d.dim_param = "N"
    del m.graph.value_info[:]
    for n in m.graph.node:
        if n.op_type == "Reshape" and n.input[1] in inits:
            a = numpy_helper.to_array(inits[n.input[1]]).copy()
            if a.size and a[0] == 1:
                a[0] = 0
                inits[n.input[1]].CopyFrom(numpy_helper.from_array(a, n.input[1]))
    onnx.save(m, str(dst))
    one = load_session(src, threads=None)
    many = load_session(dst, threads=None)
    name = one.get_inputs()[0].name
    shape = [1, *one.get_inputs()[0].shape[1:]]
    x = np.random.default_rng(0).standard_normal([4, *shape[1:]]).astype(np.float32)
    want = np.concatenate([one.run(None, {name: x[i : i + 1]})[0] for i in range(4)])
    np.testing.assert_allclose(many.run(None, {name: x})[0], want, rtol=1e-4, atol=1e-5)
    return dst


def closed_loop(svc: Any, name: str, x: dict, clients: int, seconds: float) -> dict:
    """``clients`` threads submitting the inputs ``x`` to ``name`` and waiting, for ``seconds``;
    returns answered, wall s, latencies ms (the service's CPU is read by the caller)."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            svc.submit(name, x).result(timeout=300)
            with lock:
                lat.append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"answered": len(lat), "wall_s": time.monotonic() - t0, "lat": lat}


def point(svc: Any, name: str, x: dict, c: int, seconds: float) -> dict[str, Any]:
    """One measured point: warm-up, then ``seconds`` of closed loop at concurrency ``c``."""
    from infscaler.api.common import exec_counts

    (h,) = [h for h in svc.supervisor.handles() if h.key[0] == name]
    closed_loop(svc, name, x, c, min(1.0, seconds / 3))  # warm-up (and batches forming)
    dep = svc.deployment(name)
    before = exec_counts(svc, dep)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    inst0 = process_cpu_seconds([h.pid])
    fl = ForeignLoad(lambda: process_cpu_seconds([os.getpid(), h.pid]))
    got = closed_loop(svc, name, x, c, seconds)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    other = fl.cores()
    inst = process_cpu_seconds([h.pid]) - inst0
    own = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    time.sleep(0.3)  # the instance's idle report
    ran = exec_counts(svc, dep).plus(before, -1)
    n = max(1, got["answered"])
    lat = np.array(got["lat"] or [float("nan")])
    return {
        "answered": got["answered"],
        "items_per_s": round(got["answered"] / got["wall_s"], 3),
        "cpu_ms_per_item": round((own + inst) * 1e3 / n, 3),
        "instance_cpu_ms_per_item": round(inst * 1e3 / n, 3),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "executions": ran.executions,
        "mean_batch": None if ran.mean_batch is None else round(ran.mean_batch, 2),
        "other_processes_cores": other,
    }


def bench_model(alias: str, tmp: Path, seconds: float, concurrency: tuple[int, ...]) -> dict:
    """Both arms of one model at every concurrency (see the module docstring)."""
    from infscaler.base.config import load_pipeline
    from infscaler.base.models import resolve_model
    from infscaler.service.service import Service

    path = batchable(resolve_model(alias), tmp / f"{alias}_batch.onnx")
    with Service(state_dir=tmp / f"s-{alias}", control_path="userspace", pool_mb=256) as svc:
        for arm, policy in ARMS.items():
            stage: dict[str, Any] = {"name": "m", "model": str(path), "threads": 1}
            if policy is not None:
                stage["batching"] = {"max_batch": MAX_BATCH, "max_delay_ms": 20, "policy": policy}
            svc.deploy(load_pipeline({"name": arm, "stages": [stage]}))
        (h,) = [h for h in svc.supervisor.handles() if h.key[0] == "auto"]
        inp = svc.deployment("off").pipeline.units[0].inputs[0]
        x = {inp: np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)}
        deadline = time.monotonic() + 30
        while ("auto", 0) not in svc.autoscaler.batch_decisions and time.monotonic() < deadline:
            time.sleep(0.2)
        decision = svc.autoscaler.batch_decisions.get(("auto", 0))
        rows = []
        for c in concurrency:
            row: dict[str, Any] = {"concurrency": c}
            for arm in ARMS:
                row[arm] = point(svc, arm, x, c, seconds)
                print(f"{alias} c={c} {arm}: {row[arm]}", flush=True)
            for arm in ("on", "auto"):
                row[f"{arm}_vs_off"] = {
                    k: round(row[arm][k] / row["off"][k], 3)
                    for k in ("instance_cpu_ms_per_item", "cpu_ms_per_item", "items_per_s")
                }
            rows.append(row)
    return {
        "model": MODELS[alias],
        "input": inp,
        "batch_ms_measured_at_load": h.info.get("batch_ms"),
        "decision": None if decision is None else decision.reason,
        "decided_on": None if decision is None else decision.on,
        "points": rows,
    }


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = harness.cli.parser(__doc__, duration_s=10.0)
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {','.join(MODELS)}")

    def quick(a: Any) -> None:
        a.models, a.duration_s = "squeezenet,resnet50", 3.0

    a = harness.cli.parse(ap, argv, quick)
    if bad := [m for m in a.models.split(",") if m not in MODELS]:
        ap.error(f"unknown model(s) {bad}: choose from {list(MODELS)}")
    res = harness.cli.start("batching", a)
    res.summary.update(concurrency=CONCURRENCY, max_batch=MAX_BATCH, decisions={})
    with tempfile.TemporaryDirectory(prefix="isc-batching-") as tmp:
        for alias in a.models.split(","):
            r = bench_model(alias, Path(tmp), a.duration_s, CONCURRENCY)
            res.summary["decisions"][alias] = r["decision"]
            for p in r["points"]:
                res.add(model=alias, **p, cpu_on_vs_off=p["on_vs_off"]["instance_cpu_ms_per_item"],
                        items_on_vs_off=p["on_vs_off"]["items_per_s"])  # fmt: skip
    harness.cli.finish(res, a, plot)
    harness.print_table(
        ["model", "c", "inst ms/item off", "on", "auto", "on/off", "items/s on/off", "batch on"],
        [[p["model"], p["concurrency"], p["off"]["instance_cpu_ms_per_item"],
          p["on"]["instance_cpu_ms_per_item"], p["auto"]["instance_cpu_ms_per_item"],
          p["cpu_on_vs_off"], p["items_on_vs_off"], p["on"]["mean_batch"]] for p in res.points],
    )  # fmt: skip
    for m, d in res.summary["decisions"].items():
        print(f"{m}: {d}")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Instance CPU per item and items/s, on / off, against the concurrency, per model
    (< 1 CPU: batching pays)."""
    harness.plot(data["points"], path, x="concurrency", y=["cpu_on_vs_off", "items_on_vs_off"],
                 by="model", hlines={"off": 1.0}, ylabel="on / off")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
