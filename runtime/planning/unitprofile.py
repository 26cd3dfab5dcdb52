"""Unit profiles for the planner: each served unit's service time per item, measured
in-process on this host (InferLine §4.1, the Profiler).

:func:`profile_pipeline` times each unit of a compiled pipeline (``warmup`` untimed runs,
then ``repeats`` timed); engines this host lacks use the plan's measured latency, else are
no option; memory is the plan's estimate plus ``INSTANCE_OVERHEAD_MB``.
:func:`sample_inputs` makes seeded inputs. Details: docs/planner.md, "Unit profiles".
Not pure: it runs onnxruntime and the pipeline's functions."""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from infscaler.base.device import INSTANCE_OVERHEAD_MB
from infscaler.base.errors import InfScalerError
from infscaler.base.samples import render_text_image
from infscaler.engines.onnxrt.loader import load_session
from infscaler.partitioner import profiler
from infscaler.runtime.planning.reference import readonly_view
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
from infscaler.runtime.serving.pipeline import load_function

__all__ = ["PipelineProfile", "profile_pipeline", "sample_inputs"]

_V2_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
SAMPLE_TEXT = ["InfScaler plans pipelines", "Edge inference on Jetson 2026", "P99 under the SLO"]


@dataclass(frozen=True)
class PipelineProfile:
    """What :func:`profile_pipeline` measured.

    Attributes:
        name / host: the pipeline, and where it was measured.
        units: one UnitProfile per unit, in order.
        samples_ms: unit name -> every timed call, ms.
        items: the fan-out's item count per timed request (empty without a fan-out).
        requests: timed requests (inputs x repeats).
        notes: what a reader should know (engines left out and why, estimates).
        step_ms: every step -> its mean ms per call (per item for a per-item step).
        model_shapes: model step -> the distinct input shapes it was fed."""

    name: str
    units: tuple[UnitProfile, ...]
    samples_ms: dict[str, list[float]] = field(default_factory=dict)
    items: tuple[int, ...] = ()
    requests: int = 0
    host: str = ""
    notes: tuple[str, ...] = ()
    step_ms: dict[str, float] = field(default_factory=dict)
    model_shapes: dict[str, list[dict[str, list[int]]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": self.host,
            "requests": self.requests,
            "items": list(self.items),
            "notes": list(self.notes),
            "units": [
                {
                    "unit": u.name,
                    "kind": u.kind,
                    "served": u.served,
                    "engines": {
                        e: {
                            "mean_ms": round(p.mean_ms, 4),
                            "p50_ms": round(float(np.median(p.samples_ms)), 4)
                            if p.samples_ms
                            else None,
                            "samples": len(p.samples_ms),
                            "memory_mb": round(p.memory_mb, 2),
                            "batch_ms": dict(p.batch_ms),
                        }
                        for e, p in u.engines.items()
                    },
                }
                for u in self.units
            ],
        }


def _image(h: int | None, w: int | None) -> np.ndarray:
    try:
        img = render_text_image(SAMPLE_TEXT)
    except Exception:  # noqa: BLE001 - no font / PIL: a plain random image instead
        img = np.random.default_rng(0).integers(0, 256, (96, 320, 3), dtype=np.uint8)
    if h or w:
        out = np.full((h or img.shape[0], w or img.shape[1], 3), 255, np.uint8)
        hh, ww = min(out.shape[0], img.shape[0]), min(out.shape[1], img.shape[1])
        out[:hh, :ww] = img[:hh, :ww]
        img = out
    return np.ascontiguousarray(img)


def sample_inputs(compiled: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """One request's inputs for ``compiled`` (see the module docstring).

    Raises:
        InfScalerError: an input of a datatype that cannot be made up (BYTES).
    """
    rng = np.random.default_rng(seed)
    known: dict[str, list[int]] = {}
    for u in compiled.units:
        for name, shape in (u.shapes or {}).items():
            known.setdefault(name, list(shape))
    out: dict[str, np.ndarray] = {}
    for spec in compiled.inputs:
        if spec.name not in compiled.front_inputs:
            continue
        dt = _V2_DTYPES.get(spec.datatype)
        if dt is None:
            raise InfScalerError(
                f"cannot make up a sample for input {spec.name} ({spec.datatype})",
                hint="give sample inputs (--input NAME=FILE.npy)",
            )
        shape = list(spec.shape)
        if spec.name in known and len(known[spec.name]) == len(shape):
            shape = [k if d < 0 else d for d, k in zip(shape, known[spec.name], strict=True)]
        if dt is np.uint8 and len(shape) == 3 and shape[2] == 3:
            out[spec.name] = _image(
                shape[0] if shape[0] > 0 else None, shape[1] if shape[1] > 0 else None
            )
            continue
        shape = [d if d > 0 else 4 for d in shape]
        if np.issubdtype(dt, np.floating):
            out[spec.name] = rng.standard_normal(shape).astype(dt)
        elif dt is np.bool_:
            out[spec.name] = rng.random(shape) < 0.5
        else:
            out[spec.name] = rng.integers(0, 8, shape).astype(dt)
    return out


class _Runner:
    """Runs one unit in-process and times it."""

    def __init__(self, unit: Any) -> None:
        self.unit = unit
        self.session: Any = None
        self.fn: Any = None
        if unit.kind == "model":
            # the cpu engine's own session (same loader, same options)
            self.session = load_session(unit.path, engine="cpu", threads=max(1, int(unit.threads)))
        else:
            self.fn = load_function(unit.function or "")
            warm = getattr(self.fn, "warmup", None)
            if callable(warm):
                warm(**(unit.params or {}))

    def model(self, env: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        u = self.unit
        feeds = {u.in_map[s]: env[s] for s in u.inputs}
        names = list(u.out_map)
        t0 = time.perf_counter()
        values = self.session.run(names, feeds)
        ms = (time.perf_counter() - t0) * 1e3
        return {u.out_map[k]: np.asarray(v) for k, v in zip(names, values, strict=True)}, ms

    def call(self, arg: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = self.fn(arg, **(self.unit.params or {}))
        return out, (time.perf_counter() - t0) * 1e3

    def batch_ms(self, env: Mapping[str, np.ndarray], max_batch: int) -> dict[int, float]:
        """T_b on the sample stacked b times along axis 0 (empty when it does not stack)."""
        u = self.unit
        feeds1 = {u.in_map[s]: np.asarray(env[s]) for s in u.inputs}
        if any(a.ndim == 0 for a in feeds1.values()):
            return {}
        sizes = sorted({1, *[2**i for i in range(1, 7) if 2**i < max_batch], max_batch})
        out: dict[int, float] = {}
        for b in sizes:
            feeds = {k: np.concatenate([a] * b) for k, a in feeds1.items()}
            times = []
            try:
                self.session.run(None, feeds)
                for _ in range(3):
                    t0 = time.perf_counter()
                    self.session.run(None, feeds)
                    times.append((time.perf_counter() - t0) * 1e3)
            except Exception:  # noqa: BLE001 - a fixed batch dimension: stop at what ran
                break
            out[b] = round(float(np.median(times)), 4)
        return out if len(out) > 1 else {}


def _run_once(
    compiled: Any,
    runners: list[_Runner],
    inputs: Mapping[str, np.ndarray],
    samples: dict[str, list[float]] | None,
    shapes: dict[str, list[dict[str, list[int]]]] | None = None,
    totals: list[float] | None = None,
) -> tuple[int | None, dict[str, np.ndarray]]:
    """One request through every unit: ``(fan-out item count, the first env each model unit
    saw)``; ``totals`` gets the request's time over every unit, ms."""
    env: dict[str, np.ndarray] = dict(inputs)
    items: list[dict[str, np.ndarray]] | None = None
    n_items: int | None = None
    seen: dict[str, Any] = {}
    total = [0.0]

    def note(name: str, ms: float) -> None:
        total[0] += ms
        if samples is not None:
            samples[name].append(ms)

    for u, r in zip(compiled.units, runners, strict=True):
        if u.fan_in:
            gathered = [{n: readonly_view(it[n]) for n in u.inputs} for it in items or []]
            out, ms = r.call(gathered)
            note(u.name, ms)
            env.update(out)
            items = None
        elif u.fan_out:
            out, ms = r.call({n: readonly_view(env[n]) for n in u.inputs})
            note(u.name, ms)
            if not isinstance(out, list):
                raise InfScalerError(f"stage {u.stage}: fan_out returned {type(out).__name__}")
            items = [{**env, **it} for it in out]
            n_items = len(items)
        else:
            targets = items if items is not None else [env]
            for tgt in targets:
                if u.kind == "model":
                    seen.setdefault(u.name, dict(tgt))
                    if shapes is not None:
                        fed = {u.in_map[n]: list(np.shape(tgt[n])) for n in u.inputs}
                        if fed not in shapes.setdefault(u.name, []):
                            shapes[u.name].append(fed)
                    out, ms = r.model(tgt)
                else:
                    out, ms = r.call({n: readonly_view(tgt[n]) for n in u.inputs})
                    if not isinstance(out, Mapping):
                        raise InfScalerError(
                            f"stage {u.stage}: returned {type(out).__name__}, not a dict"
                        )
                note(u.name, ms)
                tgt.update(out)
    if totals is not None:
        totals.append(total[0])
    return n_items, seen


def _plan_ms(unit: Any, engine: str) -> float | None:
    entry = (unit.plan_latency_ms or {}).get(engine)
    if isinstance(entry, dict):
        entry = entry.get("ms") if entry.get("available", True) else None
    return float(entry) if isinstance(entry, int | float) and entry > 0 else None


def _memory_mb(unit: Any, overhead_mb: float) -> tuple[float, str]:
    if unit.memory_mb is not None:
        return float(unit.memory_mb) + overhead_mb, "plan estimate"
    if unit.kind == "model" and unit.path and Path(unit.path).is_file():
        return Path(unit.path).stat().st_size / 2**20 + overhead_mb, "ONNX file size"
    return overhead_mb, "instance overhead only"


def profile_pipeline(
    compiled: Any,
    inputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: Any = None,
    instance_overhead_mb: float | None = None,
    corun: bool = False,
    idle: bool = False,
) -> PipelineProfile:
    """Measure every unit of ``compiled`` in-process (see the module docstring).

    Args:
        compiled: a :class:`~infscaler.runtime.serving.pipeline.CompiledPipeline`.
        inputs: one request's inputs, or several (default: :func:`sample_inputs`).
        repeats: timed runs per input (>= 1). warmup: untimed runs first (>= 0).
        device: a DeviceProfile: engines other than cpu only if it has them (None: cpu).
        instance_overhead_mb: default :data:`infscaler.base.device.INSTANCE_OVERHEAD_MB`.
        corun: also time each unfused model unit with every core running a copy
            (``profiler.measure_corun``): its cpu profile's ``corun``.
        idle: also time each such unit after idle gaps (``profiler.measure_idle``).

    Raises:
        ValueError: bad repeats / warmup.
        InfScalerError: a unit fails on the sample, or a per-item unit never ran."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if instance_overhead_mb is None:
        instance_overhead_mb = INSTANCE_OVERHEAD_MB
    batches = _input_batches(compiled, inputs)
    # a fused unit runs step by step; its sample is the sum of its steps' (one per call)
    steps = [s for u in compiled.units for s in u.step_units]
    runs = _time_steps(steps, batches, repeats, warmup)
    step_ms = {k: float(np.mean(v)) for k, v in runs.samples.items() if v}
    by_step = dict(zip((s.name for s in steps), runs.runners, strict=True))
    fn_ms = _fuse_samples(compiled, runs.samples, runs.totals)
    runners = [by_step.get(u.name) or by_step[u.step_units[0].name] for u in compiled.units]
    engines_here = set(device.engines) if device is not None else {"cpu"}
    notes: list[str] = []
    profiles = [
        _unit_profile(u, r, runs, fn_ms, engines_here, notes, instance_overhead_mb, corun, idle)
        for u, r in zip(compiled.units, runners, strict=True)
    ]
    return PipelineProfile(
        name=compiled.name,
        units=tuple(profiles),
        samples_ms=runs.samples,
        items=tuple(runs.counts),
        requests=len(batches) * repeats,
        host=f"{platform.node()} {platform.machine()} (in-process, onnxruntime CPU)",
        notes=tuple(notes),
        step_ms=step_ms,
        model_shapes=runs.fed,
    )


def _input_batches(
    compiled: Any,
    inputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None,
) -> list[dict[str, np.ndarray]]:
    """The requests' inputs to run: ``inputs`` (one request's or several), else one made up.

    Raises:
        ValueError: an empty sequence of requests."""
    if inputs is None:
        return [sample_inputs(compiled)]
    if isinstance(inputs, Mapping):
        return [dict(inputs)]
    batches = [dict(i) for i in inputs]
    if not batches:
        raise ValueError("inputs: give at least one request's inputs")
    return batches


@dataclass
class _Timed:
    """What the timed runs recorded: ``runners`` per step, ``samples`` (step -> ms per call),
    ``counts`` (items per request), ``seen`` (model step -> first env), ``fed`` (model step
    -> input shapes) and ``totals`` (per request, its time over every step)."""

    runners: list[_Runner]
    samples: dict[str, list[float]]
    counts: list[int] = field(default_factory=list)
    seen: dict[str, Any] = field(default_factory=dict)
    fed: dict[str, list[dict[str, list[int]]]] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)


def _time_steps(
    steps: list[Any], batches: list[dict[str, np.ndarray]], repeats: int, warmup: int
) -> _Timed:
    """Each request of ``batches`` through ``steps``, ``warmup`` times untimed then
    ``repeats`` times timed (:func:`_run_once`)."""
    flat = SimpleNamespace(units=steps)
    runs = _Timed([_Runner(s) for s in steps], {s.name: [] for s in steps})
    for feeds in batches:
        for _ in range(warmup):
            _run_once(flat, runs.runners, feeds, None)
        for _ in range(repeats):
            n, s = _run_once(flat, runs.runners, feeds, runs.samples, runs.fed, runs.totals)
            for k, v in s.items():
                runs.seen.setdefault(k, v)
            if n is not None:
                runs.counts.append(n)
    return runs


def _fuse_samples(
    compiled: Any, samples: dict[str, list[float]], totals: list[float]
) -> dict[str, float]:
    """Replace each fused unit's steps' samples in ``samples`` by the unit's: per call,
    the sum of its steps' (a ``fuse: whole`` unit: each request's ``totals``). Returns
    each fused unit's function steps' mean ms (on the cpu)."""
    fn_ms: dict[str, float] = {}  # a fused unit's function steps, mean ms (on the cpu)
    for u in compiled.units:
        if u.steps:
            per_step = [samples.pop(s.name) for s in u.steps]
            whole = any(s.fan_in for s in u.steps)  # fuse: whole: the only unit
            samples[u.name] = (
                list(totals) if whole else [float(sum(x)) for x in zip(*per_step, strict=False)]
            )
            fn_ms[u.name] = sum(
                float(np.mean(x))
                for s, x in zip(u.steps, per_step, strict=True)
                if s.kind == "function" and x
            )
    return fn_ms


def _unit_profile(
    u: Any,
    r: _Runner,
    runs: _Timed,
    fn_ms: Mapping[str, float],
    engines_here: set[str],
    notes: list[str],
    overhead_mb: float,
    corun: bool,
    idle: bool,
) -> UnitProfile:
    """Unit ``u``'s profile from its samples (cpu; on a model unit batch latencies, co-running
    and idle slowdowns when asked, and the plan's other engines); ``notes`` gets what a
    reader should know.

    Raises:
        InfScalerError: the unit never ran (the fan-out made no items)."""
    got = runs.samples[u.name]
    if not got:
        raise InfScalerError(
            f"unit {u.name} never ran on the sample inputs (the fan-out made no items)",
            hint="give inputs that produce items (--input NAME=FILE.npy / --image FILE)",
        )
    mem, origin = _memory_mb(u, overhead_mb)
    cores = max(1, int(u.threads)) if u.kind == "model" else 0
    batch: dict[int, float] = {}
    if u.kind == "model" and u.max_batch > 1 and u.name in runs.seen:
        batch = r.batch_ms(runs.seen[u.name], u.max_batch)
        if not batch:
            notes.append(f"{u.name}: no batch profile (the input does not stack on axis 0)")
    slower = 0.0
    after_idle: tuple[tuple[float, float], ...] = ()
    if u.kind == "model" and not u.steps and u.name in runs.seen:
        feeds = {u.in_map[x]: runs.seen[u.name][x] for x in u.inputs}
        if corun:
            slower = profiler.measure_corun(u.path, feeds, threads=cores)
        if idle:
            after_idle = profiler.measure_idle(u.path, feeds, threads=cores)
    engines = {
        "cpu": EngineProfile(
            "cpu",
            float(np.mean(got)),
            samples_ms=tuple(got),
            batch_ms=batch,
            memory_mb=mem if not u.fan_in else 0.0,
            cores=cores,
            corun=slower,
            idle=after_idle,
        )
    }
    if u.kind == "model":
        engines.update(_plan_engines(u, mem, fn_ms, engines_here, notes))
    if u.kind == "model" and origin != "plan estimate":
        notes.append(f"{u.name}: memory from the {origin} + instance overhead")
    return UnitProfile(
        name=u.name,
        engines=engines,
        kind=u.kind,
        fan_out=u.fan_out,
        items=tuple(runs.counts) if u.fan_out and runs.counts else (1,),
        fan_in=u.fan_in,
        served=not u.fan_in,
        bottleneck=u.bottleneck,
        min_instances=max(1, int(u.instances)),
        max_instances=u.max_instances,
        max_batch=max(1, int(u.max_batch)),
    )


def _plan_engines(
    u: Any, mem: float, fn_ms: Mapping[str, float], engines_here: set[str], notes: list[str]
) -> dict[str, EngineProfile]:
    """Model unit ``u``'s ``gpu`` / ``dla`` options from the plan's measured latency
    (:func:`_plan_ms`) where the device has the engine, its fused function steps' cpu
    time added; ``notes`` says which and why one is left out."""
    engines: dict[str, EngineProfile] = {}
    for e in ("gpu", "dla"):
        ms = _plan_ms(u, e)
        if ms is None:
            continue
        if e not in engines_here:
            notes.append(f"{u.name}: the plan has {e} {ms:g} ms, the device has no {e}")
            continue
        extra = fn_ms.get(u.name, 0.0)  # its function steps run on the cpu
        engines[e] = EngineProfile(e, ms + extra, memory_mb=mem)
        notes.append(
            f"{u.name}: {e} from the plan's measured {ms:g} ms (deterministic)"
            + (f" + its function steps' {extra:.3g} ms on the cpu" if extra else "")
        )
    return engines
