"""CLI commands of the service: ``serve``, ``deploy``, ``undeploy``, ``infer``, ``status``,
``demo`` (registered on :data:`infscaler.cli.app`).

``serve`` runs the service in the foreground (systemd ``Type=notify`` aware: READY=1 once
the pipelines given are deployed, WATCHDOG pings while healthy, STOPPING=1 and a drain
of in-flight requests on SIGTERM / SIGINT). The other commands are clients of a running
service over its Unix socket (``--socket``, default ``$INFSCALER_SOCKET`` or
``/run/infscaler/infscaler.sock``), except ``demo``, which starts its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from infscaler.base.errors import InfScalerError
from infscaler.cli import app, err, out

DEFAULT_SOCKET = "/run/infscaler/infscaler.sock"

SocketOpt = Annotated[
    str | None,
    typer.Option(
        "--socket",
        help=f"Unix socket of the service (default $INFSCALER_SOCKET or {DEFAULT_SOCKET}).",
    ),
]


#: Pipelines shipped in ``infscaler/pipelines`` (``NAME.yaml``), served by name.
BUNDLED_PIPELINES = ("ocr", "dddd")


def default_socket(socket: str | None = None) -> str:
    """``--socket``, else ``$INFSCALER_SOCKET``, else systemd's ``$RUNTIME_DIRECTORY``,
    else :data:`DEFAULT_SOCKET`."""
    if socket:
        return socket
    if os.environ.get("INFSCALER_SOCKET"):
        return os.environ["INFSCALER_SOCKET"]
    if os.environ.get("RUNTIME_DIRECTORY"):
        return str(Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0]) / "infscaler.sock")
    return DEFAULT_SOCKET


def pipeline_from_arg(arg: str, partitions: int | None = None) -> Any:
    """A pipeline from a ``serve`` argument: a pipeline YAML, an ``.onnx`` model or
    bundled alias (served whole, or partitioned into ``partitions``), or a plan dir.

    Raises:
        ConfigError: a file that is none of these.
    """
    from infscaler.base.config import load_pipeline, pipeline_for_model
    from infscaler.base.errors import ConfigError
    from infscaler.base.models import MODELS

    p = Path(arg)
    if p.suffix in (".yaml", ".yml", ".json") and p.is_file():
        return load_pipeline(p)
    if p.is_dir():
        if not (p / "plan.yaml").is_file():
            raise ConfigError(f"{p} is a directory but not a plan directory (no plan.yaml)")
        return pipeline_for_model(p)
    if p.suffix == ".onnx" and p.is_file():
        return pipeline_for_model(p, partitions=partitions)
    if arg in MODELS:
        return pipeline_for_model(arg, partitions=partitions, shapes=MODELS[arg].shapes)
    if arg in BUNDLED_PIPELINES:
        return load_pipeline(_bundled(f"{arg}.yaml"))
    raise ConfigError(
        f"cannot serve {arg!r}: not a pipeline .yaml, an .onnx file, a plan directory or a "
        "bundled model",
        hint="see `infscaler models` for the bundled models",
    )


def with_slo(cfg: Any, slo: str | None, autoscale: bool) -> Any:
    """``cfg`` with the ``--slo`` / ``--autoscale`` options applied (validated again).

    Raises:
        ConfigError: an SLO that cannot be read.
    """
    from infscaler.base.config import validate_pipeline

    if slo is None and not autoscale:
        return cfg
    data = cfg.model_dump(exclude_none=True)
    if slo is not None:
        data["slo"] = slo
    if autoscale and cfg.autoscale is None:
        data["autoscale"] = {}
    return validate_pipeline(data, f"pipeline {cfg.name}")


def _bundled(name: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("infscaler.pipelines").joinpath(name)))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


# -- serve --------------------------------------------------------------------------------


@app.command("serve")
def serve_cmd(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Pipelines to deploy: PIPELINE.yaml, MODEL.onnx, a bundled model alias, "
            "a plan directory, or a bundled pipeline: `ocr` (PP-OCRv4) or `dddd` (ddddocr "
            "detector -> recogniser)."
        ),
    ] = None,
    socket: SocketOpt = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Device profile (name or YAML).")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Plans and caches (default $STATE_DIRECTORY or ~/.local/state/infscaler).",
        ),
    ] = None,
    control_path: Annotated[
        str, typer.Option("--control-path", help="auto | ebpf | userspace")
    ] = "auto",
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", "-k", help="Partition bare models into K parts at deploy."),
    ] = None,
    pool_mb: Annotated[int, typer.Option("--pool-mb", help="Tensor pool memory cap, MB.")] = 512,
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="End-to-end latency SLO for every pipeline given (200ms)."),
    ] = None,
    autoscale: Annotated[
        bool,
        typer.Option(
            "--autoscale",
            help="Scale the pipelines' stages asymmetrically to keep P99 under --slo "
            "(Algorithm 1; pipeline.yaml may set `autoscale:` itself).",
        ),
    ] = False,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="With --slo --autoscale and models that name no partitions / threads / "
            "instances: auto = the planner's search picks K, cuts, threads and instances "
            "(`infscaler plan --explain`); eq1 = the paper's Eq. 1 as before.",
        ),
    ] = "auto",
    max_body_mb: Annotated[int, typer.Option("--max-body-mb", help="Request body limit, MB.")] = 64,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Also serve GET /metrics (Prometheus) on --metrics-host:PORT (off by default; "
            "the socket always serves it).",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            help="Address for --metrics-port: 127.0.0.1 (default), or 0.0.0.0 only in a "
            "container's own network namespace (Kubernetes pod) for a cluster's Prometheus.",
        ),
    ] = "127.0.0.1",
    max_connections: Annotated[
        int, typer.Option("--max-connections", help="API connections open at once (more: 503).")
    ] = 512,
    header_timeout_s: Annotated[
        float,
        typer.Option("--header-timeout", help="Seconds for a request's headers to arrive (408)."),
    ] = 30.0,
    body_timeout_s: Annotated[
        float,
        typer.Option("--body-timeout", help="Seconds for a request's body to arrive (408)."),
    ] = 120.0,
    max_inflight_mb: Annotated[
        float,
        typer.Option(
            "--max-inflight-mb",
            min=1,
            help="Budget of request bytes in flight, MB (each request counts twice its "
            "body: body + decoded tensors); beyond it 503 with Retry-After, checked "
            "before the body is read.",
        ),
    ] = 256,
    drain_s: Annotated[
        float, typer.Option("--drain-timeout", help="Seconds to drain in-flight requests on stop.")
    ] = 30.0,
    socket_group: Annotated[
        str | None,
        typer.Option(
            "--socket-group",
            envvar="INFSCALER_SOCKET_GROUP",
            help="Give the socket (mode 0660) to this group (name or gid); default: the "
            "service's own group. Its members may infer.",
        ),
    ] = None,
    allow_functions: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-functions",
            envvar="INFSCALER_ALLOW_FUNCTIONS",
            help="A Python package whose functions pipelines loaded through the API may "
            "use as function stages (repeatable; infscaler.pipelines always). Pipelines "
            "given on this command line may use the modules they name.",
        ),
    ] = None,
    model_repository: Annotated[
        list[str] | None,
        typer.Option(
            "--model-repository",
            envvar="INFSCALER_MODEL_REPOSITORIES",
            help="A directory pipelines loaded through the API may take models and plans "
            "from (repeatable; bundled model aliases always).",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
    watch_dir: Annotated[
        Path | None,
        typer.Option(
            "--watch-pipelines",
            help="Deploy DIR's pipeline files and keep the service in step with them "
            "(load changed, unload removed; a mounted ConfigMap: infscaler.watcher).",
        ),
    ] = None,
) -> None:
    """Run the service in the foreground on a Unix socket (Open Inference Protocol)."""
    _setup_logging(verbose)
    from infscaler.server import HttpLimits

    limits = HttpLimits(
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        max_connections=max_connections,
    )
    from infscaler.base.device import load_profile
    from infscaler.base.security import SecurityPolicy

    security = SecurityPolicy.create(allow_functions or (), model_repository or ())
    if socket_group is not None:
        from infscaler.server import resolve_group

        resolve_group(socket_group)  # an unknown group fails now, not after the deploys

    profile = load_profile(device) if device else None
    configs = [pipeline_from_arg(t, partitions) for t in targets or []]
    watcher = None
    if watch_dir is not None:
        from infscaler.watcher import start_watching

        watched, watcher = start_watching(watch_dir, default_socket(socket), err.print)
        for cfg in watched:
            # later versions of these files come through the repository API and its
            # checks: the first version gets the same, so a file that deploys at start
            # also reloads
            security.check_pipeline(cfg)
        configs += watched
    if autoscale and slo is None and any(c.slo is None for c in configs):
        raise InfScalerError("--autoscale needs --slo", hint="e.g. --slo 200ms --autoscale")
    configs = [with_slo(c, slo, autoscale) for c in configs]
    if objective not in ("auto", "eq1"):
        raise InfScalerError(f"unknown --objective {objective!r}", hint="auto or eq1")
    if control_path not in ("auto", "ebpf", "userspace"):
        raise InfScalerError(
            f"unknown --control-path {control_path!r}", hint="auto, ebpf or userspace"
        )
    code = asyncio.run(
        _serve(
            configs,
            default_socket(socket),
            profile,
            state_dir,
            control_path,
            pool_mb,
            max_body_mb,
            drain_s,
            security=security,
            socket_group=socket_group,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            limits=limits,
            max_inflight_mb=max_inflight_mb,
            objective=objective,
        )
    )
    if watcher is not None:
        watcher.stop()
    raise typer.Exit(code)


#: exit status when the front end died (EX_SOFTWARE): systemd's Restart=on-failure
#: restarts the service on a clean pool (see :mod:`infscaler.runtime.frontend`)
EXIT_FRONTEND_DIED = 70
#: seconds past ``--drain-timeout`` after which a stop no longer waits for anything
STOP_GRACE_S = 10.0


def _hard_exit_after(seconds: float, service: Any) -> None:
    """Exit the process ``seconds`` from now whatever is stuck (a dead front end,
    instances that do not stop, handlers that never finish): the bound on SIGTERM.
    Instances die with it (PR_SET_PDEATHSIG); its shared memory is unlinked first."""
    import threading

    def fire() -> None:
        err.print(f"infscaler: still stopping after {seconds:.0f} s: exiting now", highlight=False)
        with contextlib.suppress(Exception):
            from infscaler.shm.pool import remove_stale_slabs

            pool = service.pool
            if pool is not None:
                remove_stale_slabs(pool.service_id)
            if service.frontend is not None and service.frontend.deadlines is not None:
                service.frontend.deadlines.close()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(1)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


async def _serve(
    configs: list[Any],
    socket_path: str,
    profile: Any,
    state_dir: Path | None,
    control_path: str,
    pool_mb: int,
    max_body_mb: int,
    drain_s: float,
    *,
    security: Any = None,
    socket_group: str | None = None,
    metrics_port: int | None = None,
    limits: Any = None,
    metrics_host: str = "127.0.0.1",
    max_inflight_mb: float = 256,
    objective: str = "auto",
) -> int:
    from infscaler.server import (
        create_app,
        create_metrics_app,
        metrics_registry,
        start_metrics_server,
        start_unix_server,
    )
    from infscaler.service import Service
    from infscaler.systemd import SystemdNotifier

    notifier = SystemdNotifier()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    died: list[str] = []
    service = Service(
        state_dir=state_dir,
        device=profile,
        control_path=control_path,
        pool_mb=pool_mb,
        max_inflight_mb=max_inflight_mb,
        objective=objective,
    )

    def on_signal() -> None:
        if stop.is_set():  # a second signal: do not wait any longer
            _hard_exit_after(0.0, service)
            return
        # SIGTERM always exits: drain, then at most STOP_GRACE_S for the rest
        _hard_exit_after(drain_s + STOP_GRACE_S, service)
        stop.set()

    def on_frontend_death(reason: str) -> None:  # from the dying front end thread
        died.append(reason)
        loop.call_soon_threadsafe(on_signal)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    service.on_frontend_death = on_frontend_death
    service.starting = bool(configs)  # not ready until the pipelines given are deployed
    await loop.run_in_executor(None, service.start)
    runner = metrics_runner = None
    try:
        api = create_app(service, max_body_mb=max_body_mb, security=security, limits=limits)
        runner = await start_unix_server(api, socket_path, group=socket_group)
        if metrics_port is not None:
            metrics_runner, bound = await start_metrics_server(
                create_metrics_app(service, metrics_registry(api)), metrics_port, metrics_host
            )
            err.print(
                f"infscaler: metrics on http://{metrics_host}:{bound}/metrics", highlight=False
            )
        err.print(
            f"infscaler: listening on {socket_path} (control path: {service.channel.kind}, "
            f"pool {pool_mb} MB)",
            highlight=False,
        )
        for cfg in configs:
            notifier.status(f"deploying {cfg.name}")

            def progress(msg: str) -> None:
                err.print(f"  {msg}", highlight=False)
                notifier.extend_timeout(120)

            t0 = time.perf_counter()
            deploy = loop.run_in_executor(None, lambda c=cfg: service.deploy(c, progress=progress))
            waiter = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({deploy, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if waiter in done:
                err.print("interrupted while deploying")
                await deploy
                break
            waiter.cancel()
            deploy.result()
            err.print(f"deployed {cfg.name} in {time.perf_counter() - t0:.1f} s", highlight=False)
        if not stop.is_set():
            service.starting = False
            names = ", ".join(d.name for d in service.deployments()) or "no pipelines"
            notifier.ready(f"serving {names} on {socket_path}")
            notifier.start_watchdog(lambda: service.frontend.alive() and service.manager.running)
            err.print(f"infscaler: ready ({names})", highlight=False)
            await stop.wait()
        if died:
            err.print(
                f"infscaler: the front end failed ({died[0]}): exiting so that the "
                "service restarts",
                highlight=False,
            )
        notifier.stopping("draining in-flight requests")
        err.print("infscaler: stopping: draining in-flight requests", highlight=False)
        await loop.run_in_executor(None, service.close, drain_s)
        return EXIT_FRONTEND_DIED if died else 0
    finally:
        notifier.stop_watchdog()
        with contextlib.suppress(Exception):
            await loop.run_in_executor(None, service.close, 0.0)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(socket_path)


# -- client commands ----------------------------------------------------------------------


def _client(socket: str | None) -> Any:
    from infscaler.client import Client

    return Client(default_socket(socket))


@app.command("deploy")
def deploy_cmd(
    pipeline: Annotated[str, typer.Argument(help="PIPELINE.yaml (or MODEL.onnx / alias).")],
    socket: SocketOpt = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Model name (default: the pipeline's).")
    ] = None,
) -> None:
    """Deploy a pipeline to a running service (replaces one of the same name)."""
    cfg = pipeline_from_arg(pipeline)
    data = cfg.model_dump(mode="json", exclude_none=True)
    with _client(socket) as c, err.status(f"deploying {name or cfg.name}"):
        res = c.load(name or cfg.name, data)
    out.print(f"deployed {res.get('name', name or cfg.name)} in {res.get('seconds', '?')} s")


@app.command("undeploy")
def undeploy_cmd(
    name: Annotated[str, typer.Argument(help="Model name.")],
    socket: SocketOpt = None,
) -> None:
    """Drain and remove a deployed pipeline."""
    with _client(socket) as c:
        c.unload(name)
    out.print(f"undeployed {name}")


def load_image(path: Path) -> np.ndarray:
    """An image file as HxWx3 uint8 RGB.

    Raises:
        InfScalerError: missing or unreadable image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise InfScalerError(f"cannot read image {path}: {exc}") from None


def _parse_inputs(inputs: list[str], image: Path | None, meta: dict) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for item in inputs:
        name, sep, path = item.partition("=")
        if not sep:
            raise InfScalerError(f"bad --input {item!r}", hint="use --input NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InfScalerError(f"cannot read {path} for input {name}: {exc}") from None
    if image is not None:
        img_inputs = [i for i in meta["inputs"] if i["datatype"] == "UINT8"]
        if len(img_inputs) != 1:
            raise InfScalerError(
                f"--image needs a model with one UINT8 input; {meta['name']} has "
                f"{[i['name'] for i in meta['inputs']]}",
                hint="use --input NAME=FILE.npy",
            )
        feeds[img_inputs[0]["name"]] = load_image(image)
    return feeds


def _describe(value: np.ndarray) -> str:
    if value.dtype.kind in "USO":
        return "\n".join(str(v.decode() if isinstance(v, bytes) else v) for v in value.reshape(-1))
    if value.size <= 16:
        return np.array2string(value, precision=4)
    return (
        f"{value.dtype} {list(value.shape)}  min {value.min():.4g}  max {value.max():.4g}  "
        f"mean {value.mean():.4g}"
    )


@app.command("infer")
def infer_cmd(
    model: Annotated[
        str | None, typer.Argument(help="Model (pipeline) name; omit with --task.")
    ] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="NAME=FILE.npy (repeatable).")
    ] = None,
    image: Annotated[
        Path | None, typer.Option("--image", help="An image file for the model's UINT8 input.")
    ] = None,
    text: Annotated[
        list[str] | None,
        typer.Option("--text", help="A sentence for the model's BYTES input (repeatable)."),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="Model-less: name a registered task (infscaler variants list); the service "
            "picks the variant meeting --latency-ms / --min-accuracy.",
        ),
    ] = None,
    latency_ms: Annotated[
        float | None, typer.Option("--latency-ms", help="With --task: latency requirement, ms.")
    ] = None,
    min_accuracy: Annotated[
        float | None,
        typer.Option("--min-accuracy", help="With --task: accuracy requirement, 0-1."),
    ] = None,
    socket: SocketOpt = None,
    save: Annotated[
        Path | None, typer.Option("--save", help="Write each output to DIR/<name>.npy.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outputs as JSON.")] = False,
) -> None:
    """Send one inference request to a running service and print the outputs (with
    --task: a model-less query; the chosen variant is printed)."""
    if (model is None) == (task is None):
        raise InfScalerError(
            "name a model (pipeline) or a --task, not both"
            if model is not None
            else "name a model (pipeline) or a --task",
            hint="infscaler infer MODEL ..., or infscaler infer --task TASK --latency-ms 20 ...",
        )
    if task is None and (latency_ms is not None or min_accuracy is not None):
        raise InfScalerError("--latency-ms / --min-accuracy apply to --task queries")
    target = task if task is not None else model
    assert target is not None
    with _client(socket) as c:
        meta = c.model_metadata(target)
        feeds = _parse_inputs(inputs or [], image, meta)
        if text:
            str_inputs = [i for i in meta["inputs"] if i["datatype"] == "BYTES"]
            if len(str_inputs) != 1:
                raise InfScalerError(
                    f"--text needs a model with one BYTES input; {target} has "
                    f"{[i['name'] for i in meta['inputs']]}"
                )
            feeds[str_inputs[0]["name"]] = np.array(text, dtype=object)
        missing = [i["name"] for i in meta["inputs"] if i["name"] not in feeds]
        if missing:
            raise InfScalerError(
                f"{'task' if task else 'model'} {target} needs inputs {missing}",
                hint="pass --input NAME=FILE.npy, --image or --text",
            )
        if task is not None:
            res = c.infer_task(task, feeds, latency_ms=latency_ms, min_accuracy=min_accuracy)
        else:
            res = c.infer(target, feeds)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        for k, v in res.outputs.items():
            np.save(save / f"{k.replace('/', '_')}.npy", v)
    if as_json:
        print(
            json.dumps(
                {
                    "model": res.model_name,
                    "parameters": res.parameters,
                    "outputs": {
                        k: (v.astype(str) if v.dtype.kind in "SO" else v).tolist()
                        for k, v in res.outputs.items()
                    },
                },
                default=str,
            )
        )
        return
    for k, v in res.outputs.items():
        out.print(f"[bold]{k}[/]: {_describe(v)}", highlight=False)
    p = res.parameters or {}
    if "latency_ms" in p:
        out.print(f"latency {p['latency_ms']:.1f} ms", highlight=False)
    if "variant" in p:
        ok = p.get("meets_requirements")
        out.print(
            f"variant [bold]{p['variant']}[/] ({p.get('selection')}): "
            + ("meets the requirements" if ok else "[yellow]does NOT meet the requirements[/]")
            + f"\n  {p.get('selection_reason', '')}",
            highlight=False,
        )


@app.command("status")
def status_cmd(
    socket: SocketOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per stage: partition, instances (engine, pid, cores, MB), queue, P50 / P99 ms; the
    control path; pool slots and MB."""
    with _client(socket) as c:
        st = c.status()
    if as_json:
        print(json.dumps(st, indent=2, default=str))
        return
    print_status(st)


def print_status(st: dict[str, Any]) -> None:
    cp = st["control_path"]
    pool = st["pool"]
    out.print(
        f"control path: [bold]{cp['kind']}[/] ({cp['policy']}; {cp.get('reason', '')})\n"
        f"tensor pool: {pool['mapped_mb']:.0f} / {pool['cap_mb']:.0f} MB mapped, "
        f"{pool['slots_in_use']} slots in use, {pool['slots_free']} free; "
        f"restarts {st.get('restarts', 0)}",
        highlight=False,
    )
    zy = st.get("zygote") or {}
    if zy:
        started = zy.get("started") or {}
        state = (
            "off"
            if not zy.get("enabled")
            else f"pid {zy['pid']}, restarts {zy.get('restarts', 0)}"
            if zy.get("pid")
            else f"down ({zy.get('last_error') or 'starting'})"
        )
        out.print(
            f"zygote: {state}; instances forked {started.get('forked', 0)}, "
            f"spawned {started.get('spawned', 0)}",
            highlight=False,
        )
    res = st.get("resources") or {}
    if res:
        out.print(
            f"device {res['device']}: memory {res['memory_used_mb']:.0f} / "
            f"{res['memory_cap_mb']:.0f} MB (instances PSS + pool), engine slots "
            + ", ".join(f"{e} {n}" for e, n in res["max_instances"].items())
            + f", {res['cores']} cpu thread slots",
            highlight=False,
        )
    for p in st["pipelines"]:
        req = p["requests"]
        lat = req["latency"]
        table = Table(
            title=f"{p['name']} ({'ready' if p['ready'] else 'NOT ready'}"
            f"{', DEGRADED' if p.get('degraded') else ''}): "
            f"{req['success']} ok, {sum(req['fail'].values())} failed, "
            f"P50 {_ms(lat['p50_ms'])} / P99 {_ms(lat['p99_ms'])} ms"
        )
        for col in ("stage", "part", "B_k", "engine pid cores MB", "queue", "P50 ms", "P99 ms"):
            table.add_column(col)
        for u in p["units"]:
            inst = "\n".join(
                f"{i['engine']} {i['pid']} [{','.join(map(str, i['cores']))}] "
                f"{i.get('pss_mb') or i['rss_mb']:.0f}"
                + ("" if i["state"] == "ready" else f" {i['state']}")
                for i in u["instances"]
            )
            inst += "".join(
                f"\n{r['engine']} restart {r['restarts']} in {r['restart_in_s']:.1f} s"
                for r in u.get("restarting", [])
            )
            inst = inst.strip() or ("front end" if u["engine"] == "frontend" else "-")
            steps = "".join(  # a fused unit: its steps' mean ms per call
                f"\n  {st['step']} {_ms(st.get('mean_ms'))} ms" for st in u.get("steps") or ()
            )
            table.add_row(
                u["unit"] + steps,
                u["partition"] or "-",
                f"{u['bottleneck']:.3g}" if u["bottleneck"] is not None else "-",
                inst,
                str(u["queue"]),
                _ms(u["compute_p50_ms"]),
                _ms(u["compute_p99_ms"]),
            )
        out.print(table)
        if p.get("slo_ms") is not None:
            shed = "" if p.get("queue_limit") is None else f", shedding beyond {p['queue_limit']}"
            out.print(
                f"SLO {p['slo_ms']:g} ms, autoscale {'on' if p.get('autoscale') else 'off'}, "
                f"window {p.get('window')}{shed}",
                highlight=False,
            )
        for why in p.get("degraded", []):
            out.print(f"  degraded: {why}", highlight=False)
        for d in p.get("decisions", [])[-5:]:
            out.print(f"  {d['action']}: {d['reason']}", highlight=False)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


# -- demo ---------------------------------------------------------------------------------


DEMO_TEXT = ["InfScaler serves partitioned models", "Edge inference on Jetson 2026"]


@app.command("demo")
def demo_cmd(
    control_path: Annotated[
        str, typer.Option("--control-path", help="auto | ebpf | userspace")
    ] = "auto",
    partitions: Annotated[int, typer.Option("--partitions", "-k", help="K for PP-OCRv4 det.")] = 2,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Plans (default: a cache dir).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Partition PP-OCRv4 det, serve the OCR pipeline on a temporary socket, and read real
    images through the API: prints the text found and per-stage times."""
    _setup_logging(verbose)
    import yaml
    from skimage import data as skdata

    from infscaler.base.config import load_pipeline
    from infscaler.base.samples import render_text_image
    from infscaler.client import Client
    from infscaler.pipelines.ocr import character_error_rate, to_rgb
    from infscaler.server import ServerThread
    from infscaler.service import Service

    raw = yaml.safe_load(_bundled("ocr.yaml").read_text())
    for st in raw["stages"]:
        if st["name"] == "det":
            st["partitions"] = partitions
        if st["name"] == "prep" and partitions > 1:  # cut at 640x640: needs that shape
            st["params"] = {**st.get("params", {}), "pad": True, "enlarge": True}
    cfg = load_pipeline(raw)
    if state_dir is None:
        from infscaler.base.models import cache_dir

        state_dir = cache_dir() / "state"
    images = {
        "rendered (known text)": render_text_image(DEMO_TEXT),
        "skimage text.png": to_rgb(skdata.text()),
        "skimage page.png": to_rgb(skdata.page()),
    }
    with tempfile.TemporaryDirectory(prefix="infscaler-demo-") as tmp:
        sock = str(Path(tmp) / "infscaler.sock")
        with Service(state_dir=state_dir, control_path=control_path) as service:
            err.print(f"control path: {service.channel.kind}", highlight=False)
            with err.status("partitioning PP-OCRv4 det and starting the OCR pipeline") as s:
                t0 = time.perf_counter()
                service.deploy(cfg, progress=lambda m: s.update(m))
            err.print(f"OCR pipeline ready in {time.perf_counter() - t0:.1f} s", highlight=False)
            with ServerThread(service, sock), Client(sock) as client:
                units = [u.name for u in service.deployment("ocr").pipeline.units]
                for label, img in images.items():
                    res = client.infer("ocr", {"image": img})
                    texts = [str(t) for t in res.outputs["texts"].reshape(-1)]
                    out.rule(f"{label}: {img.shape[1]}x{img.shape[0]}, {len(texts)} lines")
                    for t, sc in zip(texts, res.outputs["scores"].reshape(-1), strict=False):
                        out.print(f"  {t}   [dim]({sc:.2f})[/]", highlight=False)
                    if label.startswith("rendered"):
                        cer = character_error_rate(" ".join(DEMO_TEXT), " ".join(texts))
                        out.print(f"  character error rate vs the known text: {cer:.1%}")
                    unit_ms = json.loads(res.parameters.get("unit_ms", "{}"))
                    out.print(
                        f"  latency {res.parameters.get('latency_ms', 0):.1f} ms; per stage (ms): "
                        + ", ".join(f"{u} {unit_ms.get(u, 0):.1f}" for u in units),
                        highlight=False,
                    )
                print_status(client.status())
