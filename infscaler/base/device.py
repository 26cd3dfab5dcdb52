"""Device profiles: the accelerators, memory cap, cores and power mode of a target SoC.

A profile is a YAML file (schema :class:`DeviceProfile`); bundled ones live in
``profiles/``; ``cpu-host`` is derived from this machine (:func:`host_profile`) and is the
service's default. ``sources`` cites every figure (data sheet, Jetson Linux guide, a
measurement, or a policy such as the memory cap). Memory is MB of 2**20 bytes throughout.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from infscaler.base.config import clean_validation_message
from infscaler.base.errors import ConfigError

__all__ = [
    "ENGINES",
    "HOST_CAP_FRACTION",
    "HOST_MIN_CAP_MB",
    "HOST_PROFILE",
    "INSTANCE_OVERHEAD_MB",
    "MAX_DLA_CORES",
    "Accelerator",
    "DeviceProfile",
    "bundled_profiles",
    "check_pipeline",
    "host_profile",
    "load_profile",
]

Engine = Literal["cpu", "gpu", "dla"]
Precision = Literal["fp32", "fp16", "int8"]

#: Engine kinds a profile (and a pipeline stage) may name.
ENGINES: tuple[str, ...] = ("cpu", "gpu", "dla")
#: Precisions each engine kind can run at all (DLA: FP16 and INT8 only, TensorRT
#: Developer Guide, "Working with DLA").
ENGINE_PRECISIONS: dict[str, tuple[str, ...]] = {
    "cpu": ("fp32", "fp16", "int8"),
    "gpu": ("fp32", "fp16", "int8"),
    "dla": ("fp16", "int8"),
}
#: The most NVDLA cores a Jetson module has (AGX Xavier, Xavier NX, AGX Orin, Orin NX: 2).
MAX_DLA_CORES = 2

#: Name of the profile derived from this machine (:func:`host_profile`).
HOST_PROFILE = "cpu-host"
#: ``cpu-host``'s memory cap: this fraction of the memory available when it is loaded
#: (psutil ``virtual_memory().available``, or the cgroup's headroom when smaller)...
HOST_CAP_FRACTION = 0.5
#: ... but at least this many MB (and never more than the host's total).
HOST_MIN_CAP_MB = 256
#: cpu instance slots per usable core in ``cpu-host`` (pipelined stages share cores).
HOST_INSTANCES_PER_CORE = 4
#: pinned model-instance threads per usable core in ``cpu-host`` (its explicit
#: oversubscription opt-in, :attr:`Accelerator.threads_per_core`).
HOST_THREADS_PER_CORE = 2.0

#: USS of an idle instance process (python + numpy + onnxruntime), MB, measured on the
#: development host; the same figure as ``infscaler.runtime.scaling.monitor.INSTANCE_OVERHEAD_MB``
#: (the scaler's cost of one more instance before it has reported its own USS).
INSTANCE_OVERHEAD_MB = 45.0


class Accelerator(BaseModel):
    """One engine kind on the SoC.

    Attributes:
        engine: ``cpu``, ``gpu`` (iGPU) or ``dla``.
        count: how many (DLA cores: 0-2; cpu: 1).
        cores: cpu only: core ids for inference instances (None: every core).
        precisions: what the engine runs (dla: ``fp16`` / ``int8`` only).
        max_instances: concurrent instances (Algorithm 1's R^m); per DLA core for ``dla``.
        threads_per_core: cpu only: pinned threads one core may take (:attr:`thread_slots`).
        description: free text; sources: field name -> citation.
    """

    model_config = ConfigDict(extra="forbid")

    engine: Engine
    count: int = Field(1, ge=0)
    cores: list[int] | None = None
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    max_instances: int = Field(4, ge=1)
    threads_per_core: float = Field(1.0, ge=1.0, le=16.0)
    description: str = ""
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("cores")
    @classmethod
    def _cores(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("cores must list at least one core id (or be omitted: all cores)")
        bad = [c for c in v if c < 0]
        if bad:
            raise ValueError(f"core ids must be >= 0, got {bad}")
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:
            raise ValueError(f"core ids must be unique, repeated: {dup}")
        return v

    @field_validator("precisions")
    @classmethod
    def _unique_precisions(cls, v: list[str]) -> list[str]:
        dup = sorted({p for p in v if v.count(p) > 1})
        if dup:
            raise ValueError(f"precisions must be unique, repeated: {dup}")
        return v

    @field_validator("sources")
    @classmethod
    def _source_keys(cls, v: dict[str, str]) -> dict[str, str]:
        known = set(cls.model_fields) - {"sources"}
        bad = sorted(k for k in v if k not in known)
        if bad:
            raise ValueError(f"sources name unknown fields {bad}; known: {sorted(known)}")
        return v

    @model_validator(mode="after")
    def _check(self) -> Accelerator:
        if self.engine == "dla" and self.count > MAX_DLA_CORES:
            raise ValueError(f"count: a Jetson has 0-{MAX_DLA_CORES} DLA cores, got {self.count}")
        if self.engine == "cpu" and self.count != 1:
            raise ValueError(
                f"count: the cpu entry has count 1 (list its cores in `cores`), got {self.count}"
            )
        if self.engine != "cpu" and self.cores is not None:
            raise ValueError(f"cores: applies to the cpu entry only, not {self.engine}")
        if self.engine != "cpu" and self.threads_per_core != 1.0:
            raise ValueError(f"threads_per_core: applies to the cpu entry only, not {self.engine}")
        allowed = ENGINE_PRECISIONS[self.engine]
        bad = [p for p in self.precisions if p not in allowed]
        if bad:
            raise ValueError(
                f"precisions: {self.engine} runs {' and '.join(allowed)} only, got {bad}"
            )
        return self

    @property
    def units(self) -> list[str]:
        """Named engine instances: ``["cpu"]``, ``["gpu"]``, ``["dla0", "dla1"]`` (DLA
        cores are numbered as TensorRT's ``DLA_core``); ``[]`` when ``count`` is 0."""
        if self.count < 1:
            return []
        if self.engine == "dla" or self.count > 1:
            return [f"{self.engine}{i}" for i in range(self.count)]
        return [self.engine]

    def thread_slots(self, host_cores: list[int] | None = None) -> int:
        """cpu only: the most pinned model-instance threads, ``floor(len(cores) x
        threads_per_core)`` (``cores``: the listed ones, else ``host_cores``, else this
        process's affinity, ``os.sched_getaffinity(0)``)."""
        cores = self.cores or host_cores or sorted(os.sched_getaffinity(0))
        return int(len(cores) * self.threads_per_core + 1e-9)

    @property
    def instance_limit(self) -> int:
        """The most concurrent instances on this engine kind (``max_instances``, times
        ``count`` for DLA cores; 0 when ``count`` is 0)."""
        if self.count < 1:
            return 0
        return self.max_instances * (self.count if self.engine == "dla" else 1)


class DeviceProfile(BaseModel):
    """A target device.

    Attributes:
        name / soc: short name (``orin-agx``) and module (``Jetson AGX Orin 64GB``).
        memory_mb: total (unified) DRAM, MB.
        memory_cap_mb: what instances and tensor pools may use, MB (<= ``memory_mb``).
        power_mode: nvpmodel mode name or ``null``.
        unified_memory: CPU and accelerators share one DRAM.
        accelerators: the engines (one ``cpu``, each engine at most once).
        sources: field name -> citation.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    soc: str
    memory_mb: int = Field(gt=0)
    memory_cap_mb: int = Field(gt=0)
    power_mode: str | None = None
    unified_memory: bool = False
    accelerators: list[Accelerator] = Field(min_length=1)
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("sources")
    @classmethod
    def _source_keys(cls, v: dict[str, str]) -> dict[str, str]:
        known = set(cls.model_fields) - {"sources", "accelerators", "name"}
        bad = sorted(k for k in v if k not in known)
        if bad:
            raise ValueError(
                f"sources name unknown fields {bad}; known: {sorted(known)} "
                "(an accelerator's figures are sourced in its own `sources`)"
            )
        return v

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
        """Engine kinds with count >= 1, in profile order (``["cpu", "gpu", "dla"]``)."""
        return [a.engine for a in self.accelerators if a.count > 0]

    @property
    def engine_units(self) -> list[str]:
        """Named engine instances, in profile order: ``["cpu", "gpu", "dla0", "dla1"]``."""
        return [u for a in self.accelerators for u in a.units]

    def accelerator(self, engine: str) -> Accelerator | None:
        """The entry for an engine kind (``dla0`` / ``dla1`` name the ``dla`` entry), or
        None when the profile has none with count >= 1."""
        kind = _engine_kind(engine)
        for a in self.accelerators:
            if a.engine == kind and a.count > 0:
                return a
        return None

    @property
    def instance_limits(self) -> dict[str, int]:
        """Engine kind -> the most concurrent instances (:attr:`Accelerator.instance_limit`)."""
        return {a.engine: a.instance_limit for a in self.accelerators if a.count > 0}

    @property
    def cpu_cores(self) -> list[int] | None:
        """The cpu entry's core ids (None: every core of the host)."""
        cpu = self.accelerator("cpu")
        return None if cpu is None else cpu.cores


def _engine_kind(engine: str) -> str:
    """``dla1`` -> ``dla``; other names unchanged."""
    m = re.fullmatch(r"(dla|gpu)(\d+)", engine)
    return m.group(1) if m else engine


# -- cpu-host: this machine -----------------------------------------------------------------


def _cgroup_headroom_bytes() -> int | None:
    """Bytes this process's memory cgroup (and its ancestors) may still allocate: the
    smallest ``limit - usage`` over cgroup v2 ``memory.max`` / ``memory.current`` or v1
    ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``; None when no limit applies or
    none can be read."""
    dirs: list[tuple[Path, str, str]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            base, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = (
                Path("/sys/fs/cgroup/memory"),
                (
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                ),
            )
        else:
            continue
        node = base / rel.lstrip("/")
        while True:  # the cgroup and its ancestors: each limit applies
            dirs.append((node, *files))
            if node == base or base not in node.parents:
                break
            node = node.parent
    best: int | None = None
    for d, limit_file, usage_file in dirs:
        try:
            limit_text = (d / limit_file).read_text().strip()
            usage = int((d / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or not limit_text.isdigit():
            continue
        limit = int(limit_text)
        if limit >= 1 << 60:  # v1's "no limit" is a page-rounded INT64_MAX
            continue
        headroom = max(limit - usage, 0)
        best = headroom if best is None else min(best, headroom)
    return best


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_profile() -> DeviceProfile:
    """The ``cpu-host`` profile of this machine: cpu only, the affinity cores (one instance
    each), psutil's total memory, and a cap of :data:`HOST_CAP_FRACTION` of what is available
    (or the memory cgroup's headroom), within [:data:`HOST_MIN_CAP_MB`, ``memory_mb``].
    """
    import psutil

    vm = psutil.virtual_memory()
    cores = sorted(os.sched_getaffinity(0))
    total_mb = int(vm.total // 2**20)
    avail = int(vm.available)
    cgroup = _cgroup_headroom_bytes()
    cap_basis = "psutil.virtual_memory().available"
    if cgroup is not None and cgroup < avail:
        avail, cap_basis = cgroup, "the memory cgroup's headroom (limit - usage)"
    cap_mb = min(max(int(avail * HOST_CAP_FRACTION / 2**20), HOST_MIN_CAP_MB), total_mb)
    measured = "measured on this host by psutil when the profile was loaded"
    return DeviceProfile(
        name=HOST_PROFILE,
        soc=f"this host: {_cpu_model()} ({platform.machine()}, {len(cores)} usable cores)",
        memory_mb=total_mb,
        memory_cap_mb=cap_mb,
        power_mode=None,
        unified_memory=False,
        accelerators=[
            Accelerator(
                engine="cpu",
                cores=cores,
                precisions=["fp32"],
                max_instances=HOST_INSTANCES_PER_CORE * len(cores),
                threads_per_core=HOST_THREADS_PER_CORE,
                description=f"{len(cores)} cores of {_cpu_model()}",
                sources={
                    "cores": "os.sched_getaffinity(0) on this host when the profile was loaded",
                    "precisions": "onnxruntime CPU execution provider (fp32 models)",
                    "max_instances": "InfScaler-Edge policy: 4 instances per usable core (the "
                    "stages of a pipeline take turns on the cores); the pinned threads are "
                    "bounded by threads_per_core",
                    "threads_per_core": "InfScaler-Edge policy: a development host may pin "
                    f"{HOST_THREADS_PER_CORE:g} model-instance threads per core, so a pipeline "
                    "with more model stages than cores (a 3-partition plan, the 4 models of "
                    "`ocr` on 2 cores) deploys, its stages taking turns on the cores; the "
                    "scaler adds no cpu instance beyond that (Jetson profiles: 1)",
                },
            )
        ],
        sources={
            "memory_mb": f"psutil.virtual_memory().total, {measured}",
            "memory_cap_mb": (
                f"InfScaler-Edge policy: {HOST_CAP_FRACTION:.0%} of {cap_basis} "
                f"({avail / 2**20:.0f} MB, {measured}), at least {HOST_MIN_CAP_MB} MB"
            ),
            "soc": "/proc/cpuinfo and os.sched_getaffinity(0) on this host",
        },
    )


# -- loading ----------------------------------------------------------------------------------


def bundled_profiles() -> list[str]:
    """Names of the bundled profiles (file stems under ``profiles/``) and ``cpu-host``."""
    files = resources.files("infscaler.profiles").iterdir()
    names = {Path(f.name).stem for f in files if f.name.endswith(".yaml")}
    return sorted(names | {HOST_PROFILE})


def _validation_problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {clean_validation_message(err['msg'])}"
        for err in exc.errors()
    )


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """A bundled profile by name (``cpu-host``: :func:`host_profile`), or a YAML file by path.

    Raises:
        ConfigError: unknown name, unreadable file, bad YAML, or schema violations (each
            field named by its YAML path, e.g. ``accelerators.2.count``).
    """
    if str(name_or_path) == HOST_PROFILE:
        return host_profile()
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"device profile not found: {path}")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read device profile {path}: {exc}") from None
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
        raise ConfigError(
            f"{where} must be a YAML mapping with name, soc, memory_mb, memory_cap_mb, "
            f"accelerators, ...; got {type(data).__name__}"
        )
    try:
        return DeviceProfile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            f"{where} is not a valid device profile: {_validation_problems(exc)}"
        ) from None


# -- pipeline vs profile --------------------------------------------------------------------


def _unit_memory(unit: Any, overhead_mb: float) -> tuple[float, str]:
    """MB of one instance of ``unit`` and where the figure comes from."""
    if unit.memory_mb is not None:
        plan = float(unit.memory_mb)
        origin = f"{plan:.1f} MB plan estimate (weights + activations)"
    elif unit.kind == "model" and unit.path and Path(unit.path).is_file():
        plan = Path(unit.path).stat().st_size / 2**20
        origin = f"{plan:.1f} MB ONNX file size (weights only; no plan estimate)"
    else:
        plan = 0.0
        origin = "no plan estimate" + (" (function stage)" if unit.kind == "function" else "")
    return plan + overhead_mb, f"{origin} + {overhead_mb:.0f} MB instance overhead"


class CompiledUnits(Protocol):
    """What :func:`check_pipeline` reads of a compiled pipeline
    (:class:`infscaler.runtime.serving.pipeline.CompiledPipeline`, which the base may not import):
    its name and its units (each with ``stage``, ``engine``, ``precision``, ``kind``,
    ``instances``, ``threads``, ``memory_mb``, ...)."""

    name: str

    @property
    def units(self) -> Sequence[Any]: ...

    def served_units(self) -> Sequence[Any]: ...


def check_pipeline(
    compiled: CompiledUnits,
    profile: DeviceProfile,
    *,
    pool_mb: float = 0.0,
    instance_overhead_mb: float = INSTANCE_OVERHEAD_MB,
    used_mb: float = 0.0,
    instances_used: Mapping[str, int] | None = None,
    cores_used: int = 0,
) -> list[str]:
    """Refuse a pipeline that cannot run on ``profile``, before anything starts.

    Checks each unit's engine and precision, model instances per engine against
    :attr:`DeviceProfile.instance_limits`, and memory (one instance of every served unit plus
    ``pool_mb``, and the configured instances; an instance: its plan estimate plus
    ``instance_overhead_mb``) within ``memory_cap_mb``. Threads beyond the cpu's
    :meth:`Accelerator.thread_slots` only warn.

    Args:
        compiled: the compiled pipeline.
        used_mb / instances_used / cores_used: what other deployments already hold (MB,
            instances per engine kind, pinned cpu threads).

    Returns:
        Warnings that do not stop the deploy.

    Raises:
        ConfigError: every problem found, one line each naming the stage and what to do.
    """
    dev = f"device {profile.name}"
    engines_here = ", ".join(profile.engine_units)
    problems, warnings = _engine_problems(compiled.units, profile, dev, engines_here)
    if problems:
        raise ConfigError(
            f"pipeline {compiled.name} does not fit {dev}:\n  " + "\n  ".join(problems),
            hint=f"{dev} has engines {engines_here}; `infscaler devices` lists the profiles",
        )

    served = compiled.served_units()
    # -- engine slots and cores (model instances, as the scaler counts them) -----------------
    per_engine: dict[str, list[Any]] = {}
    for u in served:
        if u.kind == "model":
            per_engine.setdefault(_engine_kind(u.engine), []).append(u)
    problems += _slot_problems(per_engine, profile, dev, instances_used)
    warnings += _core_warnings(served, per_engine.get("cpu", []), profile, dev, cores_used)
    # -- memory --------------------------------------------------------------------------------
    memory_problems, memory_warnings = _memory_problems(
        served, profile, dev, pool_mb, used_mb, instance_overhead_mb
    )
    problems += memory_problems
    warnings += memory_warnings
    if problems:
        raise ConfigError(
            f"pipeline {compiled.name} does not fit {dev}:\n  " + "\n  ".join(problems),
            hint="change the pipeline as each line says, or deploy with another --device "
            "profile (`infscaler devices` lists them)",
        )
    return warnings


def _engine_problems(
    units: Sequence[Any], profile: DeviceProfile, dev: str, engines_here: str
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of each unit's engine and precision on ``profile``: a
    known engine kind the profile has, a precision that engine runs; a ``max_instances``
    beyond the engine's limit is a warning (the scaler stops at the limit)."""
    problems: list[str] = []
    warnings: list[str] = []
    for u in units:
        kind = _engine_kind(u.engine)
        if kind not in ENGINES:
            problems.append(
                f"stage {u.stage}: engine '{u.engine}' is unknown: engines are "
                f"{', '.join(repr(e) for e in ENGINES)} (on {dev}: {engines_here})"
            )
            continue
        acc = profile.accelerator(kind)
        if acc is None or (u.engine != kind and u.engine not in acc.units):
            problems.append(
                f"stage {u.stage}: engine '{u.engine}' is not on {dev} ({profile.soc}): "
                f"set the stage's engine to one of {engines_here}, or deploy with a "
                f"profile that has a {kind}"
            )
            continue
        if u.precision not in acc.precisions:
            problems.append(
                f"stage {u.stage}: precision '{u.precision}' does not run on the {kind} of "
                f"{dev} (it runs {', '.join(acc.precisions)}): set the stage's precision to "
                "one of those, or pick another engine"
            )
        limit = acc.instance_limit
        if u.kind == "model" and u.max_instances is not None and u.max_instances > limit:
            warnings.append(
                f"stage {u.stage}: max_instances {u.max_instances} exceeds the {kind} limit "
                f"of {dev} ({limit}); the scaler stops at the device's limit"
            )
    return problems, warnings


def _slot_problems(
    per_engine: Mapping[str, list[Any]],
    profile: DeviceProfile,
    dev: str,
    instances_used: Mapping[str, int] | None,
) -> list[str]:
    """Per engine kind, the served model units' configured instances (``per_engine``)
    plus those other deployments run (``instances_used``) beyond the profile's instance
    limit."""
    problems: list[str] = []
    used = dict(instances_used or {})
    for kind, units in per_engine.items():
        limit = profile.instance_limits.get(kind, 0)
        want = sum(u.instances for u in units)
        have = used.get(kind, 0)
        if want + have > limit:
            acc = profile.accelerator(kind)
            basis = (
                f"max_instances {acc.max_instances} x {acc.count} cores"
                if acc is not None and kind == "dla"
                else "max_instances"
            )
            detail = ", ".join(f"{u.name} {u.instances}" for u in units)
            others = f" + {have} already running" if have else ""
            problems.append(
                f"stages on {kind}: {want} instances ({detail}){others} exceed the {kind} "
                f"limit of {dev} ({limit}: {basis}): lower `instances`, or move a stage "
                "to another engine"
            )
    return problems


def _core_warnings(
    served: Sequence[Any],
    cpu_units: Sequence[Any],
    profile: DeviceProfile,
    dev: str,
    cores_used: int,
) -> list[str]:
    """Warnings about the cpu cores: the model instances x threads on the cpu
    (``cpu_units``, plus ``cores_used`` by other deployments) beyond its thread slots or
    its cores, a function stage with more threads than cores, profile cores this host
    lacks (the operator's configuration is deployed as it is)."""
    warnings: list[str] = []
    cpu = profile.accelerator("cpu")
    host = sorted(os.sched_getaffinity(0))
    cores = cpu.cores if cpu is not None and cpu.cores else host
    want_cores = sum(u.instances * u.threads for u in cpu_units)
    slots = cpu.thread_slots(host) if cpu is not None else len(cores)
    if cpu_units and want_cores + cores_used > slots:
        # the operator's own configuration: deployed, with a warning (refusing it would
        # leave a user with more pipelined stages than cores, e.g. `ocr` and a
        # partitioned model on an Orin Nano, no way but writing a profile); what the
        # runtime adds by itself, the scaler's scale-outs, never passes the slots
        detail = ", ".join(f"{u.name} {u.instances}x{u.threads}" for u in cpu_units)
        others = f" + {cores_used} already pinned by other deployments" if cores_used else ""
        src = "its cpu `cores`" if cpu is not None and cpu.cores else "this host's usable cores"
        tpc = cpu.threads_per_core if cpu is not None else 1.0
        warnings.append(
            f"stages on cpu: instances x threads = {want_cores} ({detail}){others} exceed "
            f"the {slots} thread slots of {dev} ({len(cores)} cores, {src}, x "
            f"threads_per_core {tpc:g}): deployed as configured, the instances sharing "
            "cores; the scaler adds no cpu instance while the slots are full (lower "
            "`instances` or `threads`, move a stage to another engine, or raise "
            "`threads_per_core` in the profile's cpu entry)"
        )
    elif cpu_units and want_cores + cores_used > len(cores):
        warnings.append(
            f"stages on cpu: instances x threads = {want_cores + cores_used} exceed the "
            f"{len(cores)} cores of {dev}: their instances share cores (threads_per_core "
            f"{cpu.threads_per_core if cpu is not None else 1:g})"
        )
    for u in served:
        if u.kind == "function" and u.threads > len(cores):
            warnings.append(
                f"stage {u.stage}: threads {u.threads} > the {len(cores)} cores of {dev}; "
                "its instances share cores"
            )
    if cpu is not None and cpu.cores:
        missing = sorted(set(cpu.cores) - set(host))
        if missing:
            warnings.append(
                f"{dev} lists cpu cores {missing} that this host does not have (usable: "
                f"{host}); instances are pinned to the cores both have"
            )
    return warnings


def _memory_problems(
    served: Sequence[Any],
    profile: DeviceProfile,
    dev: str,
    pool_mb: float,
    used_mb: float,
    instance_overhead_mb: float,
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of memory: one instance of every served unit plus
    ``pool_mb`` and ``used_mb`` beyond the profile's cap, else the configured instances
    beyond it; a model unit without a plan estimate is a warning."""
    problems: list[str] = []
    warnings: list[str] = []
    rows = []
    for u in served:
        mb, origin = _unit_memory(u, instance_overhead_mb)
        rows.append((u, mb, origin))
        if u.kind == "model" and u.memory_mb is None:
            warnings.append(
                f"stage {u.stage}: unit {u.name} has no plan memory estimate ({origin}); "
                "its instances' measured PSS replaces it once they report"
            )
    one_each = sum(mb for _, mb, _ in rows) + pool_mb + used_mb
    configured = sum(mb * u.instances for u, mb, _ in rows) + pool_mb + used_mb
    cap = profile.memory_cap_mb
    cap_src = profile.sources.get("memory_cap_mb")
    cap_text = f"memory_cap_mb {cap} of {dev}" + (f" ({cap_src})" if cap_src else "")
    breakdown = "; ".join(f"{u.name}: {mb:.0f} MB = {origin}" for u, mb, origin in rows)
    extra = f" + {pool_mb:.0f} MB tensor pool" if pool_mb else ""
    extra += f" + {used_mb:.0f} MB used by other deployments" if used_mb else ""
    if one_each > cap:
        problems.append(
            f"one instance of every stage needs {one_each:.0f} MB{extra}, more than the "
            f"{cap_text} [{breakdown}]: raise memory_cap_mb in the profile, or serve a "
            "smaller model or fewer stages"
        )
    elif configured > cap:
        detail = ", ".join(f"{u.name} {u.instances}x{mb:.0f} MB" for u, mb, _ in rows)
        problems.append(
            f"the configured instances need {configured:.0f} MB ({detail}{extra}), more "
            f"than the {cap_text} [{breakdown}]: lower `instances` (the scaler adds "
            "instances while they fit the cap)"
        )
    return problems, warnings
