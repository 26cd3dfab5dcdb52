"""The deploy-time planner's kept decisions: JSON files
``state_dir/plans/decisions/<pipeline>-<digest>.json`` keyed by what was planned
(:func:`decision_path`), reused while they hold under the memory cap
(:func:`cap_changed`); a replan under another key gives the configuration planned before
the tie (:func:`planned_before`). Written atomically (:func:`write_json`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infscaler.base.models import file_key, resolve_model
from infscaler.runtime.planning.inputs import planned_thread_counts
from infscaler.runtime.scaling.idlecurve import load_curve

__all__ = [
    "CAP_GROWTH_REPLAN",
    "cap_changed",
    "decision_path",
    "function_key",
    "keep_decision",
    "planned_before",
    "write_json",
]

#: a kept decision is planned again when the device's memory cap grew past this factor
#: of the cap it was planned under (more memory may afford a better configuration)
CAP_GROWTH_REPLAN = 1.25


def keep_decision(
    path: Path,
    data: dict[str, Any],
    best: Any,
    cap_mb: float,
    live: dict[str, Any] | None = None,
) -> None:
    """Write a decision (the planned pipeline, the candidate's line, its memory and the cap in
    MB, and ``live``: what the live check compares), atomically."""
    kept = {
        "pipeline": data,
        "chosen": best.line(),
        "identity": best.identity(),
        "memory_mb": round(float(best.memory_mb), 1),
        "memory_cap_mb": None if not math.isfinite(cap_mb) else round(float(cap_mb), 1),
    }
    if live is not None:
        kept["live"] = live
    write_json(path, kept)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON to ``path`` (its directory made), atomically: a temporary file
    then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


#: hex digits of the key digest in a kept decision's file name, ``<pipeline>-<digest>.json``
#: (:func:`decision_path` writes it, :func:`planned_before` finds a pipeline's others)
_DECISION_DIGEST = 16


def planned_before(kept: Path, name: str) -> list[Any] | None:
    """The identity of the most recent other decision kept for pipeline ``name`` (another key),
    for the search's ``incumbent``; None when there is none or it is unreadable."""
    import re

    pattern = re.compile(rf"{re.escape(name)}-[0-9a-f]{{{_DECISION_DIGEST}}}\.json")
    try:
        others = [
            p for p in kept.parent.iterdir()
            if p != kept and pattern.fullmatch(p.name) and p.is_file()
        ]  # fmt: skip
        for p in sorted(others, key=lambda p: p.stat().st_mtime_ns, reverse=True):
            data = json.loads(p.read_text())
            identity = data.get("identity")
            if data.get("pipeline", {}).get("name") == name and isinstance(identity, list):
                return identity
    except (OSError, ValueError, AttributeError):
        return None
    return None


def cap_changed(kept: dict[str, Any], cap_mb: float) -> str | None:
    """Why a kept decision no longer holds under the memory cap ``cap_mb`` (None: it does): it
    no longer fits, or the cap grew past :data:`CAP_GROWTH_REPLAN` x the one planned under."""
    need, then = kept.get("memory_mb"), kept.get("memory_cap_mb")
    if need is not None and math.isfinite(cap_mb) and float(need) > cap_mb:
        return f"needs {float(need):.0f} MB, more than the cap of {cap_mb:.0f} MB now"
    if then is not None and cap_mb > CAP_GROWTH_REPLAN * float(then):
        return (
            f"was planned under a {float(then):.0f} MB cap; the cap is {cap_mb:.0f} MB now "
            f"(> {CAP_GROWTH_REPLAN:g}x)"
        )
    if then is None and math.isfinite(cap_mb):
        return f"was planned with no memory cap; the cap is {cap_mb:.0f} MB now"
    return None


def function_key(spec: str, allowed: Sequence[str] | None) -> str:
    """``module:attr|<file_key of the module's file>`` for a function stage, without importing
    it (allowed modules checked first, as ``load_function`` does); ``module:attr|?`` where the
    file cannot be found or the module is not allowed."""
    import importlib.util
    import sys

    from infscaler.base.security import check_function_module

    module = spec.partition(":")[0]
    try:
        if allowed is not None:
            check_function_module(spec, allowed)
        origin = getattr(sys.modules.get(module), "__file__", None)
        if origin is None:
            found = importlib.util.find_spec(module)
            origin = found.origin if found is not None else None
        if origin and Path(origin).is_file():
            return f"{spec}|{file_key(Path(origin))}"
    except Exception:  # noqa: BLE001 - planning or the deploy reports it
        pass
    return f"{spec}|?"


def decision_path(
    cfg: Any,
    device: Any,
    state_dir: Path,
    rate: float | None,
    objectives: Sequence[str],
    wake_latency_us: int | None = None,
    allowed_functions: Sequence[str] | None = None,
) -> Path:
    """Where :func:`~infscaler.runtime.planning.autoplan.plan_pipeline` keeps its decision for
    these inputs; the key includes the idle slowdowns kept for its models (factors to the
    nearest 0.25) and its function stages' files (:func:`function_key`)."""
    import hashlib

    from infscaler import __version__

    files = []
    learned = []
    for st in cfg.stages:
        if getattr(st, "function", None):
            files.append(function_key(st.function, allowed_functions))
        if getattr(st, "kind", "") == "model" and getattr(st, "model", None):
            try:
                f = Path(resolve_model(st.model))
                files.append(file_key(f))
                for t in planned_thread_counts():
                    pts = load_curve(f, t, wake_latency_us)
                    if pts:
                        learned.append([st.name, t, [round(x * 4) / 4 for _, x in pts]])
            except Exception:  # noqa: BLE001 - planning then reports it
                files.append(f"{st.model}|?")
    # the memory cap is checked on reuse instead (:func:`cap_changed`)
    dev = (
        device.model_dump_json(exclude={"memory_cap_mb", "sources"})
        if hasattr(device, "model_dump_json")
        else repr(device)
    )
    key = json.dumps(
        [cfg.model_dump_json(), dev, rate, list(objectives), __version__, files]
        + ([learned] if learned else []),
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:_DECISION_DIGEST]
    return Path(state_dir) / "plans" / "decisions" / f"{cfg.name}-{digest}.json"
