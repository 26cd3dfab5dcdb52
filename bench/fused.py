"""Fused units (function stages run inside the model unit next to them) against one
instance per stage, on the bundled ``ocr`` pipeline.

Two arms, each a fresh ``infscaler serve`` (``harness.Sut``): ``ocr`` as shipped, and
the same YAML with ``fuse: false``. Both serve one rendered 3-line image
(``infscaler.base.samples.render_text_image``) over the socket API through
``infscaler.api.loadgen`` (``harness.scenarios``): single stream (latency P50 / P90, ms)
and offline with ``--clients`` requests in flight (throughput, /s). Per arm also: the
processes the service runs and their PSS (MB), and the texts of one answer (both arms
must read the same). Writes ``results/fused.json`` (``fused_quick.json``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import OFFLINE, SINGLE_STREAM  # noqa: E402

LINES = ["Fused units cross one hop", "per model partition", "not one per function"]
ARMS = {"fused": {}, "apart": {"fuse": False}}


def texts(sock: str, name: str, image: Any) -> list[str]:
    """The texts of one answer."""
    from infscaler.api.client import Client

    with Client(sock, timeout=60) as c:
        return [str(t) for t in c.infer(name, {"image": image}).outputs["texts"]]


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=20.0)
    ap.add_argument("--clients", type=int, default=4)
    a = harness.cli.parse(ap, argv)
    import yaml

    import infscaler
    from infscaler.base.samples import render_text_image

    res = harness.cli.start("fused", a)
    raw = yaml.safe_load((Path(infscaler.__file__).parent / "pipelines" / "ocr.yaml").read_text())
    image = render_text_image(LINES)
    for arm, extra in ARMS.items():
        with harness.Sut([{**raw, **extra}]) as s:
            res.own_pids[:] = [s.pid]
            read = texts(s.sock, raw["name"], image)
            for scenario, value in ((SINGLE_STREAM, None), (OFFLINE, a.clients)):
                p = harness.scenarios.run(s.sock, raw["name"], {"image": image}, scenario, value,
                                          duration_s=a.duration_s, warmup_s=2.0)  # fmt: skip
                res.add(arm=arm, ready_s=s.ready_s, **p)
            res.summary[arm] = {"texts": read, **s.pss_mb()}
    res.summary["same_texts"] = res.summary["fused"]["texts"] == res.summary["apart"]["texts"]
    harness.cli.finish(res, a, plot)
    cols = ["arm", "scenario", "value", "throughput_rps", "p50_ms", "p90_ms", "ready_s"]
    harness.print_table(cols, [[p[k] for k in cols] for p in res.points])
    print({k: v for k, v in res.summary.items() if k != "texts"})
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Throughput and P50 per arm, one panel per scenario."""
    harness.plot(data["points"], path, x="value", y=["throughput_rps", "p50_ms"], by="arm",
                 panel="scenario", xlabel="requests in flight")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
