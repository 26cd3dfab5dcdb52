"""``infscaler perf``: perf_analyzer's measurement of a served model or pipeline over the
service's Unix socket (:mod:`infscaler.api.loadgen`): a concurrency or request-rate sweep,
one line per window on stderr, then a table per point (``--csv``: perf_analyzer's ``-f``
columns where they mean the same; ``--json``: everything).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich import box
from rich.table import Table

from infscaler.base.errors import InfScalerError
from infscaler.cli import err, out
from infscaler.cli.client import SocketOpt, default_socket

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

__all__ = ["CSV_COLUMNS", "csv_rows", "perf_cmd", "perf_table", "window_line"]

#: ``--csv`` columns: perf_analyzer's ``-f`` names (latencies in usec, as it writes them)
#: where they mean the same, then InfScaler's own. The first is ``Concurrency`` or
#: ``Request Rate`` by the sweep.
CSV_COLUMNS = [
    "Inferences/Second",
    "Server Queue",
    "Server Compute Infer",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
    "Goodput/Second",
    "Refused/Second",
    "Errors/Second",
    "Stable",
    "Trials",
]


def _us(ms: float | None) -> str:
    return "" if ms is None else str(round(ms * 1000))


def csv_rows(points: list[dict[str, Any]]) -> list[list[str]]:
    """The CSV, header first, of :meth:`PointResult.to_dict` points: latencies in usec,
    rates per second, an empty cell where there is no value."""
    first = "Concurrency" if points and points[0]["mode"] == "concurrency" else "Request Rate"
    rows = [[first, *CSV_COLUMNS]]
    for p in points:
        lat, srv = p["latency_ms"], p["server"] or {}
        rows.append(
            [
                f"{p['value']:g}",
                f"{p['throughput']:.2f}",
                _us(srv.get("queue_ms")),
                _us(srv.get("compute_ms")),
                *(_us(lat[k]) for k in ("p50", "p90", "p95", "p99", "mean")),
                "" if p["goodput"] is None else f"{p['goodput']:.2f}",
                f"{p['refused_per_s']:.2f}",
                f"{p['errors_per_s']:.2f}",
                "1" if p["stable"] else "0",
                str(p["trials"]),
            ]
        )
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def perf_table(points: list[dict[str, Any]], slo: bool) -> Table:
    """One row per point in 80 columns: load, infer/s (``*``: not stable), P50-P99 ms,
    goodput/s (with --slo), refused/s, errors/s, the server's queue and compute ms."""
    conc = bool(points) and points[0]["mode"] == "concurrency"
    t = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    cols = [
        "conc" if conc else "req/s",
        "infer/s",
        "P50",
        "P90",
        "P95",
        "P99",
        *(["good/s"] if slo else []),
        "refus/s",
        "err/s",
        "queue",
        "comp",
    ]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for p in points:
        lat, srv = p["latency_ms"], p["server"] or {}
        t.add_row(
            f"{p['value']:g}",
            f"{p['throughput']:.1f}" + ("" if p["stable"] else "*"),
            *(_ms(lat[k]) for k in ("p50", "p90", "p95", "p99")),
            *([_ms(p["goodput"])] if slo else []),
            f"{p['refused_per_s']:.1f}",
            f"{p['errors_per_s']:.1f}",
            _ms(srv.get("queue_ms")),
            _ms(srv.get("compute_ms")),
        )
    return t


def load_input_dir(path: Path) -> dict[str, np.ndarray]:
    if not path.is_dir():
        raise InfScalerError(
            f"--input-data {path} is not a directory", hint="give a directory of NAME.npy files"
        )
    arrays: dict[str, np.ndarray] = {}
    for f in sorted(path.rglob("*.npy")):  # an input named a/b is a/b.npy
        try:
            arrays[f.relative_to(path).with_suffix("").as_posix()] = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InfScalerError(f"cannot read {f}: {exc}") from None
    if not arrays:
        raise InfScalerError(
            f"--input-data {path} holds no .npy file", hint="one NAME.npy per input"
        )
    return arrays


def load_specs(
    concurrency: str | None, rate: str | None, distribution: str, arrivals: str | None
) -> list[Any]:
    from infscaler.api.loadgen import LoadSpec, parse_range

    if concurrency is not None and rate is not None:
        raise InfScalerError(
            "give --concurrency-range or --request-rate-range, not both",
            hint="one sweep per run, as perf_analyzer",
        )
    if distribution not in ("constant", "poisson"):
        raise InfScalerError(
            f"unknown --request-distribution {distribution!r}", hint="use constant or poisson"
        )
    if arrivals is not None and rate is None:
        raise InfScalerError(
            "--arrivals replays a trace at a request rate",
            hint="add --request-rate-range (the trace's mean rate), e.g. 5:20:5",
        )
    if rate is not None:
        dist = arrivals or distribution
        return [LoadSpec("request_rate", r, dist) for r in parse_range(rate, integer=False)]
    values = parse_range(concurrency or "1", integer=True)
    return [LoadSpec("concurrency", c) for c in values]


ArrivalsOpt = Annotated[
    str | None,
    typer.Option(
        "--arrivals",
        help="Replay a trace at each request rate (its mean): azure (the Azure "
        "Functions 2019 trace), azure:busiest, gamma:CV2, azure-llm.",
    ),
]
ModeOpt = Annotated[
    str,
    typer.Option(
        "--measurement-mode",
        help="time_windows (--measurement-interval) or count_windows "
        "(--measurement-request-count answers).",
    ),
]
CountOpt = Annotated[
    int,
    typer.Option("--measurement-request-count", help="Answers per window in count_windows.", min=1),
]


@app.command("perf")
def perf_cmd(
    model: Annotated[str, typer.Argument(help="Model (pipeline) name the service serves.")],
    socket: SocketOpt = None,
    concurrency_range: Annotated[
        str | None,
        typer.Option(
            "--concurrency-range",
            help="START[:END[:STEP]] requests in flight (closed loop); default 1.",
        ),
    ] = None,
    request_rate_range: Annotated[
        str | None,
        typer.Option(
            "--request-rate-range", help="START[:END[:STEP]] requests/s sent (open loop)."
        ),
    ] = None,
    request_distribution: Annotated[
        str,
        typer.Option(
            "--request-distribution", help="Arrivals at a request rate: constant or poisson."
        ),
    ] = "constant",
    arrivals: ArrivalsOpt = None,
    shape: Annotated[
        list[str] | None,
        typer.Option("--shape", help="NAME:1x3x224x224 for a dynamic input (repeatable)."),
    ] = None,
    input_data: Annotated[
        Path | None,
        typer.Option(
            "--input-data",
            help="Directory of NAME.npy, one per input (a/b.npy for input a/b; else random).",
        ),
    ] = None,
    shared_memory: Annotated[
        str,
        typer.Option("--shared-memory", help="none (binary tensor data) or system."),
    ] = "none",
    measurement_interval: Annotated[
        float,
        typer.Option("--measurement-interval", "-p", help="Window length, ms.", min=10),
    ] = 5000.0,
    stability_percentage: Annotated[
        float,
        typer.Option(
            "--stability-percentage",
            "-s",
            help="3 consecutive windows within this % are stable.",
            min=0,
        ),
    ] = 10.0,
    measurement_mode: ModeOpt = "time_windows",
    measurement_request_count: CountOpt = 50,
    max_trials: Annotated[
        int, typer.Option("--max-trials", help="Windows at most per point.", min=1)
    ] = 10,
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="Goodput: answers within this latency per s (e.g. 100ms)."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="A request unanswered after this (s) is an error.")
    ] = 60.0,
    csv_file: Annotated[
        Path | None, typer.Option("--csv", "-f", help="Write perf_analyzer's CSV columns here.")
    ] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write all results here.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="For random inputs and arrivals.")] = 0,
) -> None:
    """Measure a served model at a concurrency or request-rate sweep, as perf_analyzer:
    infer/s, P50-P99 ms, goodput at --slo, refusals, errors, server queue / compute."""
    from infscaler.api.client import Client
    from infscaler.api.loadgen import LoadGenerator, MeasureConfig, input_tensors, parse_shapes
    from infscaler.base.slo import slo_ms

    specs = load_specs(concurrency_range, request_rate_range, request_distribution, arrivals)
    if shared_memory not in ("none", "system"):
        raise InfScalerError(
            f"unknown --shared-memory {shared_memory!r}", hint="use none or system"
        )
    if measurement_mode not in ("time_windows", "count_windows"):
        raise InfScalerError(
            f"unknown --measurement-mode {measurement_mode!r}",
            hint="use time_windows or count_windows",
        )
    count = measurement_request_count if measurement_mode == "count_windows" else None
    bound = slo_ms(slo) if slo is not None else None
    shapes = parse_shapes(shape or [])
    given = load_input_dir(input_data) if input_data is not None else None
    sock = default_socket(socket)
    with Client(sock) as c:
        meta = c.model_metadata(model)
    feeds = input_tensors(meta, shapes, given, seed=seed)
    cfg = MeasureConfig(
        interval_ms=measurement_interval,
        stability_pct=stability_percentage,
        max_trials=max_trials,
        slo_ms=bound,
        timeout_s=timeout,
        seed=seed,
        request_count=count,
    )
    gen = LoadGenerator(sock, model, feeds, shared_memory=shared_memory == "system")
    points = [p.to_dict() for p in _measure(gen, specs, cfg)]
    if json_file is not None:
        doc = {
            "model": model,
            "socket": sock,
            "config": {**cfg.__dict__, "shared_memory": shared_memory},
            "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in feeds.items()},
            "points": points,
        }
        json_file.write_text(json.dumps(doc, indent=1))
    if csv_file is not None:
        with csv_file.open("w", newline="") as f:
            csv.writer(f).writerows(csv_rows(points))
    _print(points, cfg)


def _print(points: list[dict[str, Any]], cfg: Any) -> None:
    out.print(perf_table(points, cfg.slo_ms is not None))
    if any(not p["stable"] for p in points):
        window = (
            f"{cfg.interval_ms:g} ms"
            if cfg.request_count is None
            else f"{cfg.request_count} answers"
        )
        out.print(
            f"* not stable within {cfg.max_trials} windows of {window} "
            f"(±{cfg.stability_pct:g} %): the last 3 are reported",
            highlight=False,
        )
    out.print("latency ms (client side); queue / comp: server ms per request", highlight=False)


def _measure(gen: Any, specs: list[Any], cfg: Any) -> list[Any]:
    """Run the sweep, saying on stderr as it goes (as perf_analyzer's ``Pass [n]``
    lines): one line as each point starts, one per window measured."""

    def on_point(spec: Any) -> None:
        err.print(_start_line(spec, cfg), highlight=False, markup=False, soft_wrap=True)

    def on_window(spec: Any, trial: int, w: Any) -> None:
        err.print(window_line(spec, trial, w), highlight=False, markup=False, soft_wrap=True)

    return gen.run(specs, cfg, on_window, on_point)


def _start_line(spec: Any, cfg: Any) -> str:
    window = (
        f"{cfg.interval_ms:g} ms" if cfg.request_count is None else f"{cfg.request_count} answers"
    )
    return (
        f"{_label(spec)}: measuring, windows of {window}, at most {cfg.max_trials}, "
        f"until 3 are within {cfg.stability_pct:g} %"
    )


def window_line(spec: Any, trial: int, w: Any) -> str:
    """One progress line for window ``trial`` (from 1): throughput, mean latency, refusals
    and errors per second with their top codes, the server's queue / compute ms."""
    line = f"{_label(spec)}: pass [{trial}] {w.throughput:.1f} infer/s"
    mean = w.mean_ms
    line += ", mean -" if mean is None else f", mean {_ms(mean)} ms"
    for what, counts in (("refused", w.refused), ("errors", w.errors)):
        n = sum(counts.values())
        if n:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            codes = ", ".join(f"{k} {v}" for k, v in top)
            rate = n / w.duration_s if w.duration_s > 0 else 0.0
            line += f", {what} {rate:.1f}/s ({codes})"
    if w.server:
        line += (
            f", server queue {_ms(w.server['queue_ms'])} / comp {_ms(w.server['compute_ms'])} ms"
        )
    return line


def _label(spec: Any) -> str:
    if spec.mode == "concurrency":
        return f"concurrency {spec.value:g}"
    return f"{spec.value:g} req/s {spec.distribution}"
