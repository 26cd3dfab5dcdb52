"""``infscaler variants register`` and ``infscaler variants list``: the model-less variant
registry (:mod:`infscaler.modelless.variants`; INFaaS §3.2): the ``variants`` sub-command
group, loaded by :mod:`infscaler.cli` when it runs; ``infscaler infer --task`` lives in
:mod:`infscaler.cli.client`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from infscaler.base.device import load_profile
from infscaler.base.errors import InfScalerError
from infscaler.cli import err, out
from infscaler.cli.tables import Col, print_table
from infscaler.modelless.register import register
from infscaler.modelless.variants import VariantRegistry, describe

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

variants_app = typer.Typer(
    help="Model-less serving: register models as task variants (engine x precision x "
    "batch x plan), profiled and with measured or declared accuracy; list them.",
    no_args_is_help=True,
)
app.add_typer(variants_app, name="variants")

StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The service's state dir holding variants.sqlite (default $INFSCALER_STATE_DIR, "
        "$STATE_DIRECTORY, else ~/.local/state/infscaler).",
    ),
]


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InfScalerError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise InfScalerError(f"{what} must name at least one value")
    return values


@variants_app.command("register")
def register_cmd(
    model: Annotated[str, typer.Argument(help="MODEL.onnx or a bundled alias (infscaler models).")],
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="The task it serves: text-recognition, text-embedding, text-detection, or "
            "any name (then the model's own tensors). Default: the alias's task.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Registered name (default: alias / file stem).")
    ] = None,
    accuracy: Annotated[
        float | None, typer.Option("--accuracy", help="Declared accuracy, 0-1.")
    ] = None,
    val_set: Annotated[
        Path | None,
        typer.Option(
            "--val-set",
            help="Measure the accuracy: text-recognition: DIR of line images + labels.txt "
            "(file<TAB>text), 1 - CER; text-embedding: a file of sentences (one a line), "
            "agreement with the fp32 reference.",
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference", help="text-embedding: the fp32 reference model (alias or path)."
        ),
    ] = None,
    charset: Annotated[
        Path | None, typer.Option("--charset", help="text-recognition: the character list file.")
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="text-embedding: a tokenizer.json.")
    ] = None,
    shapes: Annotated[
        str | None,
        typer.Option("--shapes", help="Batch-1 shapes of dynamic inputs (x:1x3x48x320)."),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option("--device", help="Device profile (name or YAML); default: every engine."),
    ] = None,
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Batch sizes (dynamic batch dim only).")
    ] = "1,4",
    partitions: Annotated[
        str, typer.Option("--partitions", help="Plan sizes K: 1, or 1,2 (partitioner).")
    ] = "1",
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per batch size.")] = 10,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the variants as JSON.")] = False,
) -> None:
    """Generate the variants this host and the device allow, profile them (load time,
    latency per batch size, peak memory), measure or take their accuracy, and store them."""

    profile = None
    if device is not None:
        profile = load_profile(device)
    if repeats < 1:
        raise InfScalerError(f"--repeats must be >= 1, got {repeats}")
    reg = VariantRegistry(state_dir)
    with err.status(f"registering {model}") as status:
        variants = register(
            model,
            task=task,
            name=name,
            accuracy=accuracy,
            val_set=val_set,
            reference=reference,
            charset=charset,
            tokenizer=tokenizer,
            shapes=shapes,
            device=profile,
            batch_sizes=_ints(batch_sizes, "--batch-sizes"),
            partitions=_ints(partitions, "--partitions"),
            repeats=repeats,
            registry=reg,
            progress=lambda m: status.update(m),
        )
    rows = describe(variants)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    variants_table(rows, f"{variants[0].model} ({variants[0].task}) -> {reg.path}")


@variants_app.command("list")
def list_cmd(
    task: Annotated[str | None, typer.Option("--task", help="Only this task.")] = None,
    state_dir: StateDirOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also the variants not generated on this host.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The registered variants: task, engine, precision, batch, K, load ms, P50 / P99 ms,
    throughput, peak MB, accuracy (and how it was obtained)."""

    reg = VariantRegistry(state_dir)
    rows = describe(reg.variants(task, generated_only=not show_all))
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        err.print(
            f"no variants registered in {reg.path}"
            + (f" for task {task}" if task else "")
            + " (infscaler variants register ...)"
        )
        return
    variants_table(rows, str(reg.path))


def variants_table(rows: list[dict], title: str) -> None:
    """One table per task (latencies in ms, peak memory in MB), then how each model's
    accuracy was obtained and why variants were not generated (``--json``: everything)."""
    out.print(f"[dim]{escape(title)}[/]", highlight=False, soft_wrap=True)
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        cols = [Col("variant"), Col("load", "num"), Col("P50", "num"), Col("P99", "num")]
        cols += [Col("req/s", "num"), Col("MB", "num"), Col("acc", "num")]
        cells: list[list[str]] = []
        notes: dict[str, str] = {}
        for r in mine:
            if not r["generated"]:
                notes[r["variant"]] = f"not generated: {r['reason']}"
                continue
            notes.setdefault(f"{r['model']} accuracy", r["accuracy_source"])
            cells.append(
                [
                    escape(r["variant"]),
                    f"{r['load_ms']:.0f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    f"{r['throughput_qps']:.0f}",
                    f"{r['peak_mb']:.0f}",
                    f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-",
                ]
            )
        print_table(out, escape(task), cols, cells)
        for k, v in notes.items():
            out.print(f"  {k}: {v}", highlight=False, markup=False, soft_wrap=True)
