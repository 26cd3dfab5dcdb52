"""The runtime against NVIDIA Triton on the same cores, driven by the same clients.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``vs_triton.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.cli import RESULTS_DIR  # noqa: E402
from harness.host import (  # noqa: E402
    ForeignLoad,
    TreeCpu,
    busy_cpu_seconds,
    default_cache_dir,
    environment,
    process_cpu_seconds,
    wait_for_quiet,
)
from harness.models import median_ms  # noqa: E402
from harness.result import write_json  # noqa: E402

PEER = Path(__file__).resolve().parent / "peers" / "pytriton_peer.py"
REPO = Path(__file__).resolve().parent.parent
INFSCALER = Path(sys.executable).parent / "infscaler"
MAX_BATCH = 8


# --- models ------------------------------------------------------------------------------
@dataclass
class Model:
    alias: str
    path: Path
    input: str
    output: str
    shape: list[int]  # one request's shape, batch 1
    l0_ms: float = 0.0


def with_batch_dim(src: Path, dst: Path) -> Path:
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


def batchable(alias: str, out_dir: Path) -> Model:
    """The bundled model ``alias`` with a dynamic leading (batch) dim on its inputs and
    outputs (:func:`with_batch_dim`, checked against batch-1 runs; a model whose first
    input's leading dim is already dynamic, as PP-OCRv4 det's ``x: [N, 3, H, W]``, is
    copied as it is), saved as ``out_dir/alias/model.onnx``: the same file, served as
    ``model``, for every server. One request's shape: the input's static dims, a dynamic
    spatial dim 640 (PP-OCR det: 1x3x640x640, the 4.9 MB input of bench/arbitration.py)."""
    import onnx

    from infscaler.base.models import resolve_model

    (out_dir / alias).mkdir(exist_ok=True)
    src, dst = resolve_model(alias), out_dir / alias / "model.onnx"
    g = onnx.load(str(src), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    lead = next(i for i in g.input if i.name not in inits).type.tensor_type.shape.dim[0]
    path = Path(shutil.copyfile(src, dst)) if lead.dim_param else with_batch_dim(src, dst)
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    first = next(i for i in g.input if i.name not in inits)
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim[1:]]
    if not all(dims):  # PP-OCR det: its spatial dims are dynamic too
        dims = [3, 640, 640]
    return Model(alias, path, first.name, g.output[0].name, [1, *dims])


def single_thread_ms(model: Model, x: np.ndarray, n: int = 20) -> float:
    from infscaler.engines.onnxrt.loader import load_session

    return median_ms(load_session(model.path, threads=1), {model.input: x}, n)


# --- systems under test ---------------------------------------------------------------------
@dataclass
class Sut:
    """One server configuration. ``kind``: triton | ours; ``instances`` x ``threads``;
    ``batch``: dynamic batching (max batch 8); ``auto``: ours with --slo --autoscale."""

    name: str
    kind: str
    instances: int = 1
    threads: int = 1
    batch: bool = False
    auto: bool = False
    env: dict[str, str] = field(default_factory=dict)  # extra environment of ``serve``
    exe: Path = INFSCALER  # the ``infscaler`` that serves ours
    proc: subprocess.Popen | None = None
    server_pids: list[int] = field(default_factory=list)  # Triton: tritonserver
    grpc_url: str = ""
    http: dict[str, str] = field(default_factory=dict)
    tmp: str = ""

    def start(self, model: Model, slo_ms: float, peer_python: str, state_dir: Path) -> None:
        self.tmp = tempfile.mkdtemp(prefix="vs-triton-")
        if self.kind == "triton":
            self._start_triton(model, peer_python)
        else:
            self._start_ours(model, slo_ms, state_dir)

    def _start_triton(self, model: Model, peer_python: str) -> None:
        cmd = [peer_python, str(PEER), str(model.path), "--name", "model"]
        cmd += ["--instances", str(self.instances), "--threads", str(self.threads)]
        cmd += ["--max-batch", str(MAX_BATCH if self.batch else 0)]
        log = open(Path(self.tmp) / "peer.log", "w")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # tritonserver logs to this stdout too
            if line.startswith("READY"):
                break
        else:
            raise RuntimeError(f"{self.name}: Triton did not start: {log.name}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain it
        import psutil

        kids = psutil.Process(self.proc.pid).children(recursive=True)
        self.server_pids = [p.pid for p in kids if p.name().startswith("tritonserver")]
        self.grpc_url = "127.0.0.1:18001"
        self.http = {"base": "http://127.0.0.1:18000"}

    def _start_ours(self, model: Model, slo_ms: float, state_dir: Path) -> None:
        sock, gsock = f"{self.tmp}/isc.sock", f"{self.tmp}/isc-grpc.sock"
        cmd = [str(self.exe), "serve", "-v", "--socket", sock, "--grpc-socket", gsock]
        cmd += ["--state-dir", str(state_dir / model.alias)]
        if self.auto:
            shapes = f"{model.input}:{'x'.join(map(str, model.shape))}"
            cmd += [str(model.path), "--shapes", shapes, "--slo", f"{slo_ms:.0f}ms", "--autoscale"]
        else:
            cmd += [str(self._pipeline_yaml(model))]
        log = open(Path(self.tmp) / "serve.log", "w")  # noqa: SIM115 - closed with the process
        env = {**os.environ, **self.env}
        if self.exe != INFSCALER:  # another tree's install: its own code, not ours
            env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp, env=env
        )
        import httpx

        deadline = time.monotonic() + 600
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=5) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name}: serve exited (see {log.name})")
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("http://isc/v2/models/model/ready").status_code == 200:
                        break
                time.sleep(0.5)
            else:
                raise RuntimeError(f"{self.name}: not ready in 600 s (see {log.name})")
        self.server_pids = [self.proc.pid]
        self.grpc_url = f"unix:{gsock}"
        self.http = {"uds": sock, "base": "http://isc"}

    def _pipeline_yaml(self, model: Model) -> Path:
        import yaml

        stage: dict[str, Any] = {
            "name": "model",
            "model": str(model.path),
            "inputs": {model.input: model.input},
            "outputs": {model.output: model.output},
            "instances": self.instances,
            "threads": self.threads,
        }
        if self.batch:
            stage["batching"] = {"max_batch": MAX_BATCH, "max_delay_ms": 0, "policy": "fixed"}
        doc = {
            "name": "model",
            "inputs": [{"name": model.input, "datatype": "FP32", "shape": [-1, *model.shape[1:]]}],
            "outputs": [model.output],
            "stages": [stage],
        }
        path = Path(self.tmp) / "pipeline.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def planned(self) -> list[str]:
        """Ours: the planner's choice as its deploy printed it (``chosen ...`` lines)."""
        log = Path(self.tmp) / "serve.log"
        if self.kind != "ours" or not log.exists():
            return []
        return [ln.strip() for ln in log.read_text().splitlines() if ": chosen " in ln]

    def stop(self, keep_logs: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep_logs:
            shutil.rmtree(self.tmp, ignore_errors=True)


# --- clients ----------------------------------------------------------------------------------
class GrpcClient:
    """tritonclient.grpc, one connection per client thread (keep-alive)."""

    def __init__(self, sut: Sut, model: Model, x: np.ndarray, name: str = "model") -> None:
        import tritonclient.grpc as grpcclient

        self._name = name
        self._c = grpcclient.InferenceServerClient(sut.grpc_url)
        self._in = grpcclient.InferInput(model.input, list(x.shape), "FP32")
        self._in.set_data_from_numpy(x)
        self._out = [grpcclient.InferRequestedOutput(model.output)]

    def infer(self) -> str | None:
        from tritonclient.utils import InferenceServerException

        try:
            self._c.infer(self._name, [self._in], outputs=self._out)
            return None
        except InferenceServerException as exc:
            return str(exc.status() or "error")

    def close(self) -> None:
        self._c.close()


class HttpClient:
    """httpx with the v2 binary tensor extension (Triton's and ours), keep-alive."""

    def __init__(self, sut: Sut, model: Model, x: np.ndarray, name: str = "model") -> None:
        import httpx

        self._path = f"/v2/models/{name}/infer"
        transport = httpx.HTTPTransport(uds=sut.http["uds"]) if "uds" in sut.http else None
        self._c = httpx.Client(base_url=sut.http["base"], transport=transport, timeout=60)
        raw = np.ascontiguousarray(x).tobytes()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": model.input,
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "outputs": [{"name": model.output, "parameters": {"binary_data": True}}],
            }
        ).encode()
        self._body = header + raw
        self._headers = {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        }

    def infer(self) -> str | None:
        import httpx

        try:
            r = self._c.post(self._path, content=self._body, headers=self._headers)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return None if r.status_code == 200 else str(r.status_code)

    def close(self) -> None:
        self._c.close()


CLIENTS = {"grpc": GrpcClient, "http": HttpClient}


def _summary(lat_ms: list[float], refusals: dict[str, int], wall: float, slo_ms: float) -> dict:
    a = np.asarray(lat_ms)
    return {
        "answered": int(a.size),
        "throughput_rps": round(a.size / wall, 2),
        "goodput_rps": round(float((a <= slo_ms).sum()) / wall, 2),
        "p50_ms": round(float(np.percentile(a, 50)), 1) if a.size else None,
        "p99_ms": round(float(np.percentile(a, 99)), 1) if a.size else None,
        "refused": sum(refusals.values()),
        "refused_by": refusals,
        "wall_s": round(wall, 2),
    }


def closed_loop(make, conc: int, duration_s: float, slo_ms: float) -> dict:  # noqa: ANN001
    lat: list[float] = []
    refusals: dict[str, int] = {}
    lock = threading.Lock()
    clients = [make() for _ in range(conc)]
    t_end = time.perf_counter() + duration_s

    def worker(c) -> None:  # noqa: ANN001
        while time.perf_counter() < t_end:
            t = time.perf_counter()
            err = c.infer()
            dt = (time.perf_counter() - t) * 1e3
            with lock:
                if err is None:
                    lat.append(dt)
                else:
                    refusals[err] = refusals.get(err, 0) + 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    return _summary(lat, refusals, wall, slo_ms)


def open_loop(make, rate: float, duration_s: float, slo_ms: float, seed: int) -> dict:  # noqa: ANN001
    from infscaler.api.loadgen import arrival_times

    sends = arrival_times("poisson", rate, duration_s, seed=seed)
    lat: list[float] = []
    refusals: dict[str, int] = {}
    lock = threading.Lock()
    local = threading.local()
    made: list[Any] = []

    def one(t_sched: float) -> None:
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = make()
            with lock:
                made.append(c)
        err = c.infer()
        dt = (time.perf_counter() - t_sched) * 1e3
        with lock:
            if err is None:
                lat.append(dt)
            else:
                refusals[err] = refusals.get(err, 0) + 1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=48) as pool:
        for s in sends:
            delay = t0 + s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, t0 + s)
    for c in made:
        c.close()
    return _summary(lat, refusals, duration_s, slo_ms) | {
        "offered_rps": round(rate, 2),
        "sent": len(sends),
        "within_slo": int(sum(v <= slo_ms for v in lat)),
    }


# --- one server through every point -------------------------------------------------------
def measure(sut: Sut, model: Model, x: np.ndarray, args: argparse.Namespace, slo_ms: float) -> dict:
    """Every point of ``sut``, per protocol: closed loop at each concurrency, then Poisson
    at each load (:func:`point`)."""
    cores = len(os.sched_getaffinity(0))
    capacity = cores * 1000.0 / model.l0_ms
    out: dict[str, Any] = {"config": sut.name}
    for proto in args.protocols:

        def make(proto: str = proto):  # noqa: ANN202
            return CLIENTS[proto](sut, model, x)

        closed_loop(make, 2, args.warmup_s, slo_ms)
        points = []
        for conc in args.concurrency:
            run = lambda d, c=conc: closed_loop(make, c, d, slo_ms)  # noqa: E731
            points.append({"load": "closed", "concurrency": conc, **point(sut, run, args)})
        for i, frac in enumerate(args.loads):
            run = lambda d, r=frac * capacity, k=i: open_loop(make, r, d, slo_ms, seed=k)  # noqa: E731
            points.append({"load": "poisson", "x_capacity": frac, **point(sut, run, args)})
        out[proto] = points
    if sut.kind == "ours":
        out["scaler_decisions"] = scaler_decisions(sut)
    return out


def point(sut: Sut, run, args: argparse.Namespace) -> dict:  # noqa: ANN001
    """One point: ``run(args.settle_s)`` unmeasured (its rate kept as
    ``settle_throughput_rps``), then ``run(args.duration_s)`` measured (:func:`_cpu`); for
    ours, the autoscaler's decisions over both (``decisions``, by action)."""
    before = scaler_decisions(sut) if sut.kind == "ours" else {}
    settled = run(args.settle_s) if args.settle_s > 0 else None
    res = _cpu(sut, lambda: run(args.duration_s))
    if settled is not None:
        res["settle_throughput_rps"] = settled["throughput_rps"]
    if sut.kind == "ours":
        after = scaler_decisions(sut)
        res["decisions"] = {
            k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)
        }
    return res


def scaler_decisions(sut: Sut) -> dict[str, float]:
    """The autoscaler's decisions applied so far, by action (``GET /metrics``,
    ``infscaler_scaler_decisions``); empty when the service does not answer."""
    import httpx

    out: dict[str, float] = {}
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.Client(transport=httpx.HTTPTransport(uds=sut.http["uds"]), timeout=10) as c,
    ):
        for line in c.get(f"{sut.http['base']}/metrics").text.splitlines():
            if line.startswith("infscaler_scaler_decisions") and 'action="' in line:
                action = line.split('action="', 1)[1].split('"', 1)[0]
                out[action] = out.get(action, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _cpu(sut: Sut, run) -> dict:  # noqa: ANN001
    """``run()``'s result with the servers' CPU per request over it and other processes'
    load (cores)."""
    assert sut.proc is not None
    tree = TreeCpu(sut.proc.pid, sut.server_pids)
    fl = ForeignLoad(lambda: process_cpu_seconds([os.getpid()]) + sum(tree.total()))
    res = run()
    res["other_processes_cores"] = fl.cores()
    server, rest = tree.stop()
    n = max(1, res["answered"] + res["refused"])
    res["server_cpu_ms_per_request"] = round(server * 1e3 / n, 3)
    res["model_procs_cpu_ms_per_request"] = round(rest * 1e3 / n, 3)
    res["processes_seen"] = tree.pids()
    return res


def suts(args: argparse.Namespace) -> list[Sut]:
    cores = len(os.sched_getaffinity(0))
    hands = [(cores, 1, False), (1, cores, False), (cores, 1, True)]
    out = [Sut(f"triton {i}x{t}{' batch' if b else ''}", "triton", i, t, b) for i, t, b in hands]
    out.append(Sut("ours auto", "ours", auto=True))
    # auto without the merge of instances at low concurrency (runtime/scaling/threads.py)
    off = {"INFSCALER_THREADS": "off"}
    out.append(Sut("ours auto threads-off", "ours", auto=True, env=off))
    out += [Sut(f"ours {i}x{t}{' batch' if b else ''}", "ours", i, t, b) for i, t, b in hands]
    if args.baseline:  # the same auto served by another install (before / after in one run)
        out.append(Sut("ours auto baseline", "ours", auto=True, exe=args.baseline))
    if args.configs:  # in the order given (ours auto first unless listed)
        keep = args.configs.split(",")
        names = keep if "ours auto" in keep else ["ours auto", *keep]
        by_name = {s.name: s for s in out}
        out = [by_name[n] for n in names if n in by_name]
    elif args.quick:
        out = [s for s in out if s.kind == "triton" or s.name == "ours auto"]
    return out


def ratios(entry: dict, protocols: list[str]) -> dict:
    """ours auto / the best Triton configuration at each point (throughput closed loop,
    goodput everywhere)."""
    out: dict[str, list] = {}
    rows = entry["configs"]
    auto = next(r for r in rows if r["config"] == "ours auto")
    triton = [r for r in rows if r["config"].startswith("triton")]
    if not triton:
        return {}
    for proto in protocols:
        out[proto] = []
        for k, pt in enumerate(auto[proto]):
            best_tp = max(t[proto][k]["throughput_rps"] for t in triton)
            best_gp = max(t[proto][k]["goodput_rps"] for t in triton)
            out[proto].append({
                "point": pt.get("concurrency", pt.get("x_capacity")), "load": pt["load"],
                "throughput_ratio": round(pt["throughput_rps"] / best_tp, 3) if best_tp else None,
                "goodput_ratio": round(pt["goodput_rps"] / best_gp, 3) if best_gp else None})  # fmt: skip
    return out


def plot(data: dict, path: Path) -> None:
    """Per model and protocol: closed-loop answers/s against the concurrency, and Poisson
    goodput (within the SLO)/s against the offered load x ideal capacity, one line per
    configuration (``harness.plot``)."""
    import harness

    pts = [{"panel": f"{m['model']} {proto} {q['load']}", "config": cfg["config"],
            "x": q.get("concurrency") if q["load"] == "closed" else q.get("x_capacity"),
            "y": q["throughput_rps"] if q["load"] == "closed" else q["goodput_rps"]}
           for m in data["models"] for cfg in m["configs"] for proto in data["settings"]["protocols"]
           for q in cfg.get(proto, [])]  # fmt: skip
    harness.plot(pts, path, x="x", y="y", by="config", panel="panel",
                 xlabel="closed: concurrency; poisson: offered x ideal capacity",
                 ylabel="closed: answers/s; poisson: goodput/s")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` sets the models, points and durations not given."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="default resnet50,ppocrv4-det,squeezenet (quick: squeezenet)")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--concurrency", help="closed-loop points, default 1,2,4,8 (quick: 1,4)")
    ap.add_argument("--loads", help="Poisson rates, x ideal capacity: default 0.3,0.5,0.7,0.9 "
                    "(quick: 0.5); '' for none")  # fmt: skip
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--duration-s", type=float, help="measured per point, default 15 (quick: 5)")
    ap.add_argument("--settle-s", type=float, default=20.0,
                    help="each point's load runs this long unmeasured first (default 20: ours' move to "
                    "threads at concurrency 1 needs a 10 s window of looks and an instance swap)")  # fmt: skip
    ap.add_argument("--warmup-s", type=float, help="at concurrency 2 per protocol, default 3 (quick: 1)")  # fmt: skip
    ap.add_argument("--peer-venv", default="/tmp/isc-triton-venv",
                    help="made with /usr/bin/python3.11 when absent (only a Triton configuration needs it)")  # fmt: skip
    ap.add_argument("--configs", default="",
                    help="comma-separated configuration names to run, in that order (ours auto always "
                    "runs, first unless listed): 'triton 2x1', 'triton 1x2', 'triton 2x1 batch', 'ours 2x1', ...")  # fmt: skip
    ap.add_argument("--state-dir", type=Path,
                    help="ours' state directory (plans, decisions kept between runs); default: a fresh "
                    "temporary one per run, removed at the end")  # fmt: skip
    ap.add_argument("--name", help="results/NAME.json and .png (default vs_triton, quick: vs_triton_quick)")  # fmt: skip
    ap.add_argument("--baseline", type=Path,
                    help="an `infscaler` executable of another install (e.g. main's .venv/bin/infscaler): "
                    "adds the configuration 'ours auto baseline', auto served by it")  # fmt: skip
    ap.add_argument("--keep-logs", action="store_true", help="keep every server's log directory")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    quick = {"models": "squeezenet", "concurrency": "1,4", "loads": "0.5", "duration_s": 5.0,
             "warmup_s": 1.0}  # fmt: skip
    full = {"models": "resnet50,ppocrv4-det,squeezenet", "concurrency": "1,2,4,8",
            "loads": "0.3,0.5,0.7,0.9", "duration_s": 15.0, "warmup_s": 3.0}  # fmt: skip
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.name = args.name or ("vs_triton_quick" if args.quick else "vs_triton")
    args.models = args.models.split(",")
    args.protocols = args.protocols.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.loads = [float(v) for v in args.loads.split(",") if v.strip()]
    return args


def main() -> int:
    args = parse_args()
    default_cache_dir()
    # Triton's virtualenv only where a Triton configuration runs (ours alone need none)
    needs_peer = any(s.kind == "triton" for s in suts(args))
    peer_python = peer_venv(Path(args.peer_venv)) if needs_peer else ""
    quiet = wait_for_quiet(60)
    work = Path(tempfile.mkdtemp(prefix="vs-triton-models-"))
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="vs-triton-state-"))
    data: dict[str, Any] = {
        "environment": environment(),
        "quiet_before": quiet,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "state_dir": str(args.state_dir) if args.state_dir else "fresh (temporary)",
        "models": [],
    }
    busy0 = busy_cpu_seconds()
    for alias in args.models:
        model = batchable(alias, work)
        x = np.random.default_rng(0).standard_normal(model.shape).astype(np.float32)
        model.l0_ms = single_thread_ms(model, x)
        slo_ms = args.slo_x * model.l0_ms
        entry: dict[str, Any] = {
            "model": alias,
            "l0_ms": round(model.l0_ms, 2),
            "slo_ms": round(slo_ms, 1),
            "input_bytes": int(x.nbytes),
            "configs": [],
        }
        for sut in suts(args):
            print(f"{alias}: {sut.name} ...", flush=True)
            ok = False
            # a fresh run: each of ours its own state directory (no plan kept from another)
            sd = state if args.state_dir else state / sut.name.replace(" ", "_")
            try:
                sut.start(model, slo_ms, peer_python, sd)
                entry["configs"].append(measure(sut, model, x, args, slo_ms))
                entry["configs"][-1]["planned"] = sut.planned()
                ok = True
            finally:
                sut.stop(keep_logs=args.keep_logs or not ok)
                if args.keep_logs or not ok:
                    print(f"  logs: {sut.tmp}", flush=True)
            cols = ("throughput_rps", "goodput_rps", "p99_ms", "refused")
            print(json.dumps({p: [(q.get("concurrency") or q.get("x_capacity"), *(q[k] for k in cols),
                                   q["server_cpu_ms_per_request"], q.get("settle_throughput_rps"),
                                   q.get("decisions"))
                                  for q in entry["configs"][-1][p]] for p in args.protocols}),
                  flush=True)  # fmt: skip
        entry["auto_vs_best_triton"] = ratios(entry, args.protocols)
        data["models"].append(entry)
    data["busy_cpu_s"] = round(busy_cpu_seconds() - busy0, 1)
    write_json(RESULTS_DIR / f"{args.name}.json", data)
    plot(data, RESULTS_DIR / f"{args.name}.png")
    shutil.rmtree(work, ignore_errors=True)
    if args.state_dir is None:
        shutil.rmtree(state, ignore_errors=True)
    for m in data["models"]:
        print(m["model"], json.dumps(m["auto_vs_best_triton"]))
    return 0


def peer_venv(venv: Path) -> str:
    """The peer's python: ``venv`` made from ``/usr/bin/python3.11`` with nvidia-pytriton and
    onnxruntime when it does not exist (the stub links the system's libpython3.11)."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run(["/usr/bin/python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "nvidia-pytriton", "onnxruntime", "numpy<2"],
            check=True,
        )
    return str(py)


if __name__ == "__main__":
    sys.exit(main())
