"""Fleet node commands: ``infscaler watch-pipelines DIR`` (the ConfigMap roll-out path) and
``infscaler probe live|ready`` (the DaemonSet's exec probes)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from infscaler.base.errors import InfScalerError
from infscaler.cli import err, out
from infscaler.cli.client import default_socket
from infscaler.cli.params import FastCommand

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)


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

    from infscaler.cli.watcher import PipelineWatcher

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


@app.command("probe", cls=FastCommand)
def probe_cmd(
    what: Annotated[str, typer.Argument(help="live | ready")],
    socket: Annotated[str | None, typer.Option("--socket", help="The service's socket.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds.")] = 5.0,
) -> None:
    """Exit 0 if the service is live (answers) / ready (every pipeline deployed and
    ready, not draining), else 1 with the reason: a Kubernetes exec probe."""

    from infscaler.api.client import Client, InferenceServerError

    if what not in ("live", "ready"):
        raise InfScalerError(f"unknown probe {what!r}", hint="live or ready")
    path = default_socket(socket)
    try:
        with Client(path, timeout=timeout) as c:
            c.request("GET", f"/v2/health/{what}")
    except InferenceServerError as exc:
        err.print(
            f"not {what}: {path} answered {exc.status}: {exc.message}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    except InfScalerError as exc:
        err.print(f"not {what}: {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    out.print(what)
