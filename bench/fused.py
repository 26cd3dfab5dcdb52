"""Fused units (issue 14) vs one instance per stage, on the bundled ``ocr`` pipeline.

One service (userspace or eBPF control path) deploys the bundled ``ocr`` pipeline twice:
``ocr`` as shipped (function stages fused into the model units next to them) and
``ocr_apart`` with ``fuse: false`` (every stage its own instance, as before issue 14).
Both serve the same rendered 3-line image (``infscaler.base.samples.render_text_image``)
in-process (``Service.infer``: the runtime, no HTTP):

* sequential: ``--requests`` requests each, interleaved (fused, apart, fused, ...) so
  drift of the host affects both alike; median / P90 latency, ms;
* concurrent: ``--clients`` threads x ``--per-client`` requests on one deployment, then
  on the other; throughput, requests/s;
* processes (instances) per deployment, their PSS summed (MB, each instance's last
  ``stats`` report), and the outputs of both compared (the same texts).

Writes ``bench/results/fused.json`` (``fused_quick.json`` with ``--quick``: 10
sequential requests, 2 clients x 5).

Usage::

    .venv/bin/python bench/fused.py [--quick] [--requests 60] [--clients 4] [--per-client 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, environment  # noqa: E402

LINES = ["Fused units cross one hop", "per model partition", "not one per function"]


def _pss(svc: Any, name: str) -> tuple[int, float]:
    hs = [h for h in svc.supervisor.handles() if h.key[0] == name and h.state == "ready"]
    return len(hs), round(sum(float((h.stats or h.info).get("pss_mb") or 0.0) for h in hs), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--control-path", default="auto")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.clients, args.per_client = 10, 2, 5

    import yaml

    import infscaler
    from infscaler.base.config import load_pipeline
    from infscaler.base.models import cache_dir
    from infscaler.base.samples import render_text_image
    from infscaler.service.service import Service

    raw = yaml.safe_load((Path(infscaler.__file__).parent / "pipelines" / "ocr.yaml").read_text())
    apart = {**raw, "name": "ocr_apart", "fuse": False}
    image = render_text_image(LINES)
    result: dict[str, Any] = {"environment": environment(), "image_shape": list(image.shape)}
    with Service(
        state_dir=cache_dir() / "state", control_path=args.control_path, pool_mb=256
    ) as svc:
        names = ("ocr", "ocr_apart")
        for cfg in (raw, apart):
            t0 = time.perf_counter()
            svc.deploy(load_pipeline(cfg))
            result.setdefault("deploy_s", {})[cfg["name"]] = round(time.perf_counter() - t0, 2)
        result["control_path"] = svc.channel.kind
        result["units"] = {n: [u.name for u in svc.deployment(n).pipeline.units] for n in names}
        texts = {}
        for n in names:  # warm-up, and the outputs compared
            texts[n] = [str(t) for t in svc.infer(n, {"image": image}).outputs["texts"]]
        result["texts"] = texts
        result["same_texts"] = texts["ocr"] == texts["ocr_apart"]
        lat: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.requests):
            for n in names:
                t0 = time.perf_counter()
                svc.infer(n, {"image": image})
                lat[n].append((time.perf_counter() - t0) * 1e3)
        result["sequential_ms"] = {
            n: {
                "median": round(float(np.median(v)), 2),
                "p90": round(float(np.percentile(v, 90)), 2),
                "n": len(v),
            }
            for n, v in lat.items()
        }
        rps = {}
        for n in names:

            def client(n: str = n) -> None:
                for _ in range(args.per_client):
                    svc.infer(n, {"image": image})

            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rps[n] = round(args.clients * args.per_client / (time.perf_counter() - t0), 2)
        result["concurrent_rps"] = rps
        time.sleep(1.5)  # one more stats report from every instance
        result["instances"] = {}
        for n in names:
            count, pss = _pss(svc, n)
            result["instances"][n] = {"processes": count, "pss_mb_total": pss}
    out = RESULTS_DIR / ("fused_quick.json" if args.quick else "fused.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    summary = {k: result[k] for k in ("sequential_ms", "concurrent_rps", "instances", "same_texts")}
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
