"""Decision time of model-less variant selection (INFaaS Algorithm 1; target <= 100 us,
INFaaS reports 2.2 ms for its getVariant with Redis lookups, §6.4).

Four parts: (1) a real registry of about 20 variants over three tasks, profiled here;
(2) the policy alone (:func:`infscaler.modelless.selector.select`) on random queries:
P50 / P99 / mean microseconds per decision and the branch that answered; (3) synthetic
catalogs of 20, 100, 1000 variants; (4) through the router of a live service
(``--no-service`` skips it).

"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

LINES = [
    "Invoice 2024-07 total: 1,284.50 EUR",
    "東京駅まで歩いて10分です",
    "カメラの設定を確認してください",
    "今天天气很好，我们去公园散步",
    "Order #A7731 shipped via DHL",
    "ありがとうございました",
]


def us_stats(ns: list[int]) -> dict:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"n": len(a), **harness.percentiles(a, "us", digits=2, extra=("mean", "max"))}


def register_real(state: Path, repeats: int, log) -> tuple[object, dict]:
    from infscaler.modelless.accuracy import build_ocr_val_set
    from infscaler.modelless.register import register
    from infscaler.modelless.variants import VariantRegistry

    reg = VariantRegistry(state)
    val = build_ocr_val_set(state.parent / "val", LINES)
    t0 = time.perf_counter()
    common = {"registry": reg, "repeats": repeats, "warmup": 1}
    for alias in ("ppocrv4-rec", "ppocrv5-rec", "ppocrv6-small-rec", "ppocrv6-tiny-rec"):
        log(f"registering {alias}")
        register(alias, val_set=val, batch_sizes=(1, 4), **common)
    for alias, acc, ks in (("ppocrv4-det", 0.8, (1,)), ("ppocrv5-det", 0.8, (1,)),
                           ("ppocrv6-small-det", 0.85, (1,)), ("ppocrv6-tiny-det", 0.75, (1, 2))):  # fmt: skip
        log(f"registering {alias} (declared accuracy {acc})")
        register(alias, accuracy=acc, batch_sizes=(1,), partitions=ks, **common)
    for alias in ("minilm-int8", "minilm-l3"):
        log(f"registering {alias}")
        register(alias, batch_sizes=(1, 4), **common)
    seconds = time.perf_counter() - t0
    from infscaler.modelless.variants import describe

    rows = describe(reg.variants())
    return reg, {"register_seconds": round(seconds, 1), "variants": rows}


def random_loads(cat, rng: random.Random) -> dict:
    from infscaler.modelless.selector import VariantLoad, VariantState

    names = [p.name for p in cat.profiles]
    rng.shuffle(names)
    loads = {}
    k = max(1, len(names) // 3)
    for n in names[:k]:
        loads[n] = VariantLoad(VariantState.ACTIVE, 1, 0, 1.0, rng.random() * 0.8)
    for n in names[k : k + 2]:
        loads[n] = VariantLoad(VariantState.OVERLOADED, 1, 12, 100.0, 1.3)
    for n in names[k + 2 : k + 3]:
        loads[n] = VariantLoad(VariantState.INTERFERED, 1, 0, 5.0, 0.2)
    return loads


def random_queries(tasks: list[str], n: int, rng: random.Random) -> list:
    from infscaler.modelless.selector import Query

    out = []
    for _ in range(n):
        task = rng.choice(tasks)
        if rng.random() < 0.1:
            out.append(Query(task))
            continue
        lat = 10 ** rng.uniform(0, 2.6)  # 1-400 ms
        acc = rng.uniform(0.0, 1.0) if rng.random() < 0.8 else None
        out.append(Query(task, lat, acc))
    return out


def timed_ns(fn, calls: list[tuple], warmup: int) -> tuple[list[int], list]:  # noqa: ANN001
    """``fn(*args)`` for the first ``warmup`` of ``calls`` untimed, then for each of them:
    every call's ns and its result."""
    for args in calls[:warmup]:
        fn(*args)
    ns, out, clock = [], [], time.perf_counter_ns
    for args in calls:
        t0 = clock()
        r = fn(*args)
        ns.append(clock() - t0)
        out.append(r)
    return ns, out


def time_policy(cat, loads, queries) -> tuple[dict, dict]:
    from infscaler.modelless.selector import select

    ns, sels = timed_ns(select, [(q, cat, loads) for q in queries], 200)
    steps: dict[str, int] = {}
    for sel in sels:
        steps[sel.step] = steps.get(sel.step, 0) + 1
    return us_stats(ns), steps


def synthetic_catalog(n: int, rng: random.Random):
    from infscaler.modelless.selector import Catalog, VariantProfile

    def profile(i: int) -> VariantProfile:
        b = (1, 2, 4, 8)[i % 4]
        return VariantProfile(name=f"m{i // 4}.b{b}", task="synthetic", model=f"m{i // 4}",
                              latency_ms=10 ** rng.uniform(0, 2.5), accuracy=rng.uniform(0.5, 0.99),
                              load_ms=rng.uniform(20, 3000), memory_mb=rng.uniform(20, 500), batch=b)  # fmt: skip

    return Catalog([profile(i) for i in range(n)])


def time_router(reg, n: int, log) -> dict:
    """TaskRouter.select on a live service with two recogniser variants deployed."""
    from infscaler.modelless.tasks import TaskRouter
    from infscaler.service.service import Service

    with tempfile.TemporaryDirectory(prefix="isc-sel-") as tmp:
        svc = Service(state_dir=tmp, control_path="userspace", pool_mb=64).start()
        try:
            router = TaskRouter(svc, reg, autoscale=False, rebalance_interval_s=None)
            cat = router.catalog()
            names = [p.name for p in cat.variants("text-recognition") if p.batch == 1][:2]
            for name in names:
                log(f"deploying {name}")
                router.ensure_active(name)
            img = np.full((48, 320, 3), 255, np.uint8)
            for name in names:  # a few requests so that the stats have samples
                for _ in range(10):
                    svc.infer(name, {"image": img})
            rng = random.Random(1)
            queries = random_queries(["text-recognition"], n, rng)
            calls = [(q.task, q.latency_ms, q.min_accuracy) for q in queries]
            ns, _ = timed_ns(router.select, calls, 100)
            reads, _ = timed_ns(router.loads, [("text-recognition",)] * min(n, 2000), 0)
            return {"deployed": names, "router_select": us_stats(ns),
                    "monitor_read_only": us_stats(reads)}  # fmt: skip
        finally:
            svc.close()


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--queries", type=int, default=20000, help="queries per measurement")
    ap.add_argument("--repeats", type=int, default=5, help="profiling repeats per variant")
    ap.add_argument("--no-service", action="store_true", help="skip the live-service part")

    def quick(a) -> None:
        a.queries, a.repeats = 5000, 3

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("selector_decision", a)
    n = a.queries

    def log(msg: str) -> None:
        print(f"  {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="isc-variants-") as tmp:
        reg, registered = register_real(Path(tmp) / "state", a.repeats, log)
        cat = reg.catalog()
        rng = random.Random(0)
        loads = random_loads(cat, rng)
        stats, steps = time_policy(cat, loads, random_queries(cat.tasks, n, rng))
        res.summary.update(registry=registered, tasks={t: len(cat.variants(t)) for t in cat.tasks},
                           states={k: v.state.value for k, v in loads.items()})  # fmt: skip
        res.add(decision="policy, real registry", variants=len(cat.profiles), **stats,
                branches=steps)  # fmt: skip
        for size in (20, 100, 1000):
            syn = synthetic_catalog(size, random.Random(size))
            sq = random_queries(["synthetic"], n if size < 1000 else n // 4, random.Random(size))
            st, br = time_policy(syn, random_loads(syn, random.Random(size)), sq)
            res.add(decision="policy, synthetic", variants=size, **st, branches=br)
        if not a.no_service:
            live = time_router(reg, n // 4, log)
            for key in ("router_select", "monitor_read_only"):
                res.add(decision=f"live {key}", variants=len(cat.profiles), deployed=live["deployed"],
                        **live[key])  # fmt: skip
    harness.cli.finish(res, a, plot)
    harness.print_table(["decision", "variants", "P50 us", "P99 us", "mean us"],
                        [[p["decision"], p["variants"], p["p50_us"], p["p99_us"], p["mean_us"]]
                         for p in res.points])  # fmt: skip
    return 0


def plot(data: dict, png: Path) -> None:
    """P50 and P99 decision time (us, log) against the catalog's variants (log), the
    100 us target and INFaaS's getVariant (2.2 ms) as lines."""
    harness.plot(data["points"], png, x="variants", y=["p50_us", "p99_us"], by="decision",
                 logx=True, logy=True, hlines={"target 100 us": 100.0, "INFaaS 2.2 ms": 2200.0},
                 xlabel="variants in the catalog", ylabel="decision time, us")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
