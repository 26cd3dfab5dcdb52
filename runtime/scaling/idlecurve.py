"""The idle slowdown a model served, kept for the planner's next deploy
(docs/scaling.md, "What idle costs").

Files: ``cache_dir() / "idle" / "<model key>-<host>-t<threads>-<wake>.json"`` (model key:
the ONNX file's resolved path, size and mtime; ``<wake>``: ``sleep`` or the PM QoS limit,
``0us``). Written by :func:`learn` every :data:`LEARN_INTERVAL_S`, read by
:func:`load_curve`; older than :data:`MAX_AGE_S`, ignored."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from infscaler.base.models import cache_dir, file_key
from infscaler.partitioner.profiler import host_fingerprint

__all__ = [
    "LEARN_INTERVAL_S",
    "MAX_AGE_S",
    "curve_for",
    "curve_path",
    "learn",
    "load_curve",
    "save_curve",
]

SCHEMA = 1
#: Seconds between two :func:`learn` calls for one pipeline (the autoscaler's loop).
LEARN_INTERVAL_S = 60.0
#: A kept curve older than this (s) is not planned with: the host may have changed.
MAX_AGE_S = 7 * 86400.0

Points = tuple[tuple[float, float], ...]


def _model_key(model: str | os.PathLike[str]) -> str:
    return hashlib.sha256(file_key(model).encode()).hexdigest()[:16]


def _valid(points: Points) -> bool:
    """Points the simulator takes (``EngineProfile.idle``: idle s > 0, increasing) that
    are a slowdown (factor >= 1), and at least one."""
    gaps = [g for g, _ in points]
    return (
        bool(points)
        and all(math.isfinite(g) and g > 0 and math.isfinite(f) and f >= 1 for g, f in points)
        and gaps == sorted(set(gaps))
    )


def _wake(wake_latency_us: int | None) -> str:
    return "sleep" if wake_latency_us is None else f"{int(wake_latency_us)}us"


def curve_path(model: str | os.PathLike[str], threads: int, wake_latency_us: int | None) -> Path:
    """Where the curve of ``model`` at ``threads`` threads on this host under
    ``wake_latency_us`` (None: none held) is kept.

    Raises:
        OSError: ``model`` does not exist."""
    name = f"{_model_key(model)}-{host_fingerprint()}-t{int(threads)}-{_wake(wake_latency_us)}"
    return cache_dir() / "idle" / f"{name}.json"


def save_curve(
    model: str | os.PathLike[str],
    threads: int,
    wake_latency_us: int | None,
    points: Points,
    items: int,
) -> Path:
    """Keep ``points`` (``(idle s, factor)``, increasing idle) atomically; returns the file.

    Raises:
        ValueError: no points, a point not (idle s > 0, factor >= 1), or idle not increasing.
        OSError: the cache directory cannot be written."""
    pts = tuple((float(g), float(f)) for g, f in points)
    if not _valid(pts):
        raise ValueError(f"idle points must be (idle s > 0, factor >= 1), got {pts}")
    path = curve_path(model, threads, wake_latency_us)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "schema": SCHEMA,
        "model": str(Path(model).resolve()),
        "threads": int(threads),
        "wake_latency_us": wake_latency_us,
        "host": host_fingerprint(),
        "points": list(pts),
        "items": int(items),
        "saved_at": time.time(),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def load_curve(
    model: str | os.PathLike[str],
    threads: int,
    wake_latency_us: int | None,
    *,
    max_age_s: float = MAX_AGE_S,
    now: float | None = None,
) -> Points:
    """The kept curve, or ``()`` when there is none, it is older than ``max_age_s``, or
    the file is unreadable (a bad file is never fatal: the planner plans without)."""
    try:
        data = json.loads(curve_path(model, threads, wake_latency_us).read_text())
        if data.get("schema") != SCHEMA:
            return ()
        age = (time.time() if now is None else now) - float(data["saved_at"])
        if not 0 <= age <= max_age_s:
            return ()
        pts = tuple((float(g), float(f)) for g, f in data["points"])
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    return pts if _valid(pts) else ()


def curve_for(
    model: str | os.PathLike[str],
    threads: int,
    wake_latency_us: int | None,
    counts: tuple[int, ...],
) -> Points:
    """The curve to plan ``model`` at ``threads`` with: the one kept at that count, else at the
    nearest of ``counts`` (ties: the larger), else ``()``."""
    own = load_curve(model, threads, wake_latency_us)
    if own:
        return own
    for t in sorted((c for c in counts if c != threads), key=lambda c: (abs(c - threads), -c)):
        kept = load_curve(model, t, wake_latency_us)
        if kept:
            return kept
    return ()


def learn(
    dep: Any, handles: list[Any], wake_latency_us: int | None, handover_ms: float
) -> list[Path]:
    """Keep the curves ``dep`` served so far for each unit running one whole ONNX model on the
    cpu at one thread count; returns the files written.

    Args:
        dep: a Deployment. handles: the supervisor's instance handles.
        wake_latency_us: the PM QoS limit held (None: none).
        handover_ms: the simulator's time per hop."""
    points = dep.route.stats.idle_points(handover_ms)
    summaries = dep.route.stats.idle_summaries()
    written = []
    for u in dep.pipeline.units:
        if u.kind != "model" or u.engine != "cpu" or u.num_partitions != 1 or u.steps:
            continue
        if not u.path or not points[u.index]:
            continue
        threads = {int(h.unit.threads) for h in handles if h.key == (dep.name, u.index)}
        if len(threads) != 1:
            continue
        items = sum(b["wake_count"] for b in summaries[u.index]["bins"])
        with contextlib.suppress(OSError, ValueError):
            written.append(
                save_curve(u.path, threads.pop(), wake_latency_us, points[u.index], items)
            )
    return written
