"""Threads per instance at low concurrency, on bare onnxruntime (no server, no IPC).

Four ways to spend 2 cores on one model, each driven closed-loop at concurrency 1, 2, 4
by client threads in this process (onnxruntime releases the GIL in ``run``):

- ``2x1``: two sessions x 1 intra-op thread; a request takes a free session.
- ``1x2``: one session x 2 intra-op threads; requests take turns on it.
- ``2x2``: two sessions x 2 threads (oversubscribed), spinning off
  (``session.intra_op.allow_spinning=0``, as the serving engine sets it).
- ``dual``: two instances, each holding a 1-thread and a 2-thread session, weights
  shared between the two by ``SessionOptions.add_initializer`` (onnxruntime's
  user-provided initializers; the session does not copy them); a request runs on the
  2-thread session when no other instance is busy, else on the 1-thread one.

Configurations alternate inside each round (A/B over rounds), so slow drift of a loaded
host falls on all of them alike. Models: the bundled ``resnet50`` and ``squeezenet``
(onnx wheel's light models, random initializers by ``resolve_model``). Reports per point
the throughput (requests/s), P50 / P99 latency (ms) and per round the ratios to ``2x1``;
the resident memory a second (2-thread) session adds, with and without shared weights.
Writes ``results/threads_lowc.json``.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, default_cache_dir, environment, write_json  # noqa: E402

CONFIGS = ("2x1", "1x2", "2x2", "dual")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _session(path: Path, threads: int, shared: dict | None = None):  # noqa: ANN202
    from infscaler.engines.onnxrt.loader import load_session, session_options

    so = session_options(threads, spinning=False)
    for name, value in (shared or {}).items():
        so.add_initializer(name, value)
    return load_session(path, engine="cpu", options=so)


def _shared_initializers(path: Path) -> dict:
    """The model's initializers as OrtValues (kept alive by the caller's dict)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    return {
        i.name: ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(i)) for i in g.initializer
    }


class Instance:
    """One serving instance: a lock, a 1-thread session and optionally a 2-thread one."""

    busy = 0
    busy_lock = threading.Lock()

    def __init__(self, one, two=None) -> None:  # noqa: ANN001
        self.one, self.two, self.lock = one, two, threading.Lock()

    def run(self, feed: dict, pool: list[Instance]) -> None:
        with Instance.busy_lock:
            others = Instance.busy
            Instance.busy += 1
        try:
            sess = self.two if (self.two is not None and others == 0) else self.one
            sess.run(None, feed)
        finally:
            with Instance.busy_lock:
                Instance.busy -= 1


def build(config: str, path: Path, shared: dict) -> list[Instance]:
    if config == "2x1":
        return [Instance(_session(path, 1)) for _ in range(2)]
    if config == "1x2":
        return [Instance(_session(path, 2))]
    if config == "2x2":
        return [Instance(_session(path, 2)) for _ in range(2)]
    return [Instance(_session(path, 1, shared), _session(path, 2, shared)) for _ in range(2)]


def closed_loop(pool: list[Instance], feed: dict, conc: int, seconds: float) -> dict:
    free = list(pool)
    cv = threading.Condition()
    lat: list[float] = []
    stop = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            with cv:
                while not free:
                    cv.wait()
                inst = free.pop()
            try:
                inst.run(feed, pool)
            finally:
                with cv:
                    free.append(inst)
                    cv.notify()
            lat.append((time.perf_counter() - t0) * 1e3)

    t = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(conc)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return {
        "rate": len(lat) / wall,
        "p50_ms": float(np.percentile(lat, 50)) if lat else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat else None,
        "n": len(lat),
    }


def _probe(path: Path, share: bool) -> float:
    """RSS added by a second (2-thread) session beside a 1-thread one in this (fresh)
    process, MB; with ``share`` both take the weights from one set of OrtValues."""
    shared = _shared_initializers(path) if share else None
    a = _session(path, 1, shared)
    r0 = _rss_mb()
    b = _session(path, 2, shared)
    added = _rss_mb() - r0
    del a, b
    return added


def memory(path: Path) -> dict:
    """:func:`_probe` in a fresh process each (freed memory would hide the next), MB."""
    out = {}
    for label in ("copied", "shared"):
        cmd = [sys.executable, __file__, "--probe", str(path)] + (
            ["--share"] if label == "shared" else []
        )
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[f"second_session_{label}_mb"] = round(float(res.stdout.strip().splitlines()[-1]), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,squeezenet")
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seconds", type=float, default=4.0, help="per point per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS_DIR / "threads_lowc.json"))
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--share", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(_probe(Path(args.probe), args.share))
        return 0
    default_cache_dir()
    from infscaler.base.models import resolve_model

    concs = [int(c) for c in args.concurrency.split(",")]
    configs = args.configs.split(",")
    data: dict = {"environment": environment(), "loaded_host": True, "models": {}}
    for alias in args.models.split(","):
        path = resolve_model(alias)
        shared = _shared_initializers(path)
        s = _session(path, 1)
        inp = s.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        feed = {inp.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        pools = {c: build(c, path, shared) for c in configs}
        for p in pools.values():  # warm every session
            for inst in p:
                for sess in (inst.one, inst.two):
                    if sess is not None:
                        sess.run(None, feed)
        runs: dict = {c: {str(k): [] for k in concs} for c in configs}
        for r in range(args.rounds):
            for k in concs:
                order = configs if r % 2 == 0 else configs[::-1]
                for c in order:
                    res = closed_loop(pools[c], feed, k, args.seconds)
                    runs[c][str(k)].append(res)
                    print(
                        f"{alias} round {r} c={k} {c}: {res['rate']:.1f}/s p50 {res['p50_ms']:.0f} ms",
                        flush=True,
                    )
        summary = {}
        for k in concs:
            base = [x["rate"] for x in runs["2x1"][str(k)]] if "2x1" in runs else None
            for c in configs:
                rates = [x["rate"] for x in runs[c][str(k)]]
                row = {
                    "rate_median": float(np.median(rates)),
                    "p50_ms_median": float(np.median([x["p50_ms"] for x in runs[c][str(k)]])),
                }
                if base:
                    row["ratio_to_2x1_per_round"] = [
                        round(a / b, 3) for a, b in zip(rates, base, strict=True)
                    ]
                summary[f"c{k}/{c}"] = row
        del pools
        data["models"][alias] = {"runs": runs, "summary": summary, "memory": memory(path)}
        print(alias, data["models"][alias]["memory"], flush=True)
        write_json(Path(args.out), data)  # after each model: a late failure keeps it
    for alias, m in data["models"].items():
        for key, row in m["summary"].items():
            print(alias, key, row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
