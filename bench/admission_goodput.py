"""Admission on vs off, same configuration: does SLO admission ever cost goodput?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``admission_goodput.py``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import process_cpu_seconds  # noqa: E402
from harness.models import MODEL_SETTINGS  # noqa: E402
from harness.scenarios import OFFLINE, SINGLE_STREAM  # noqa: E402

MODES = ("off", "on")


def point_row(kind: str, factor: float, load: float, point: Any, cpu_s: float) -> dict:
    """One load point of the load generator as a JSON row (goodput, admitted P99 from
    send, refusals, server CPU per answer)."""
    s = point.summary
    ok = point.totals["ok"]
    return {
        "kind": kind,
        "factor": factor,
        "load": round(load, 3),
        "goodput_rps": round(s["goodput"] or 0.0, 3),
        "throughput_rps": round(s["throughput"], 3),
        "admitted_p99_ms": None if (p99 := s["latency_ms"]["p99"]) is None else round(p99, 2),
        "refused_rps": round(s["refused_per_s"], 3),
        "errors_rps": round(s["errors_per_s"], 3),
        "stable": point.stable,
        "totals": point.totals,
        "server_cpu_ms_per_answer": round(1e3 * cpu_s / ok, 3) if ok else None,
    }


async def http_points(
    svc: Any, model: str, body: bytes, headers: dict, specs: list, cfg: Any, pool: int = 0
) -> list[tuple[Any, Any, float]]:
    """Each ``(kind, factor, LoadSpec)`` of ``specs`` measured in turn on one session
    (``pool`` connections at most; 0: unbounded); ``(spec row key, point, server CPU s)``."""
    import aiohttp

    from infscaler.api.loadgen import LoadGenerator

    gen = LoadGenerator(svc.sock, model, {})
    conn = aiohttp.UnixConnector(path=svc.sock, limit=pool)
    out = []
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)
    ) as session:
        for key, spec in specs:
            c0 = process_cpu_seconds(svc.processes())
            point = await gen.measure(session, spec, cfg, body, headers)
            out.append((key, point, process_cpu_seconds(svc.processes()) - c0))
    return out


def grpc_closed(sock: str, model: str, feeds: dict, n: int, duration_s: float, slo_ms: float):
    """``n`` tritonclient.grpc clients (a thread each) back to back for ``duration_s``;
    goodput, admitted P99 from send and refusals / s (None without tritonclient)."""
    try:
        import tritonclient.grpc as tg
        from tritonclient.utils import InferenceServerException
    except ImportError:
        return None
    import numpy as np

    lat, refused, errors = [], [0], [0]
    lock = threading.Lock()
    end = time.monotonic() + duration_s

    def worker() -> None:
        client = tg.InferenceServerClient(url="unix:" + sock)
        inputs = []
        for name, arr in feeds.items():
            i = tg.InferInput(name, list(arr.shape), "FP32")
            i.set_data_from_numpy(np.ascontiguousarray(arr, np.float32))
            inputs.append(i)
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                client.infer(model, inputs)
                with lock:
                    lat.append((time.perf_counter() - t0) * 1e3)
            except InferenceServerException as exc:
                with lock:
                    (refused if exc.status() == "StatusCode.UNAVAILABLE" else errors)[0] += 1
        client.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.monotonic() - t0
    lat.sort()
    return {
        "goodput_rps": round(sum(x <= slo_ms for x in lat) / span, 3),
        "throughput_rps": round(len(lat) / span, 3),
        "admitted_p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
        "refused_rps": round(refused[0] / span, 3),
        "errors": errors[0],
    }


def serve(mode: str, a: Any, cores: int, slo_ms: float, tmp: Path) -> harness.Sut:
    """The configuration served (``slo`` only when ``mode`` is "on"), ready."""
    pipe = harness.models.static_pipeline(
        a.model, a.model, 1, cores, slo_ms if mode == "on" else None
    )
    args = ["--drain-timeout", "5", "--grpc-socket", str(tmp / f"{mode}-grpc.sock")]
    return harness.Sut([pipe], args=args).__enter__()


def measure_http(svc: Any, a: Any, ctx: dict, key: tuple, spec: Any, pool: int = 0) -> dict:
    """One HTTP load point on ``svc`` (the method, step 3 or 4) as a JSON row."""
    from infscaler.api.loadgen import MeasureConfig

    cfg = MeasureConfig(interval_ms=a.window_ms, max_trials=a.trials, slo_ms=ctx["slo_ms"],
                        timeout_s=30.0, seed=a.seed)  # fmt: skip
    body, headers = ctx["body"], ctx["headers"]
    ((k, point, cpu),) = asyncio.run(
        http_points(svc, a.model, body, headers, [(key, spec)], cfg, pool=pool)
    )
    return point_row(k[0], k[1], k[2], point, cpu)


def run_all(a: Any, ctx: dict, tmp: Path) -> list[dict[str, Any]]:
    """Both services up at once (the idle one costs nothing), every point measured on
    one then the other, in alternating order, so a change in the host's load between
    two measurements of a point is as likely to favour either (steps 2-5)."""
    from infscaler.api.loadgen import LoadSpec

    cores, slo_ms, feeds = ctx["cores"], ctx["slo_ms"], ctx["feeds"]
    svcs: dict[str, Any] = {}
    out = {m: {"mode": m, "http": [], "grpc": []} for m in MODES}
    try:
        for m in MODES:
            svcs[m] = serve(m, a, cores, slo_ms, tmp)
            harness.scenarios.run(svcs[m].sock, a.model, feeds, SINGLE_STREAM, duration_s=1.0)
        off = svcs["off"]
        cap = harness.scenarios.run(off.sock, a.model, feeds, OFFLINE, 2 * cores,
                                    duration_s=a.calibrate_s)  # fmt: skip
        ctx["capacity"], c = cap, cap["throughput_rps"]
        print(f"  capacity {c}/s", flush=True)
        i = 0
        for f in ctx["factors"]:
            n = max(1, round(f * cores))
            for key, spec in (
                (("closed", f, n), LoadSpec("concurrency", n)),
                (("open", f, f * c), LoadSpec("request_rate", f * c, "poisson")),
            ):
                for m in MODES if i % 2 == 0 else MODES[::-1]:
                    out[m]["http"].append(measure_http(svcs[m], a, ctx, key, spec))
                i += 1
                print(f"  http {key[0]} {f:g}x done", flush=True)
        spec = LoadSpec("request_rate", 2 * c, "poisson")
        out["on"]["keepalive16"] = measure_http(
            svcs["on"], a, ctx, ("keepalive16", 2.0, 2 * c), spec, 16
        )
        for f in ctx["factors"]:
            n = max(1, round(f * cores))
            for m in MODES if i % 2 == 0 else MODES[::-1]:
                g = grpc_closed(str(tmp / f"{m}-grpc.sock"), a.model, feeds, n, a.grpc_s, slo_ms)
                if g is None:
                    out[m]["grpc"] = None
                elif out[m]["grpc"] is not None:
                    out[m]["grpc"].append({"kind": "closed", "factor": f, "load": n, **g})
            i += 1
    finally:
        for m, svc in svcs.items():
            out[m]["serve_log_tail"] = svc.log_path.read_text().splitlines()[-20:]
            svc.__exit__(None, None, None)
            out[m]["stop"] = svc.stopped
    return [out[m] for m in MODES]


def compare(data: dict[str, Any], tolerance: float, slo_ms: float) -> dict[str, Any]:
    """Per point: goodput on / off and whether on >= ``tolerance`` x off; the keep-alive
    check (admitted P99 from send <= 2 x SLO)."""
    by = {m["mode"]: m for m in data["modes"]}
    checks: dict[str, Any] = {}
    rows = []
    for proto in ("http", "grpc"):
        off, on = by["off"].get(proto), by["on"].get(proto)
        if not off or not on:
            continue
        for x, y in zip(off, on, strict=True):
            ratio = y["goodput_rps"] / x["goodput_rps"] if x["goodput_rps"] else None
            ok = y["goodput_rps"] >= tolerance * x["goodput_rps"]
            key = f"{proto}_{x['kind']}_{x['factor']:g}x"
            checks[f"goodput_on_ge_off_{key}"] = ok
            on_over_off = None if ratio is None else round(ratio, 3)
            rows.append({"point": key, "off": x, "on": y, "on_over_off": on_over_off})
    ka = by["on"].get("keepalive16")
    if ka:
        p99 = ka["admitted_p99_ms"]
        checks["keepalive16_2x_admitted_p99_within_2x_slo"] = p99 is not None and p99 <= 2 * slo_ms
    return {"rows": rows, "checks": checks, "passed": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    p = harness.cli.parser(__doc__, duration_s=30.0, quiet_wait_s=120.0)
    p.add_argument("--model", default="resnet50", choices=sorted(MODEL_SETTINGS))
    p.add_argument("--slo-x", type=float, default=3.0)
    p.add_argument("--factors", default="0.5,1,2,5")
    p.add_argument("--window-ms", type=float, default=5000.0)
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--grpc-s", type=float, default=10.0)
    p.add_argument("--calibrate-s", type=float, default=10.0, help="capacity point, s")
    p.add_argument("--tolerance", type=float, default=0.9)

    def quick(a: Any) -> None:
        a.window_ms, a.trials, a.grpc_s, a.calibrate_s = 1500.0, 3, 3.0, 4.0

    a = harness.cli.parse(p, argv, quick)
    from infscaler.api.codec import encode_infer_request

    res = harness.cli.start("admission_goodput", a)
    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 8 if a.quick else 20)
    slo_ms = a.slo_x * cal["l0_ms"]
    body, headers = encode_infer_request(feeds, binary=True, binary_output=True)
    ctx: dict[str, Any] = {"cores": cal["cores"], "slo_ms": slo_ms, "feeds": feeds, "body": body,
                           "headers": headers, "factors": [float(x) for x in a.factors.split(",")]}  # fmt: skip
    print(f"== {a.model}: L0 {cal['l0_ms']} ms, SLO {slo_ms:.1f} ms, {len(body)} B a request")
    modes = run_all(a, ctx, Path(tempfile.mkdtemp(prefix="isc-admission-")))
    comparison = compare({"modes": modes}, a.tolerance, slo_ms)
    for r in comparison["rows"]:
        for mode in MODES:
            res.add(point=r["point"], mode=mode, slo_ms=round(slo_ms, 2), **r[mode])
    res.summary.update(calibration=cal, slo_ms=round(slo_ms, 2), request_bytes=len(body),
                       capacity=ctx["capacity"], modes=modes, comparison=comparison)  # fmt: skip
    harness.cli.finish(res, a, plot if res.points else None)
    harness.print_table(
        ["point", "load", "good off", "good on", "on/off", "P99 off", "P99 on", "refused/s on"],
        [[r["point"], r["off"]["load"], r["off"]["goodput_rps"], r["on"]["goodput_rps"],
          r["on_over_off"], r["off"]["admitted_p99_ms"], r["on"]["admitted_p99_ms"],
          r["on"]["refused_rps"]] for r in comparison["rows"]],
    )  # fmt: skip
    print("checks:", comparison["checks"], "passed:", comparison["passed"])
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Goodput and admitted P99 from send against the load factor, admission on and off,
    one panel per protocol and load kind, the SLO as a line."""
    pts = [{**p, "cell": p["point"].rsplit("_", 1)[0]} for p in data["points"]]
    harness.plot(pts, path, x="factor", y=["goodput_rps", "admitted_p99_ms"], by="mode",
                 panel="cell", hline_key="slo_ms", logy=True, xlabel="load, x capacity (or x cores)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
