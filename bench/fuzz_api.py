"""Fuzz the v2 API's edge: up to 10,000 malformed requests against a live service.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``fuzz_api.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import api_edge  # noqa: E402
import harness  # noqa: E402
from api_edge_cases import KINDS, STRATEGIES  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402


def _instance_pids(svc) -> list[int]:
    pids = []
    for p in svc.status().get("pipelines", []):
        for u in p.get("units", []):
            pids += [i["pid"] for i in u.get("instances", []) if i.get("pid")]
    return pids


def _rss(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(Exception):  # an instance that is gone has no RSS
            total += api_edge.rss_mb(pid)
    return round(total, 1)


def run(count: int, seed: int, valid_every: int) -> dict:
    from infscaler.api.server import HttpLimits, ServerThread
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service

    tmp = Path(tempfile.mkdtemp(prefix="isc-fuzz-"))
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{HERE}{os.pathsep}{old}" if old else str(HERE)
    sock = str(tmp / "api.sock")
    model = api_edge.small_model(tmp / "small.onnx")
    limits = HttpLimits(header_timeout_s=5.0, body_timeout_s=5.0)
    by_status: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    wrong: list[dict] = []
    valid_failures: list[str] = []
    samples: list[dict] = []
    rng = random.Random(seed + 1)
    with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(api_edge.fuzz_pipeline(model)))
        with ServerThread(svc, sock, max_body_mb=4, limits=limits):
            if (why := api_edge.check_valid(sock)) is not None:
                raise SystemExit(f"the service does not answer a valid request: {why}")
            slots0 = svc.status()["pool"]["slots_in_use"]
            inst = _instance_pids(svc)
            me = os.getpid()
            t0 = time.perf_counter()
            every = max(1, count // 200)
            sent = [0]

            fuzz = settings(
                max_examples=max(1, count // len(KINDS)),
                deadline=None,
                database=None,
                phases=[Phase.generate],  # record every answer; nothing to shrink
                suppress_health_check=list(HealthCheck),
            )

            def sample(i: int) -> None:
                samples.append({"requests": i, "seconds": round(time.perf_counter() - t0, 2),
                                "service_rss_mb": _rss([me]), "instances_rss_mb": _rss(inst)})  # fmt: skip

            def one(case: api_edge.Case) -> None:
                i = sent[0]
                sent[0] += 1
                if i % every == 0:
                    sample(i)
                a = api_edge.send(sock, case.raw, shut_write=case.shut_write)
                status = "closed" if a.status is None else str(a.status)
                by_status[status] += 1
                by_kind[case.kind][status] += 1
                why = api_edge.judge(case, a)
                if why is not None and len(wrong) < 200:
                    wrong.append({"kind": case.kind, "note": case.note, "why": why})
                elif why is not None:
                    wrong.append({"kind": case.kind, "why": "(more)"})
                due = valid_every and i % valid_every == valid_every - 1
                if due and (why := api_edge.check_valid(sock, rng)) is not None:
                    valid_failures.append(f"after case {i}: {why}")

            for kind in KINDS:  # each kind its share (hypothesis stops early once exhausted)
                hypothesis_seed(seed)(fuzz(given(case=STRATEGIES[kind])(one)))()
            count = sent[0]
            elapsed = time.perf_counter() - t0
            sample(count)
            final_valid = api_edge.check_valid(sock)
            end = time.monotonic() + 30
            while (slots := svc.status()["pool"]["slots_in_use"]) > slots0:
                if time.monotonic() > end:
                    break
                time.sleep(0.1)
    os.environ["PYTHONPATH"] = old
    five = sum(n for s, n in by_status.items() if s.startswith("5"))
    return {
        "count": count,
        "seed": seed,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(count / elapsed, 1),
        "by_status": dict(sorted(by_status.items())),
        "by_kind": {k: dict(sorted(v.items())) for k, v in by_kind.items()},
        "not_4xx_json": len(wrong),
        "not_4xx_json_examples": wrong[:50],
        "status_5xx": five,
        "valid_requests_interleaved": count // valid_every if valid_every else 0,
        "valid_failures": valid_failures[:50],
        "valid_after_run": final_valid or "ok",
        "pool_slots_in_use_before": slots0,
        "pool_slots_in_use_after": slots,
        "pool_slots_leaked": max(0, slots - slots0),
        "rss_mb": {
            "service_start": samples[0]["service_rss_mb"],
            "service_end": samples[-1]["service_rss_mb"],
            "instances_start": samples[0]["instances_rss_mb"],
            "instances_end": samples[-1]["instances_rss_mb"],
        },
        "rss_samples": samples,
        "limits": {
            "header_timeout_s": limits.header_timeout_s,
            "body_timeout_s": limits.body_timeout_s,
            "max_connections": limits.max_connections,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--count", type=int, default=10_000, help="malformed requests")
    ap.add_argument("--valid-every", type=int, default=50, help="a valid request every N")
    ap.set_defaults(seed=13)

    def quick(a) -> None:
        a.count = 300

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("fuzz_api", a)
    r = run(a.count, a.seed, a.valid_every)
    for sample in r.pop("rss_samples"):
        res.add(**sample)
    res.summary = r
    harness.cli.finish(res, a, plot)
    print(f"{r['count']} malformed requests in {r['seconds']} s: by status {r['by_status']}")
    print(f"not 4xx JSON: {r['not_4xx_json']}, 5xx: {r['status_5xx']}, valid failures: "
          f"{len(r['valid_failures'])}, valid after: {r['valid_after_run']}, slots leaked: "
          f"{r['pool_slots_leaked']}, RSS MB: {r['rss_mb']}")  # fmt: skip
    ok = not r["not_4xx_json"] and not r["valid_failures"] and not r["pool_slots_leaked"]
    return 0 if ok and r["valid_after_run"] == "ok" else 1


def plot(data: dict, path: Path) -> None:
    """RSS (MB) of the service and of its instances against the malformed requests sent."""
    harness.plot(data["points"], path, x="requests", y=["service_rss_mb", "instances_rss_mb"],
                 xlabel="malformed requests sent", ylabel="RSS, MB")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
