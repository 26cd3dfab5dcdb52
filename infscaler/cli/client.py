"""CLI commands that are clients of a running service (``deploy``, ``undeploy``, ``infer``,
``status``) over its Unix socket, and what ``serve`` shares with them (the socket, a
pipeline from a command-line argument)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from infscaler.base.errors import ConfigError, InfScalerError
from infscaler.cli import err, out
from infscaler.cli.params import FastCommand

if TYPE_CHECKING:  # the client commands import numpy, the client and pydantic when they run
    import numpy as np

#: This module's commands; :mod:`infscaler.cli` loads them when one runs.
app = typer.Typer(add_completion=False)

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


def triton_model(path: Path) -> Path | None:
    """``path`` when it is a Triton model directory
    (:func:`infscaler.base.triton.is_model_dir`), else None."""
    from infscaler.base.triton import is_model_dir

    return path if is_model_dir(path) else None


def triton_pipeline_from_dir(
    path: Path, partitions: int | None = None, shapes: str | None = None
) -> Any:
    """A Triton model directory as a pipeline (:func:`infscaler.base.triton.triton_pipeline`),
    each ignored ``config.pbtxt`` field printed as a warning.

    Raises:
        ConfigError: a file or field that cannot be served (the message names both).
    """
    from infscaler.base.triton import triton_pipeline
    from infscaler.engines import available

    model = triton_pipeline(
        path, gpu_available=available("gpu")[0], partitions=partitions, shapes=shapes
    )
    for line in model.warnings:
        err.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)
    return model.config


def pipelines_from_arg(
    arg: str, partitions: int | None = None, shapes: str | None = None
) -> list[Any]:
    """:func:`pipeline_from_arg`, and for a Triton model repository (a directory of
    Triton model directories) one pipeline per model, named after its directory.

    Raises:
        ConfigError: as :func:`pipeline_from_arg`.
    """
    from infscaler.base.triton import repository_models

    p = Path(arg)
    if p.is_dir() and not (p / "plan.yaml").is_file() and triton_model(p) is None:
        models = repository_models(p)
        if models:
            return [pipeline_from_arg(str(d), partitions, shapes) for d in models]
    return [pipeline_from_arg(arg, partitions, shapes)]


def pipeline_from_arg(arg: str, partitions: int | None = None, shapes: str | None = None) -> Any:
    """A pipeline from a ``serve`` argument: a pipeline YAML, an ``.onnx`` model or bundled
    alias (partitioned into ``partitions`` if given), a plan dir, or a Triton model
    directory; ``shapes``: ``--shapes`` for a model's dynamic inputs.

    Raises:
        ConfigError: a file that is none of these, or ``shapes`` for a pipeline file or
            plan directory.
    """
    from infscaler.base.config import load_pipeline, pipeline_for_model
    from infscaler.base.models import MODELS

    p = Path(arg)
    triton = triton_model(p) if p.is_dir() and not (p / "plan.yaml").is_file() else None
    model = p.suffix == ".onnx" and p.is_file() or arg in MODELS or triton is not None
    if shapes and not model:
        raise ConfigError(
            f"--shapes applies to .onnx models and bundled aliases, not to {arg!r}",
            hint="set `shapes:` on the model stage in the pipeline file instead",
        )
    if p.suffix in (".yaml", ".yml", ".json") and p.is_file():
        return load_pipeline(p)
    if triton is not None:  # a Triton model directory: its config.pbtxt, latest version
        return triton_pipeline_from_dir(triton, partitions, shapes)
    if p.is_dir():
        if not (p / "plan.yaml").is_file():
            raise ConfigError(
                f"{p} is a directory but neither a plan directory (no plan.yaml) nor a "
                "Triton model directory (no <version>/model.onnx)",
                hint="give a plan directory (infscaler partition MODEL -o DIR), a Triton "
                "model directory or repository (MODEL/1/model.onnx), or the .onnx file",
            )
        return pipeline_for_model(p)
    if p.suffix == ".onnx" and p.is_file():
        return pipeline_for_model(p, partitions=partitions, shapes=shapes)
    if arg in MODELS:
        return pipeline_for_model(arg, partitions=partitions, shapes=shapes or MODELS[arg].shapes)
    if arg in BUNDLED_PIPELINES:
        return load_pipeline(bundled_path(f"{arg}.yaml"))
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

    if slo is None and not autoscale:
        return cfg
    from infscaler.base.config import validate_pipeline

    data = cfg.model_dump(exclude_none=True)
    if slo is not None:
        data["slo"] = slo
    if autoscale and cfg.autoscale is None:
        data["autoscale"] = {}
    return validate_pipeline(data, f"pipeline {cfg.name}")


def bundled_path(name: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("infscaler.pipelines").joinpath(name)))


def _client(socket: str | None) -> Any:
    """The service's client (:class:`~infscaler.api.client.Client`)."""
    from infscaler.api.client import Client

    return Client(default_socket(socket))


@app.command("deploy", cls=FastCommand)
def deploy_cmd(
    pipeline: Annotated[
        str, typer.Argument(help="PIPELINE.yaml (or MODEL.onnx / alias / Triton REPO/MODEL).")
    ],
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


@app.command("undeploy", cls=FastCommand)
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
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        raise InfScalerError(f"cannot read image {path}: {exc}") from None


def input_feeds(
    inputs: list[str], image: Path | None, kind: str, name: str, names: list[str], uint8: list[str]
) -> dict[str, np.ndarray]:
    """Feeds from ``--input NAME=FILE.npy`` items and an ``--image`` file for the ``kind``
    ``name`` whose inputs are ``names`` (``uint8``: those of datatype UINT8).

    Raises:
        InfScalerError: a malformed item, an unreadable file, or ``--image`` while the
            target has not exactly one UINT8 input.
    """
    import numpy as np

    feeds: dict[str, np.ndarray] = {}
    for item in inputs:
        key, sep, path = item.partition("=")
        if not sep or not key:
            raise InfScalerError(f"bad --input {item!r}", hint="use --input NAME=FILE.npy")
        try:
            feeds[key] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InfScalerError(f"cannot read {path} for input {key}: {exc}") from None
    if image is not None:
        if len(uint8) != 1:
            raise InfScalerError(
                f"--image needs {kind} with one UINT8 input; {name} has {names}",
                hint="use --input NAME=FILE.npy",
            )
        feeds[uint8[0]] = load_image(image)
    return feeds


def _parse_inputs(inputs: list[str], image: Path | None, meta: dict) -> dict[str, np.ndarray]:
    names = [i["name"] for i in meta["inputs"]]
    uint8 = [i["name"] for i in meta["inputs"] if i["datatype"] == "UINT8"]
    return input_feeds(inputs, image, "a model", meta["name"], names, uint8)


def _spec(i: dict) -> str:
    """``name (FP32 [-1, 3, 224, 224])`` of an input's metadata."""
    return f"{i['name']} ({i['datatype']} {list(i['shape'])})"


def missing_inputs_error(what: str, missing: list[dict]) -> InfScalerError:
    """The error for inputs not given: each one's name, shape and datatype on its line
    (the model metadata, ``GET /v2/models/NAME``; -1: any size)."""
    lines = "".join(f"\n  {i['name']}  {i['datatype']}  {list(i['shape'])}" for i in missing)
    return InfScalerError(
        f"{what} needs {len(missing)} more input{'s' if len(missing) > 1 else ''} "
        f"(name, datatype, shape; -1: any size):{lines}",
        hint="pass --input NAME=FILE.npy for each, --image or --text, or --random",
    )


def random_input(i: dict, rng: np.random.Generator) -> np.ndarray:
    """A random tensor for input metadata ``i`` (:func:`~infscaler.api.loadgen.random_tensor`;
    dynamic dims (-1) take 1)."""
    from infscaler.api.loadgen import random_tensor

    return random_tensor(i["datatype"], [1 if int(d) < 0 else int(d) for d in i["shape"]], rng)


def check_feeds(feeds: dict[str, np.ndarray], meta: dict, cast: bool = False) -> None:
    """Each given array has its input's datatype and rank, else an error saying the
    conversion to make; ``cast``: convert another numeric dtype in place (``astype``)."""
    from infscaler.api.codec import DATATYPES

    for i in meta["inputs"]:
        a = feeds.get(i["name"])
        if a is None or i["datatype"] not in DATATYPES or i["datatype"] == "BYTES":
            continue
        want = DATATYPES[i["datatype"]]
        if a.dtype != want and cast and a.dtype.kind in "biuf":
            a = feeds[i["name"]] = a.astype(want)
        if a.dtype != want:
            raise InfScalerError(
                f"input {_spec(i)} was given {a.dtype} {list(a.shape)}",
                hint=f"convert it: np.save(path, np.load(path).astype(np.{want.name})), "
                "or pass --cast",
            )
        if len(a.shape) != len(i["shape"]):
            raise InfScalerError(
                f"input {_spec(i)} was given rank {a.ndim} {list(a.shape)}",
                hint="reshape it to the model's rank (-1: any size)",
            )


def _describe(value: np.ndarray) -> str:
    import numpy as np

    if value.dtype.kind in "USO":
        return "\n".join(str(v.decode() if isinstance(v, bytes) else v) for v in value.reshape(-1))
    if value.size <= 16:
        return np.array2string(value, precision=4)
    return (
        f"{value.dtype} {list(value.shape)}  min {value.min():.4g}  max {value.max():.4g}  "
        f"mean {value.mean():.4g}"
    )


@app.command("infer", cls=FastCommand)
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
    random: Annotated[
        bool,
        typer.Option(
            "--random",
            help="Fill the inputs not given with random data of their shape and datatype "
            "(dynamic dims: 1), as trtexec does.",
        ),
    ] = False,
    cast: Annotated[
        bool,
        typer.Option(
            "--cast",
            help="Convert a .npy of another numeric dtype to the input's datatype (float64 "
            "-> FP32) instead of refusing it.",
        ),
    ] = False,
) -> None:
    """Send one inference request to a running service and print the outputs (with
    --task: a model-less query; the chosen variant is printed)."""
    import numpy as np

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
        missing = [i for i in meta["inputs"] if i["name"] not in feeds]
        if missing and random:
            rng = np.random.default_rng(0)
            feeds.update({i["name"]: random_input(i, rng) for i in missing})
            missing = []
        if missing:
            raise missing_inputs_error(f"{'task' if task else 'model'} {target}", missing)
        check_feeds(feeds, meta, cast)
        if task is not None:
            res = c.infer_task(task, feeds, latency_ms=latency_ms, min_accuracy=min_accuracy)
        else:
            res = c.infer(target, feeds)
    _print_result(res, save, as_json)


def _print_result(res: Any, save: Path | None, as_json: bool) -> None:
    """``infer``'s output: each output saved to ``save``/<name>.npy (when given), then the
    outputs as JSON (``--json``) or one line each with the latency and the chosen variant."""
    import numpy as np

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


@app.command("status", cls=FastCommand)
def status_cmd(
    socket: SocketOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per stage: partition, instances (engine, pid, cores, MB), queue, P50 / P99 ms, mean
    batch size; the control path; pool slots and MB."""
    with _client(socket) as c:
        st = c.status()
    if as_json:
        print(json.dumps(st, indent=2, default=str))
        return
    print_status(st)


def print_status(st: dict[str, Any]) -> None:
    """``infscaler status``'s text: control path, pool, zygote, resources, then a table per
    pipeline (:func:`~infscaler.cli.tables.print_table`)."""
    from rich.markup import escape

    from infscaler.cli.tables import Col, print_table

    cp = st["control_path"]
    pool = st["pool"]
    out.print(
        f"control path: [bold]{cp['kind']}[/] ({cp['policy']}; {cp.get('reason', '')})\n"
        f"tensor pool: {pool['mapped_mb']:.0f} / {pool['cap_mb']:.0f} MB mapped, "
        f"{pool['slots_in_use']} slots in use, {pool['slots_free']} free; "
        f"restarts {st.get('restarts', 0)}",
        highlight=False,
    )
    if st.get("grpc_socket"):
        out.print(f"gRPC socket: {st['grpc_socket']}", highlight=False, soft_wrap=True)
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
    tel = st.get("telemetry") or {}
    if tel:
        shown = "read" if tel.get("available") else f"not read: {tel.get('reason', '')}"
        out.print(f"telemetry ({tel.get('source', 'jtop')}): {shown}", highlight=False)
    cpu = st.get("cpu_priority") or {}
    if cpu:
        why = f" (cgroups not used: {cpu['reason']})" if cpu.get("reason") else ""
        levels = "; ".join(priority_text(p) for p in st["pipelines"])
        kept = "".join(f"; {n} kept to cores {c}" for n, c in (cpu.get("kept") or {}).items())
        out.print(f"CPU by priority: {cpu['mode']}{why}; {levels}{kept}", highlight=False)
    for p in st["pipelines"]:
        req = p["requests"]
        lat = req["latency"]
        title = (
            f"{escape(p['name'])} ({'ready' if p['ready'] else 'NOT ready'}"
            f"{', DEGRADED' if p.get('degraded') else ''}): "
            f"{req['success']} ok, {sum(req['fail'].values())} failed, "
            f"P50 {fmt_ms(lat['p50_ms'])} / P99 {fmt_ms(lat['p99_ms'])} ms"
        )
        cols = [Col("stage"), Col("part"), Col("B_k", "num"), Col("engine pid cores MB")]
        cols += [Col("queue", "num"), Col("P50 ms", "num"), Col("P99 ms", "num")]
        cols += [Col("batch", "num")]
        print_table(out, title, cols, [unit_row(u) for u in p["units"]])
        if p.get("slo_ms") is not None:
            shed = "" if p.get("queue_limit") is None else f", shedding beyond {p['queue_limit']}"
            out.print(
                f"SLO {p['slo_ms']:g} ms, autoscale {'on' if p.get('autoscale') else 'off'}, "
                f"window {p.get('window')}{shed}",
                highlight=False,
            )
        refused = req.get("refused") or {}
        if refused or req.get("configurations", 1) > 1:
            codes = ", ".join(f"{k} {v}" for k, v in sorted(refused.items(), key=lambda kv: -kv[1]))
            out.print(
                f"  refused: {codes or 'none'}; counted over "
                f"{req.get('configurations', 1)} configuration(s)",
                highlight=False,
                markup=False,
            )
        for why in p.get("degraded", []):
            out.print(f"  degraded: {why}", highlight=False)
        for d in p.get("decisions", [])[-5:]:
            out.print(f"  {d['action']}: {d['reason']}", highlight=False)


def priority_text(p: dict[str, Any]) -> str:
    """A pipeline's priority level and CPU share in ``infscaler status``:
    ``name priority 2 nice 10`` (and ``cpu.weight 11`` in the cgroup mode)."""
    text = f"{p['name']} priority {p.get('priority', 1)} nice {p.get('cpu_nice', 0)}"
    weight = p.get("cpu_weight")
    return text if weight is None else f"{text} cpu.weight {weight}"


def unit_row(u: dict[str, Any]) -> list[str]:
    """A stage's row of the status table: its instances one per line."""
    from rich.markup import escape

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
        f"\n  {st['step']} {fmt_ms(st.get('mean_ms'))} ms" for st in u.get("steps") or ()
    )
    return [
        u["unit"] + steps,
        u["partition"] or "-",
        f"{u['bottleneck']:.3g}" if u["bottleneck"] is not None else "-",
        escape(inst),
        str(u["queue"]),
        fmt_ms(u["compute_p50_ms"]),
        fmt_ms(u["compute_p99_ms"]),
        batch_text(u.get("exec") or {}),
    ]


def batch_text(ex: dict[str, Any]) -> str:
    """A unit's batch column: its mean batch size so far (items per execution) and, when
    it batches, the size its instances run now (``1.8 (<=4)``); ``-`` before any run."""
    mean = ex.get("mean_batch")
    if mean is None:
        return "-"
    now = int(ex.get("batch") or 1)
    return f"{mean:.2f}" + (f" (<={now})" if now > 1 else "")


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
