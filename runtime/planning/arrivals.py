"""Arrival processes for the planner's simulator and the benchmarks: sorted arrays of
request arrival times in seconds, starting near 0.

:func:`poisson`; :func:`gamma` (mean 1 / rate, squared CV ``cv2``: InferLine §2.1, §6);
:func:`azure_functions` (Azure Functions 2019 trace, Shahrad et al., ATC'20: per-minute
counts spread as Poisson); :func:`azure_llm` (Azure LLM inference trace 2023, Patel et
al., ISCA'24: timestamps replayed); :func:`from_spec` (the CLI's ``--arrivals``). The
traces ship in ``infscaler/runtime/planning/traces/`` (README.md: source, licence);
``$INFSCALER_TRACES`` names another directory. Pure: numpy only; random ones take a ``seed``."""

from __future__ import annotations

import csv
import gzip
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "AZURE_FUNCTIONS_FILE",
    "AZURE_LLM_FILE",
    "azure_functions",
    "azure_llm",
    "cv2_of",
    "from_spec",
    "gamma",
    "poisson",
    "trace_dir",
]

AZURE_FUNCTIONS_FILE = "azure-functions-2019-500fn-480min-invocations.csv"
AZURE_LLM_FILE = "azure-llm-inference-2023-conv.csv"


def _positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def poisson(rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` requests/s over ``duration_s``.

    Raises:
        ValueError: a rate or duration that is not positive.
    """
    return gamma(rate, 1.0, duration_s, seed)


def gamma(rate: float, cv2: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times (s) over ``duration_s`` with i.i.d. gamma inter-arrivals of mean
    ``1 / rate`` and squared CV ``cv2`` (``cv2 = 1``: Poisson).

    Raises:
        ValueError: a rate, CV^2 or duration that is not positive."""
    rate = _positive("rate", rate)
    cv2 = _positive("cv2", cv2)
    duration_s = _positive("duration_s", duration_s)
    rng = np.random.default_rng(seed)
    shape, scale = 1.0 / cv2, cv2 / rate
    expected = rate * duration_s
    chunks: list[np.ndarray] = []
    t = 0.0
    n = int(expected + 6.0 * math.sqrt(expected * cv2) + 16)
    while True:
        gaps = rng.gamma(shape, scale, size=n)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
        if t >= duration_s:
            break
    out = np.concatenate(chunks)
    return out[out < duration_s]


def cv2_of(arrivals: np.ndarray) -> float:
    """The squared coefficient of variation of the inter-arrival times of ``arrivals``."""
    gaps = np.diff(np.asarray(arrivals, dtype=float))
    if gaps.size < 2 or gaps.mean() <= 0:
        raise ValueError("need at least 3 arrivals with increasing times to compute CV^2")
    return float(gaps.var() / gaps.mean() ** 2)


def trace_dir() -> Path:
    """``$INFSCALER_TRACES``, else the traces shipped in the package (``traces/`` beside
    this module)."""
    env = os.environ.get("INFSCALER_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "traces"


def _trace_file(path: str | os.PathLike[str] | None, default_name: str) -> Path:
    """The trace ``default_name`` (or ``default_name`` + ``.gz``) at ``path`` (a file or
    a directory; default :func:`trace_dir`)."""
    p = Path(path) if path is not None else trace_dir() / default_name
    if p.is_dir():
        p = p / default_name
    if not p.is_file() and p.with_name(p.name + ".gz").is_file():
        p = p.with_name(p.name + ".gz")
    if not p.is_file():
        raise FileNotFoundError(
            f"arrival trace not found: {p} (set INFSCALER_TRACES to the directory holding "
            f"{default_name}, or pass its path)"
        )
    return p


def _open_text(p: Path) -> Any:
    """``p`` for reading as text (gunzipped when it ends in ``.gz``)."""
    if p.suffix == ".gz":
        return gzip.open(p, "rt", newline="")
    return p.open(newline="")


def azure_functions(
    path: str | os.PathLike[str] | None = None,
    function: str | None = None,
    start_min: int = 0,
    minutes: int | None = None,
    scale: float = 1.0,
    seed: int = 0,
) -> np.ndarray:
    """Arrival times (s) from the Azure Functions 2019 trace: minute ``m`` of the window holds
    ``count_m x scale`` requests (a fraction rounded up with that probability), placed
    uniformly inside the minute. Time 0 is the start of the window.

    Args:
        path: the invocations CSV (or its directory); default: :func:`trace_dir`.
        function: None (all functions summed), ``"busiest"``, or a ``HashFunction`` value
            (a unique prefix of at least 6 characters).
        start_min: first minute of the window, 0-based. minutes: None: to the end.
        scale: rate multiplier (> 0). seed: for the placement inside each minute.

    Raises:
        FileNotFoundError: the trace file is missing.
        ValueError: an unknown function, a window outside the trace, a bad scale."""
    scale = _positive("scale", scale)
    p = _trace_file(path, AZURE_FUNCTIONS_FILE)
    with _open_text(p) as f:
        reader = csv.reader(f)
        header = next(reader)
        try:
            first = header.index("HashFunction")
            col0 = header.index("Trigger") + 1
        except ValueError:
            raise ValueError(
                f"{p} is not the Azure Functions invocations CSV (no HashFunction / Trigger "
                "columns)"
            ) from None
        rows = [(r[first], np.asarray(r[col0:], dtype=np.int64)) for r in reader if r]
    if not rows:
        raise ValueError(f"{p} holds no functions")
    total_min = len(rows[0][1])
    if function is None:
        counts = np.sum([c for _, c in rows], axis=0)
    elif function == "busiest":
        counts = max(rows, key=lambda r: int(r[1].sum()))[1]
    else:
        if len(function) < 6:
            raise ValueError(f"function {function!r}: give at least 6 characters of its hash")
        hits = [c for h, c in rows if h.startswith(function)]
        if not hits:
            raise ValueError(f"function {function!r} is not in {p.name}")
        if len(hits) > 1:
            raise ValueError(f"function prefix {function!r} matches {len(hits)} functions")
        counts = hits[0]
    if not isinstance(start_min, int | np.integer) or not 0 <= start_min < total_min:
        raise ValueError(f"start_min must be an integer in [0, {total_min}), got {start_min!r}")
    if minutes is None:
        minutes = total_min - start_min
    if not isinstance(minutes, int | np.integer) or minutes < 1:
        raise ValueError(f"minutes must be a positive integer, got {minutes!r}")
    if start_min + minutes > total_min:
        raise ValueError(
            f"window start_min={start_min} + minutes={minutes} exceeds the trace's "
            f"{total_min} minutes"
        )
    rng = np.random.default_rng(seed)
    window = counts[start_min : start_min + minutes].astype(float) * scale
    whole = np.floor(window)
    n = (whole + (rng.random(window.size) < (window - whole))).astype(np.int64)
    minute_of = np.repeat(np.arange(minutes, dtype=float), n)
    times = (minute_of + rng.random(minute_of.size)) * 60.0
    return np.sort(times)


def azure_llm(
    path: str | os.PathLike[str] | None = None,
    time_scale: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> np.ndarray:
    """Arrival times (s) of the Azure LLM inference trace 2023: its timestamps relative to the
    first, x ``time_scale``, cut to ``[start_s, start_s + duration_s)`` and shifted to 0.

    Raises:
        FileNotFoundError: the trace file is missing.
        ValueError: a bad ``time_scale`` / window, or an unreadable file."""
    time_scale = _positive("time_scale", time_scale)
    if not math.isfinite(start_s) or start_s < 0:
        raise ValueError(f"start_s must be >= 0, got {start_s!r}")
    if duration_s is not None:
        duration_s = _positive("duration_s", duration_s)
    p = _trace_file(path, AZURE_LLM_FILE)
    with _open_text(p) as f:
        reader = csv.reader(f)
        header = next(reader)
        if not header or header[0] != "TIMESTAMP":
            raise ValueError(f"{p} is not the Azure LLM trace (first column TIMESTAMP)")
        stamps = [r[0] for r in reader if r]
    if not stamps:
        raise ValueError(f"{p} holds no requests")
    try:
        t = np.array(stamps, dtype="datetime64[us]")
    except ValueError as exc:
        raise ValueError(f"{p}: cannot read timestamps: {exc}") from None
    secs = np.sort((t - t.min()).astype(np.int64) / 1e6) * time_scale
    end = np.inf if duration_s is None else start_s + duration_s
    sel = secs[(secs >= start_s) & (secs < end)] - start_s
    if sel.size == 0:
        raise ValueError(
            f"no requests in the window [{start_s}, {end}) s of the trace "
            f"({secs[-1]:.0f} s long at time_scale {time_scale:g})"
        )
    return sel


def from_spec(spec: str, rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrivals at a mean of ``rate`` requests/s over ``duration_s`` from a CLI spec:
    ``poisson``; ``gamma:CV2``; ``azure`` / ``azure:busiest`` / ``azure:HASH`` (the first
    ``ceil(duration_s / 60)`` minutes, scaled to ``rate``); ``azure-llm`` (time-scaled so
    ``rate x duration_s`` requests fall in ``duration_s``).

    Raises:
        ValueError: an unknown spec or bad numbers.
        FileNotFoundError: a trace file is missing."""
    rate = _positive("rate", rate)
    duration_s = _positive("duration_s", duration_s)
    kind, _, arg = str(spec).strip().lower().partition(":")
    if kind == "poisson" and not arg:
        return poisson(rate, duration_s, seed)
    if kind == "gamma":
        try:
            cv2 = float(arg)
        except ValueError:
            raise ValueError(f"arrivals {spec!r}: write gamma:CV2, e.g. gamma:4") from None
        return gamma(rate, cv2, duration_s, seed)
    if kind == "azure":
        minutes = max(1, math.ceil(duration_s / 60.0))
        raw = azure_functions(function=arg or None, minutes=minutes, scale=1.0, seed=seed)
        base = raw.size / (minutes * 60.0)
        if base <= 0:
            raise ValueError(f"arrivals {spec!r}: the trace window holds no requests")
        a = azure_functions(function=arg or None, minutes=minutes, scale=rate / base, seed=seed)
        return a[a < duration_s]
    if kind == "azure-llm" and not arg:
        full = azure_llm()
        k = int(round(rate * duration_s))
        if 0 < k < full.size and full[k] > 0:
            scale = duration_s / full[k]  # the k-th request lands at duration_s
        else:  # the whole trace is too short for rate x duration: its mean rate instead
            scale = full.size / max(full[-1], 1e-9) / rate
        return azure_llm(time_scale=scale, duration_s=duration_s)
    raise ValueError(
        f"unknown arrivals {spec!r}: use poisson, gamma:CV2 (e.g. gamma:4), azure, "
        "azure:busiest or azure-llm"
    )
