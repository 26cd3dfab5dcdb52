"""The variant registry: generate, profile and store the variants of registered models
(INFaaS §3.2). More: docs/variants.md, "`infscaler/modelless/register.py`".
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.models import MODELS, BundledModel, resolve_model
from infscaler.base.procutil import module_command
from infscaler.engines import ENGINE_KINDS, create_engine, engine_availability, engine_class
from infscaler.engines.base import process_memory_bytes
from infscaler.modelless.accuracy import (
    AccuracyRunner,
    embed,
    embedding_agreement,
    load_ocr_val_set,
    measure_rec,
    sentences_from,
)
from infscaler.modelless.modelinfo import (
    ModelInfo,
    concrete_shapes,
    dequantize,
    inspect_model,
    profile_feeds,
    shapes_text,
    task_io,
)
from infscaler.modelless.variants import (
    KNOWN_TASKS,
    NAME_RE,
    TASK_RE,
    RegistrationError,
    Variant,
    VariantRegistry,
    file_sha256,
)
from infscaler.partitioner.api import partition_model
from infscaler.partitioner.plan import read_plan

__all__ = [
    "register",
]

# -- profiling -----------------------------------------------------------------------------


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {
        "p50": round(float(np.percentile(a, 50)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
    }


def _profile_chain(
    paths: Sequence[str],
    engine: str,
    precision: str,
    shapes: dict[str, list[int]],
    batches: Sequence[int],
    *,
    warmup: int,
    repeats: int,
    threads: int,
) -> dict[str, Any]:
    """Load ``paths`` (a chain of partitions: outputs feed the next by name) on
    ``engine`` in this process and time them. Returns load_ms (sum of the partitions'),
    latency {b: p50/p99} of the chain, the bottleneck P50 (slowest partition at the
    largest batch) and peak_mb (USS growth across the load and the runs)."""

    info = inspect_model(paths[0])
    rng = np.random.default_rng(0)
    before = process_memory_bytes()
    peak = before
    engines = []
    load_ms = 0.0
    try:
        for p in paths:
            t0 = time.perf_counter()
            eng = create_engine(engine, p, threads=threads, precision=precision).load()
            load_ms += (time.perf_counter() - t0) * 1e3
            engines.append(eng)
        peak = max(peak, process_memory_bytes())
        latency: dict[str, dict[str, float]] = {}
        part_p50: list[float] = []
        for b in batches:
            feeds = profile_feeds(info, shapes, b, rng)
            per_part: list[list[float]] = [[] for _ in engines]
            total: list[float] = []
            for i in range(warmup + repeats):
                tensors = dict(feeds)
                t_all = time.perf_counter()
                for k, eng in enumerate(engines):
                    names = [t.name for t in eng.inputs]
                    t0 = time.perf_counter()
                    tensors.update(eng.infer({n: tensors[n] for n in names}))
                    if i >= warmup:
                        per_part[k].append((time.perf_counter() - t0) * 1e3)
                if i >= warmup:
                    total.append((time.perf_counter() - t_all) * 1e3)
            latency[str(b)] = _percentiles(total)
            part_p50 = [float(np.percentile(x, 50)) for x in per_part]
            peak = max(peak, process_memory_bytes())
    finally:
        for eng in engines:
            eng.close()
    return {
        "load_ms": round(load_ms, 3),
        "latency_ms": latency,
        "bottleneck_p50_ms": round(max(part_p50), 4) if part_p50 else None,
        "peak_mb": round(max(0, peak - before) / 2**20, 2),
    }


def _profile(
    paths: Sequence[Path],
    engine: str,
    precision: str,
    shapes: dict[str, list[int]],
    batches: Sequence[int],
    *,
    warmup: int,
    repeats: int,
    threads: int,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """:func:`_profile_chain` in a fresh Python process (its memory growth the variant's alone;
    a crash fails this variant only).

    Raises:
        RegistrationError: the child failed (its last lines of stderr).
    """
    import subprocess

    job = {
        "paths": [str(p) for p in paths],
        "engine": engine,
        "precision": precision,
        "shapes": shapes,
        "batches": list(batches),
        "warmup": warmup,
        "repeats": repeats,
        "threads": threads,
    }
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    proc = subprocess.run(
        module_command("infscaler.modelless.register"),
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RegistrationError(f"profiling {Path(paths[0]).name} on {engine} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _profile_main() -> None:
    """Child side of :func:`_profile`: a job as JSON on stdin, the result on stdout."""
    import sys

    job = json.loads(sys.stdin.read())
    result = _profile_chain(**job)  # the keyword arguments _profile sent
    sys.stdout.write(json.dumps(result) + "\n")


# -- registration --------------------------------------------------------------------------


def _engines_for(device: Any) -> list[tuple[str, list[str]]]:
    """(engine, precisions the profile lists) of the device profile, or every kind."""

    if device is None:
        return [(k, []) for k in ENGINE_KINDS]
    return [(a.engine, list(a.precisions)) for a in device.accelerators if a.count > 0]


def _host() -> str:
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"


def register(
    model: str | os.PathLike[str],
    *,
    task: str | None = None,
    name: str | None = None,
    accuracy: float | None = None,
    val_set: str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] | None = None,
    charset: str | os.PathLike[str] | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    shapes: str | None = None,
    device: Any = None,
    batch_sizes: Sequence[int] = (1, 4),
    partitions: Sequence[int] = (1,),
    warmup: int = 2,
    repeats: int = 10,
    threads: int = 1,
    registry: VariantRegistry | str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> list[Variant]:
    """Register a model: generate, profile and store its variants.

    Args:
        model: an ``.onnx`` path or a bundled alias.
        task, name: default: the alias's, or the file's stem.
        accuracy / val_set: declared accuracy 0-1, or a validation set to measure it on.
        reference: text-embedding: the fp32 reference model.
        charset / tokenizer: a recogniser's character list / a ``tokenizer.json``.
        shapes: concrete shapes of dynamic inputs at batch 1.
        device: a :class:`~infscaler.base.device.DeviceProfile` (None: every engine kind).
        batch_sizes, partitions: the variants' batch sizes and plan sizes K.
        warmup, repeats, threads: profiling runs and intra-op threads.
        registry: the store or its directory (default: the service's state dir).
        progress: called with a line per step.

    Returns:
        Every variant stored, generated or not.

    Raises:
        RegistrationError: bad task / name / accuracy, a model that does not fit the task, no
            accuracy source, a bad validation set.
        ModelLoadError / ModelNotInstalledError / ShapeError: the model cannot be used.
    """

    reg = registry if isinstance(registry, VariantRegistry) else VariantRegistry(registry)
    source = str(model)
    alias = MODELS.get(source) if not Path(source).exists() else None
    task, path, name = _identify(source, alias, task, name)
    _check_options(task, accuracy, val_set, batch_sizes, partitions)
    info = inspect_model(path)
    io = task_io(
        task,
        info,
        alias=alias,
        charset=str(charset) if charset else None,
        tokenizer=str(tokenizer) if tokenizer else None,
        files_dir=reg.files_dir,
        model_name=name,
    )
    base_shapes = concrete_shapes(
        info, task, shapes if shapes is not None else (alias.shapes if alias else None)
    )
    batches = sorted(set(batch_sizes)) if info.dynamic_batch else [1]
    if not info.dynamic_batch and any(b > 1 for b in batch_sizes):
        progress(f"{name}: the batch dim is fixed, batch 1 only")
    # Accuracy reference and validation data, loaded once.
    ocr_samples = (
        load_ocr_val_set(val_set) if task == "text-recognition" and val_set is not None else None
    )
    if task == "text-recognition" and accuracy is None and ocr_samples is None:
        raise RegistrationError(
            "give --val-set DIR (text-line images + labels.txt) or --accuracy X",
            hint="infscaler.modelless.accuracy.build_ocr_val_set renders one from known text",
        )
    if task not in ("text-recognition", "text-embedding") and accuracy is None:
        raise RegistrationError(f"declare the accuracy of {name} for {task} (--accuracy X)")

    m = _Registering(
        reg=reg,
        task=task,
        name=name,
        source=source,
        path=path,
        info=info,
        io=io,
        base_shapes=base_shapes,
        created=time.time(),
        host=_host(),
    )
    out, runs = _generate(m, device, progress)
    acc_of = _accuracies(m, runs, accuracy, val_set, reference, ocr_samples, progress)
    out.extend(
        _profile_variants(
            m,
            runs,
            acc_of,
            partitions,
            batches,
            device,
            warmup=warmup,
            repeats=repeats,
            threads=threads,
            progress=progress,
        )
    )
    if not any(v.generated for v in out):
        raise RegistrationError(
            f"no variant of {name} can be generated on this host: "
            + "; ".join(v.reason for v in out),
            hint="register on a host that has one of the device's engines",
        )
    reg.replace_model(name, out)
    return out


@dataclass
class _Registering:
    """The model being registered, and what each of its variants records of it."""

    reg: VariantRegistry
    task: str
    name: str
    source: str
    path: Path
    info: ModelInfo
    io: dict[str, Any]
    base_shapes: dict[str, list[int]]
    created: float
    host: str


def _identify(
    source: str, alias: BundledModel | None, task: str | None, name: str | None
) -> tuple[str, Path, str]:
    """The task, model file and registered name of ``source``.

    Raises:
        RegistrationError: no task, or a malformed task or name.
        ModelLoadError / ModelNotInstalledError: as :func:`resolve_model`.
    """
    task = task or (alias.task if alias is not None else None)
    if not task:
        raise RegistrationError(
            "name the task the model serves (--task)",
            hint=f"e.g. --task text-recognition; tasks with an interface: {', '.join(KNOWN_TASKS)}",
        )
    if not TASK_RE.match(task):
        raise RegistrationError(f"task names are lower-case words with '-': got {task!r}")
    path = resolve_model(source)
    name = name or (alias.alias if alias is not None else path.stem)
    if not NAME_RE.match(name):
        raise RegistrationError(
            f"model name {name!r}: use 1-40 letters, digits, '-' or '_'",
            hint="pass --name",
        )
    return task, path, name


def _check_options(
    task: str,
    accuracy: float | None,
    val_set: str | os.PathLike[str] | None,
    batch_sizes: Sequence[int],
    partitions: Sequence[int],
) -> None:
    """RegistrationError for two accuracy sources, an accuracy outside [0, 1], a validation set
    without a measure, or batch / plan sizes out of range.
    """
    if accuracy is not None and val_set is not None:
        raise RegistrationError("give --accuracy or --val-set, not both")
    if accuracy is not None and not (isinstance(accuracy, int | float) and 0 <= accuracy <= 1):
        raise RegistrationError(f"accuracy must be within [0, 1], got {accuracy!r}")
    if val_set is not None and task not in ("text-recognition", "text-embedding"):
        raise RegistrationError(
            f"accuracy is measured for text-recognition and text-embedding only; declare "
            f"it for {task} (--accuracy)"
        )
    bad_b = [b for b in batch_sizes if not isinstance(b, int) or not 1 <= b <= 64]
    bad_k = [k for k in partitions if k not in (1, 2)]
    if bad_b or bad_k or not batch_sizes or not partitions:
        raise RegistrationError(
            f"batch sizes must be 1-64 and plan sizes K 1 or 2; got {list(batch_sizes)}, "
            f"{list(partitions)}"
        )


def _generate(
    m: _Registering, device: Any, progress: Callable[[str], None]
) -> tuple[list[Variant], list[tuple[str, str, Path]]]:
    """The variants that cannot be generated here (stored with
    the reason) and the (engine, precision, file) runs that can, per engine of ``device``."""
    availability = engine_availability()
    out: list[Variant] = []
    runs: list[tuple[str, str, Path]] = []  # (engine, precision, file) generated
    for engine, listed in _engines_for(device):
        ok, why = availability.get(engine, (False, "unknown engine"))
        if not ok:
            out.append(
                Variant(
                    name=f"{m.name}.{engine}",
                    task=m.task,
                    model=m.name,
                    source=m.source,
                    path=str(m.path),
                    engine=engine,
                    precision="/".join(listed) or "-",
                    generated=False,
                    reason=f"engine {engine} is not available on this host: {why}",
                    io=m.io,
                    host=m.host,
                    created=m.created,
                )
            )
            continue
        if engine == "cpu":
            runs.append((engine, m.info.precision, m.path))
            if m.info.precision == "int8":
                try:
                    fp32 = dequantize(m.path, m.reg.files_dir / "models" / f"{m.name}.fp32.onnx")
                    runs.append((engine, "fp32", fp32))
                except RegistrationError as exc:
                    progress(str(exc))
        else:
            host_prec = set(engine_class(engine).precisions)
            for prec in [p for p in ("fp16", "int8") if p in host_prec]:
                if listed and prec not in listed:
                    continue
                if prec == "int8" and m.info.precision != "int8":
                    out.append(
                        Variant(
                            name=f"{m.name}.{engine}.int8",
                            task=m.task,
                            model=m.name,
                            source=m.source,
                            path=str(m.path),
                            engine=engine,
                            precision="int8",
                            generated=False,
                            reason="int8 on TensorRT needs a calibration set (not supported)",
                            io=m.io,
                            host=m.host,
                            created=m.created,
                        )
                    )
                    continue
                runs.append((engine, prec, m.path))
    return out, runs


def _accuracies(
    m: _Registering,
    runs: list[tuple[str, str, Path]],
    accuracy: float | None,
    val_set: str | os.PathLike[str] | None,
    reference: str | os.PathLike[str] | None,
    ocr_samples: list[tuple[np.ndarray, str]] | None,
    progress: Callable[[str], None],
) -> dict[tuple[str, str, str], tuple[float | None, str]]:
    """The accuracy of each run and how it was found,
    ``(engine, precision, file) -> (accuracy, source)``, shared by its batch sizes and
    plans."""
    acc_of: dict[tuple[str, str, str], tuple[float | None, str]] = {}
    ref_emb: np.ndarray | None = None
    sentences: list[str] = []
    if m.task == "text-embedding" and accuracy is None:
        sentences = sentences_from(val_set)
        ref_emb, ref_what = _embedding_reference(
            m.reg, m.task, reference, m.info, m.path, m.name, m.io, sentences, progress
        )
    for engine, prec, file in runs:
        key = (engine, prec, str(file))
        if accuracy is not None:
            acc_of[key] = (float(accuracy), "declared")
            continue
        engine_prec = "fp32" if engine == "cpu" else prec
        run = AccuracyRunner(file, engine, engine_prec)
        try:
            if ocr_samples is not None:
                progress(f"{m.name} ({engine} {prec}): measuring CER on {len(ocr_samples)} lines")
                cer = measure_rec(run, m.io, ocr_samples)
                acc_of[key] = (
                    round(max(0.0, 1.0 - cer), 6),
                    f"measured: 1 - CER ({cer:.4f}) on {len(ocr_samples)} lines of {val_set}",
                )
            else:
                assert ref_emb is not None
                emb = embed(run, m.io, sentences)
                agree = embedding_agreement(emb, ref_emb)
                acc_of[key] = (
                    round(agree, 6),
                    f"measured: agreement of pairwise similarities with {ref_what} on "
                    f"{len(sentences)} sentences",
                )
        finally:
            run.close()
    return acc_of


def _profile_variants(
    m: _Registering,
    runs: list[tuple[str, str, Path]],
    acc_of: dict[tuple[str, str, str], tuple[float | None, str]],
    partitions: Sequence[int],
    batches: Sequence[int],
    device: Any,
    *,
    warmup: int,
    repeats: int,
    threads: int,
    progress: Callable[[str], None],
) -> list[Variant]:
    """Every generated variant of each run, per plan size K
    and batch size, profiled; a plan that cannot fit the task is stored as not
    generated."""
    out: list[Variant] = []
    for engine, prec, file in runs:
        engine_prec = "fp32" if engine == "cpu" else prec
        acc, acc_how = acc_of[(engine, prec, str(file))]
        for k in partitions:
            chain = [file]
            plan_dir = None
            if k > 1 and not _plan_fits(m.task, m.info):
                out.append(
                    Variant(
                        name=f"{m.name}.{engine}.{prec}.b1.k{k}",
                        task=m.task,
                        model=m.name,
                        source=m.source,
                        path=str(file),
                        engine=engine,
                        precision=prec,
                        partitions=k,
                        generated=False,
                        reason="a plan fixes the model's dynamic dims at the profiled shapes "
                        f"({shapes_text(m.base_shapes)}), but {m.task} inputs vary in them",
                        io=m.io,
                        host=m.host,
                        created=m.created,
                    )
                )
                continue
            if k > 1:
                plan_dir, chain = _plan(
                    file,
                    m.base_shapes,
                    m.reg.files_dir / "plans" / f"{m.name}.{prec}.k{k}",
                    k,
                    device,
                    progress,
                )
            for b in batches if k == 1 else [1]:
                vname = f"{m.name}.{engine}.{prec}.b{b}" + (f".k{k}" if k > 1 else "")
                progress(f"profiling {vname}")
                prof = _profile(
                    chain,
                    engine,
                    engine_prec,
                    m.base_shapes,
                    sorted({1, b}),
                    warmup=warmup,
                    repeats=repeats,
                    threads=threads,
                )
                vio = dict(m.io)
                vio["bottleneck_p50_ms"] = prof["bottleneck_p50_ms"] if k > 1 else None
                out.append(
                    Variant(
                        name=vname,
                        task=m.task,
                        model=m.name,
                        source=m.source,
                        path=str(file),
                        engine=engine,
                        precision=prec,
                        batch=b,
                        partitions=k,
                        plan=str(plan_dir) if plan_dir else None,
                        load_ms=prof["load_ms"],
                        latency_ms=prof["latency_ms"],
                        peak_mb=prof["peak_mb"],
                        weights_mb=round(sum(p.stat().st_size for p in chain) / 2**20, 3),
                        accuracy=acc,
                        accuracy_source=acc_how,
                        io=vio,
                        shapes=shapes_text(m.base_shapes),
                        host=m.host,
                        created=m.created,
                    )
                )
    return out


def _plan_fits(task: str, info: ModelInfo) -> bool:
    """A plan's partitions have the shapes they were cut at: fine when the model's
    non-batch dims are static, or the task's pre-processing fixes them (the detector's
    square canvas)."""
    if task == "text-detection":
        return True
    return all(isinstance(d, int) for t in info.inputs for d in t.shape[1:])


def _plan(
    file: Path,
    shapes: dict[str, list[int]],
    out_dir: Path,
    k: int,
    device: Any,
    progress: Callable[[str], None],
) -> tuple[Path, list[Path]]:
    """Partition ``file`` into ``k`` operator groups (Eq. 1); the plan dir and its parts."""

    if not (out_dir / "plan.yaml").is_file():
        progress(f"partitioning {file.name} into {k} operator groups")
        partition_model(
            file,
            shapes=shapes_text(shapes),
            num_partitions=k,
            device=device,
            out_dir=out_dir,
            force=True,
            threads=1,
            progress=progress,
        )
    plan = read_plan(out_dir, load_parts=False)
    return out_dir, [out_dir / p["file"] for p in plan.summary["partitions"]]


def _embedding_reference(
    reg: VariantRegistry,
    task: str,
    reference: str | os.PathLike[str] | None,
    info: ModelInfo,
    path: Path,
    name: str,
    io: dict[str, Any],
    sentences: list[str],
    progress: Callable[[str], None],
) -> tuple[np.ndarray, str]:
    """The fp32 reference embeddings of ``sentences`` and where they came from."""

    meta = reg.task_meta(task)
    if reference is not None:
        ref_source = str(reference)
        ref_path = resolve_model(ref_source)
        ref_alias = MODELS.get(ref_source) if not Path(ref_source).exists() else None
        ref_info = inspect_model(ref_path)
        ref_io = task_io(
            task,
            ref_info,
            alias=ref_alias,
            charset=None,
            tokenizer=io["tokenizer"] if ref_alias is None else None,
            files_dir=reg.files_dir,
            model_name=f"ref-{name}",
        )
        stem = ref_alias.alias if ref_alias is not None else ref_path.stem
    elif meta.get("reference"):
        ref_path = Path(meta["reference"])
        ref_io = meta["io"]
        ref_info = inspect_model(ref_path)
        ref_source = meta.get("source", str(ref_path))
        stem = meta.get("name", ref_path.stem)
    elif info.precision == "int8":
        ref_path, ref_io, ref_info, ref_source, stem = path, io, info, str(path), name
    else:
        raise RegistrationError(
            f"no fp32 reference for {task}: give --reference MODEL (fp32, or int8 with "
            "weight-only quantisation, dequantised) or --accuracy X",
            hint="the first text-embedding model registered with a reference sets it for the task",
        )
    what = meta["what"] if reference is None and meta.get("reference") else f"{stem} (fp32)"
    if ref_info.precision == "int8":
        ref_path = dequantize(ref_path, reg.files_dir / "models" / f"{stem}.fp32.onnx")
        what = f"{stem} (int8 weights dequantised to fp32)"
    elif ref_info.precision != "fp32":
        raise RegistrationError(f"the reference {ref_source} is {ref_info.precision}, not fp32")
    progress(f"reference embeddings: {what}")
    run = AccuracyRunner(ref_path)
    try:
        emb = embed(run, ref_io, sentences)
    finally:
        run.close()
    if not meta.get("reference") or reference is not None:
        reg.set_task_meta(
            task,
            {
                "reference": str(ref_path),
                "io": ref_io,
                "source": ref_source,
                "name": stem,
                "what": what,
                "sha256": file_sha256(ref_path),
            },
        )
    return emb, what


if __name__ == "__main__":
    _profile_main()
