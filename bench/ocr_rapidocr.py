"""The bundled ``ocr`` pipeline served by InfScaler against rapidocr_onnxruntime's own API.

Writes ``results/ocr_rapidocr.json`` and ``.png`` (``_quick`` with --quick).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/ocr_rapidocr.py`".
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    environment,
    print_table,
    process_cpu_seconds,
    wait_for_quiet,
    write_json,
)

# -- inputs -------------------------------------------------------------------------


def images() -> list[tuple[str, np.ndarray]]:
    """The real images, RGB uint8 [H, W, 3]."""
    from skimage import data

    from infscaler.base.samples import render_text_image

    def rgb(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim == 2:
            a = np.stack([a] * 3, axis=-1)
        return np.ascontiguousarray(a[..., :3].astype(np.uint8))

    return [
        ("text.png", rgb(data.text())),
        ("page.png", rgb(data.page())),
        ("astronaut.png", rgb(data.astronaut())),
        ("rendered", rgb(render_text_image(["INFSCALER EDGE 2026", "pipelines on 2 cores"]))),
    ]


# -- the baseline: RapidOCR replicated over the cores ----------------------------------

_OCR: Any = None


def _rapid_init(extra: dict[str, Any]) -> None:
    global _OCR
    from rapidocr_onnxruntime import RapidOCR

    _OCR = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1, **extra)


def _rapid_run(bgr: np.ndarray) -> list[str]:
    res, _ = _OCR(bgr)
    return [str(r[1]) for r in res] if res else []


def _rapid_threads(_: Any = None) -> list[int]:
    return [
        int(x.session.get_session_options().intra_op_num_threads)
        for x in (_OCR.text_det.infer, _OCR.text_cls.infer, _OCR.text_rec.session)
    ]


class RapidSide:
    """RapidOCR in ``n`` spawned processes (1 intra-op thread each)."""

    def __init__(self, n: int, extra: dict[str, Any] | None = None) -> None:
        self.pool = mp.get_context("spawn").Pool(
            n, initializer=_rapid_init, initargs=(extra or {},)
        )
        self.name = f"RapidOCR x{n}" + (" det 640 max" if extra else "")
        # every worker loaded (one task each cannot be guaranteed; ask more than n)
        self.threads = self.pool.map(_rapid_threads, range(4 * n), chunksize=1)

    def pids(self) -> list[int]:
        return [p.pid for p in self.pool._pool]  # noqa: SLF001 - the pool's processes

    def infer(self, rgb: np.ndarray) -> list[str]:
        return self.pool.apply(_rapid_run, (np.ascontiguousarray(rgb[..., ::-1]),))

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


# -- InfScaler: `infscaler serve ocr` ----------------------------------------------------


class ServedSide:
    """``infscaler serve ocr`` in a subprocess, reached over its socket."""

    name = "InfScaler ocr"

    def __init__(self, tmp: Path, extra: list[str], pipeline: str = "ocr") -> None:
        from infscaler.api.client import Client

        self.sock = tmp / "isc.sock"
        self.log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed in close()
        cli = str(Path(sys.executable).parent / "infscaler")
        self.proc = subprocess.Popen(
            [cli, "serve", "--socket", str(self.sock), "--state-dir", str(tmp / "state"),
             *extra, pipeline],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._local = threading.local()
        t0 = time.monotonic()
        with Client(self.sock, timeout=300) as c:
            while True:
                if self.proc.poll() is not None:
                    raise SystemExit(f"infscaler serve exited {self.proc.returncode}: {tmp}")
                if time.monotonic() - t0 > 600:
                    raise SystemExit("infscaler serve not ready after 600 s")
                try:
                    if c.is_ready():
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                time.sleep(0.5)

    def pids(self) -> list[int]:
        try:
            p = psutil.Process(self.proc.pid)
            return [p.pid, *[c.pid for c in p.children(recursive=True)]]
        except psutil.NoSuchProcess:
            return []

    def infer(self, rgb: np.ndarray) -> list[str]:
        from infscaler.api.client import Client

        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = Client(self.sock, timeout=120)
        return [str(t) for t in c.infer("ocr", {"image": rgb}).outputs["texts"].tolist()]

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -- measuring ---------------------------------------------------------------------------


def pss_mb(pids: list[int]) -> float:
    """Summed PSS of ``pids``, MB (the runtime's own reading; a process that exited
    meanwhile counts 0)."""
    from infscaler.runtime.scaling.telemetry import ProcessMemoryError, process_memory

    total = 0.0
    for pid in pids:
        try:
            total += process_memory(pid).pss_mb or 0.0
        except ProcessMemoryError:
            continue
    return total


def drive(
    side: Any, imgs: list[tuple[str, np.ndarray]], clients: int, n: int, budget_s: float
) -> dict:
    """Closed loop: ``clients`` threads, ``n`` requests after one warm-up pass."""
    for _name, img in imgs:  # warm-up: every image once per client slot
        for _ in range(clients):
            side.infer(img)
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    count = [0]
    stop_at = time.monotonic() + budget_s
    mem: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            mem.append(pss_mb(side.pids()))

    def worker(k: int) -> None:
        i = k
        while True:
            with lock:
                if count[0] >= n or time.monotonic() > stop_at:
                    return
                count[0] += 1
            img = imgs[i % len(imgs)][1]
            i += 1
            t0 = time.perf_counter()
            try:
                side.infer(img)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                lat.append((time.perf_counter() - t0) * 1e3)

    meter = ForeignLoad(lambda: process_cpu_seconds([os.getpid(), *side.pids()]))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    sampling.set()
    sampler.join()
    mem.append(pss_mb(side.pids()))
    arr = np.array(lat) if lat else np.array([np.nan])
    return {
        "side": side.name,
        "clients": clients,
        "answered": len(lat),
        "errors": len(errors),
        "error_samples": errors[:3],
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(lat) / wall, 3),
        "p50_ms": round(float(np.percentile(arr, 50)), 1),
        "p99_ms": round(float(np.percentile(arr, 99)), 1),
        "pss_mb_mean": round(float(np.mean(mem)), 1),
        "pss_mb_peak": round(float(np.max(mem)), 1),
        "processes": len(side.pids()),
        "other_cpu_cores": round(meter.cores(), 3),
    }


def agreement(rapid: RapidSide, served: ServedSide, imgs: list[tuple[str, np.ndarray]]) -> list:
    """Both sides' texts per image (the figures compare like with like only if they read
    the same lines)."""
    out = []
    for name, img in imgs:
        a, b = rapid.infer(img), served.infer(img)
        norm = lambda ts: sorted(t.replace(" ", "").lower() for t in ts)  # noqa: E731
        common = len(set(norm(a)) & set(norm(b)))
        out.append({"image": name, "rapidocr": a, "infscaler": b, "common_lines": common})
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    names = [r["side"] for r in rows]
    axes[0].bar(
        names,
        [r["throughput_rps"] for r in rows],
        color=["tab:gray", "tab:blue", "silver"][: len(rows)],
    )
    axes[0].set_ylabel("images / s")
    axes[0].set_title(f"throughput: {res['ratios']['throughput']:.2f}x")
    axes[1].bar(
        names,
        [r["pss_mb_mean"] for r in rows],
        color=["tab:gray", "tab:blue", "silver"][: len(rows)],
    )
    axes[1].set_ylabel("summed PSS, MB (mean under load)")
    axes[1].set_title(f"memory: {res['ratios']['pss_mean']:.2f}x")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("PP-OCRv4 on 2 cores: InfScaler `ocr` vs RapidOCR replicated", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (smoke)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` option")
    ap.add_argument("--pipeline", default="ocr", help="pipeline served (a YAML named `ocr`)")
    args = ap.parse_args(argv)
    n, budget = (40, 40.0) if args.quick else (args.requests, args.budget_s)
    imgs = images()
    quiet = wait_for_quiet(5.0 if args.quick else 120.0)
    runs = []
    with tempfile.TemporaryDirectory(prefix="isc-ocr-bench-") as tmp:
        rapid = RapidSide(args.replicas)
        same = RapidSide(args.replicas, {"det_limit_side_len": 640, "det_limit_type": "max"})
        served = ServedSide(Path(tmp), args.serve_arg, args.pipeline)
        try:
            agree = agreement(rapid, served, imgs)
            runs.append(drive(rapid, imgs, args.clients, n, budget))
            runs.append(drive(served, imgs, args.clients, n, budget))
            runs.append(drive(same, imgs, args.clients, n, budget))
            st = subprocess.run(
                [str(Path(sys.executable).parent / "infscaler"), "status", "--socket",
                 str(served.sock)], capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            status = st.stdout
        finally:
            rapid.close()
            same.close()
            served.close()
    base, ours, like = runs
    res = {
        "environment": environment(),
        "quiet": quiet,
        "images": [(nm, list(a.shape)) for nm, a in imgs],
        "rapidocr_threads_per_session": rapid.threads[0] if rapid.threads else None,
        "agreement": agree,
        "runs": runs,
        "ratios": {
            "throughput": round(ours["throughput_rps"] / base["throughput_rps"], 3),
            "pss_mean": round(ours["pss_mb_mean"] / base["pss_mb_mean"], 3),
            "pss_peak": round(ours["pss_mb_peak"] / base["pss_mb_peak"], 3),
        },
        "ratios_same_det_input": {
            "throughput": round(ours["throughput_rps"] / like["throughput_rps"], 3),
            "pss_mean": round(ours["pss_mb_mean"] / like["pss_mb_mean"], 3),
        },
        "targets": {"throughput": ">= 2.5", "pss_mean": "<= 0.7", "processes": "<= 4"},
        "infscaler_status": status,
    }
    stem = "ocr_rapidocr_quick" if args.quick else "ocr_rapidocr"
    write_json(RESULTS_DIR / f"{stem}.json", res)
    plot(res, RESULTS_DIR / f"{stem}.png")
    print_table(
        ["side", "img/s", "P50 ms", "P99 ms", "PSS MB mean", "peak", "procs", "errors", "other CPU"],
        [
            [r["side"], r["throughput_rps"], r["p50_ms"], r["p99_ms"], r["pss_mb_mean"],
             r["pss_mb_peak"], r["processes"], r["errors"], r["other_cpu_cores"]]
            for r in runs
        ],
    )  # fmt: skip
    print(f"ratios: {res['ratios']}; same det input: {res['ratios_same_det_input']}")
    for a in agree:
        print(f"  {a['image']}: rapidocr {a['rapidocr'][:4]} | infscaler {a['infscaler'][:4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
