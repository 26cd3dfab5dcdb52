"""``infscaler plan``: the starting configuration of a pipeline for an arrival rate and a
latency SLO: compiled as ``serve`` would, each unit measured in-process, then the
planner's least-memory configuration whose simulated P99 meets the SLO within the device's
cap (:func:`infscaler.runtime.planning.planner.plan`); with ``--fleet``, many streams
placed on many nodes (:func:`plan_fleet`).

Exit status: 0 with a configuration, 1 when none meets the SLO within the cap, 2 on bad
arguments.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
import yaml
from rich.markup import escape

from infscaler.base.device import load_profile
from infscaler.base.errors import InfScalerError
from infscaler.base.slo import parse_slo
from infscaler.cli import err, out
from infscaler.cli.client import fmt_ms, input_feeds, pipeline_from_arg
from infscaler.cli.fleetfile import expand_names, load_fleet, units_from_spec
from infscaler.cli.tables import Col, print_table
from infscaler.cli.units import parse_rate, parse_slo_ms
from infscaler.partitioner.search import OBJECTIVES
from infscaler.runtime.planning.arrivals import from_spec
from infscaler.runtime.planning.autoplan import plan_measured
from infscaler.runtime.planning.fleet import (
    GROUP_LABEL,
    FleetNode,
    Stream,
    capacity_curve,
    place,
    realise,
)
from infscaler.runtime.planning.planner import (
    FRONTEND_MS,
    HANDOVER_MS,
    ModelStage,
    plan,
    resource_cap,
)
from infscaler.runtime.planning.unitprofile import profile_pipeline, sample_inputs
from infscaler.runtime.serving.pipeline import compile_pipeline

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

__all__ = ["plan_cmd", "search_cmd"]

#: Requests the default --duration simulates at least (a P99 from fewer is mostly noise).
MIN_REQUESTS = 2000


def _load_inputs(inputs: list[str], image: Path | None, compiled: Any) -> dict[str, np.ndarray]:
    names = [i.name for i in compiled.inputs]
    uint8 = [i.name for i in compiled.inputs if i.datatype == "UINT8"]
    feeds = input_feeds(inputs, image, "a pipeline", compiled.name, names, uint8)
    if feeds:
        unknown = sorted(set(feeds) - {i.name for i in compiled.inputs})
        if unknown:
            raise InfScalerError(
                f"{compiled.name} has no inputs {unknown}",
                hint=f"its inputs: {[i.name for i in compiled.inputs]}",
            )
        # inputs not given: made up, as without any
        feeds = {**sample_inputs(compiled), **feeds}
    return feeds


def _device(name: str | None) -> Any:

    return load_profile(name or "cpu-host")


def print_plan(res: Any, name: str, device: Any, duration_s: float) -> None:
    pred = res.prediction
    head = "Starting configuration" if res.feasible else "INFEASIBLE: last configuration tried"
    out.print(
        f"[bold]{head}[/] for {name}: {res.rate:g} requests/s ({res.arrivals}), "
        f"SLO {res.slo_ms:g} ms, device {device.name}",
        highlight=False,
    )
    rows = []
    for r in res.rows():
        unit = r["unit"] + (" (front end)" if r["kind"] == "front end" else "")
        if r["items_per_request"] is not None:
            unit += f" (x{r['items_per_request']:g} items)"
        rows.append(
            [
                escape(unit),
                r["engine"],
                str(r["instances"]),
                str(r["batch"]),
                f"{r['service_ms']:.3g}",
                "-" if r["utilisation"] is None else f"{r['utilisation']:.0%}",
                f"{r['memory_mb']:.0f}",
            ]
        )
    cols = [Col("unit"), Col("engine"), Col("instances", "num"), Col("batch", "num")]
    cols += [Col("service ms", "num"), Col("utilisation", "num"), Col("memory MB", "num")]
    print_table(out, None, cols, rows)
    cap = "no cap" if res.memory_cap_mb == float("inf") else f"cap {res.memory_cap_mb:.0f} MB"
    if pred is not None:
        att = "" if pred.slo_attainment is None else f", SLO attainment {pred.slo_attainment:.1%}"
        out.print(
            f"predicted: P99 {fmt_ms(pred.p99_ms)} ms (P50 {fmt_ms(pred.p50_ms)}), throughput "
            f"{pred.throughput_rps:.1f} requests/s{att} over {duration_s:g} s simulated "
            f"({pred.requests} requests)",
            highlight=False,
        )
    out.print(
        f"memory: {res.memory_mb:.0f} MB ({cap}; instances + pool {res.pool_mb:g} MB); "
        f"{res.simulations} simulations",
        highlight=False,
    )
    for s in res.steps:
        out.print(f"  [dim]{s}[/]", highlight=False)
    for n in res.notes:
        err.print(f"[yellow]note:[/] {n}", highlight=False)


PipelineArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="PIPELINE.yaml, MODEL.onnx, a bundled model alias, a plan directory, or "
        "`ocr` (what `serve` takes); several: planned together within the device's cap "
        "(docs/scaling.md). Not with --fleet.",
        show_default=False,
    ),
]
RateOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rate",
        help="Mean arrival rate: 40/s (or 40, 2400/min); with several pipelines NAME=RATE "
        "per pipeline (repeatable; none: its max rate).",
        show_default=False,
    ),
]
SloOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--slo",
        help="End-to-end P99 SLO: 200ms or 0.2s; with several pipelines NAME=SLO "
        "(repeatable; default: the pipeline's own slo).",
        show_default=False,
    ),
]
TopOpt = Annotated[
    int,
    typer.Option(
        "--top", help="Several pipelines: candidates per pipeline the joint choice tries."
    ),
]
DeviceOpt = Annotated[
    str | None,
    typer.Option("--device", help="Device profile whose cap applies (default cpu-host)."),
]
ArrivalsOpt = Annotated[
    str,
    typer.Option(
        "--arrivals",
        help="Sample arrival process: poisson, gamma:CV2 (gamma:4), azure (Azure "
        "Functions 2019, scaled to --rate), azure:busiest, azure-llm.",
    ),
]
DurationOpt = Annotated[
    float | None,
    typer.Option(
        "--duration",
        help="Seconds of arrivals to simulate (default: 60, or enough for 2000 requests).",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of arrivals and service times.")]
HandoverOpt = Annotated[
    float,
    typer.Option(
        "--handover-ms",
        help="Time of one token handover, ms (default: the served hop measured by bench/chain_latency.py).",
    ),
]
PoolOpt = Annotated[
    float, typer.Option("--pool-mb", help="Tensor pool memory counted with instances, MB.")
]
RepeatsOpt = Annotated[
    int, typer.Option("--repeats", help="Timed runs of the sample input per unit.")
]
InputOpt = Annotated[
    list[str] | None,
    typer.Option("--input", "-i", help="Sample input NAME=FILE.npy (repeatable)."),
]
ImageOpt = Annotated[
    Path | None, typer.Option("--image", help="An image file for the UINT8 input.")
]
PartitionsOpt = Annotated[
    int | None, typer.Option("--partitions", "-k", help="Partition bare models into K.")
]
StateDirOpt = Annotated[Path | None, typer.Option("--state-dir", help="Plans (as for `serve`).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
FleetOpt = Annotated[
    Path | None,
    typer.Option(
        "--fleet",
        help="FLEET.yaml: place its streams on its nodes with the fewest nodes "
        "(docs/fleet.md); PIPELINE, --rate, --slo, --device are then not used.",
    ),
]
ValuesOpt = Annotated[
    Path | None,
    typer.Option("--values", help="With --fleet: write the Helm values (groups) here."),
]
ExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="Search K, cuts, threads and instances and print every candidate with why it lost.",
    ),
]
ObjectiveOpt = Annotated[
    str | None,
    typer.Option(
        "--objective",
        help="Partition objectives the search tries: auto (eq1, minmax, weights), "
        "eq1 (the paper's Eq. 1 only), minmax or weights. Implies the search.",
    ),
]
MaxPartitionsOpt = Annotated[
    int, typer.Option("--max-partitions", help="Search: largest K per model stage.")
]
FrontendOpt = Annotated[
    float | None,
    typer.Option("--frontend-ms", help="Search: front-end CPU per request, ms."),
]
RefineOpt = Annotated[
    int,
    typer.Option(
        "--refine",
        help="Search: measure the partitions of the N best candidates and search "
        "again (0: estimates from the whole model's time only).",
    ),
]


@app.command("plan")
def plan_cmd(
    pipelines: PipelineArg = None,
    rates: RateOpt = None,
    slos: SloOpt = None,
    device: DeviceOpt = None,
    arrivals: ArrivalsOpt = "poisson",
    duration: DurationOpt = None,
    seed: SeedOpt = 0,
    handover_ms: HandoverOpt = HANDOVER_MS,
    pool_mb: PoolOpt = 0.0,
    repeats: RepeatsOpt = 5,
    inputs: InputOpt = None,
    image: ImageOpt = None,
    partitions: PartitionsOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    values_out: ValuesOpt = None,
    explain: ExplainOpt = False,
    objective: ObjectiveOpt = None,
    max_partitions: MaxPartitionsOpt = 3,
    frontend_ms: FrontendOpt = None,
    refine: RefineOpt = 3,
    top: TopOpt = 6,
) -> None:
    """Plan the starting configuration: per unit engine, instances and batch with the
    least memory whose simulated P99 meets --slo at --rate within the device's cap.
    Several pipelines: one configuration each, together within the cap, by priority.
    With --fleet: place many streams on many nodes (each planned as above)."""
    if len(pipelines or []) > 1 and fleet is None:
        code = _plan_set(pipelines or [], rates or [], slos or [], device, explain, as_json,
                         objective, max_partitions, frontend_ms, refine, arrivals, seed,
                         handover_ms, top)  # fmt: skip
        if code:
            raise typer.Exit(code)
        return
    pipeline = (pipelines or [""])[0]
    rate, slo = _one(rates, "--rate"), _one(slos, "--slo")
    if fleet is not None:
        if pipeline or rate or slo or device:
            raise InfScalerError(
                "--fleet takes the pipelines, rates, SLOs and devices from the fleet file",
                hint="drop PIPELINE / --rate / --slo / --device, or drop --fleet",
            )
        code = plan_fleet(
            fleet,
            as_json=as_json,
            values_out=values_out,
            seed=seed,
            state_dir=state_dir,
            repeats=repeats,
        )
        if code:
            raise typer.Exit(code)
        return
    if not pipeline:
        raise InfScalerError(
            "plan needs a PIPELINE (or --fleet FLEET.yaml)", hint="e.g. infscaler plan ocr"
        )
    if explain or objective is not None or not rate:
        code = search_cmd(
            pipeline,
            slo=slo,
            rate=rate or None,
            device=device,
            objective=objective or "auto",
            max_partitions=max_partitions,
            frontend_ms=frontend_ms,
            refine=refine,
            arrivals=arrivals,
            seed=seed,
            handover_ms=handover_ms,
            repeats=repeats,
            as_json=as_json,
        )
        if code:
            raise typer.Exit(code)
        return

    rate_rps, slo_ms, duration = _rate_plan_args(rate, slo, duration, handover_ms, pool_mb, repeats)
    profile = _device(device)
    times = _arrival_times(arrivals, rate_rps, duration, seed)
    cfg = pipeline_from_arg(pipeline, partitions)
    compiled = compile_pipeline(
        cfg,
        state_dir=state_dir,
        device=profile,
        progress=lambda m: err.print(f"  {m}", highlight=False),
    )
    feeds = _load_inputs(list(inputs or []), image, compiled)
    with err.status(f"measuring {len(compiled.units)} units of {compiled.name} in-process"):
        prof = profile_pipeline(compiled, feeds or None, repeats=repeats, device=profile)
    with err.status(f"simulating {compiled.name} at {rate_rps:g} requests/s"):
        res = plan(
            prof.units,
            rate_rps,
            slo_ms,
            profile,
            arrivals=times,
            duration_s=duration,
            seed=seed,
            handover_ms=handover_ms,
            pool_mb=pool_mb,
            max_inflight=compiled.config.max_inflight or "auto",
        )
    res = replace(res, arrivals=arrivals)
    _print_rate_plan(res, prof, compiled.name, profile, duration, seed, as_json)
    if not res.feasible:
        err.print(f"[bold red]infeasible:[/] {res.reason}", highlight=False)
        raise typer.Exit(1)


def _one(values: list[str] | None, option: str) -> str:
    """The one value of ``option`` for one pipeline ("" when not given).

    Raises:
        InfScalerError: given more than once.
    """
    if values and len(values) > 1:
        raise InfScalerError(f"{option} given {len(values)} times for one pipeline",
                             hint=f"NAME= values are for several pipelines: {option} X once")  # fmt: skip
    return values[0] if values else ""


def _plan_set(
    pipelines: list[str], rates: list[str], slos: list[str], device: str | None,
    explain: bool, as_json: bool, objective: str | None, max_partitions: int,
    frontend_ms: float | None, refine: int, arrivals: str, seed: int, handover_ms: float,
    top: int,
) -> int:  # fmt: skip
    """Several pipelines planned together (:func:`infscaler.cli.planset.plan_set_cmd`),
    the search's arguments checked as for one (:func:`_search_args`)."""
    from infscaler.cli.planset import plan_set_cmd

    _, _, objectives, fe = _search_args(
        "1x", None, objective or "auto", refine, max_partitions, frontend_ms, handover_ms,
        arrivals, seed,
    )  # fmt: skip
    if top < 1:
        raise InfScalerError(f"--top must be >= 1, got {top}")
    search = {"objectives": objectives, "refine": refine, "frontend_ms": fe, "seed": seed,
              "arrivals": arrivals, "handover_ms": handover_ms,
              "max_partitions": max_partitions}  # fmt: skip
    return plan_set_cmd(pipelines, rates=rates, slos=slos, device=device, explain=explain,
                        as_json=as_json, search=search, top_k=top)  # fmt: skip


def _rate_plan_args(
    rate: str,
    slo: str,
    duration: float | None,
    handover_ms: float,
    pool_mb: float,
    repeats: int,
) -> tuple[float, float, float]:
    """``(requests/s, SLO ms, seconds simulated)`` of a plan at a rate (``--duration``
    by default 60 s, or enough for :data:`MIN_REQUESTS`, at most an hour).

    Raises:
        InfScalerError: a missing or bad --rate / --slo, or a bad --duration,
            --handover-ms, --pool-mb or --repeats.
    """
    if not rate:
        raise InfScalerError("plan needs --rate", hint="e.g. --rate 40/s")
    if not slo:
        raise InfScalerError("plan needs --slo", hint="e.g. --slo 200ms")
    rate_rps = parse_rate(rate)
    slo_ms = parse_slo_ms(slo)
    if duration is None:
        duration = min(3600.0, max(60.0, MIN_REQUESTS / rate_rps))
    if not duration > 0:
        raise InfScalerError(f"--duration must be positive, got {duration:g}")
    if handover_ms < 0 or pool_mb < 0:
        raise InfScalerError("--handover-ms and --pool-mb must be >= 0")
    if repeats < 1:
        raise InfScalerError(f"--repeats must be >= 1, got {repeats}")
    return rate_rps, slo_ms, duration


def _arrival_times(arrivals: str, rate_rps: float, duration: float, seed: int) -> np.ndarray:
    """The arrival times of ``--arrivals`` at ``rate_rps`` over ``duration`` s.

    Raises:
        InfScalerError: an unknown arrival process, or one that gives no requests.
    """
    try:
        times = from_spec(arrivals, rate_rps, duration, seed)
    except (ValueError, FileNotFoundError) as exc:
        raise InfScalerError(
            str(exc), hint="--arrivals poisson, gamma:4, azure, azure:busiest or azure-llm"
        ) from None
    if times.size == 0:
        raise InfScalerError(
            f"--arrivals {arrivals} gives no requests in {duration:g} s at {rate_rps:g}/s",
            hint="raise --duration or --rate",
        )
    return times


def _print_rate_plan(
    res: Any, prof: Any, name: str, profile: Any, duration: float, seed: int, as_json: bool
) -> None:
    """A plan at a rate: as JSON (the pipeline, device, duration, seed, the units'
    profile and the plan), else as tables (:func:`print_plan`) and the profile's notes."""
    if as_json:
        d = res.to_dict()
        print(
            json.dumps(
                {
                    "pipeline": name,
                    "device": profile.name,
                    "duration_s": duration,
                    "seed": seed,
                    "profile": prof.to_dict(),
                    "plan": d,
                },
                indent=2,
                default=str,
            )
        )
    else:
        print_plan(res, name, profile, duration)
        for n in prof.notes:
            err.print(f"[yellow]note:[/] {n}", highlight=False)


def search_cmd(
    pipeline: str,
    *,
    slo: str,
    rate: str | None,
    device: str | None,
    objective: str,
    max_partitions: int,
    frontend_ms: float | None,
    seed: int,
    handover_ms: float,
    repeats: int,
    as_json: bool,
    refine: int = 3,
    arrivals: str = "poisson",
) -> int:
    """``infscaler plan MODEL|PIPELINE --slo X [--rate R] --explain``: the deploy-time
    planner's search (:func:`infscaler.runtime.planning.autoplan.plan_measured`), printed:
    every candidate with why it lost, the winner, and Eq. 1's own plan beside it.
    ``--slo``: ms or a factor (``3x``) of the measured 1-thread latency. Returns the exit
    status (0: a winner, 1: none meets the SLO).

    Raises:
        InfScalerError: bad arguments (no SLO, unknown objective, ...).
    """
    spec, rate_rps, objectives, fe = _search_args(
        slo, rate, objective, refine, max_partitions, frontend_ms, handover_ms, arrivals, seed
    )
    profile = _device(device)
    say = lambda m: err.print(f"  {m}", highlight=False)  # noqa: E731
    # the deploy-time planner's own entry: model stages measured, function steps and
    # fan-out items from a sample request, the fused units, then the search
    found = plan_measured(
        pipeline_from_arg(pipeline),
        spec,
        device=profile,
        progress=say,
        searching=lambda _slo: err.status("searching K, cuts, threads and instances"),
        refine=refine,
        rate=rate_rps,
        arrivals=arrivals,
        seed=seed,
        handover_ms=handover_ms,
        frontend_ms=fe,
        max_partitions=max_partitions,
        objectives=objectives,
    )
    res, stages = found.outcome, found.stages
    eq1 = {
        st.name: (st.eq1_cuts(max_partitions), st.share(st.eq1_cuts(max_partitions)))
        for st in stages
        if isinstance(st, ModelStage)
    }
    if as_json:
        d = res.to_dict()
        d["device"] = profile.name
        d["eq1_plan"] = {n: {"cuts": list(c), "bottleneck_share": s} for n, (c, s) in eq1.items()}
        print(json.dumps(d, indent=2, default=str))
    else:
        print_search(res, stages, eq1)
    if res.best is None:
        err.print("[bold red]infeasible:[/] no candidate meets the SLO within the cap")
        return 1
    return 0


def _search_args(
    slo: str,
    rate: str | None,
    objective: str,
    refine: int,
    max_partitions: int,
    frontend_ms: float | None,
    handover_ms: float,
    arrivals: str,
    seed: int,
) -> tuple[Any, float | None, tuple[str, ...], float]:
    """The search's arguments, checked before anything slow runs: ``(SLO, requests/s or
    None, objectives, front-end ms)``.

    Raises:
        InfScalerError: no or a bad --slo, a bad --rate, --arrivals, --objective,
            --refine, --max-partitions, --frontend-ms or --handover-ms.
    """
    if not slo:
        raise InfScalerError("plan needs --slo", hint="e.g. --slo 200ms or --slo 3x")
    try:
        spec = parse_slo(slo)
    except InfScalerError as exc:
        raise InfScalerError(f"--slo: {exc.message}", hint="e.g. --slo 200ms or 3x") from None
    if spec.ms is None and spec.factor is None:
        raise InfScalerError("the search needs an SLO", hint="e.g. --slo 200ms or --slo 3x")
    rate_rps = parse_rate(rate) if rate else None

    try:  # the arrival spec is checked before anything slow runs
        from_spec(arrivals, rate_rps or 1.0, 60.0, seed)
    except (ValueError, FileNotFoundError) as exc:
        raise InfScalerError(
            str(exc), hint="--arrivals poisson, gamma:4, azure, azure:busiest or azure-llm"
        ) from None
    if objective == "auto":
        objectives: tuple[str, ...] = OBJECTIVES
    elif objective in OBJECTIVES:
        objectives = (objective,)
    else:
        raise InfScalerError(
            f"unknown --objective {objective!r}", hint="auto, eq1, minmax or weights"
        )
    if refine < 0:
        raise InfScalerError(f"--refine must be >= 0, got {refine}")
    if not 1 <= max_partitions <= 8:
        raise InfScalerError(f"--max-partitions must be 1..8, got {max_partitions}")
    fe = FRONTEND_MS if frontend_ms is None else frontend_ms
    if fe < 0 or handover_ms < 0:
        raise InfScalerError("--frontend-ms and --handover-ms must be >= 0")
    return spec, rate_rps, objectives, fe


def print_search(res: Any, stages: list[Any], eq1: dict[str, tuple[Any, float]]) -> None:
    """The search's candidates as a table (why each lost), per model stage the share of
    Eq. 1's own plan beside the winner's, and the winner with its comparisons."""
    rows = [
        [
            str(i + 1),
            escape(c.label()),
            f"{c.goodput_rps:.1f}"
            + ("" if c.goodput_lo is None else " [{:.1f}, {:.1f}]".format(*c.interval())),
            "-" if c.max_rate_rps is None else f"{c.max_rate_rps:.1f}",
            fmt_ms(c.p99_ms),
            f"{c.memory_mb:.0f}",
            "/".join(f"{s:.0%}" for s in c.share),
            escape(c.why),
        ]
        for i, c in enumerate(res.candidates)
    ]
    cols = [Col("#", "num"), Col("plan"), Col("goodput/s", "num"), Col("max/s", "num")]
    cols += [Col("P99 ms", "num"), Col("MB", "num"), Col("bottleneck"), Col("why", "text")]
    print_table(out, escape(res.explain[0]), cols, rows)
    for name, (cuts, share) in eq1.items():
        won = ""
        if res.best is not None:
            k = [s.name for s in stages if isinstance(s, ModelStage)].index(name)
            won = f"; the winner's: {res.best.share[k]:.1%} (K={len(res.best.cuts[k]) + 1})"
        out.print(
            f"{name}: Eq. 1's own plan K={len(cuts) + 1} cuts {list(cuts)} puts "
            f"{share:.1%} of the FLOPs in its bottleneck partition{won}",
            highlight=False,
        )
    if res.best is not None:
        out.print(f"[bold]winner:[/] {escape(res.best.line())}", highlight=False)
        for line in res.explain:
            if line.startswith("vs "):
                out.print(escape(line), highlight=False)


# -- infscaler plan --fleet --------------------------------------------------------------


#: Nodes listed one per line at most (more: see --json).
MAX_LISTED = 40


def _units_for(
    fleet: Any,
    base: Path,
    name: str,
    device: str,
    profile: Any,
    cache: dict,
    state_dir: Path | None,
    repeats: int,
) -> tuple[Any, ...]:

    spec = fleet.pipelines[name]
    if device in spec.devices:
        return units_from_spec(spec.devices[device])
    if spec.units is not None:
        return units_from_spec(spec.units)
    key = ("file", name)
    if key not in cache:
        path = Path(spec.file)
        path = path if path.is_absolute() else base / path
        cfg = pipeline_from_arg(str(path))
        compiled = compile_pipeline(cfg, state_dir=state_dir, device=profile)
        with err.status(f"measuring {name} in-process ({len(compiled.units)} units)"):
            prof = profile_pipeline(compiled, repeats=repeats, device=profile)
        err.print(
            f"[yellow]note:[/] {name}: unit profiles measured on this host ({prof.host}), "
            "used for every device type without its own `devices:` entry",
            highlight=False,
        )
        cache[key] = prof.units
    return cache[key]


def plan_fleet(
    path: Path,
    *,
    as_json: bool = False,
    values_out: Path | None = None,
    seed: int = 0,
    state_dir: Path | None = None,
    repeats: int = 5,
) -> int:
    """Load ``path``, compute the capacity curves (one per pipeline x SLO x device type),
    place the streams and print the placement, the node labels and the Helm values.
    Returns the exit status: 0 all placed, 1 some streams could not be placed.

    Raises:
        InfScalerError / ConfigError: a bad fleet file (its YAML path named).
    """

    fleet, base = load_fleet(path)
    profiles: dict[str, Any] = {}
    nodes: list[FleetNode] = []
    seen: set[str] = set()
    for i, n in enumerate(fleet.nodes):
        if n.device not in profiles:
            try:
                profiles[n.device] = load_profile(n.device)
            except InfScalerError as exc:
                raise InfScalerError(f"nodes[{i}].device: {exc.message}", hint=exc.hint) from None
        for name in expand_names(n.prefix, n.name, n.count):
            if name in seen:
                raise InfScalerError(f"nodes[{i}]: node {name} is listed twice")
            seen.add(name)
            nodes.append(FleetNode(name, n.device, resource_cap(profiles[n.device])))
    streams: list[Stream] = []
    seen = set()
    for i, s in enumerate(fleet.streams):
        try:
            rate = parse_rate(str(s.rate))
            slo_text = s.slo if s.slo is not None else fleet.pipelines[s.pipeline].slo
            if slo_text is None:
                raise InfScalerError(f"no SLO: set slo on the stream or on pipelines.{s.pipeline}")
            slo_ms = parse_slo_ms(str(slo_text) if not isinstance(slo_text, str) else slo_text)
        except InfScalerError as exc:
            raise InfScalerError(f"streams[{i}]: {exc.message}", hint=exc.hint) from None
        for name in expand_names(s.prefix, s.name, s.count):
            if name in seen:
                raise InfScalerError(f"streams[{i}]: stream {name} is listed twice")
            seen.add(name)
            streams.append(Stream(name, s.pipeline, rate, slo_ms))
    keys = sorted({s.key for s in streams})
    curves = {}
    cache: dict = {}
    t0 = time.perf_counter()
    for p, slo_ms in keys:
        for d, prof in sorted(profiles.items()):
            units = _units_for(fleet, base, p, d, prof, cache, state_dir, repeats)
            with err.status(f"planning {p} at SLO {slo_ms:g} ms on {d}"):
                curves[(p, slo_ms, d)] = capacity_curve(
                    p, units, slo_ms, d, prof, pool_mb=fleet.pool_mb, seed=seed
                )
    curve_s = time.perf_counter() - t0
    res = place(streams, nodes, curves, pool_mb=fleet.pool_mb)
    res.curve_seconds = curve_s
    k8s = realise(res)
    if values_out is not None:
        values_out.write_text(
            "# Helm values from `infscaler plan --fleet` (merge with -f into the chart)\n"
            + yaml.safe_dump(k8s["values"], sort_keys=False)
        )
    if as_json:
        d = res.to_dict()
        d["kubernetes"] = k8s
        print(json.dumps(d, indent=2, default=str))
        return 0 if res.feasible else 1
    cols = [Col("pipeline"), Col("SLO ms", "num"), Col("device")]
    cols += [Col("max requests/s", "num"), Col("planner runs", "num")]
    rows = [
        [escape(c.pipeline), f"{c.slo_ms:g}", c.device, f"{c.max_rate:.1f}", str(c.planner_runs)]
        for c in curves.values()
    ]
    print_table(out, "capacity per node (single-device planner)", cols, rows)
    out.print(
        f"[bold]{len(res.nodes)} nodes used[/] of {len(nodes)} for {len(streams)} streams "
        f"(lower bound {res.lower_bound}, by {res.bound_by}); packing {res.seconds:.2f} s, "
        f"capacity curves {curve_s:.1f} s",
        highlight=False,
    )
    cols = [Col("node"), Col("device"), Col("pipeline"), Col("requests/s", "num")]
    cols += [Col("streams", "num"), Col("planned for /s", "num")]
    rows = []
    for n in res.nodes[:MAX_LISTED]:
        for key, rate in sorted(n.rates.items()):
            c = curves[(key[0], key[1], n.device)]
            rows.append(
                [
                    escape(n.node),
                    n.device,
                    escape(f"{key[0]} @{key[1]:g}ms"),
                    f"{rate:.1f}",
                    str(len(n.streams[key])),
                    f"{c.rates[n.levels[key]]:.1f}",
                ]
            )
    print_table(out, "placement", cols, rows)
    if len(res.nodes) > MAX_LISTED:
        out.print(f"... {len(res.nodes) - MAX_LISTED} more nodes (--json lists them all)")
    out.print("Kubernetes: label the nodes, then install the chart with the groups:")
    for node, group in list(k8s["labels"].items())[:MAX_LISTED]:
        out.print(
            f"  kubectl label node {node} {GROUP_LABEL}={group} --overwrite",
            highlight=False,
            soft_wrap=True,
        )
    if len(k8s["labels"]) > MAX_LISTED:
        out.print(f"  ... {len(k8s['labels']) - MAX_LISTED} more (--json)")
    out.print(yaml.safe_dump(k8s["values"], sort_keys=False), highlight=False)
    for name, why in list(res.unplaced.items())[:MAX_LISTED]:
        err.print(f"[bold red]not placed:[/] {name}: {why}", highlight=False)
    if len(res.unplaced) > MAX_LISTED:
        err.print(f"... {len(res.unplaced) - MAX_LISTED} more not placed")
    return 0 if res.feasible else 1
