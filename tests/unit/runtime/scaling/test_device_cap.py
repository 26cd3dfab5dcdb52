"""runtime.scaling.types.device_cap: R^m of a device profile, against caps computed by
hand from the bundled profiles' YAML, and the two callers that build it (the monitor and
the planner's simulator) giving the same cap for the same inputs."""

from __future__ import annotations

import os
from types import SimpleNamespace

from infscaler.base.device import load_profile
from infscaler.runtime.planning.simulator import cap_from_profile
from infscaler.runtime.scaling.monitor import Monitor
from infscaler.runtime.scaling.types import ResourceCap, device_cap


def _with_cpu(profile, **update):
    """``profile`` with its cpu entry's fields replaced by ``update``."""
    accs = [a.model_copy(update=update) if a.engine == "cpu" else a for a in profile.accelerators]
    return profile.model_copy(update={"accelerators": accs})


def test_orin_agx_by_hand() -> None:
    # orin-agx.yaml: memory_cap_mb 49152; cpu cores [0..11], max_instances 12; gpu
    # max_instances 6; dla count 2 x max_instances 2 = 4 slots. The cores are listed,
    # so the host's count is not used; threads_per_core 1: 12 thread slots.
    cap = device_cap(load_profile("orin-agx"), host_cores=3)
    assert cap == ResourceCap(
        memory_cap_mb=49152.0,
        memory_used_mb=0.0,
        max_instances={"cpu": 12, "gpu": 6, "dla": 4},
        cores=12,
        physical_cores=12,
    )


def test_generic_x86_by_hand() -> None:
    # generic-x86.yaml: memory_cap_mb 8192; one cpu entry, max_instances 4, no cores
    # listed: the host's 3 cores, 3 thread slots.
    cap = device_cap(load_profile("generic-x86"), host_cores=3, memory_used_mb=812.5)
    assert cap == ResourceCap(
        memory_cap_mb=8192.0,
        memory_used_mb=812.5,
        max_instances={"cpu": 4},
        cores=3,
        physical_cores=3,
    )


def test_threads_per_core_and_an_engine_with_no_units() -> None:
    # 3 host cores x threads_per_core 1.5 = 4.5: 4 thread slots, 3 physical cores
    cap = device_cap(_with_cpu(load_profile("generic-x86"), threads_per_core=1.5), host_cores=3)
    assert (cap.cores, cap.physical_cores) == (4, 3)
    # 12 listed cores x 2 = 24 slots; a DLA entry with count 0 has no slots at all
    agx = _with_cpu(load_profile("orin-agx"), threads_per_core=2.0)
    agx = agx.model_copy(
        update={
            "accelerators": [
                a.model_copy(update={"count": 0}) if a.engine == "dla" else a
                for a in agx.accelerators
            ]
        }
    )
    cap = device_cap(agx, host_cores=3)
    assert cap.max_instances == {"cpu": 12, "gpu": 6}
    assert (cap.cores, cap.physical_cores) == (24, 12)


def test_the_simulator_builds_the_same_cap() -> None:
    for name in ("orin-agx", "generic-x86"):
        profile = load_profile(name)
        assert cap_from_profile(profile, host_cores=3) == device_cap(profile, host_cores=3)
        here = len(os.sched_getaffinity(0))
        assert cap_from_profile(profile) == device_cap(profile, host_cores=here)


def test_the_monitor_builds_the_same_cap_with_the_memory_it_measures() -> None:
    profile = load_profile("generic-x86")
    handle = SimpleNamespace(state="ready", stats={"pss_mb": 100.0}, info={}, unit=None)
    service = SimpleNamespace(
        device_profile=lambda: profile,
        supervisor=SimpleNamespace(handles=lambda: [handle]),
        pool=SimpleNamespace(stats=lambda: {"mapped_bytes": 16 * 2**20}),
    )
    here = len(os.sched_getaffinity(0))
    cap = Monitor(service).cap()
    assert cap == device_cap(profile, host_cores=here, memory_used_mb=116.0)
    assert (cap.cores, cap.physical_cores, cap.memory_used_mb) == (here, here, 116.0)
