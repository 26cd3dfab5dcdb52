"""Device profiles (sources, validation, cpu-host), pipeline-vs-profile checks, and host
telemetry (psutil here; jetson-stats on a Jetson)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import psutil
import pytest
import yaml
from pydantic import ValidationError

from infscaler.base.config import load_pipeline
from infscaler.base.device import (
    HOST_MIN_CAP_MB,
    INSTANCE_OVERHEAD_MB,
    Accelerator,
    DeviceProfile,
    bundled_profiles,
    check_pipeline,
    load_profile,
)
from infscaler.base.errors import ConfigError
from infscaler.runtime.scaling.telemetry import process_memory
from infscaler.runtime.serving.pipeline import compile_pipeline

JETSONS = ("xavier-agx", "xavier-nx", "orin-agx", "orin-nx", "orin-nano")


# -- profiles ---------------------------------------------------------------------------------


def unsourced(p: DeviceProfile) -> list[str]:
    """Figures of ``p`` without a source, as ``memory_mb`` / ``accelerators[gpu].precisions``:
    memory_mb, memory_cap_mb, power_mode (when set); per accelerator: precisions,
    max_instances, ``cores`` of the cpu (when listed), ``count`` of the others."""
    missing = [
        k
        for k in ("memory_mb", "memory_cap_mb", "power_mode")
        if getattr(p, k) is not None and not p.sources.get(k)
    ]
    for a in p.accelerators:
        keys = ["precisions", "max_instances"]
        if a.engine == "cpu":
            keys += ["cores"] if a.cores is not None else []
            keys += ["threads_per_core"] if a.threads_per_core != 1.0 else []
        else:
            keys.append("count")
        missing += [f"accelerators[{a.engine}].{k}" for k in keys if not a.sources.get(k)]
    return missing


def test_every_bundled_profile_loads_with_sources():
    names = bundled_profiles()
    assert {*JETSONS, "generic-x86", "cpu-host"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name
        assert unsourced(p) == [], name
        assert p.sources["memory_mb"] and p.sources["memory_cap_mb"]
        for acc in p.accelerators:
            assert acc.sources.get("precisions") and acc.sources.get("max_instances")
    for name in JETSONS:
        p = load_profile(name)
        assert p.unified_memory and p.power_mode and "data sheet" in p.sources["memory_mb"].lower()
        assert "dla" not in p.engines or set(p.accelerator("dla").precisions) <= {"fp16", "int8"}


def test_engine_units_name_each_dla_core():
    assert load_profile("orin-agx").engine_units == ["cpu", "gpu", "dla0", "dla1"]
    assert load_profile("orin-nano").engine_units == ["cpu", "gpu"]
    assert load_profile("orin-agx").instance_limits == {"cpu": 12, "gpu": 6, "dla": 4}
    # the existing fields keep working
    acc = load_profile("xavier-agx").accelerators[2]
    assert (acc.engine, acc.count, acc.max_instances) == ("dla", 2, 2)
    assert load_profile("xavier-agx").accelerators[0].cores == list(range(8))


def test_cpu_host_is_this_machine():
    p = load_profile("cpu-host")
    vm = psutil.virtual_memory()
    assert p.engines == ["cpu"] and p.power_mode is None
    assert p.accelerators[0].cores == sorted(os.sched_getaffinity(0))
    assert p.accelerators[0].max_instances == 4 * len(os.sched_getaffinity(0))
    assert abs(p.memory_mb - vm.total / 2**20) <= 0.01 * vm.total / 2**20
    assert HOST_MIN_CAP_MB <= p.memory_cap_mb <= p.memory_mb
    assert p.memory_cap_mb <= max(vm.total / 2**20 * 0.5 * 1.05, HOST_MIN_CAP_MB)
    assert (
        "psutil" in p.sources["memory_mb"]
        and "sched_getaffinity" in (p.accelerators[0].sources["cores"])
    )


def _profile(**over):
    data = {
        "name": "x",
        "soc": "y",
        "memory_mb": 1000,
        "memory_cap_mb": 500,
        "accelerators": [{"engine": "cpu", "cores": [0, 1]}],
    }
    data.update(over)
    return data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_profile(accelerators=[{"engine": "npu"}]), r"accelerators\.0\.engine"),
        (
            _profile(accelerators=[{"engine": "cpu"}, {"engine": "dla", "count": 3}]),
            r"accelerators\.1: .*count: a Jetson has 0-2 DLA cores, got 3",
        ),
        (_profile(memory_cap_mb=2000), r"memory_cap_mb \(2000\) exceeds memory_mb \(1000\)"),
        (
            _profile(accelerators=[{"engine": "cpu"}, {"engine": "dla", "precisions": ["fp32"]}]),
            r"accelerators\.1: precisions: dla runs fp16 and int8 only, got \['fp32'\]",
        ),
        (
            _profile(accelerators=[{"engine": "cpu", "cores": [0, 1, 1]}]),
            r"accelerators\.0\.cores: core ids must be unique, repeated: \[1\]",
        ),
        (
            _profile(accelerators=[{"engine": "cpu", "cores": [-1]}]),
            r"accelerators\.0\.cores: core ids must be >= 0",
        ),
        (_profile(accelerators=[{"engine": "gpu"}]), "must include a cpu entry"),
        (_profile(sources={"memroy_mb": "typo"}), r"sources: sources name unknown fields"),
    ],
)
def test_bad_profiles_are_refused_naming_the_field(tmp_path, data, match):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_profile_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- cpu\n- gpu\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping.*got list"):
        load_profile(path)


# -- pipeline vs profile ----------------------------------------------------------------------


def _function_pipeline(tmp_path, instances: int = 1):
    cfg = load_pipeline(
        {
            "name": "fx",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": ["z"],
            "stages": [
                {
                    "name": "scale",
                    "function": "stagefuncs:scale",
                    "inputs": ["x"],
                    "outputs": ["y"],
                    "instances": instances,
                },
                {
                    "name": "add",
                    "function": "stagefuncs:add_one",
                    "inputs": ["y"],
                    "outputs": ["z"],
                },
            ],
        }
    )
    return compile_pipeline(cfg, state_dir=tmp_path)


def _model_pipeline(tmp_path, path: Path, engine: str, precision: str = "fp16", **stage):
    cfg = load_pipeline(
        {
            "name": "m",
            "stages": [
                {"name": "det", "model": str(path), "engine": engine, "precision": precision}
                | stage
            ],
        }
    )
    return compile_pipeline(cfg, state_dir=tmp_path)


def _small_host(cap_mb: int, cores: int = 2) -> DeviceProfile:
    return DeviceProfile(
        name="tiny",
        soc="test",
        memory_mb=4096,
        memory_cap_mb=cap_mb,
        accelerators=[
            {"engine": "cpu", "cores": list(range(cores)), "max_instances": cores},
            {"engine": "dla", "count": 1, "precisions": ["fp16"], "max_instances": 1},
        ],
        sources={"memory_cap_mb": "test figure"},
    )


@pytest.mark.usefixtures("stagefuncs_on_path")
def test_fitting_pipeline_passes(tmp_path, residual_path):
    assert check_pipeline(_function_pipeline(tmp_path), load_profile("cpu-host")) == []
    cp = _model_pipeline(tmp_path, residual_path, "dla")
    warnings = check_pipeline(cp, load_profile("xavier-nx"), pool_mb=64)
    assert any("no plan memory estimate" in w and "ONNX file size" in w for w in warnings)


def test_absent_and_unknown_engines_are_refused(tmp_path, residual_path):
    cp = _model_pipeline(tmp_path, residual_path, "dla")
    with pytest.raises(ConfigError) as info:
        check_pipeline(cp, load_profile("orin-nano"))
    msg = str(info.value)
    assert "stage det: engine 'dla' is not on device orin-nano" in msg
    assert "one of cpu, gpu" in msg
    cp.units[0] = dataclasses.replace(cp.units[0], engine="npu")
    with pytest.raises(ConfigError, match=r"stage det: engine 'npu' is unknown: engines are"):
        check_pipeline(cp, load_profile("orin-agx"))
    cp.units[0] = dataclasses.replace(cp.units[0], engine="dla1")
    assert check_pipeline(cp, load_profile("orin-agx")) is not None
    with pytest.raises(ConfigError, match="engine 'dla1' is not on device tiny"):
        check_pipeline(cp, _small_host(1024))


def test_precision_and_instance_limits_are_checked(tmp_path, residual_path):
    cp = _model_pipeline(tmp_path, residual_path, "dla", precision="int8")
    with pytest.raises(
        ConfigError, match="precision 'int8' does not run on the dla of device tiny"
    ):
        check_pipeline(cp, _small_host(1024))
    cp = _model_pipeline(tmp_path, residual_path, "dla", instances=2)
    with pytest.raises(ConfigError, match=r"stages on dla: 2 instances \(det 2\) exceed"):
        check_pipeline(cp, _small_host(1024))
    # pinned threads beyond the slots are the operator's choice: deployed, with a warning
    # that says the scaler adds none while the slots are full ...
    cp = _model_pipeline(tmp_path, residual_path, "cpu", precision="fp32", instances=2, threads=2)
    (msg,) = [w for w in check_pipeline(cp, _small_host(1024)) if "threads" in w]
    assert "instances x threads = 4 (det 2x2)" in msg and "exceed the 2 thread slots" in msg
    assert "threads_per_core" in msg and "the scaler adds no cpu instance" in msg
    # ... others' pinned threads count too
    cp1 = _model_pipeline(tmp_path, residual_path, "cpu", precision="fp32", instances=1)
    assert not [w for w in check_pipeline(cp1, _small_host(1024), cores_used=1) if "threads" in w]
    (msg,) = [
        w for w in check_pipeline(cp1, _small_host(1024, cores=1), cores_used=1) if "threads" in w
    ]
    assert "1 already pinned by other deployments" in msg
    # ... and with the profile's opt-in to oversubscription, only sharing cores is noted
    host = _small_host(1024)
    host.accelerators[0] = host.accelerators[0].model_copy(update={"threads_per_core": 2.0})
    (warning,) = [w for w in check_pipeline(cp, host) if "threads" in w]
    assert "instances x threads = 4 exceed the 2 cores" in warning
    assert host.accelerators[0].thread_slots() == 4
    # the opt-in is the cpu's alone, and needs a source like every figure
    with pytest.raises(ValidationError, match="threads_per_core: applies to the cpu"):
        Accelerator(engine="gpu", threads_per_core=2)
    assert "accelerators[cpu].threads_per_core" in unsourced(host)
    assert load_profile("cpu-host").accelerators[0].threads_per_core == 2.0
    assert "accelerators[cpu].threads_per_core" not in unsourced(load_profile("cpu-host"))


@pytest.mark.usefixtures("stagefuncs_on_path")
def test_cap_smaller_than_one_instance_is_refused(tmp_path):
    cp = _function_pipeline(tmp_path)
    need = 2 * INSTANCE_OVERHEAD_MB
    with pytest.raises(ConfigError) as info:
        check_pipeline(cp, _small_host(int(need) - 1))
    msg = str(info.value)
    assert f"one instance of every stage needs {need:.0f} MB" in msg
    assert "memory_cap_mb" in msg and "instance overhead" in msg and "(test figure)" in msg
    # one of each fits, but not with the pool ...
    assert check_pipeline(cp, _small_host(int(need) + 1)) == []
    with pytest.raises(ConfigError, match="tensor pool"):
        check_pipeline(cp, _small_host(int(need) + 1), pool_mb=10)
    # ... nor the configured instances
    with pytest.raises(ConfigError, match="the configured instances need"):
        check_pipeline(_function_pipeline(tmp_path, instances=3), _small_host(int(need) + 1))


@pytest.mark.usefixtures("stagefuncs_on_path")
def test_plan_memory_estimate_counts(tmp_path):
    cp = _function_pipeline(tmp_path)
    cp.units[0] = dataclasses.replace(cp.units[0], kind="model", memory_mb=500.0)
    with pytest.raises(ConfigError, match=r"500\.0 MB plan estimate"):
        check_pipeline(cp, _small_host(512))


# -- telemetry --------------------------------------------------------------------------------


def test_process_memory_of_this_process():
    m = process_memory(os.getpid())
    assert 0 < m.uss_mb <= m.rss_mb
    assert m.pss_mb is None or m.uss_mb <= m.pss_mb <= m.rss_mb
