"""Decision time of model-less variant selection (INFaaS Algorithm 1; target <= 100 us,
INFaaS reports 2.2 ms for its getVariant with Redis lookups, §6.4).

Four parts: (1) a real registry of about 20 variants over three tasks, profiled here;
(2) the policy alone (:func:`infscaler.modelless.selector.select`) on random queries:
P50 / P99 / mean microseconds per decision and the branch that answered; (3) synthetic
catalogs of 20, 100, 1000 variants; (4) through the router of a live service
(``--no-service`` skips it).

Writes ``results/selector_decision.json`` and ``.png`` (``_quick`` with --quick).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/selector_decision.py`".
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, environment, print_table, write_json  # noqa: E402

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
    return {
        "n": len(a),
        "p50_us": round(float(np.percentile(a, 50)), 2),
        "p99_us": round(float(np.percentile(a, 99)), 2),
        "mean_us": round(float(a.mean()), 2),
        "max_us": round(float(a.max()), 2),
    }


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
    for alias, acc, ks in (
        ("ppocrv4-det", 0.8, (1,)),
        ("ppocrv5-det", 0.8, (1,)),
        ("ppocrv6-small-det", 0.85, (1,)),
        ("ppocrv6-tiny-det", 0.75, (1, 2)),
    ):
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


def time_policy(cat, loads, queries) -> tuple[dict, dict]:
    from infscaler.modelless.selector import select

    for q in queries[:200]:  # warm-up
        select(q, cat, loads)
    ns = []
    steps: dict[str, int] = {}
    clock = time.perf_counter_ns
    for q in queries:
        t0 = clock()
        sel = select(q, cat, loads)
        ns.append(clock() - t0)
        steps[sel.step] = steps.get(sel.step, 0) + 1
    return us_stats(ns), steps


def synthetic_catalog(n: int, rng: random.Random):
    from infscaler.modelless.selector import Catalog, VariantProfile

    return Catalog(
        [
            VariantProfile(
                name=f"m{i // 4}.b{(1, 2, 4, 8)[i % 4]}",
                task="synthetic",
                model=f"m{i // 4}",
                latency_ms=10 ** rng.uniform(0, 2.5),
                accuracy=rng.uniform(0.5, 0.99),
                load_ms=rng.uniform(20, 3000),
                memory_mb=rng.uniform(20, 500),
                batch=(1, 2, 4, 8)[i % 4],
            )
            for i in range(n)
        ]
    )


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
            for q in queries[:100]:
                router.select(q.task, q.latency_ms, q.min_accuracy)
            ns = []
            clock = time.perf_counter_ns
            for q in queries:
                t0 = clock()
                router.select(q.task, q.latency_ms, q.min_accuracy)
                ns.append(clock() - t0)
            monitor = []
            for _ in range(min(n, 2000)):
                t0 = clock()
                router.loads("text-recognition")
                monitor.append(clock() - t0)
            return {
                "deployed": names,
                "router_select": us_stats(ns),
                "monitor_read_only": us_stats(monitor),
            }
        finally:
            svc.close()


def plot(data: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.4))
    labels, p50, p99 = [], [], []
    real = data["policy_real"]
    labels.append(f"real registry\n({real['generated_variants']} variants)")
    p50.append(real["decision"]["p50_us"])
    p99.append(real["decision"]["p99_us"])
    for row in data["policy_synthetic"]:
        labels.append(f"synthetic\n{row['variants']} variants")
        p50.append(row["decision"]["p50_us"])
        p99.append(row["decision"]["p99_us"])
    if data.get("router"):
        labels.append("TaskRouter.select\nlive service")
        p50.append(data["router"]["router_select"]["p50_us"])
        p99.append(data["router"]["router_select"]["p99_us"])
    x = np.arange(len(labels))
    ax.bar(x - 0.2, p50, 0.4, label="P50")
    ax.bar(x + 0.2, p99, 0.4, label="P99")
    ax.axhline(100, color="red", ls="--", lw=1, label="target 100 us")
    ax.axhline(2200, color="gray", ls=":", lw=1, label="INFaaS getVariant 2.2 ms")
    ax.set_yscale("log")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("decision time (us, log)")
    env = data["environment"]
    host = env["host"]
    host = (
        f"{host.get('cpu_model', '?')}, {host.get('cores', '?')} cores"
        if isinstance(host, dict)
        else host
    )
    load = env.get("load_average_at_start", [0])[0], env.get("load_average_at_end", [0])[0]
    ax.set_title(
        f"Variant selection decision time ({host}; load average {load[0]:.1f} -> {load[1]:.1f})",
        fontsize=9,
    )
    for xi, v in zip(x + 0.2, p99, strict=True):
        ax.text(xi, v * 1.1, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", fontsize=7)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer queries, repeats")
    ap.add_argument("--queries", type=int, default=None, help="queries per measurement")
    ap.add_argument("--no-service", action="store_true", help="skip the live-service part")
    args = ap.parse_args()
    n = args.queries or (5000 if args.quick else 20000)
    repeats = 3 if args.quick else 5
    suffix = "_quick" if args.quick else ""

    def log(msg: str) -> None:
        print(f"  {msg}", flush=True)

    data: dict = {"environment": environment(), "settings": {"queries": n, "repeats": repeats}}
    with tempfile.TemporaryDirectory(prefix="isc-variants-") as tmp:
        reg, registered = register_real(Path(tmp) / "state", repeats, log)
        data["registry"] = registered
        cat = reg.catalog()
        rng = random.Random(0)
        loads = random_loads(cat, rng)
        queries = random_queries(cat.tasks, n, rng)
        stats, steps = time_policy(cat, loads, queries)
        data["policy_real"] = {
            "generated_variants": len(cat.profiles),
            "tasks": {t: len(cat.variants(t)) for t in cat.tasks},
            "states": {k: v.state.value for k, v in loads.items()},
            "decision": stats,
            "branches": steps,
        }
        data["policy_synthetic"] = []
        for size in (20, 100, 1000):
            syn = synthetic_catalog(size, random.Random(size))
            sl = random_loads(syn, random.Random(size))
            sq = random_queries(["synthetic"], n if size < 1000 else n // 4, random.Random(size))
            st, br = time_policy(syn, sl, sq)
            data["policy_synthetic"].append({"variants": size, "decision": st, "branches": br})
        if not args.no_service:
            data["router"] = time_router(reg, n // 4, log)
    data["environment"]["load_average_at_end"] = list(os.getloadavg())

    rows = [
        [
            f"real ({data['policy_real']['generated_variants']} variants)",
            stats["p50_us"],
            stats["p99_us"],
            stats["mean_us"],
        ]
    ]
    for row in data["policy_synthetic"]:
        d = row["decision"]
        rows.append([f"synthetic {row['variants']}", d["p50_us"], d["p99_us"], d["mean_us"]])
    if data.get("router"):
        for key in ("router_select", "monitor_read_only"):
            d = data["router"][key]
            rows.append([f"live {key}", d["p50_us"], d["p99_us"], d["mean_us"]])
    print_table(["decision", "P50 us", "P99 us", "mean us"], rows)
    out = RESULTS_DIR / f"selector_decision{suffix}.json"
    write_json(out, data)
    plot(data, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
