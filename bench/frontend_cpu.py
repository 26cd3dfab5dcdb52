"""The front end's CPU per request, ms: the figure the planner's search models as a
single-threaded server that competes with the instances for the cores
(``infscaler.runtime.planning.planner.FRONTEND_MS``, ``infscaler plan --frontend-ms``).

Writes ``results/frontend_cpu.json`` (``_quick`` with --quick; harness.Result, no plot).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``frontend_cpu.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

CLIENT = """
import sys, time
import numpy as np
from infscaler.api.client import Client
sock, n, shape = sys.argv[1], int(sys.argv[2]), [int(v) for v in sys.argv[3].split("x")]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
with Client(sock) as c:
    for _ in range(10):
        c.infer("fe", {"x": x})
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(n):
        c.infer("fe", {"x": x})
    print(f"{(time.perf_counter() - t0) * 1e3 / n:.4f}", flush=True)
"""


def first(tensors):
    """A stage that returns the first element of ``x`` (almost no compute)."""
    return {"y": np.asarray(tensors["x"]).reshape(-1)[:1].copy()}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("-n", type=int, help="timed requests (default 2000, --quick 200)")
    ap.add_argument("--shape", default="1x3x224x224", help="input shape (FP32)")
    args = harness.cli.parse(ap, argv)
    res = harness.cli.start("frontend_cpu", args)
    from infscaler.api.server import ServerThread
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service

    n = args.n or (200 if args.quick else 2000)
    shape = [int(v) for v in args.shape.split("x")]
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{here}{os.pathsep}{old}" if old else here
    state = Path(os.environ["INFSCALER_CACHE_DIR"]) / "bench-state"
    cfg = load_pipeline(
        {
            "name": "fe",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": shape}],
            "outputs": ["y"],
            "stages": [
                {
                    "name": "first",
                    "function": "frontend_cpu:first",
                    "inputs": ["x"],
                    "outputs": ["y"],
                }
            ],
        }
    )
    with tempfile.TemporaryDirectory() as tmp, Service(state_dir=state, pool_mb=64) as svc:
        sock = str(Path(tmp) / "bench.sock")
        with ServerThread(svc, sock, max_body_mb=16):
            svc.deploy(cfg)
            child = subprocess.Popen(
                [sys.executable, "-c", CLIENT, sock, str(n), args.shape],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert child.stdout is not None and child.stdin is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError("the client did not start")
                cpu0, t0 = time.process_time(), time.perf_counter()
                child.stdin.write("go\n")
                child.stdin.flush()
                latency = float(child.stdout.readline())
                cpu1, t1 = time.process_time(), time.perf_counter()
            finally:
                child.wait(timeout=60)
    cpu_ms = (cpu1 - cpu0) * 1e3 / n
    res.summary.update(requests=n, shape=shape, frontend_cpu_ms_per_request=round(cpu_ms, 4),
                       client_latency_ms_mean=latency, wall_s=round(t1 - t0, 3))  # fmt: skip
    res.add(**res.summary)
    print(f"front end CPU {cpu_ms:.3f} ms per request ({n} requests of {args.shape} FP32; "
          f"client latency {latency:.3f} ms mean)")  # fmt: skip
    harness.cli.finish(res, args, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
