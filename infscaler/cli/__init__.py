"""The ``infscaler`` command line (typer + rich): the app, its consoles and :func:`main`.
Each command's module is imported only when it runs (:data:`COMMANDS`); errors print one
message and a hint on stderr and exit with status 2."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup, TyperOption

from infscaler.base.errors import InfScalerError

out = Console()
err = Console(stderr=True)


def _fit_help() -> None:
    """Typer's ``--help`` fitted to 80 columns, on first render: flags show no type, option
    names are never wrapped or cut, and a long word folds onto the next line."""
    from rich.table import Table
    from typer import rich_utils

    if getattr(rich_utils, "_infscaler_fitted", False):
        return
    typed = TyperOption.display_type_rich
    param_help = rich_utils._get_parameter_help

    def flag_type(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and not self.count else typed(self, ctx)

    def folded_help(**kwargs: Any) -> Any:
        cell = param_help(**kwargs)
        for item in getattr(cell, "renderables", ()):
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return cell

    class HelpTable(Table):
        def add_row(self, *cells: Any, **kwargs: Any) -> None:
            super().add_row(*cells, **kwargs)
            for column, cell in zip(self.columns, cells, strict=False):
                name = getattr(cell, "plain", cell)
                if isinstance(name, str) and name.startswith("-") and " " not in name:
                    column.no_wrap = True

    TyperOption.display_type_rich = flag_type  # type: ignore[method-assign]
    rich_utils._get_parameter_help = folded_help
    rich_utils.Table = HelpTable  # type: ignore[misc]
    rich_utils._infscaler_fitted = True  # type: ignore[attr-defined]


def _fitted(format_help: Any) -> Any:
    def wrapper(self: Any, ctx: Any, formatter: Any) -> Any:
        _fit_help()
        return format_help(self, ctx, formatter)

    return wrapper


TyperCommand.format_help = _fitted(TyperCommand.format_help)  # type: ignore[method-assign]
TyperGroup.format_help = _fitted(TyperGroup.format_help)  # type: ignore[method-assign]

#: Command -> (the module that defines it, the help line ``infscaler --help`` shows).
#: The module is imported only when its command runs (or its own ``--help`` is asked
#: for), so the CLI starts without the service, server, client, partitioner or planner
#: (and their aiohttp / httpx / onnx / pydantic). Click's "lazily loading subcommands"
#: pattern; tests/integration/cli/test_cli_lazy.py checks each line against the command's own help.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": (
        "infscaler.cli.models",
        "List the bundled real models (found inside installed pip packages).",
    ),
    "devices": ("infscaler.cli.models", "List the bundled device profiles (for --device)."),
    "inspect": (
        "infscaler.cli.models",
        "Operator table: FLOPs, parameters, activations (and ms); bottlenecks marked.",
    ),
    "partition": (
        "infscaler.cli.models",
        "Split MODEL into operator groups by InfScaler Eq. 1 (or --objective) and write a plan directory.",
    ),
    "serve": (
        "infscaler.cli.service",
        "Run the service in the foreground on a Unix socket (Open Inference Protocol).",
    ),
    "deploy": (
        "infscaler.cli.client",
        "Deploy a pipeline to a running service (replaces one of the same name).",
    ),
    "undeploy": ("infscaler.cli.client", "Drain and remove a deployed pipeline."),
    "infer": (
        "infscaler.cli.client",
        "Send one inference request to a running service and print the outputs (with --task: a model-less query; the chosen variant is printed).",
    ),
    "status": (
        "infscaler.cli.client",
        "Per stage: partition, instances (engine, pid, cores, MB), queue, P50 / P99 ms, mean batch size; the control path; pool slots and MB.",
    ),
    "demo": (
        "infscaler.cli.service",
        "Partition PP-OCRv4 det, serve the OCR pipeline on a temporary socket, and read real images through the API: prints the text found and per-stage times.",
    ),
    "plan": (
        "infscaler.cli.plan",
        "Plan the starting configuration: per unit engine, instances and batch with the least memory whose simulated P99 meets --slo at --rate within the device's cap. Several pipelines: one configuration each, together within the cap, by priority. With --fleet: place many streams on many nodes (each planned as above).",
    ),
    "watch-pipelines": (
        "infscaler.cli.fleet",
        "Keep the service's pipelines equal to DIR's *.yaml files: load a new or changed one (replaced once the new one is ready), unload one whose file went away.",
    ),
    "probe": (
        "infscaler.cli.fleet",
        "Exit 0 if the service is live (answers) / ready (every pipeline deployed and ready, not draining), else 1 with the reason: a Kubernetes exec probe.",
    ),
    "perf": (
        "infscaler.cli.perf",
        "Measure a served model at a concurrency or request-rate sweep, as perf_analyzer: infer/s, P50-P99 ms, goodput at --slo, refusals, errors, server queue / compute.",
    ),
    "variants": (
        "infscaler.cli.variants",
        "Model-less serving: register models as task variants (engine x precision x batch x plan), profiled and with measured or declared accuracy; list them.",
    ),
}


def load_command(name: str) -> Any:
    """The click command ``name`` from its module (:data:`COMMANDS`), importing it."""
    module = importlib.import_module(COMMANDS[name][0])
    cmd = typer.main.get_command(module.app)
    sub = getattr(cmd, "commands", None)
    return sub[name] if sub is not None else cmd


class _LazyGroup(TyperGroup):
    """The top-level group: lists :data:`COMMANDS` from the table (help without importing
    them) and imports a command's module when the command is resolved to run."""

    _resolving = False

    def get_params(self, ctx: Any) -> list[Any]:
        from infscaler.cli.params import plain_params  # no pydantic for --help / --version

        params = super().get_params(ctx)
        plain_params(params)
        return params

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        if not self._resolving:  # listing for --help: the table's line is enough
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1], callback=None)
        return load_command(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        self._resolving = True
        try:
            return super().resolve_command(ctx, args)
        finally:
            self._resolving = False


app = typer.Typer(
    cls=_LazyGroup,
    name="infscaler",
    help="InfScaler-Edge: bottleneck-aware partitioning and serving of ONNX models on "
    "multi-accelerator edge devices (Jetson Xavier / Orin).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command: -h too
)


def _print_version(value: bool) -> None:
    if value:
        from infscaler.base import __version__

        out.print(f"infscaler {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        callback=_print_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    # a callback makes typer build a group even though every command is lazy
    pass


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; a user error prints one message (and a hint) and exits 2
    (as typer's usage errors do)."""
    try:
        app(args=argv, prog_name="infscaler")
    except InfScalerError as exc:
        err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
        if exc.hint:
            err.print(f"[yellow]hint:[/] {exc.hint}", highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
