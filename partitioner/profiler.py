"""Measured per-operator and whole-model latency per engine (InfScaler §IV-A, Eq. 1):
:func:`profile_model` (per-node ms and T_o) and :func:`measure_boundary_overhead` (T_p).

More: docs/architecture.md, "`partitioner/profiler.py`".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from infscaler.base.errors import ConfigError
from infscaler.base.models import cache_dir
from infscaler.engines import (
    ENGINE_KINDS,
    engine_backend,
    require_engine,
)
from infscaler.engines.onnxrt.loader import CPU_PROVIDER, execution_providers
from infscaler.partitioner.ortrace import traced_node_times
from infscaler.partitioner.sessions import (
    ModelSource,
    model_source,
    served,
    time_served,
    times_served,
)

_CPU = CPU_PROVIDER
_TEGRA_RELEASE = Path("/etc/nv_tegra_release")
_SCHEMA = 1


def _is_jetson() -> bool:
    return _TEGRA_RELEASE.exists()


#: what each backend of the engine layer reports as the profile's ``provider``
_BACKEND_PROVIDER = {
    "onnxruntime-cpu": CPU_PROVIDER,
    "onnxruntime-cuda": "CUDAExecutionProvider",
    "onnxruntime-trt": "TensorrtExecutionProvider",
    "onnxruntime-trt-dla": "TensorrtExecutionProvider-DLA",
    "tensorrt": "TensorRT",
    "tensorrt-dla": "TensorRT-DLA",
}


def _backend(engine: str) -> str:
    """The backend serving ``engine`` here (``onnxruntime-cpu``, ``onnxruntime-cuda``,
    ``tensorrt``, ``tensorrt-dla``); raises ConfigError (unknown) or EngineUnavailable.
    """
    require_engine(engine)
    backend = engine_backend(engine)
    assert backend is not None
    return backend


def profiled_engines() -> dict[str, str | None]:
    """Engine kind -> the backend that serves (and so profiles) it here, or None when the
    host lacks it (:func:`infscaler.engines.engine_backend` of each of
    :data:`~infscaler.engines.ENGINE_KINDS`, cpu first)."""
    return {kind: engine_backend(kind) for kind in ENGINE_KINDS}


# ------------------------------------------------------------------------------ host


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        for line in text.splitlines():
            k, sep, v = line.partition(":")
            if sep and k.strip() == key and v.strip():
                return v.strip()
    try:
        dt = Path("/proc/device-tree/model").read_bytes().rstrip(b"\0").decode(errors="replace")
        if dt:
            return dt
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity``, which respects
    ``taskset`` / cgroup cpusets), falling back to ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_fingerprint() -> str:
    """12 hex chars hashing host name, machine, CPU model, CPU count and onnxruntime version."""
    import onnxruntime as ort  # on first use: importing the partitioner stays cheap

    parts = [
        platform.node(),
        platform.machine(),
        _cpu_model(),
        str(os.cpu_count()),
        ort.__version__,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def host_description() -> dict[str, Any]:
    """What this host is, for plan files: ``{"fingerprint", "hostname", "machine",
    "cpu_model", "cores", "jetson", "onnxruntime", "providers", "engines"}``."""
    import onnxruntime as ort

    return {
        "fingerprint": host_fingerprint(),
        "hostname": platform.node(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "jetson": _is_jetson(),
        "onnxruntime": ort.__version__,
        "providers": execution_providers(),
        "engines": profiled_engines(),
    }


# -------------------------------------------------------------------------- profiles


@dataclass
class ModelProfile:
    """Measured latencies of one model on one engine (InfScaler §IV-A; Eq. 1's T_o).

    Attributes:
        engine: ``'cpu'``, ``'gpu'`` or ``'dla'``; provider: the execution provider.
        host: :func:`host_fingerprint` of the measuring host.
        node_ms: node name -> median ms per run (``ORT_DISABLE_ALL``); 0.0 where untraced
            and under TensorRT.
        total_ms: T_o, median ``session.run`` ms as served.
        unoptimized_total_ms: median per-run sum of kernel ms (0.0 under TensorRT).
        warmup, repeats, threads: the runs and intra-op threads.
        model_sha256: hex SHA-256 of the model file.
        input_shapes: input name -> shape of the feeds used.
        unmatched_ms: trace kernel name -> median ms for kernels naming no graph node.
        outputs: last run's ``{"unoptimized", "optimized"}`` outputs; not serialised.
    """

    engine: str
    provider: str
    host: str
    node_ms: dict[str, float]
    total_ms: float
    unoptimized_total_ms: float
    warmup: int
    repeats: int
    threads: int
    model_sha256: str
    input_shapes: dict[str, tuple[int, ...]]
    unmatched_ms: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, dict[str, np.ndarray]] | None = field(
        default=None, repr=False, compare=False
    )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (shapes as lists) with a ``"schema"`` version (no outputs)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "outputs"}
        d["node_ms"] = dict(self.node_ms)
        d["unmatched_ms"] = dict(self.unmatched_ms)
        d["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        d["schema"] = _SCHEMA
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelProfile:
        """Inverse of :meth:`to_dict`; ConfigError on missing keys, wrong types or schema."""
        try:
            if d.get("schema", _SCHEMA) != _SCHEMA:
                raise ValueError(f"schema {d.get('schema')} != {_SCHEMA}")
            return cls(
                engine=str(d["engine"]),
                provider=str(d["provider"]),
                host=str(d["host"]),
                node_ms={str(k): float(v) for k, v in d["node_ms"].items()},
                total_ms=float(d["total_ms"]),
                unoptimized_total_ms=float(d["unoptimized_total_ms"]),
                warmup=int(d["warmup"]),
                repeats=int(d["repeats"]),
                threads=int(d["threads"]),
                model_sha256=str(d["model_sha256"]),
                input_shapes={
                    str(k): tuple(int(x) for x in v) for k, v in d["input_shapes"].items()
                },
                unmatched_ms={str(k): float(v) for k, v in d.get("unmatched_ms", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"invalid model profile: {type(exc).__name__}: {exc}") from None


def _shape_key(
    feeds: dict[str, np.ndarray], warmup: int, repeats: int, threads: int, backend: str | None
) -> str:
    desc = {
        "feeds": sorted([n, list(np.shape(a)), str(np.asarray(a).dtype)] for n, a in feeds.items()),
        "warmup": warmup,
        "repeats": repeats,
        "threads": threads,
        # the serving backend and its session settings (no spinning since the engine
        # layer): a profile measured another way is never reused
        "backend": backend,
        "spinning": False,
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:10]


def profile_cache_path(
    model_sha256: str,
    engine: str,
    feeds: dict[str, np.ndarray],
    *,
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
) -> Path:
    """``cache_dir()/profiles/<sha256[:16]>-<engine>-<host>-<key>.json``, key hashing the feeds'
    shapes / dtypes, warmup, repeats, threads and the backend.
    """
    t = int(threads or usable_cores())
    key = _shape_key(feeds, warmup, repeats, t, engine_backend(engine))
    name = f"{model_sha256[:16]}-{engine}-{host_fingerprint()}-{key}.json"
    return cache_dir() / "profiles" / name


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def profile_model(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    engine: str = "cpu",
    model_sha256: str,
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
    cache: bool = True,
    node_names: Sequence[str] | None = None,
) -> ModelProfile:
    """Measure per-node times and T_o of ``model`` on ``engine`` (InfScaler §IV-A).

    Per-node medians come from a profiled ``ORT_DISABLE_ALL`` session (onnxruntime engines),
    ``total_ms`` from the model as served; both on ``threads or usable_cores()`` threads.

    Args:
        model: a ModelProto with unique node names, an ``.onnx`` path, or a
            :class:`~.weights.StubModel` (cpu only).
        feeds: input name -> array with concrete shapes.
        model_sha256: hex SHA-256 of the model file (cache key).
        warmup, repeats: runs, >= 0 and >= 1.
        cache: read and (atomically) write :func:`profile_cache_path`.
        node_names: the model's top-level node names, if known.

    Raises:
        EngineUnavailable: the host lacks ``engine``.
        ConfigError: unknown engine, bad warmup / repeats / threads, a stub off cpu.
        ModelLoadError: onnxruntime cannot create or run the session.
        InferenceError: the gpu / dla engine cannot run the model.
    """
    backend = _backend(engine)
    if warmup < 0 or repeats < 1 or (threads is not None and threads < 1):
        raise ConfigError(
            f"invalid profiling settings: warmup={warmup}, repeats={repeats}, threads={threads}",
            hint="use warmup >= 0, repeats >= 1 and threads >= 1 (or None for all cores)",
        )
    n_threads = int(threads or usable_cores())
    path = profile_cache_path(
        model_sha256, engine, feeds, warmup=warmup, repeats=repeats, threads=n_threads
    )
    host = host_fingerprint()
    match = {"model_sha256": model_sha256, "engine": engine, "host": host}
    cached = _cached(path, ModelProfile, **match) if cache else None
    if cached is not None:
        return cached

    if node_names is None:
        source, names = model_source(model)
    else:
        source, names = model_source(model, node_names=False)[0], list(node_names)

    # 1. Per-node kernel times, no graph optimisation (where onnxruntime serves).
    outputs: dict[str, dict[str, np.ndarray]] = {}
    if backend.startswith("onnxruntime"):
        node_ms, unmatched_ms, totals, outputs["unoptimized"] = traced_node_times(
            source, names, feeds, engine, n_threads, warmup, repeats
        )
    else:
        node_ms, unmatched_ms, totals = dict.fromkeys(names, 0.0), {}, []

    # 2. T_o: whole-model latency as served.
    total_ms, outputs["optimized"] = time_served(source, feeds, engine, n_threads, warmup, repeats)

    profile = ModelProfile(
        engine=engine,
        provider=_BACKEND_PROVIDER.get(backend, backend),
        host=host,
        node_ms=node_ms,
        total_ms=total_ms,
        unoptimized_total_ms=float(statistics.median(totals)) if totals else 0.0,
        warmup=warmup,
        repeats=repeats,
        threads=n_threads,
        model_sha256=model_sha256,
        input_shapes={n: tuple(int(d) for d in np.shape(a)) for n, a in feeds.items()},
        unmatched_ms=unmatched_ms,
        outputs=outputs,
    )
    if cache:
        _write_json_atomic(path, profile.to_dict())
    return profile


def _cached(path: Path, cls: Any, **match: str) -> Any:
    """The ``cls`` (a ``from_dict`` class) cached in ``path`` whose fields equal
    ``match``; None when it does not, or cannot be read."""
    data = _read_json(path) if path.is_file() else None
    try:
        cached = cls.from_dict(data) if data is not None else None
    except ConfigError:
        return None
    return cached if cached and all(getattr(cached, k) == v for k, v in match.items()) else None


def measure_latency(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    engine: str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """Median one-request latency (ms) of ``model`` as served on ``engine`` and the last run's
    outputs (no cache, no trace); raises as :func:`profile_model`.
    """
    _backend(engine)
    source, _ = model_source(model, node_names=False)
    return time_served(source, feeds, engine, int(threads or usable_cores()), warmup, repeats)


def median_err(times_ms: Sequence[float], confidence: float = 0.95) -> float | None:
    """Relative half-width of the distribution-free confidence interval of the median (order
    statistics j and n+1-j); None for fewer than 2 runs or a median <= 0.

    >>> round(median_err([10.0, 11.0, 9.0, 10.0, 12.0]), 3)
    0.2

    Raises:
        ValueError: ``confidence`` not in (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    xs = sorted(float(x) for x in times_ms)
    n = len(xs)
    if n < 2:
        return None
    med = statistics.median(xs)
    if not med > 0:
        return None
    # coverage of [x_(j), x_(n+1-j)] (1-based) is 1 - 2 P(Bin(n, 1/2) <= j - 1)
    j, tail = 1, 1 / 2.0**n  # tail = P(Bin <= j - 1)
    while j < n // 2:
        tail += math.comb(n, j) / 2.0**n  # P(Bin <= j): the coverage of rank j + 1
        if 1 - 2 * tail < confidence:
            break
        j += 1
    lo, hi = xs[j - 1], xs[n - j]
    return float(max(med - lo, hi - med) / med)


def measure_latency_runs(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    engine: str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
) -> tuple[list[float], dict[str, np.ndarray]]:
    """As :func:`measure_latency`, but every timed run's ms in order, with the last
    run's outputs."""
    _backend(engine)
    source, _ = model_source(model, node_names=False)
    return times_served(source, feeds, engine, int(threads or usable_cores()), warmup, repeats)


def measure_latency_samples(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    engine: str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    threads: int | None = None,
    budget_s: float = 0.0,
    max_repeats: int = 0,
) -> list[float]:
    """Every timed run's ms as served, in order: ``repeats`` runs, then more while the
    runs took under ``budget_s`` s in all, up to ``max_repeats``. Raises as
    :func:`measure_latency`."""
    _backend(engine)
    source, _ = model_source(model, node_names=False)
    n = int(threads or usable_cores())
    times, _ = times_served(source, feeds, engine, n, warmup, repeats, budget_s, max_repeats)
    return times


def measure_corun(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    threads: int = 1,
    copies: int | None = None,
    warmup: int = 2,
    repeats: int = 10,
) -> float:
    """Co-run slowdown on the cpu: ``median(together) / median(alone) - 1`` (>= 0) with
    ``copies`` sessions as served (default ``usable_cores() // threads``) running at once,
    alone runs before and after to cancel drift; 0.0 when fewer than 2 copies fit.
    Raises as :func:`measure_latency` (cpu)."""
    import threading

    n = int(copies if copies is not None else usable_cores() // max(1, threads))
    if n < 2:
        return 0.0
    _backend("cpu")
    source, _ = model_source(model, node_names=False)
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(served(source, "cpu", threads)) for _ in range(n)]
        for run in runs:
            for _ in range(warmup):
                run(feeds)

        def timed(run: Callable[[dict[str, np.ndarray]], Any], k: int, out: list[float]) -> None:
            for _ in range(k):
                t0 = time.perf_counter()
                run(feeds)
                out.append((time.perf_counter() - t0) * 1000.0)

        alone: list[float] = []
        together: list[float] = []
        timed(runs[0], max(1, repeats // 2), alone)
        ready = threading.Barrier(n)
        errors: list[BaseException] = []

        def copy(run: Callable[[dict[str, np.ndarray]], Any]) -> None:
            try:
                ready.wait()
                timed(run, repeats, together)  # list.append is atomic
            except BaseException as exc:  # noqa: BLE001 - raised in the caller below
                errors.append(exc)

        workers = [threading.Thread(target=copy, args=(r,), daemon=True) for r in runs]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        timed(runs[0], max(1, repeats // 2), alone)
    return max(0.0, statistics.median(together) / statistics.median(alone) - 1.0)


#: Idle gaps (s) :func:`measure_idle` times a model after (docs/architecture.md).
IDLE_GAPS_S = (0.05, 0.1, 0.25)


def measure_idle(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    *,
    threads: int = 1,
    gaps_s: Sequence[float] = IDLE_GAPS_S,
    warmup: int = 2,
    repeats: int = 5,
) -> tuple[tuple[float, float], ...]:
    """Post-idle slowdown on the cpu: ``((gap s, median after the gap / back to back), ...)``.

    Raises:
        ValueError: a gap <= 0. Else as :func:`measure_latency` (cpu).
    """
    gaps = sorted({float(g) for g in gaps_s})
    if not gaps or gaps[0] <= 0 or not all(math.isfinite(g) for g in gaps):
        raise ValueError(f"gaps_s must be idle seconds > 0, got {list(gaps_s)!r}")
    _backend("cpu")
    source, _ = model_source(model, node_names=False)
    with served(source, "cpu", max(1, int(threads))) as run:
        for _ in range(warmup):
            run(feeds)

        def timed(gap: float) -> float:
            if gap:
                time.sleep(gap)
            t0 = time.perf_counter()
            run(feeds)
            return (time.perf_counter() - t0) * 1000.0

        n = max(1, int(repeats))
        warm = [timed(0.0) for _ in range(n)]
        after = {g: [timed(g) for _ in range(n)] for g in gaps}
        warm += [timed(0.0) for _ in range(n)]
    base = statistics.median(warm)
    return tuple((g, max(1.0, statistics.median(after[g]) / base)) for g in gaps)


# ------------------------------------------------------------------ boundary overhead


@dataclass
class BoundaryOverhead:
    """T_p of Eq. 1: one partition boundary's cost (InfScaler §IV-A).

    Attributes:
        fixed_ms: median ms of a numpy copy + ``session.run`` of a 1-element Identity.
        per_mb_ms: ms per 10^6 bytes crossing (an Identity of ``tensor_bytes``), >= 0.
        engine, provider, host: where it was measured.
        tensor_bytes: size of the large tensor; repeats: measured runs of each model.
    """

    fixed_ms: float
    per_mb_ms: float
    engine: str = "cpu"
    provider: str = _CPU
    host: str = ""
    tensor_bytes: int = 4 << 20
    repeats: int = 50

    def ms(self, nbytes: int) -> float:
        """T_p in ms for a boundary crossed by ``nbytes`` bytes of tensors:
        ``fixed_ms + per_mb_ms * nbytes / 1e6``."""
        return self.fixed_ms + self.per_mb_ms * nbytes / 1e6

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with a ``"schema"`` version."""
        d = asdict(self)
        d["schema"] = _SCHEMA
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BoundaryOverhead:
        """Inverse of :meth:`to_dict`; ConfigError on missing keys, wrong types or schema."""
        try:
            if d.get("schema", _SCHEMA) != _SCHEMA:
                raise ValueError(f"schema {d.get('schema')} != {_SCHEMA}")
            return cls(
                fixed_ms=float(d["fixed_ms"]),
                per_mb_ms=float(d["per_mb_ms"]),
                engine=str(d.get("engine", "cpu")),
                provider=str(d.get("provider", _CPU)),
                host=str(d.get("host", "")),
                tensor_bytes=int(d.get("tensor_bytes", 4 << 20)),
                repeats=int(d.get("repeats", 50)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"invalid boundary overhead: {type(exc).__name__}: {exc}") from None


def identity_model(n: int) -> bytes:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [n])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"], name="identity")], "boundary", [x], [y]
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def boundary_cache_path(engine: str, tensor_bytes: int, repeats: int) -> Path:
    """``cache_dir() / "profiles" / "boundary-<engine>-<host>-<tensor_bytes>-<repeats>.json"``."""
    name = f"boundary-{engine}-{host_fingerprint()}-{tensor_bytes}-{repeats}.json"
    return cache_dir() / "profiles" / name


def measure_boundary_overhead(
    *,
    engine: str = "cpu",
    tensor_bytes: int = 4 << 20,
    repeats: int = 50,
    cache: bool = True,
) -> BoundaryOverhead:
    """Measure T_p (Eq. 1) on ``engine`` from a small and a ``tensor_bytes`` Identity model as
    served (copy + run, ``repeats`` each); cached per host and engine when ``cache``.

    Raises:
        EngineUnavailable: the host lacks ``engine``.
        ConfigError: an unknown engine, ``tensor_bytes < 8`` or ``repeats < 1``.
    """
    backend = _backend(engine)
    if tensor_bytes < 8 or repeats < 1:
        raise ConfigError(
            f"invalid boundary-overhead settings: tensor_bytes={tensor_bytes}, repeats={repeats}",
            hint="use tensor_bytes >= 8 and repeats >= 1",
        )
    path = boundary_cache_path(engine, tensor_bytes, repeats)
    host = host_fingerprint()
    cached = _cached(path, BoundaryOverhead, host=host, engine=engine) if cache else None
    if cached is not None:
        return cached

    threads = usable_cores()
    n_big = tensor_bytes // 4
    rng = np.random.default_rng(0)
    x_small = rng.random(1, dtype=np.float32)
    x_big = rng.random(n_big, dtype=np.float32)

    def once(run: Callable[[dict[str, np.ndarray]], Any], x: np.ndarray) -> float:
        t0 = time.perf_counter()
        moved = np.copy(x)
        run({"x": moved})
        return (time.perf_counter() - t0) * 1000.0

    with (
        served(identity_model(1), engine, threads) as small,
        served(identity_model(n_big), engine, threads) as big,
    ):
        for _ in range(5):
            once(small, x_small)
            once(big, x_big)
        t_small: list[float] = []
        t_big: list[float] = []
        for _ in range(repeats):
            t_small.append(once(small, x_small))
            t_big.append(once(big, x_big))

    fixed = float(statistics.median(t_small))
    mb = (n_big * 4 - 4) / 1e6
    per_mb = max(0.0, (float(statistics.median(t_big)) - fixed) / mb) if mb > 0 else 0.0
    result = BoundaryOverhead(
        fixed_ms=fixed,
        per_mb_ms=per_mb,
        engine=engine,
        provider=_BACKEND_PROVIDER.get(backend, backend),
        host=host,
        tensor_bytes=tensor_bytes,
        repeats=repeats,
    )
    if cache:
        _write_json_atomic(path, result.to_dict())
    return result
