"""Fleet commands: ``infscaler plan --fleet FLEET.yaml`` (its body, :func:`plan_fleet`),
``infscaler watch-pipelines DIR`` (the Kubernetes ConfigMap roll-out path) and
``infscaler probe live|ready`` (the DaemonSet's exec probes). Registered on
:data:`infscaler.cli.app`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from infscaler.base.errors import InfScalerError
from infscaler.cli import app, err, out

__all__ = ["plan_fleet"]

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
    from infscaler.fleetfile import units_from_spec

    spec = fleet.pipelines[name]
    if device in spec.devices:
        return units_from_spec(spec.devices[device])
    if spec.units is not None:
        return units_from_spec(spec.units)
    key = ("file", name)
    if key not in cache:
        from infscaler.cli_service import pipeline_from_arg
        from infscaler.runtime.pipeline import compile_pipeline
        from infscaler.runtime.unitprofile import profile_pipeline

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
    from infscaler.base.device import load_profile
    from infscaler.cli_plan import parse_rate, parse_slo_ms
    from infscaler.fleetfile import expand_names, load_fleet
    from infscaler.runtime.fleet import (
        GROUP_LABEL,
        FleetNode,
        Stream,
        capacity_curve,
        place,
        realise,
    )
    from infscaler.runtime.planner import resource_cap

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
    table = Table(title="capacity per node (single-device planner)")
    for col in ("pipeline", "SLO ms", "device", "max requests/s", "planner runs"):
        table.add_column(col, justify="left" if col in ("pipeline", "device") else "right")
    for c in curves.values():
        table.add_row(
            c.pipeline, f"{c.slo_ms:g}", c.device, f"{c.max_rate:.1f}", str(c.planner_runs)
        )
    out.print(table)
    out.print(
        f"[bold]{len(res.nodes)} nodes used[/] of {len(nodes)} for {len(streams)} streams "
        f"(lower bound {res.lower_bound}, by {res.bound_by}); packing {res.seconds:.2f} s, "
        f"capacity curves {curve_s:.1f} s",
        highlight=False,
    )
    table = Table(title="placement")
    for col in ("node", "device", "pipeline", "requests/s", "streams", "planned for /s"):
        table.add_column(col)
    for n in res.nodes[:MAX_LISTED]:
        for key, rate in sorted(n.rates.items()):
            c = curves[(key[0], key[1], n.device)]
            table.add_row(
                n.node,
                n.device,
                f"{key[0]} @{key[1]:g}ms",
                f"{rate:.1f}",
                str(len(n.streams[key])),
                f"{c.rates[n.levels[key]]:.1f}",
            )
    out.print(table)
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


# -- the roll-out path and the probes ------------------------------------------------------


@app.command("watch-pipelines")
def watch_cmd(
    directory: Annotated[
        Path, typer.Argument(help="Directory of PIPELINE.yaml files (a mounted ConfigMap).")
    ],
    socket: Annotated[str | None, typer.Option("--socket", help="The service's socket.")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between looks.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Sync once and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Keep the service's pipelines equal to DIR's *.yaml files: load a new or changed
    one (replaced once the new one is ready), unload one whose file went away."""
    from infscaler.cli_service import default_socket
    from infscaler.watcher import PipelineWatcher

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    if not directory.is_dir():
        raise InfScalerError(
            f"{directory} is not a directory", hint="mount the pipelines ConfigMap there"
        )
    w = PipelineWatcher(
        directory, default_socket(socket), log=lambda m: err.print(m, highlight=False)
    )
    if once:
        res = w.sync()
        raise typer.Exit(1 if res.failed else 0)
    w.run(interval)


@app.command("probe")
def probe_cmd(
    what: Annotated[str, typer.Argument(help="live | ready")],
    socket: Annotated[str | None, typer.Option("--socket", help="The service's socket.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds.")] = 5.0,
) -> None:
    """Exit 0 if the service is live (answers) / ready (every pipeline deployed and
    ready, not draining), else 1 with the reason: a Kubernetes exec probe."""
    from infscaler.cli_service import default_socket
    from infscaler.client import Client

    if what not in ("live", "ready"):
        raise InfScalerError(f"unknown probe {what!r}", hint="live or ready")
    path = default_socket(socket)
    try:
        with Client(path, timeout=timeout) as c:
            ok = c.is_live() if what == "live" else c.is_ready()
    except InfScalerError as exc:
        err.print(f"not {what}: {exc.message}", highlight=False)
        raise typer.Exit(1) from None
    if not ok:
        err.print(f"not {what}: {path} answered 503", highlight=False)
        raise typer.Exit(1)
    out.print(what)
