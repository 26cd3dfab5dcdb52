"""Load generator for a served model or pipeline: perf_analyzer's measurement on the
service's Unix socket (asyncio + aiohttp, the v2 codec), with its two kinds of load:
concurrency N (closed loop) and request rate R (open loop: ``constant``, ``poisson``, or
a trace such as ``azure`` replayed at a mean of R/s).

Sources: Triton perf_analyzer ``docs/cli.md``. More: docs/api.md, "`infscaler/api/loadgen.py`".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

from infscaler.api.codec import DATATYPES, ShmTensor, encode_infer_request, tensor_to_bytes
from infscaler.base.errors import InfScalerError

__all__ = [
    "LoadGenerator",
    "LoadSpec",
    "MeasureConfig",
    "PointResult",
    "Window",
    "answer_code",
    "arrival_times",
    "input_tensors",
    "is_stable",
    "open_session",
    "parse_range",
    "parse_shapes",
    "percentile",
    "random_tensor",
    "server_delta",
    "summarize",
]

#: At most this many distinct refusal / error codes are kept per point; the rest are
#: counted under ``"(other)"`` (a hostile or chatty server cannot grow the report).
MAX_REASONS = 16
#: the longest reason code taken from an answer (longer: counted as ``http_<status>``)
_CODE_CHARS = 32
_STABLE_WINDOWS = 3


# -- pure parts -----------------------------------------------------------------------


def parse_range(text: str, *, integer: bool) -> list[float]:
    """perf_analyzer's ``start:end:step`` (``end`` inclusive, ``end`` and ``step`` optional):
    ``"1:8:2"`` -> ``[1, 3, 5, 7]``; ``integer``: whole numbers (concurrency).

    Raises:
        InfScalerError: unreadable, non-positive, ``end < start``, step <= 0, or more
            than 1000 points.
    """
    parts = str(text).strip().split(":")
    hint = "write START[:END[:STEP]], e.g. 1:8:2"
    if not 1 <= len(parts) <= 3:
        raise InfScalerError(f"cannot read range {text!r}", hint=hint)
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise InfScalerError(f"cannot read range {text!r}", hint=hint) from None
    start = nums[0]
    end = nums[1] if len(nums) > 1 else start
    step = nums[2] if len(nums) > 2 else 1.0
    if not all(math.isfinite(n) for n in nums) or start <= 0 or step <= 0:
        raise InfScalerError(f"range {text!r}: start and step must be positive", hint=hint)
    if integer and not all(n == int(n) for n in nums):
        raise InfScalerError(f"range {text!r}: concurrency is a whole number", hint=hint)
    if end < start:
        raise InfScalerError(f"range {text!r}: end {end:g} is below start {start:g}", hint=hint)
    count = int(math.floor((end - start) / step + 1e-9)) + 1
    if count > 1000:
        raise InfScalerError(f"range {text!r} has {count} points; at most 1000", hint=hint)
    return [round(start + i * step, 9) for i in range(count)]


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """perf_analyzer's ``--shape NAME:D1xD2...`` (or ``NAME:D1,D2``), repeatable.

    Raises:
        InfScalerError: no ``:``, an empty name, or a dimension that is not an integer >= 0.
    """
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = str(item).rpartition(":")
        if not sep or not name or not dims:
            raise InfScalerError(f"cannot read --shape {item!r}", hint="write NAME:1x3x224x224")
        try:
            shape = [int(d) for d in dims.replace(",", "x").split("x")]
        except ValueError:
            raise InfScalerError(
                f"--shape {item!r}: dimensions must be integers", hint="write NAME:1x3x224x224"
            ) from None
        if any(d < 0 for d in shape):
            raise InfScalerError(f"--shape {item!r}: dimensions must be >= 0")
        shapes[name] = shape
    return shapes


def input_tensors(
    meta: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]] | None = None,
    given: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """One request's inputs for a model's metadata: each from ``given`` if there, else
    :func:`random_tensor` of its datatype and shape (``shapes``, else dynamic dims 1).

    Raises:
        InfScalerError: a given input of another datatype or rank, a ``shapes`` entry for no
            input or of the wrong rank, or an unknown datatype.
    """
    shapes = dict(shapes or {})
    given = dict(given or {})
    names = [i["name"] for i in meta.get("inputs", [])]
    for extra in (set(shapes) | set(given)) - set(names):
        raise InfScalerError(
            f"model {meta.get('name')} has no input {extra!r}", hint=f"its inputs: {names}"
        )
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in meta.get("inputs", []):
        name, dt, dims = spec["name"], spec["datatype"], [int(d) for d in spec["shape"]]
        if dt not in DATATYPES:
            raise InfScalerError(f"input {name}: unknown datatype {dt!r}")
        want = shapes.get(name)
        if want is not None and len(want) != len(dims):
            raise InfScalerError(
                f"--shape {name}: rank {len(want)} {list(want)}, the model's is {len(dims)} {dims}"
            )
        if name in given:
            a = np.asarray(given[name])
            if dt != "BYTES" and (a.dtype != DATATYPES[dt] or a.ndim != len(dims)):
                raise InfScalerError(
                    f"input {name} ({dt} {dims}) was given {a.dtype} {list(a.shape)}",
                    hint=f"save it as np.{DATATYPES[dt].name} with rank {len(dims)}",
                )
            out[name] = a
            continue
        shape = list(want) if want is not None else [1 if d < 0 else d for d in dims]
        out[name] = random_tensor(dt, shape, rng)
    return out


def random_tensor(dt: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """A random v2 ``dt`` tensor of ``shape`` (trtexec's default input): floats uniform in
    [0, 1), integers in [0, 255] (or what the type holds), BOOL random, BYTES ``b"infscaler"``."""
    if dt == "BYTES":
        return np.full(shape, b"infscaler", dtype=object)
    if dt == "BOOL":
        return rng.random(shape) < 0.5
    dtype = DATATYPES[dt]
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    top = min(255, int(np.iinfo(dtype).max))
    return rng.integers(0, top + 1, shape).astype(dtype)


def arrival_times(distribution: str, rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Send times (s from the start, sorted) at a mean of ``rate``/s over ``duration_s``:
    ``constant`` (k / rate), ``poisson``, or a trace / process spec of
    :func:`infscaler.runtime.planning.arrivals.from_spec` (``azure``, ``gamma:4``, ...).

    Raises:
        InfScalerError: an unknown distribution, a bad rate, a missing trace file.
    """
    from infscaler.runtime.planning import arrivals

    if distribution == "constant":
        if not (math.isfinite(rate) and rate > 0):
            raise InfScalerError(f"request rate must be positive, got {rate!r}")
        return np.arange(0.0, duration_s, 1.0 / rate)
    try:
        return arrivals.from_spec(distribution, rate, duration_s, seed)
    except (ValueError, FileNotFoundError) as exc:
        raise InfScalerError(
            f"arrivals {distribution!r}: {exc}",
            hint="use constant, poisson, or a trace: azure, azure:busiest, gamma:4",
        ) from None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100): the smallest value with at
    least q % of the values at or below it (perf_analyzer's client percentiles);
    None for no values. ``[10, 20, 30, 40]`` -> P50 20, P90 40."""
    if not values:
        return None
    s = sorted(values)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return float(s[min(k, len(s)) - 1])


@dataclass
class Window:
    """One measurement window: what was answered in it (by answer time).

    Attributes:
        duration_s: its measured length, s.
        latencies_ms: client-side latency of each successful answer, ms.
        refused: reason -> count of 429 / 503 answers.
        errors: kind -> count of other failures (status, connection, timeout).
        server: :func:`server_delta` over the window (None: statistics unavailable).
    """

    duration_s: float
    latencies_ms: list[float] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    server: dict[str, float] | None = None

    @property
    def throughput(self) -> float:
        """Successful inferences per second."""
        return len(self.latencies_ms) / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mean_ms(self) -> float | None:
        return sum(self.latencies_ms) / len(self.latencies_ms) if self.latencies_ms else None


def _within(values: Sequence[float], pct: float) -> bool:
    mean = sum(values) / len(values)
    if mean == 0:
        return all(v == 0 for v in values)
    return all(abs(v - mean) <= pct / 100.0 * mean for v in values)


def is_stable(windows: Sequence[Window], pct: float) -> bool:
    """perf_analyzer's stability rule: the last 3 windows' throughputs, and their mean
    latencies, are each within ``pct`` % of their mean (fewer than 3: False; three without
    answers: True)."""
    if len(windows) < _STABLE_WINDOWS:
        return False
    last = windows[-_STABLE_WINDOWS:]
    if not _within([w.throughput for w in last], pct):
        return False
    means = [w.mean_ms for w in last]
    if all(m is None for m in means):
        return True
    if any(m is None for m in means):
        return False
    return _within([m for m in means if m is not None], pct)


def _stat(doc: Mapping[str, Any] | None) -> dict[str, int] | None:
    try:
        st = doc["model_stats"][0]["inference_stats"]  # type: ignore[index]
        return {
            "success": int(st["success"]["count"]),
            "fail": int(st["fail"]["count"]),
            "queue_ns": int(st["queue"]["ns"]),
            "compute_ns": int(st["compute_infer"]["ns"]),
        }
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def server_delta(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> dict[str, float] | None:
    """The server-side split between two statistics answers: ``success`` and ``fail`` counts,
    and per success ``queue_ms`` and ``compute_ms`` (None: either is missing or malformed)."""
    a, b = _stat(before), _stat(after)
    if a is None or b is None:
        return None
    ok = b["success"] - a["success"]
    return {
        "success": float(ok),
        "fail": float(b["fail"] - a["fail"]),
        "queue_ms": (b["queue_ns"] - a["queue_ns"]) / 1e6 / ok if ok > 0 else 0.0,
        "compute_ms": (b["compute_ns"] - a["compute_ns"]) / 1e6 / ok if ok > 0 else 0.0,
    }


def _merge_counts(dicts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _merge_server(windows: Sequence[Window]) -> dict[str, float] | None:
    parts = [w.server for w in windows]
    if not parts or any(p is None for p in parts):
        return None
    ok = sum(p["success"] for p in parts if p)
    return {
        "success": ok,
        "fail": sum(p["fail"] for p in parts if p),
        "queue_ms": sum(p["queue_ms"] * p["success"] for p in parts if p) / ok if ok else 0.0,
        "compute_ms": sum(p["compute_ms"] * p["success"] for p in parts if p) / ok if ok else 0.0,
    }


def summarize(windows: Sequence[Window], slo_ms: float | None = None) -> dict[str, Any]:
    """The last 3 windows merged: ``throughput``, ``latency_ms`` percentiles and mean,
    ``goodput`` (within ``slo_ms``, per s), ``refused`` / ``errors`` per s and by code, and
    ``server`` (:func:`server_delta` merged)."""
    last = list(windows[-_STABLE_WINDOWS:])
    span = sum(w.duration_s for w in last)
    lat = [x for w in last for x in w.latencies_ms]
    refused = _merge_counts([w.refused for w in last])
    errors = _merge_counts([w.errors for w in last])

    def rate(n: float) -> float:
        return n / span if span > 0 else 0.0

    return {
        "windows_measured": len(last),
        "measured_s": span,
        "throughput": rate(len(lat)),
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p95": percentile(lat, 95),
            "p99": percentile(lat, 99),
            "mean": sum(lat) / len(lat) if lat else None,
        },
        "goodput": None if slo_ms is None else rate(sum(1 for x in lat if x <= slo_ms)),
        "refused_per_s": rate(sum(refused.values())),
        "errors_per_s": rate(sum(errors.values())),
        "refused_by_code": refused,
        "errors_by_code": errors,
        "server": _merge_server(last),
    }


# -- the load ---------------------------------------------------------------------------


def open_session(socket_path: str, timeout_s: float = 60.0) -> Any:
    """An ``aiohttp.ClientSession`` on the service's Unix socket (no connection limit;
    each request times out after ``timeout_s``), for :meth:`LoadGenerator.measure`; use
    it as ``async with open_session(sock) as session``."""
    import aiohttp

    conn = aiohttp.UnixConnector(path=str(socket_path), limit=0)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s))


@dataclass(frozen=True)
class LoadSpec:
    """One load point: ``mode`` ``"concurrency"`` (``value`` requests in flight) or
    ``"request_rate"`` (``value`` requests/s sent at ``distribution``'s times)."""

    mode: str
    value: float
    distribution: str = "constant"

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "request_rate"):
            raise InfScalerError(f"unknown load mode {self.mode!r}")


@dataclass(frozen=True)
class MeasureConfig:
    """How each point is measured (perf_analyzer's defaults).

    Attributes:
        interval_ms: window length, ms.
        stability_pct: the stability rule's tolerance, %.
        max_trials: windows at most per point.
        slo_ms: goodput's latency bound, ms (None: no goodput).
        timeout_s: a request not answered within it is an error, s.
        max_inflight: open loop: arrivals beyond this many in flight are ``skipped``.
        seed: for random inputs and arrivals.
        request_count: a window ends after this many answers (perf_analyzer's
            ``count_windows``); None: time windows.
    """

    interval_ms: float = 5000.0
    stability_pct: float = 10.0
    max_trials: int = 10
    slo_ms: float | None = None
    timeout_s: float = 60.0
    max_inflight: int = 1024
    seed: int = 0
    request_count: int | None = None


@dataclass
class PointResult:
    """One load point's measurement: :func:`summarize` of its windows, plus ``stable``,
    ``trials`` and the totals over the whole point (``sent``, ``ok``, ``refused``,
    ``errors``, ``skipped``) and the service's ``server_success`` delta over it."""

    spec: LoadSpec
    stable: bool
    windows: list[Window]
    summary: dict[str, Any]
    totals: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the load, ``stable``, ``trials``, the summary and the totals."""
        return {
            "mode": self.spec.mode,
            "value": self.spec.value,
            "distribution": self.spec.distribution if self.spec.mode == "request_rate" else None,
            "stable": self.stable,
            "trials": len(self.windows),
            **self.summary,
            "totals": self.totals,
            "windows": [
                {
                    "duration_s": w.duration_s,
                    "throughput": w.throughput,
                    "mean_ms": w.mean_ms,
                    "ok": len(w.latencies_ms),
                    "refused": sum(w.refused.values()),
                    "errors": sum(w.errors.values()),
                }
                for w in self.windows
            ],
        }


def count_key(d: dict[str, int], key: str) -> None:
    if key not in d and len(d) >= MAX_REASONS:
        key = "(other)"
    d[key] = d.get(key, 0) + 1


def answer_code(status: int, body: bytes) -> str:
    """The reason code of an error answer: its JSON's ``code`` (a short lower-case word,
    docs/api.md "Refusal codes"), else ``http_<status>``; never the message."""
    try:
        doc = json.loads(body)
        code = doc.get("code") if isinstance(doc, dict) else None
    except (ValueError, UnicodeDecodeError):
        code = None
    if (
        isinstance(code, str)
        and 0 < len(code) <= _CODE_CHARS
        and code.islower()
        and code.replace("_", "a").isalpha()
    ):
        return code
    return f"http_{status}"


@dataclass
class Outcome:
    kind: str  # ok | refused | error
    latency_ms: float
    reason: str = ""


class LoadRun:
    """One point's state: outcomes in answer order, counters, and (count windows) the
    event set once ``target`` answers have come in."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.sent = 0
        self.skipped = 0
        self.stop = asyncio.Event()
        self.target: int | None = None
        self.full = asyncio.Event()

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.target is not None and len(self.outcomes) >= self.target:
            self.full.set()

    async def window_end(
        self, task: asyncio.Future[None], cut: int, t_end: float, count: int | None
    ) -> None:
        """Until the window is over: ``t_end`` (time windows) or ``count`` answers after
        ``cut`` (count windows, also bounded by ``t_end``), or the load ended."""
        waits: set[asyncio.Future[Any]] = {task}
        if count is not None:
            self.target = cut + count
            self.full.clear()
            if len(self.outcomes) >= self.target:
                return
            waits.add(asyncio.ensure_future(self.full.wait()))
        await asyncio.wait(
            waits,
            timeout=max(0.0, t_end - time.perf_counter()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        for w in waits - {task}:
            w.cancel()


class LoadGenerator:
    """Sends one model's requests on the service's Unix socket and measures them.

    Args:
        socket_path: the service's socket.
        model: the model (pipeline) name.
        inputs: name -> array, every request's body.
        shared_memory: send the inputs through a system shared memory region instead.
        parameters: request parameters, e.g. ``{"timeout_ms": 200}``.

    Raises (from :meth:`run`):
        InfScalerError: unreachable service, unknown model, or shared memory not set up.
    """

    def __init__(
        self,
        socket_path: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        shared_memory: bool = False,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self.socket_path = str(socket_path)
        self.model = model
        self.inputs = dict(inputs)
        self.shared_memory = shared_memory
        self.parameters = dict(parameters or {})
        self._url = f"http://infscaler/v2/models/{quote(model, safe='')}"

    def run(
        self,
        specs: Sequence[LoadSpec],
        cfg: MeasureConfig,
        on_window: Callable[[LoadSpec, int, Window], None] | None = None,
        on_point: Callable[[LoadSpec], None] | None = None,
    ) -> list[PointResult]:
        """Measure each load point in turn (:meth:`measure`); ``on_point(spec)`` is
        called as a point starts and ``on_window(spec, trial, window)`` after each of
        its windows (progress: ``trial`` counts from 1)."""
        from infscaler.api.client import Client

        region = None
        inputs: Mapping[str, Any] = self.inputs
        with Client(self.socket_path) as client:
            client.model_metadata(self.model)  # unreachable / unknown model: a clear error
            if self.shared_memory:
                region, inputs = _shm_inputs(client, self.inputs)
            try:
                body, headers = encode_infer_request(
                    inputs, binary=True, binary_output=True, parameters=self.parameters or None
                )
                return asyncio.run(self._run_all(specs, cfg, body, headers, on_window, on_point))
            finally:
                if region is not None:
                    client.unregister_system_shm(region[0])
                    region[1].close()

    async def _run_all(self, specs, cfg, body, headers, on_window, on_point) -> list[PointResult]:  # noqa: ANN001
        out = []
        async with open_session(self.socket_path, cfg.timeout_s) as session:
            for spec in specs:
                if on_point is not None:
                    on_point(spec)
                out.append(await self.measure(session, spec, cfg, body, headers, on_window))
        return out

    async def _one(self, session: Any, body: bytes, headers: Mapping[str, str]) -> Outcome:
        import aiohttp

        t0 = time.perf_counter()
        try:
            async with session.post(f"{self._url}/infer", data=body, headers=headers) as r:
                data = await r.read()
                status = r.status
        except TimeoutError:
            return Outcome("error", (time.perf_counter() - t0) * 1e3, "client_timeout")
        except (aiohttp.ClientError, OSError):
            return Outcome("error", (time.perf_counter() - t0) * 1e3, "connection")
        ms = (time.perf_counter() - t0) * 1e3
        if status == 200:
            return Outcome("ok", ms)
        kind = "refused" if status in (429, 503) else "error"
        return Outcome(kind, ms, answer_code(status, data))

    async def _stats(self, session: Any) -> dict[str, Any] | None:
        try:
            async with session.get(f"{self._url}/stats") as r:
                return await r.json() if r.status == 200 else None
        except Exception:  # noqa: BLE001 - no statistics: the split reads None
            return None

    async def _closed(self, session: Any, run: LoadRun, n: int, body: bytes, headers: Any) -> None:
        async def worker() -> None:
            while not run.stop.is_set():
                run.sent += 1
                run.add(await self._one(session, body, headers))

        await asyncio.gather(*(worker() for _ in range(int(n))))

    async def _open(
        self,
        session: Any,
        run: LoadRun,
        times: np.ndarray,
        cfg: MeasureConfig,
        body: bytes,
        headers: Any,
    ) -> None:
        pending: set[asyncio.Task[None]] = set()

        async def fire() -> None:
            run.add(await self._one(session, body, headers))

        t0 = time.perf_counter()
        for t in times:
            delay = t0 + float(t) - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.stop.wait(), delay)
            if run.stop.is_set():
                break
            if len(pending) >= cfg.max_inflight:
                run.skipped += 1
                continue
            run.sent += 1
            task = asyncio.ensure_future(fire())
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)

    def replay(self, times: Sequence[float], timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Send one request at each of ``times`` (s from the start, sorted), whatever is in
        flight; returns per request, in send order, ``{"t_s", "sent_s", "outcome" (ok /
        refused / error), "code" (:func:`answer_code`), "ms"}``.

        Raises:
            InfScalerError: the service cannot be reached or the model is unknown.
        """
        from infscaler.api.client import Client

        with Client(self.socket_path) as client:
            client.model_metadata(self.model)
        body, headers = encode_infer_request(
            self.inputs, binary=True, binary_output=True, parameters=self.parameters or None
        )
        return asyncio.run(self._replay(list(times), timeout_s, body, headers))

    async def _replay(
        self, times: list[float], timeout_s: float, body: bytes, headers: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [{} for _ in times]
        async with open_session(self.socket_path, timeout_s) as session:

            async def fire(i: int, t: float, sent: float) -> None:
                o = await self._one(session, body, headers)
                rows[i] = {"t_s": round(t, 4), "sent_s": round(sent, 4), "outcome": o.kind,
                           "code": o.reason, "ms": round(o.latency_ms, 2)}  # fmt: skip

            tasks = []
            t0 = time.perf_counter()
            for i, t in enumerate(times):
                delay = t0 + float(t) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(fire(i, t, time.perf_counter() - t0)))
            await asyncio.gather(*tasks)
        return rows

    async def measure(
        self,
        session: Any,
        spec: LoadSpec,
        cfg: MeasureConfig,
        body: bytes,
        headers: Mapping[str, str],
        on_window: Callable[[LoadSpec, int, Window], None] | None = None,
    ) -> PointResult:
        """One load point: start the load, measure windows until stable or
        ``max_trials``, stop the load and wait for every request in flight."""
        run = LoadRun()
        interval_s = cfg.interval_ms / 1e3
        # count windows end after request_count answers, or at the latest after timeout_s
        window_s = interval_s if cfg.request_count is None else cfg.timeout_s
        if spec.mode == "concurrency":
            load = self._closed(session, run, int(spec.value), body, headers)
        else:
            span = window_s * (cfg.max_trials + 1)
            times = arrival_times(spec.distribution, spec.value, span, cfg.seed)
            load = self._open(session, run, times, cfg, body, headers)
        first_stats = stats = await self._stats(session)
        task = asyncio.ensure_future(load)
        windows: list[Window] = []
        cut, t_cut = len(run.outcomes), time.perf_counter()
        while len(windows) < cfg.max_trials and not task.done():
            await run.window_end(task, cut, t_cut + window_s, cfg.request_count)
            now, end = time.perf_counter(), len(run.outcomes)
            after = await self._stats(session)
            w = window_of(run.outcomes[cut:end], now - t_cut)
            w.server = server_delta(stats, after)
            windows.append(w)
            cut, t_cut, stats = end, now, after
            if on_window is not None:
                on_window(spec, len(windows), w)
            if is_stable(windows, cfg.stability_pct):
                break
        run.stop.set()
        await task
        last_stats = await self._stats(session)
        kinds = [o.kind for o in run.outcomes]
        whole = server_delta(first_stats, last_stats)
        totals = {
            "sent": run.sent,
            "ok": kinds.count("ok"),
            "refused": kinds.count("refused"),
            "errors": kinds.count("error"),
            "skipped": run.skipped,
            "server_success": int(whole["success"]) if whole else -1,
        }
        return PointResult(
            spec,
            is_stable(windows, cfg.stability_pct),
            windows,
            summarize(windows, cfg.slo_ms),
            totals,
        )


def window_of(outcomes: Sequence[Outcome], duration_s: float) -> Window:
    w = Window(duration_s)
    for o in outcomes:
        if o.kind == "ok":
            w.latencies_ms.append(o.latency_ms)
        elif o.kind == "refused":
            count_key(w.refused, o.reason)
        else:
            count_key(w.errors, o.reason)
    return w


def _socket_gid(client: Any) -> int | None:
    """The group of the client's socket when this process is in it (the group a service
    running as its own user shares with its clients), else None."""
    try:
        gid = os.stat(client.socket_path).st_gid
    except (AttributeError, OSError):
        return None
    return gid if gid in (os.getgid(), *os.getgroups()) else None


def _shm_inputs(client: Any, inputs: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, Any]]:
    """The inputs written into a new, randomly named shared memory region (mode 0660, of the
    socket's group where this process is in it) registered with the service:
    ``((region name, the region), name -> ShmTensor)``."""
    from infscaler.api.codec import datatype_of
    from infscaler.api.sysshm import SharedMemoryRegion

    blobs = {k: bytes(tensor_to_bytes(np.asarray(v))) for k, v in inputs.items()}
    size = sum(len(b) for b in blobs.values())
    # a name nobody can guess and take first, on the service's side or in /dev/shm
    name = f"perf-{os.getpid()}-{secrets.token_hex(8)}"
    region = SharedMemoryRegion.create(
        f"/infscaler-{name}", max(1, size), mode=0o660, gid=_socket_gid(client)
    )
    try:
        assert region.buf is not None
        tensors: dict[str, Any] = {}
        off = 0
        for k, b in blobs.items():
            region.buf[off : off + len(b)] = b
            a = np.asarray(inputs[k])
            tensors[k] = ShmTensor(name, datatype_of(a), list(a.shape), len(b), off)
            off += len(b)
        client.register_system_shm(name, region.key, max(1, size))
    except BaseException:
        region.close()
        raise
    return (name, region), tensors
