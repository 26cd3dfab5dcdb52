"""Device profiles: the accelerators, memory cap, cores and power mode of a target SoC.

A profile is a YAML file (schema :class:`DeviceProfile`, validated with pydantic). The
bundled ones live in ``profiles/`` (installed as ``infscaler.profiles``): Jetson AGX
Xavier, Xavier NX, AGX Orin, Orin NX, Orin Nano, and ``generic-x86`` (a CPU-only host).
``--device`` takes a bundled name (``orin-agx``) or a path to a YAML file.

The partitioner records the profile in the plan and reports, per partition, the latency
on each of the profile's engines that this host has; engines the host lacks are listed as
unavailable with the reason, never estimated. The runtime's scaler (InfScaler Algorithm 1)
uses ``memory_cap_mb`` and each accelerator's ``max_instances`` as the resource limits R^m.
Figures come from NVIDIA's Jetson module data sheets.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infscaler.errors import ConfigError

Engine = Literal["cpu", "gpu", "dla"]


class Accelerator(BaseModel):
    """One engine kind on the SoC.

    Attributes:
        engine: ``cpu``, ``gpu`` (iGPU) or ``dla``.
        count: how many (DLA cores: 0-2; CPU: 1 entry, its cores in ``cores``).
        cores: CPU cores available to inference instances (cpu only).
        precisions: precisions the engine runs (``fp32``, ``fp16``, ``int8``).
        max_instances: resource limit on concurrent instances (Algorithm 1's R^m).
        description: free text (``512-core Volta, 64 Tensor Cores``).
    """

    model_config = ConfigDict(extra="forbid")

    engine: Engine
    count: int = Field(1, ge=0)
    cores: list[int] | None = None
    precisions: list[Literal["fp32", "fp16", "int8"]] = ["fp32"]
    max_instances: int = Field(4, ge=1)
    description: str = ""


class DeviceProfile(BaseModel):
    """A target device (see the module docstring).

    Attributes:
        name: short name (``orin-agx``).
        soc: SoC / module (``Jetson AGX Orin 64GB``).
        memory_mb: total unified DRAM, MB.
        memory_cap_mb: memory InfScaler may use for instances and tensor pools, MB.
        power_mode: nvpmodel mode name (``MAXN``) or ``null``.
        unified_memory: CPU and accelerators share one DRAM (Jetson: true).
        accelerators: the engines.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    soc: str
    memory_mb: int = Field(gt=0)
    memory_cap_mb: int = Field(gt=0)
    power_mode: str | None = None
    unified_memory: bool = False
    accelerators: list[Accelerator]

    @model_validator(mode="after")
    def _check(self) -> DeviceProfile:
        if self.memory_cap_mb > self.memory_mb:
            raise ValueError(
                f"memory_cap_mb ({self.memory_cap_mb}) exceeds memory_mb ({self.memory_mb})"
            )
        engines = [a.engine for a in self.accelerators]
        if "cpu" not in engines:
            raise ValueError("accelerators must include a cpu entry")
        if len(set(engines)) != len(engines):
            raise ValueError(f"each engine may appear once in accelerators, got {engines}")
        return self

    @property
    def engines(self) -> list[str]:
        """Engine names with count >= 1, in profile order."""
        return [a.engine for a in self.accelerators if a.count > 0]


def bundled_profiles() -> list[str]:
    """Names of the bundled profiles (file stems under ``profiles/``)."""
    files = resources.files("infscaler.profiles").iterdir()
    return sorted(Path(f.name).stem for f in files if f.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """Load a bundled profile by name, or a YAML file by path.

    Raises:
        ConfigError: unknown name, unreadable file, bad YAML, or schema violations (the
            message names each offending field by its YAML path).
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"device profile not found: {path}")
        text = path.read_text()
        where = str(path)
    else:
        res = resources.files("infscaler.profiles").joinpath(f"{name_or_path}.yaml")
        if not res.is_file():
            raise ConfigError(
                f"unknown device profile '{name_or_path}'",
                hint=f"use one of {', '.join(bundled_profiles())} or a path to a YAML file",
            )
        text = res.read_text()
        where = f"profiles/{name_or_path}.yaml"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a YAML mapping with name, soc, memory_mb, ...")
    try:
        return DeviceProfile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{where} is not a valid device profile: {problems}") from None
