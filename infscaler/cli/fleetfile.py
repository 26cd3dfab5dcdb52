"""The fleet file of ``infscaler plan --fleet FLEET.yaml``: nodes (device profiles),
pipelines (unit profiles) and streams (rates and SLOs). More: docs/fleet.md,
"`infscaler/cli/fleetfile.py`"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from infscaler.base.errors import ConfigError
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile

__all__ = ["FleetFile", "load_fleet", "units_from_spec"]


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSpec(_Base):
    mean_ms: float = Field(gt=0)
    cv: float = Field(0.0, ge=0)
    memory_mb: float = Field(0.0, ge=0)
    cores: int = Field(0, ge=0)
    batch_ms: dict[int, float] = Field(default_factory=dict)


class UnitSpec(_Base):
    name: str
    engines: dict[str, EngineSpec]
    kind: str = "model"
    fan_out: bool = False
    items: list[int] = Field(default_factory=lambda: [1])
    fan_in: bool = False
    min_instances: int = Field(1, ge=1)
    max_instances: int | None = Field(None, ge=1)
    max_batch: int = Field(1, ge=1)

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: dict[str, EngineSpec]) -> dict[str, EngineSpec]:
        bad = sorted(set(v) - {"cpu", "gpu", "dla"})
        if bad or not v:
            raise ValueError(f"engines must be some of cpu, gpu, dla (got {sorted(v)})")
        return v


class PipelineSpec(_Base):
    slo: str | float | None = None
    file: str | None = None
    units: list[UnitSpec] | None = None
    devices: dict[str, list[UnitSpec]] = Field(default_factory=dict)


class NodeSpec(_Base):
    name: str | None = None
    prefix: str | None = None
    count: int = Field(1, ge=1)
    device: str


class StreamSpec(_Base):
    name: str | None = None
    prefix: str | None = None
    count: int = Field(1, ge=1)
    pipeline: str
    rate: str | float
    slo: str | float | None = None


class FleetFile(_Base):
    pool_mb: float = Field(512.0, ge=0)
    nodes: list[NodeSpec] = Field(min_length=1)
    pipelines: dict[str, PipelineSpec] = Field(min_length=1)
    streams: list[StreamSpec] = Field(min_length=1)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def load_fleet(path: str | Path) -> tuple[FleetFile, Path]:
    """Parse and validate a fleet file (names, counts and references too); returns it and
    its directory (``file:`` paths are relative to it).

    Raises:
        ConfigError: the message names every offending YAML path.
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read fleet file {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"fleet file {p} must be a mapping with nodes, pipelines, streams",
            hint="see docs/fleet.md",
        )
    try:
        fleet = FleetFile.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_where(tuple(e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            f"fleet file {p} is not valid: " + "; ".join(dict.fromkeys(problems)),
            hint="see docs/fleet.md",
        ) from None
    problems = []
    for i, n in enumerate(fleet.nodes):
        if (n.name is None) == (n.prefix is None):
            problems.append(f"nodes[{i}]: give either name or prefix (with count)")
    for i, s in enumerate(fleet.streams):
        if (s.name is None) == (s.prefix is None):
            problems.append(f"streams[{i}]: give either name or prefix (with count)")
        if s.pipeline not in fleet.pipelines:
            problems.append(
                f"streams[{i}].pipeline: unknown pipeline {s.pipeline!r} "
                f"(the file has {sorted(fleet.pipelines)})"
            )
    for name, ps in fleet.pipelines.items():
        if (ps.file is None) == (ps.units is None):
            problems.append(f"pipelines.{name}: give either file or units")
    if problems:
        raise ConfigError(f"fleet file {p} is not valid: " + "; ".join(problems))
    return fleet, p.resolve().parent


def units_from_spec(specs: list[UnitSpec]) -> tuple[Any, ...]:
    """The simulator's unit profiles from the file's ``units``.

    Raises:
        ConfigError: a value the simulator refuses (its message).
    """

    out = []
    for u in specs:
        try:
            out.append(
                UnitProfile(
                    name=u.name,
                    engines={
                        e: EngineProfile(
                            e,
                            s.mean_ms,
                            cv=s.cv,
                            memory_mb=s.memory_mb,
                            cores=s.cores if e == "cpu" else 0,
                            batch_ms=dict(s.batch_ms),
                        )
                        for e, s in u.engines.items()
                    },
                    kind=u.kind,
                    fan_out=u.fan_out,
                    items=tuple(u.items),
                    fan_in=u.fan_in,
                    served=not u.fan_in,
                    min_instances=u.min_instances,
                    max_instances=u.max_instances,
                    max_batch=u.max_batch,
                )
            )
        except ValueError as exc:
            raise ConfigError(f"unit {u.name}: {exc}") from None
    return tuple(out)


def expand_names(prefix: str | None, name: str | None, count: int) -> list[str]:
    """``name`` alone, or ``prefix`` + 0001.. ``count`` (4 digits at least)."""
    if name is not None:
        return [name] if count == 1 else [f"{name}-{i:04d}" for i in range(1, count + 1)]
    return [f"{prefix}{i:04d}" for i in range(1, count + 1)]
