"""Fault handling logic without a service: the restart backoff (50 ms doubling to a 10 s cap)
and the scaler's cpu core cap. The faults a live service survives are in
tests/integration/runtime/processes/test_faults.py."""

from __future__ import annotations

import pytest

from infscaler.runtime.processes.supervisor import RestartPolicy
from infscaler.runtime.scaling.scaler import decide
from infscaler.runtime.scaling.types import (
    EngineOption,
    ResourceCap,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

#: the scaler's cap on its own: the violation counts at once (no settle window, no
#: sustain; those are tested in tests/unit/runtime/scaling/test_scaler_settle.py)
NOW = ScalerConfig(settle_s=0.0, sustain_s=0.0)


# -- the restart policy (pure) ---------------------------------------------------------------


def test_backoff_doubles_from_50_ms_to_a_10_s_cap() -> None:
    p = RestartPolicy()
    assert [p.delay(n) for n in (1, 2, 3, 4)] == [0.05, 0.1, 0.2, 0.4]
    assert p.delay(8) == pytest.approx(6.4) and p.delay(9) == 10.0 and p.delay(10_000) == 10.0
    with pytest.raises(ValueError, match="initial_s <= max_s"):
        RestartPolicy(initial_s=20.0)


# -- the core cap ------------------------------------------------------------------------------


def _cap_snapshot(cores: int, pinned: int) -> Snapshot:
    unit = UnitState(
        index=0,
        name="part/0",
        bottleneck=100.0,
        instances={"cpu": pinned},
        options=(EngineOption("cpu", latency_ms=50.0, memory_mb=50.0, cores=1),),
    )
    return Snapshot(
        now=100.0,
        slo_ms=100.0,
        p99_ms=900.0,  # 9x the SLO: overload
        arrival_rate=100.0,
        units=(unit,),
        cap=ResourceCap(memory_cap_mb=8000.0, memory_used_mb=100.0, max_instances={"cpu": 8}),
        cores_used=pinned,
        instances_used={"cpu": pinned},
    )


def test_scaler_refuses_a_cpu_instance_beyond_the_pinned_thread_slots() -> None:
    import dataclasses

    s = _cap_snapshot(cores=2, pinned=2)
    s = dataclasses.replace(s, cap=dataclasses.replace(s.cap, cores=2))
    decisions, _ = decide(s, ScalerState(), NOW)
    assert [d.action for d in decisions] == ["shed"]
    assert "cpu refused: cores 2+1 > 2" in decisions[0].reason
    # one slot free: admitted
    s1 = dataclasses.replace(s, cores_used=1)
    (d,) = decide(s1, ScalerState(), NOW)[0]
    assert d.action == "scale_out" and "cores 1+1 <= 2" in d.reason
