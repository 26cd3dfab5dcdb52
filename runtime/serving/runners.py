"""What an instance runs: a model on its engine, a function stage, or a fused chain of
steps; and the errors a stage raises.

:class:`ModelRunner` (an ONNX partition on the CPU / GPU / DLA engine of
:mod:`infscaler.engines`, with its warm-up, batch profile and thread probes),
:class:`FunctionRunner` (a Python function stage, ``module:function``), and
:class:`FusedRunner` (consecutive units run one after another in one process,
:func:`~infscaler.runtime.serving.pipeline.fuse_units`). Each is called with the input tensors
(name -> array) and returns the output tensors; :func:`check_outputs` holds a function's
result to the declared outputs. The serving loop around them is
:class:`~infscaler.runtime.serving.instance.Instance`.

:class:`StageError` (the stage failed on one request: HTTP 500) and
:class:`StageInputError` (the request's data is unusable: HTTP 400) are what function
stages raise; their authors import them from :mod:`infscaler.runtime.serving.instance` (the
public place, re-exported there).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from infscaler.engines import create_engine
from infscaler.engines.base import pin_process
from infscaler.runtime.serving.pipeline import Unit, load_function

__all__ = [
    "ITEM_BITS",
    "ITEM_MASK",
    "MAX_ITEMS",
    "FunctionRunner",
    "FusedRunner",
    "ModelRunner",
    "StageError",
    "StageInputError",
    "check_outputs",
]

log = logging.getLogger("infscaler.instance")

#: Request ids are ``seq << ITEM_BITS | item``: item 0 is the request itself, ``i + 1``
#: item ``i`` of a fan-out (so every token in flight has its own id).
ITEM_BITS = 16
ITEM_MASK = (1 << ITEM_BITS) - 1
#: The most items one fan-out may produce.
MAX_ITEMS = ITEM_MASK - 1


class StageError(Exception):
    """A unit failed on one request (reported to the client, the instance goes on)."""


class StageInputError(StageError, ValueError):
    """The request's own data is unusable by a function stage (an empty or malformed
    image, a value out of the range the stage handles): raise it from a function stage
    (``from infscaler.runtime.serving.instance import StageInputError``) and the client gets
    HTTP 400 with its message. Any other exception from a stage is a 500 (the server
    failed on a valid request). A ``ValueError`` too, so callers that catch that keep
    working."""

    status = 400


class ModelRunner:
    """Runs a model unit on its engine (:mod:`infscaler.engines`)."""

    def __init__(self, unit: Unit, cores: list[int] | None) -> None:
        self.unit = unit
        # the cores this process may use before the engine pins it (thread probes)
        self._allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.engine = create_engine(
            unit.engine,
            unit.path,
            threads=unit.threads,
            cores=cores,
            precision=unit.precision,
            shapes=unit.shapes or None,
        )

    def load(self) -> dict[str, Any]:
        self.engine.load()
        #: axis 0 is a batch dim: the model declares it dynamic on every input, so a run
        #: on a ``[4, ...]`` input infers 4 items (Triton's ``max_batch_size`` > 0)
        self.batch_axis = bool(self.engine.inputs) and all(
            len(i.shape) > 0 and i.shape[0] is None for i in self.engine.inputs
        )
        self._warm_up()
        self.batch_ms = self.profile_batches() if self.unit.max_batch > 1 else {}
        self.warm_ms_by_threads = self.probe_threads()
        return self.engine.describe()

    def probe_threads(self, repeats: int = 5) -> dict[int, float]:
        """Service time of one item at each intra-op thread count 1 .. ``max_threads``
        (at most the cores this process may use), ms: median of ``repeats`` timed runs
        on the warm-up's zeros after one untimed run; the measurement the scaler's
        ``scale_up`` / ``scale_down`` predict from (:func:`infscaler.runtime.scaling.scaler.
        service_ms_at`). Its own count runs on its own engine; every other count on a
        probe engine (a second onnxruntime session of the same file, closed after)
        pinned to that many cores, its own first, then the others the process may use.
        The pinning is restored after each probe.

        Empty when the unit is not a cpu model with ``max_threads`` > 1, or its input
        shapes are unknown (no feeds to time). A count whose probe fails is left out
        (logged): no figure is invented for it. Costs one more session's memory while
        a probe runs, at load only."""
        u = self.unit
        feeds = getattr(self, "_feeds", None)
        if u.engine != "cpu" or not u.max_threads or u.max_threads <= 1 or feeds is None:
            return {}
        own = list(self.engine.cores or [])
        pool = own + [c for c in self._allowed if c not in own]
        out: dict[int, float] = {}

        def timed(run: Callable[[], Any]) -> float:
            run()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
            return round(float(np.median(times)), 3)

        for k in range(1, min(int(u.max_threads), max(len(pool), 1)) + 1):
            if k == int(u.threads):
                try:
                    out[k] = timed(lambda: self.engine.infer(feeds))
                except Exception as exc:  # noqa: BLE001 - reported, not invented
                    log.warning("unit %s: timing %d thread(s) failed: %s", u.name, k, exc)
                continue
            probe = create_engine(
                "cpu", u.path, threads=k, cores=pool[:k] or None, shapes=u.shapes or None
            )
            try:
                probe.load()
                out[k] = timed(lambda p=probe: p.infer(feeds))
            except Exception as exc:  # noqa: BLE001 - reported, not invented
                log.warning("unit %s: probing %d thread(s) failed: %s", u.name, k, exc)
            finally:
                with contextlib.suppress(Exception):
                    probe.close()
                with contextlib.suppress(Exception):
                    pin_process(own or self._allowed)
                del probe
        # the probe sessions' freed heap back to the system (glibc malloc_trim(3)), so
        # the PSS this instance reports is its own session's, not the probes'
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)
        return out

    def profile_batches(self, repeats: int = 5, budget_s: float = 3.0) -> dict[int, float]:
        """Batch latency T_b (ms, median of the timed runs) for b = 1, 2, 4, ...,
        ``max_batch`` on zeros, when every input's shape beyond axis 0 is known (MArk §4
        needs T_b to choose the batch size). The sizes are timed in rounds, one run of
        each size per round, so a burst of load from other processes falls on every size
        alike rather than on one; ``repeats`` rounds, fewer (at least 3) once the rounds
        have taken ``budget_s`` s. Empty when shapes are unknown; a size the engine
        refuses (a fixed batch dimension) ends the profile at the sizes before it."""
        dims = {}
        for info in self.engine.inputs:
            shape = self.unit.shapes.get(info.name) or info.shape
            if not shape or any(d is None or d < 0 for d in shape[1:]):
                return {}
            dims[info.name] = (list(shape[1:]), info.dtype)
        sizes = sorted({1, *[2**i for i in range(1, 7) if 2**i < self.unit.max_batch]})
        if self.unit.max_batch not in sizes:
            sizes.append(int(self.unit.max_batch))
        feeds: dict[int, dict[str, np.ndarray]] = {}
        for b in sizes:
            feed = {n: np.zeros([b, *rest], dtype=dt) for n, (rest, dt) in dims.items()}
            try:
                self.engine.infer(feed)  # untimed: first-run allocations
            except Exception:  # noqa: BLE001 - a fixed batch dim: stop at what ran
                break
            feeds[b] = feed
        times: dict[int, list[float]] = {b: [] for b in feeds}
        start = time.perf_counter()
        for r in range(repeats):
            if r >= 3 and time.perf_counter() - start > budget_s:
                break
            for b, feed in feeds.items():
                t0 = time.perf_counter()
                self.engine.infer(feed)
                times[b].append((time.perf_counter() - t0) * 1e3)
        return {b: round(float(np.median(ts)), 3) for b, ts in times.items() if ts}

    def _warm_up(self) -> None:
        """One run on zeros when every input shape is known (first request then pays
        no lazy initialisation), then a second one timed: ``warm_ms``, the service time
        the front end's SLO admission starts from before real requests are measured."""
        self.warm_ms: float | None = None
        feeds = {}
        for info in self.engine.inputs:
            shape = self.unit.shapes.get(info.name) or info.shape
            if shape is None or any(d is None or d < 0 for d in shape):
                return
            feeds[info.name] = np.zeros(shape, dtype=info.dtype)
        self._feeds = feeds
        with contextlib.suppress(Exception):
            self.engine.infer(feeds)
            t0 = time.perf_counter()
            self.engine.infer(feeds)
            self.warm_ms = round((time.perf_counter() - t0) * 1e3, 3)

    def __call__(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        u = self.unit
        feeds = {u.in_map[s]: tensors[s] for s in u.inputs}
        out = self.engine.infer(feeds, outputs=list(u.out_map))
        return {u.out_map[k]: v for k, v in out.items()}

    @property
    def memory_mb(self) -> float:
        return float(getattr(self.engine, "memory_mb", 0.0) or 0.0)

    def close(self) -> None:
        self.engine.close()


class FunctionRunner:
    """Runs a function unit (``module:callable``) and checks what it returns."""

    def __init__(self, unit: Unit, cores: list[int] | None) -> None:
        self.unit = unit
        self.cores = cores
        self.fn: Callable[..., Any] | None = None

    def load(self) -> dict[str, Any]:
        """Import the function and run its optional warm-up: a callable attribute
        ``warmup`` on the function, called with the stage's params (lazy imports, tables
        loaded once), so the first request does not pay for them."""
        if self.cores:
            os.sched_setaffinity(0, self.cores)
        self.fn = load_function(self.unit.function or "")
        warmup = getattr(self.fn, "warmup", None)
        if callable(warmup):
            warmup(**self.unit.params)
        return {"kind": "function", "function": self.unit.function, "cores": self.cores}

    def __call__(self, tensors: Any) -> Any:
        """Run the function on ``tensors`` (name -> array; a fan-in step of a whole unit,
        :class:`FusedRunner`: the list of per-item dicts) and check what it returns."""
        assert self.fn is not None
        u = self.unit
        if u.fan_in:
            return check_outputs(u, self.fn(list(tensors), **u.params))
        result = self.fn({k: tensors[k] for k in u.inputs}, **u.params)
        if u.fan_out:
            if not isinstance(result, list | tuple):
                raise StageError(
                    f"fan_out function {u.function} returned {type(result).__name__}, "
                    "not a list of dicts"
                )
            if len(result) > MAX_ITEMS:
                raise StageError(f"{len(result)} items from {u.function}; at most {MAX_ITEMS}")
            return [check_outputs(u, item) for item in result]
        return check_outputs(u, result)

    memory_mb = 0.0

    def close(self) -> None:
        pass


class FusedRunner:
    """Runs a fused unit (:func:`~infscaler.runtime.serving.pipeline.fuse_units`): one runner
    per step (:class:`ModelRunner` / :class:`FunctionRunner`), in order, on one tensor
    dict, in this process (no slot, no token hop between steps).

    A whole-pipeline unit (``fuse: whole``, :func:`~infscaler.runtime.serving.pipeline.
    whole_unit`) has a fan-out step before other steps: each item it returns runs
    the per-item steps after it on its own tensor dict (the request's tensors plus the
    item's), in item order, and the fan-in step is called with the list of the items'
    tensors it reads (its ``inputs``; ``[]`` when the fan-out made no items), as the
    front end calls it for a staged pipeline; the steps after it see its outputs. Every
    model step runs with the unit's ``threads``.

    A step's exception propagates with :attr:`current` naming the step (the request
    fails with the step's name; :class:`StageInputError` stays a 400). Per step it
    counts ``served``, ``errors`` and ``busy_ns`` (:meth:`step_stats`). After a call,
    :attr:`produced` holds every step's outputs (a fan-out unit's carry may include
    tensors an earlier step wrote).
    """

    def __init__(self, unit: Unit, cores: list[int] | None) -> None:
        self.unit = unit
        # no thread probes in a fused unit: its function steps would not speed up with
        # the model's threads, so it is not scaled vertically (runtime.scaler)
        self.runners: list[ModelRunner | FunctionRunner] = [
            ModelRunner(dataclasses.replace(s, max_threads=None, threads=unit.threads), cores)
            if s.kind == "model"
            else FunctionRunner(s, cores)
            for s in unit.steps
        ]
        self.model = next((r for r in self.runners if isinstance(r, ModelRunner)), None)
        self.models = [r for r in self.runners if isinstance(r, ModelRunner)]
        self.current: str | None = None
        self.produced: dict[str, np.ndarray] = {}
        n = len(self.runners)
        self.served, self.errors, self.busy_ns = [0] * n, [0] * n, [0] * n

    def load(self) -> dict[str, Any]:
        """Load every step (the model's engine, warm-up and batch profile included);
        returns the model step's description with ``steps`` (the step names)."""
        described = [r.load() for r in self.runners]
        warm = [getattr(m, "warm_ms", None) for m in self.models]
        # every model step once (a whole unit's per-item model: once, not per item)
        self.warm_ms = None if not warm or None in warm else round(sum(warm), 3)
        self.batch_ms = getattr(self.model, "batch_ms", {})
        main = next(
            (d for r, d in zip(self.runners, described, strict=True) if r is self.model), {}
        )
        return {**main, "steps": [s.name for s in self.unit.steps]}

    def _step(self, i: int, arg: Any) -> Any:
        """Run step ``i`` on ``arg`` (a tensor dict; the fan-in: the items), counted."""
        self.current = self.unit.steps[i].name
        t0 = time.monotonic_ns()
        try:
            result = self.runners[i](arg)
        except BaseException:
            self.errors[i] += 1
            raise
        finally:
            self.busy_ns[i] += time.monotonic_ns() - t0
        self.served[i] += 1
        return result

    def __call__(self, tensors: Mapping[str, np.ndarray]) -> Any:
        env: dict[str, np.ndarray] = dict(tensors)
        self.produced = {}
        result: Any = None
        steps = self.unit.steps
        i = 0
        while i < len(steps):
            result = self._step(i, env)
            if steps[i].fan_out and i + 1 < len(steps):  # a whole unit: run the items here
                j = next(k for k in range(i + 1, len(steps)) if steps[k].fan_in)
                gathered = []
                for item in result:
                    item_env = {**env, **item}
                    for k in range(i + 1, j):
                        item_env.update(self._step(k, item_env))
                    gathered.append({t: item_env[t] for t in steps[j].inputs})
                result = self._step(j, gathered)
                i = j
            if isinstance(result, dict):
                env.update(result)
                self.produced.update(result)
            i += 1
        self.current = None
        if self.unit.fan_out:
            return result  # the items (fan_out ends a unit)
        return {k: env[k] for k in self.unit.outputs}

    def step_stats(self) -> list[dict[str, Any]]:
        """Per step: ``step`` (name), ``served``, ``errors``, ``busy_ms`` (ms, in all)."""
        return [
            {
                "step": s.name,
                "served": self.served[i],
                "errors": self.errors[i],
                "busy_ms": round(self.busy_ns[i] / 1e6, 3),
            }
            for i, s in enumerate(self.unit.steps)
        ]

    @property
    def memory_mb(self) -> float:
        return float(sum(m.memory_mb for m in self.models))

    def close(self) -> None:
        for r in self.runners:
            r.close()


def check_outputs(unit: Unit, result: Any) -> dict[str, np.ndarray]:
    """The outputs of a function unit: exactly the declared names, plain dtypes.

    Raises:
        StageError: not a dict, missing / extra names, object dtype.
    """
    if not isinstance(result, Mapping):
        raise StageError(
            f"function {unit.function} returned {type(result).__name__}, not a dict of arrays"
        )
    keys = set(result)
    if keys != set(unit.outputs):
        raise StageError(
            f"function {unit.function} returned {sorted(keys)}, the pipeline declares "
            f"outputs {sorted(unit.outputs)}"
        )
    out = {}
    for k, v in result.items():
        a = np.asarray(v)
        if a.dtype.kind in "OV":
            raise StageError(f"function {unit.function}: output {k!r} has dtype {a.dtype}")
        out[k] = a
    return out
