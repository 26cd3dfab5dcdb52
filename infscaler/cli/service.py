"""CLI commands that run the service: ``serve`` (in the foreground; systemd ``Type=notify``:
READY=1 once the pipelines given are deployed, WATCHDOG pings while healthy, STOPPING=1
and a drain on SIGTERM / SIGINT) and ``demo`` (on a temporary socket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from infscaler.api.client import Client
from infscaler.api.grpc import default_grpc_socket
from infscaler.api.server import (
    HttpLimits,
    ServerThread,
    create_app,
    create_metrics_app,
    metrics_registry,
    resolve_group,
    start_grpc_server,
    start_metrics_server,
    start_unix_server,
)
from infscaler.base.config import load_pipeline
from infscaler.base.device import load_profile
from infscaler.base.errors import InfScalerError
from infscaler.base.models import cache_dir
from infscaler.base.quotas import PeerQuotas
from infscaler.base.ratelog import install_rate_limit
from infscaler.base.samples import render_text_image
from infscaler.base.security import SecurityPolicy
from infscaler.base.threads import named_executor, set_os_thread_name
from infscaler.cli import err, out
from infscaler.cli.client import (
    SocketOpt,
    bundled_path,
    default_socket,
    pipelines_from_arg,
    print_status,
    with_slo,
)
from infscaler.cli.watcher import start_watching
from infscaler.pipelines.ocr import character_error_rate, to_rgb
from infscaler.service.service import Service
from infscaler.service.systemd import SystemdNotifier
from infscaler.shm.cleanup import remove_stale_slabs

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

#: ``serve --cpu-wake-latency-us`` when not given (:mod:`infscaler.runtime.scaling.wakepolicy`)
WAKE_DEFAULT = "auto"


def _say(line: str) -> None:
    """One startup / progress line on stderr, whole (never wrapped or cut) and plain text."""
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def wake_option(value: str) -> int | str | None:
    """``--cpu-wake-latency-us``: ``auto``, ``none`` or an int of µs >= 0.

    Raises:
        InfScalerError: anything else (the message says what it takes).
    """
    v = value.strip().lower()
    if v in ("auto", "none"):
        return None if v == "none" else "auto"
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise InfScalerError(
            f"--cpu-wake-latency-us takes auto, none or microseconds >= 0, got {value!r}",
            hint="0 keeps idle CPUs polling while serving",
        )
    return n


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # one line per cause every 10 s (with a count): a client flood cannot fill the journal
    install_rate_limit(10.0)


# -- serve --------------------------------------------------------------------------------

# ``serve``'s arguments and options (typer's ``Annotated`` style, one alias each)
TargetsArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Pipelines to deploy: PIPELINE.yaml, MODEL.onnx, a bundled model alias, "
        "a plan directory, a Triton model directory or repository (config.pbtxt + "
        "VERSION/model.onnx), or a bundled pipeline: `ocr` (PP-OCRv4) or `dddd` (ddddocr "
        "detector -> recogniser)."
    ),
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="Device profile (name or YAML).")]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Plans and caches (default $STATE_DIRECTORY or ~/.local/state/infscaler).",
    ),
]
ControlPathOpt = Annotated[str, typer.Option("--control-path", help="auto | ebpf | userspace")]
PartitionsOpt = Annotated[
    int | None,
    typer.Option("--partitions", "-k", help="Partition bare models into K parts at deploy."),
]
ShapesOpt = Annotated[
    str | None,
    typer.Option(
        "--shapes",
        help="Concrete shapes of a model's dynamic inputs, trtexec style "
        "(x:1x3x224x224[,y:...]), for the .onnx models and aliases given; a dynamic "
        "batch dim alone takes 1 with a warning.",
    ),
]
PoolMbOpt = Annotated[int, typer.Option("--pool-mb", help="Tensor pool memory cap, MB.")]
SloOpt = Annotated[
    str | None,
    typer.Option("--slo", help="End-to-end latency SLO for every pipeline given (200ms)."),
]
AutoscaleOpt = Annotated[
    bool,
    typer.Option(
        "--autoscale",
        help="Scale the pipelines' stages asymmetrically to keep P99 under --slo "
        "(Algorithm 1; pipeline.yaml may set `autoscale:` itself).",
    ),
]
ObjectiveOpt = Annotated[
    str,
    typer.Option(
        "--objective",
        help="With --slo --autoscale and models that name no partitions / threads / "
        "instances: auto = the planner's search picks K, cuts, threads and instances "
        "(`infscaler plan --explain`); eq1 = the paper's Eq. 1 as before.",
    ),
]
CpuWakeLatencyOpt = Annotated[
    str,
    typer.Option(
        "--cpu-wake-latency-us",
        help="Hold a Linux PM QoS request while serving: idle CPUs use no cpuidle state "
        "slower to leave than this, µs (0: they poll), so requests that find the device "
        "idle stop paying the cores' wake-up; costs power. auto: hold 0 µs once an "
        "autoscaled pipeline misses its SLO, while SLO pipelines stay; none: never. Needs root (else "
        "logged, ignored).",
    ),
]
MaxBodyMbOpt = Annotated[int, typer.Option("--max-body-mb", help="Request body limit, MB.")]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Also serve GET /metrics (Prometheus) on --metrics-host:PORT (off by default; "
        "the socket always serves it).",
    ),
]
MetricsHostOpt = Annotated[
    str,
    typer.Option(
        "--metrics-host",
        help="Address for --metrics-port: 127.0.0.1 (default), or 0.0.0.0 only in a "
        "container's own network namespace (Kubernetes pod) for a cluster's Prometheus.",
    ),
]
MaxConnectionsOpt = Annotated[
    int, typer.Option("--max-connections", help="API connections open at once (more: 503).")
]
MaxJsonMbOpt = Annotated[
    float,
    typer.Option(
        "--max-json-mb",
        min=0.001,
        help="JSON an inference request may carry, MB (its body, or the JSON header "
        "before binary data; 413 beyond): JSON takes up to 20x its size decoded.",
    ),
]
MaxConnectionsPerUidOpt = Annotated[
    int,
    typer.Option(
        "--max-connections-per-uid",
        min=1,
        help="Connections one client user may hold open (more: 503); the service's "
        "user and root are not limited.",
    ),
]
OperatorConnectionsOpt = Annotated[
    int,
    typer.Option(
        "--operator-connections",
        min=0,
        help="Of --max-connections, how many only the service's user and root may use "
        "(the operator always gets in).",
    ),
]
MaxPendingPerUidOpt = Annotated[
    int,
    typer.Option(
        "--max-pending-per-uid",
        min=1,
        help="Inference requests one client user may have queued or running at once, "
        "HTTP and gRPC together (more: 503 with Retry-After); the service's user and "
        "root are not limited.",
    ),
]
OperatorPendingOpt = Annotated[
    int,
    typer.Option(
        "--operator-pending",
        min=0,
        help="Of the 1024 requests the service admits at once, how many only the "
        "service's user and root may use (their requests always get in).",
    ),
]
MaxInflightMbPerUidOpt = Annotated[
    float,
    typer.Option(
        "--max-inflight-mb-per-uid",
        min=1,
        help="Of --max-inflight-mb, what one client user may hold, MB (more: 503).",
    ),
]
MaxRegionsPerUidOpt = Annotated[
    int,
    typer.Option(
        "--max-regions-per-uid",
        min=1,
        help="System shared memory regions one client user may hold registered (more: 429).",
    ),
]
MaxRegionsOpt = Annotated[
    int,
    typer.Option(
        "--max-regions",
        min=1,
        help="Regions all client users together may hold registered (more: 429).",
    ),
]
VariantLoadsPerMinOpt = Annotated[
    float,
    typer.Option(
        "--variant-loads-per-min",
        min=0.01,
        help="Model-less queries one client user may make per minute that load a "
        "variant (more: 429 with Retry-After); queries a loaded variant serves are free.",
    ),
]
HeaderTimeoutOpt = Annotated[
    float,
    typer.Option("--header-timeout", help="Seconds for a request's headers to arrive (408)."),
]
BodyTimeoutOpt = Annotated[
    float,
    typer.Option("--body-timeout", help="Seconds for a request's body to arrive (408)."),
]
KeepaliveTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--keepalive-timeout",
        help="Seconds an idle connection (no request or call open) is kept open.",
    ),
]
MaxStreamsPerUidOpt = Annotated[
    int,
    typer.Option(
        "--max-streams-per-uid",
        min=1,
        help="gRPC calls one client user may have open at once over all its connections "
        "(more: RESOURCE_EXHAUSTED); the service's user and root are not limited.",
    ),
]
MaxInflightMbOpt = Annotated[
    float,
    typer.Option(
        "--max-inflight-mb",
        min=1,
        help="Budget of request bytes in flight, MB (a request counts twice its "
        "binary data, body + decoded tensors, and 20x its JSON); beyond it 503 with "
        "Retry-After, checked before the body is read.",
    ),
]
DrainTimeoutOpt = Annotated[
    float, typer.Option("--drain-timeout", help="Seconds to drain in-flight requests on stop.")
]
SocketGroupOpt = Annotated[
    str | None,
    typer.Option(
        "--socket-group",
        envvar="INFSCALER_SOCKET_GROUP",
        help="Give the socket (mode 0660) to this group (name or gid); default: the "
        "service's own group. Its members may infer.",
    ),
]
GrpcSocketOpt = Annotated[
    str | None,
    typer.Option(
        "--grpc-socket",
        envvar="INFSCALER_GRPC_SOCKET",
        help="Serve the v2 gRPC protocol (Triton's GRPCInferenceService; tritonclient.grpc "
        "with url='unix:PATH') on this Unix socket; default: beside --socket "
        "(infscaler.sock -> infscaler-grpc.sock). Same mode, group and quotas.",
    ),
]
NoGrpcOpt = Annotated[bool, typer.Option("--no-grpc", help="Serve HTTP only: no gRPC socket.")]
AllowFunctionsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-functions",
        envvar="INFSCALER_ALLOW_FUNCTIONS",
        help="A Python package whose functions pipelines loaded through the API may "
        "use as function stages (repeatable; infscaler.pipelines always). Pipelines "
        "given on this command line may use the modules they name.",
    ),
]
ModelRepositoryOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model-repository",
        envvar="INFSCALER_MODEL_REPOSITORIES",
        help="A directory pipelines loaded through the API may take models and plans "
        "from (repeatable; bundled model aliases always); a Triton model repository's "
        "models are also served at start, as `serve REPO` does.",
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")]
WatchPipelinesOpt = Annotated[
    Path | None,
    typer.Option(
        "--watch-pipelines",
        help="Deploy DIR's pipeline files and keep the service in step with them "
        "(load changed, unload removed; a mounted ConfigMap: infscaler.cli.watcher).",
    ),
]


@app.command("serve")
def serve_cmd(
    targets: TargetsArg = None,
    socket: SocketOpt = None,
    device: DeviceOpt = None,
    state_dir: StateDirOpt = None,
    control_path: ControlPathOpt = "auto",
    partitions: PartitionsOpt = None,
    shapes: ShapesOpt = None,
    pool_mb: PoolMbOpt = 512,
    slo: SloOpt = None,
    autoscale: AutoscaleOpt = False,
    objective: ObjectiveOpt = "auto",
    cpu_wake_latency_us: CpuWakeLatencyOpt = WAKE_DEFAULT,
    max_body_mb: MaxBodyMbOpt = 64,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    max_connections: MaxConnectionsOpt = 512,
    max_json_mb: MaxJsonMbOpt = 16.0,
    max_connections_per_uid: MaxConnectionsPerUidOpt = PeerQuotas.connections_per_uid,
    operator_connections: OperatorConnectionsOpt = PeerQuotas.operator_connections,
    max_pending_per_uid: MaxPendingPerUidOpt = PeerQuotas.pending_per_uid,
    operator_pending: OperatorPendingOpt = PeerQuotas.operator_pending,
    max_inflight_mb_per_uid: MaxInflightMbPerUidOpt = PeerQuotas.inflight_mb_per_uid,
    max_regions_per_uid: MaxRegionsPerUidOpt = PeerQuotas.regions_per_uid,
    max_regions: MaxRegionsOpt = PeerQuotas.regions,
    variant_loads_per_min: VariantLoadsPerMinOpt = PeerQuotas.variant_loads_per_min,
    header_timeout_s: HeaderTimeoutOpt = 30.0,
    body_timeout_s: BodyTimeoutOpt = 120.0,
    keepalive_timeout_s: KeepaliveTimeoutOpt = 75.0,
    max_streams_per_uid: MaxStreamsPerUidOpt = PeerQuotas.streams_per_uid,
    max_inflight_mb: MaxInflightMbOpt = 256,
    drain_s: DrainTimeoutOpt = 30.0,
    socket_group: SocketGroupOpt = None,
    allow_functions: AllowFunctionsOpt = None,
    model_repository: ModelRepositoryOpt = None,
    verbose: VerboseOpt = False,
    watch_dir: WatchPipelinesOpt = None,
    grpc_socket: GrpcSocketOpt = None,
    no_grpc: NoGrpcOpt = False,
) -> None:
    """Run the service in the foreground on a Unix socket (Open Inference Protocol)."""
    _setup_logging(verbose)

    limits = HttpLimits(
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        keepalive_timeout_s=keepalive_timeout_s,
        max_connections=max_connections,
        max_json_mb=max_json_mb,
        quotas=PeerQuotas(
            connections_per_uid=max_connections_per_uid,
            operator_connections=operator_connections,
            pending_per_uid=max_pending_per_uid,
            operator_pending=operator_pending,
            inflight_mb_per_uid=max_inflight_mb_per_uid,
            regions_per_uid=max_regions_per_uid,
            regions=max_regions,
            variant_loads_per_min=variant_loads_per_min,
            streams_per_uid=max_streams_per_uid,
        ),
    )
    security = _security_policy(allow_functions, model_repository, socket_group)
    profile = load_profile(device) if device else None
    configs, watcher = _initial_pipelines(
        _with_repositories(targets, model_repository),
        partitions,
        shapes,
        watch_dir,
        socket,
        security,
        slo,
        autoscale,
    )
    wake = _checked_choices(objective, cpu_wake_latency_us, control_path)
    service = Service(
        state_dir=state_dir,
        device=profile,
        control_path=control_path,
        pool_mb=pool_mb,
        max_inflight_mb=max_inflight_mb,
        max_inflight_mb_per_uid=max_inflight_mb_per_uid,
        pending_per_uid=max_pending_per_uid,
        operator_pending=operator_pending,
        objective=objective,
        cpu_wake_latency_us=wake,
    )
    code = asyncio.run(
        _serve(
            service,
            configs,
            default_socket(socket),
            max_body_mb,
            drain_s,
            security=security,
            socket_group=socket_group,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            limits=limits,
            grpc_socket=None
            if no_grpc
            else grpc_socket or default_grpc_socket(default_socket(socket)),
        )
    )
    if watcher is not None:
        watcher.stop()
    raise typer.Exit(code)


def _security_policy(
    allow_functions: list[str] | None, model_repository: list[str] | None, socket_group: str | None
) -> SecurityPolicy:
    """``serve``'s security policy (what pipelines loaded through the API may use), once
    ``--socket-group`` is known to name a group."""
    security = SecurityPolicy.create(allow_functions or (), model_repository or ())
    if socket_group is not None:
        resolve_group(socket_group)  # an unknown group fails now, not after the deploys
    return security


def _with_repositories(targets: list[str] | None, repositories: list[str] | None) -> list[str]:
    """The targets, then each ``--model-repository`` that is a Triton model repository
    (:func:`infscaler.base.triton.repository_models`) and not already a target."""
    from infscaler.base.triton import repository_models

    given = {os.path.realpath(t) for t in targets or []}
    extra = [
        r for r in repositories or [] if os.path.realpath(r) not in given and repository_models(r)
    ]
    return [*(targets or []), *dict.fromkeys(extra)]


def _initial_pipelines(
    targets: list[str] | None,
    partitions: int | None,
    shapes: str | None,
    watch_dir: Path | None,
    socket: str | None,
    security: SecurityPolicy,
    slo: str | None,
    autoscale: bool,
) -> tuple[list[Any], Any]:
    """``(the pipelines serve deploys at start, the --watch-pipelines watcher or None)``:
    the targets, then the watched directory's files (checked as the repository API checks
    them), each with ``--slo`` / ``--autoscale``.

    Raises:
        InfScalerError: ``--autoscale`` without ``--slo`` for a pipeline that has none.
    """
    configs = [c for t in targets or [] for c in pipelines_from_arg(t, partitions, shapes)]
    watcher = None
    if watch_dir is not None:
        watched, watcher = start_watching(watch_dir, default_socket(socket), err.print)
        for cfg in watched:
            # later versions of these files come through the repository API and its
            # checks: the first version gets the same, so a file that deploys at start
            # also reloads
            security.check_pipeline(cfg)
        configs += watched
    if autoscale and slo is None and any(c.slo is None for c in configs):
        raise InfScalerError("--autoscale needs --slo", hint="e.g. --slo 200ms --autoscale")
    return [with_slo(c, slo, autoscale) for c in configs], watcher


def _checked_choices(
    objective: str, cpu_wake_latency_us: str, control_path: str
) -> int | str | None:
    """Check ``--objective`` and ``--control-path``; returns ``--cpu-wake-latency-us``
    as the service takes it (:func:`wake_option`).

    Raises:
        InfScalerError: an unknown choice (the message says which ones there are).
    """
    if objective not in ("auto", "eq1"):
        raise InfScalerError(f"unknown --objective {objective!r}", hint="auto or eq1")
    wake = wake_option(cpu_wake_latency_us)
    if control_path not in ("auto", "ebpf", "userspace"):
        raise InfScalerError(
            f"unknown --control-path {control_path!r}", hint="auto, ebpf or userspace"
        )
    return wake


#: exit status when the front end died (EX_SOFTWARE): systemd's Restart=on-failure
#: restarts the service on a clean pool (see :mod:`infscaler.runtime.serving.frontend`)
EXIT_FRONTEND_DIED = 70
#: seconds past ``--drain-timeout`` after which a stop no longer waits for anything
STOP_GRACE_S = 10.0


def _hard_exit_after(seconds: float, service: Any) -> None:
    """Exit the process ``seconds`` from now whatever is stuck (the bound on SIGTERM),
    unlinking its shared memory first; instances die with it (PR_SET_PDEATHSIG)."""

    def fire() -> None:
        err.print(f"infscaler: still stopping after {seconds:.0f} s: exiting now", highlight=False)
        with contextlib.suppress(Exception):
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


async def _start_beside(
    service: Any,
    api: Any,
    grpc_socket: str | None,
    socket_group: str | None,
    metrics_port: int | None,
    metrics_host: str,
) -> tuple[Any, Any]:
    """The gRPC socket and the metrics port beside the HTTP ``api`` (each when asked
    for): ``(grpc server, metrics runner)``, None for one not started; neither left
    running when the other fails."""
    grpc_server = metrics_runner = None
    if grpc_socket is not None:
        grpc_server = await start_grpc_server(api, grpc_socket, socket_group)
        _say(f"infscaler: gRPC on {grpc_socket}")
    if metrics_port is not None:
        try:
            metrics_runner, bound = await start_metrics_server(
                create_metrics_app(service, metrics_registry(api)),
                metrics_port,
                metrics_host,
            )
        except BaseException:
            if grpc_server is not None:
                await grpc_server.stop()
            raise
        _say(f"infscaler: metrics on http://{metrics_host}:{bound}/metrics")
    return grpc_server, metrics_runner


async def _serve(
    service: Service,
    configs: list[Any],
    socket_path: str,
    max_body_mb: int,
    drain_s: float,
    *,
    security: Any,
    socket_group: str | None,
    metrics_port: int | None,
    limits: Any,
    metrics_host: str,
    grpc_socket: str | None,
) -> int:
    """Serve ``service`` (not started) on ``socket_path`` until a stop signal or the front
    end's death; returns the exit status."""
    notifier = SystemdNotifier()
    # the API's event loop runs on the main thread: named for its role, not the process's
    # ("infscaler" in /proc/PID/task/TID/comm told it from no other thread); the prefix
    # keeps `pgrep infscaler` finding the service
    threading.current_thread().name = "infscaler-api"
    set_os_thread_name("infscaler-api")
    loop = asyncio.get_running_loop()
    loop.set_default_executor(named_executor("isc-api-exec"))  # off-loop work, named
    stop = asyncio.Event()
    died: list[str] = []

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
    runner = metrics_runner = grpc_server = None
    try:
        kw = {"security": security, "limits": limits, "grpc": grpc_socket is not None}
        api = create_app(service, max_body_mb=max_body_mb, **kw)
        runner = await start_unix_server(api, socket_path, group=socket_group)
        grpc_server, metrics_runner = await _start_beside(
            service, api, grpc_socket, socket_group, metrics_port, metrics_host
        )
        _say(
            f"infscaler: listening on {socket_path} (control path: {service.channel.kind}, "
            f"pool {service.pool_mb} MB)"
        )
        await _deploy_given(service, configs, stop, notifier)
        if not stop.is_set():
            service.starting = False
            names = ", ".join(d.name for d in service.deployments()) or "no pipelines"
            notifier.ready(f"serving {names} on {socket_path}")
            notifier.start_watchdog(lambda: service.frontend.alive() and service.manager.running)
            _say(f"infscaler: ready ({names})")
            await stop.wait()
        if died:
            err.print(
                f"infscaler: the front end failed ({died[0]}): exiting so that the "
                "service restarts",
                highlight=False,
            )
        notifier.stopping("draining in-flight requests")
        err.print("infscaler: stopping: draining in-flight requests", highlight=False)
        t_stop = time.perf_counter()
        await loop.run_in_executor(None, service.close, drain_s)
        err.print(
            f"infscaler: stopped in {time.perf_counter() - t_stop:.1f} s "
            f"(exit {EXIT_FRONTEND_DIED if died else 0})",
            highlight=False,
        )
        return EXIT_FRONTEND_DIED if died else 0
    finally:
        notifier.stop_watchdog()
        with contextlib.suppress(Exception):
            await loop.run_in_executor(None, service.close, 0.0)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if grpc_server is not None:
            await grpc_server.stop()
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(socket_path)


async def _deploy_given(
    service: Any, configs: list[Any], stop: asyncio.Event, notifier: Any
) -> None:
    """Plan the pipelines given together (:meth:`~infscaler.service.deploy.DeployMixin.plan_set`),
    then deploy them one by one in a worker thread, telling systemd; a stop signal ends it
    after the deploy in progress."""
    loop = asyncio.get_running_loop()
    say = lambda m: err.print(f"  {m}", highlight=False)  # noqa: E731
    await loop.run_in_executor(None, service.plan_set, configs, say)
    for cfg in configs:
        notifier.status(f"deploying {cfg.name}")

        def progress(msg: str) -> None:
            _say(f"  {msg}")
            notifier.extend_timeout(120)

        t0 = time.perf_counter()
        deploy = loop.run_in_executor(None, lambda c=cfg: service.deploy(c, progress=progress))
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({deploy, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            err.print("interrupted while deploying")
            await deploy
            return
        waiter.cancel()
        deploy.result()
        _say(f"deployed {cfg.name} in {time.perf_counter() - t0:.1f} s")


# -- demo ---------------------------------------------------------------------------------


DEMO_TEXT = ["InfScaler serves partitioned models", "Edge inference on Jetson 2026"]


@app.command("demo")
def demo_cmd(
    control_path: ControlPathOpt = "auto",
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

    raw = yaml.safe_load(bundled_path("ocr.yaml").read_text())
    for st in raw["stages"]:
        if st["name"] == "det":
            st["partitions"] = partitions
        if st["name"] == "prep" and partitions > 1:  # cut at 640x640: needs that shape
            st["params"] = {**st.get("params", {}), "pad": True, "enlarge": True}
    cfg = load_pipeline(raw)
    if state_dir is None:
        state_dir = cache_dir() / "state"
    images = {
        "rendered (known text)": render_text_image(DEMO_TEXT),
        "skimage text.png": to_rgb(skdata.text()),
        "skimage page.png": to_rgb(skdata.page()),
    }
    with tempfile.TemporaryDirectory(prefix="infscaler-demo-") as tmp:
        sock = str(Path(tmp) / "infscaler.sock")
        with Service(state_dir=state_dir, control_path=control_path) as service:
            _say(f"control path: {service.channel.kind}")
            with err.status("partitioning PP-OCRv4 det and starting the OCR pipeline"):
                t0 = time.perf_counter()
                service.deploy(cfg, progress=lambda m: _say(f"  {m}"))
            _say(f"OCR pipeline ready in {time.perf_counter() - t0:.1f} s")
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
                    unit_ms = res.unit_ms
                    out.print(
                        f"  latency {res.parameters.get('latency_ms', 0):.1f} ms; per stage (ms): "
                        + ", ".join(f"{u} {unit_ms.get(u, 0):.1f}" for u in units),
                        highlight=False,
                    )
                print_status(client.status())
