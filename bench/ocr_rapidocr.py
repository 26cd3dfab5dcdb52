"""The bundled ``ocr`` pipeline served by InfScaler against rapidocr_onnxruntime's own API.

``infscaler serve ocr`` (``harness.Sut``) over its socket against rapidocr_onnxruntime's own
API replicated over the cores (``--replicas`` spawned processes of 1 thread), and the same
again with its detector input capped at 640 as in ``ocr.yaml``; each side in a closed
loop of ``--clients`` over 4 real images: throughput, P50 / P99, the summed PSS of the
side's processes (sampled every 0.5 s) and the texts read. Targets against the default
API: >= 2.5x the throughput at <= 0.7x the PSS. More: bench/HISTORY.md, "Lean instances
against the library a user would call".
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import ForeignLoad, process_cpu_seconds  # noqa: E402

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
    """``infscaler serve ocr`` (:class:`harness.Sut`), reached over its socket, one client
    per thread."""

    name = "InfScaler ocr"

    def __init__(self, sut: harness.Sut) -> None:
        self.sut, self._local = sut, threading.local()

    def pids(self) -> list[int]:
        return self.sut.processes()

    def infer(self, rgb: np.ndarray) -> list[str]:
        from infscaler.api.client import Client

        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = Client(self.sut.sock, timeout=120)
        return [str(t) for t in c.infer("ocr", {"image": rgb}).outputs["texts"].tolist()]


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
        **harness.percentiles(arr, digits=1),
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


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=240.0, quiet_wait_s=120.0)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` option")
    ap.add_argument("--pipeline", default="ocr", help="pipeline served (a YAML named `ocr`)")

    def quick(a: Any) -> None:
        a.requests, a.duration_s = 40, 40.0

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("ocr_rapidocr", a)
    imgs = images()
    rapid = RapidSide(a.replicas)
    same = RapidSide(a.replicas, {"det_limit_side_len": 640, "det_limit_type": "max"})
    try:
        with harness.Sut([a.pipeline], args=a.serve_arg) as s:
            served = ServedSide(s)
            res.summary["agreement"] = agreement(rapid, served, imgs)
            for side in (rapid, served, same):
                res.own_pids[:] = [*rapid.pids(), *same.pids(), *s.processes()]
                res.add(**drive(side, imgs, a.clients, a.requests, a.duration_s))
            res.summary["infscaler_status"] = s.status()
    finally:
        rapid.close()
        same.close()
    base, ours, like = res.points
    res.summary.update(
        rapidocr_threads_per_session=rapid.threads[0] if rapid.threads else None,
        ratios={"throughput": round(ours["throughput_rps"] / base["throughput_rps"], 3),
                "pss_mean": round(ours["pss_mb_mean"] / base["pss_mb_mean"], 3)},
        ratios_same_det_input={"throughput": round(ours["throughput_rps"] / like["throughput_rps"], 3),
                               "pss_mean": round(ours["pss_mb_mean"] / like["pss_mb_mean"], 3)},
        targets={"throughput": ">= 2.5", "pss_mean": "<= 0.7"},
    )  # fmt: skip
    harness.cli.finish(res, a, plot)
    harness.print_table(["side", "img/s", "P50 ms", "P99 ms", "PSS MB mean", "procs", "errors"],
                        [[r["side"], r["throughput_rps"], r["p50_ms"], r["p99_ms"], r["pss_mb_mean"],
                          r["processes"], r["errors"]] for r in res.points])  # fmt: skip
    print(
        f"ratios: {res.summary['ratios']}; same det input: {res.summary['ratios_same_det_input']}"
    )
    return 0


def plot(data: dict, path: Path) -> None:
    """Throughput (images/s) and mean summed PSS (MB) per side."""
    pts = [{"side": p["side"], "x": 0, "images_per_s": p["throughput_rps"]} for p in data["points"]]
    pts += [{"side": p["side"], "x": 1, "pss_mb": p["pss_mb_mean"]} for p in data["points"]]
    harness.plot(pts, path, x="x", y=["images_per_s", "pss_mb"], by="side", logy=True,
                 xlabel="0: images/s, 1: summed PSS MB (mean under load)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
