"""The planner's cap counts demand as the runtime's scaler does: one more cpu instance
of a unit fits while the cores its instances are expected to keep busy at the planned
rate (:func:`~infscaler.runtime.planning.resources.demand_cores`), plus the new one's
share, fit the physical cores (:func:`~infscaler.runtime.scaling.demand.fits_cores`).
Every figure is worked out in the comments."""

from __future__ import annotations

import pytest

from infscaler.runtime.planning.greedy import fits_instance
from infscaler.runtime.planning.resources import demand_cores
from infscaler.runtime.planning.simulator import EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap


def k3() -> list[UnitProfile]:
    # a 3-partition model: 1, 45 and 10 ms per request on one thread each
    return [UnitProfile(f"m/{i}", {"cpu": EngineProfile("cpu", ms, cores=1)})
            for i, ms in enumerate((1.0, 45.0, 10.0))]  # fmt: skip


CAP = ResourceCap(10_000.0, 0.0, {"cpu": 8}, cores=4, physical_cores=2)
ONE = [UnitConfig({"cpu": 1})] * 3


def test_demand_cores_is_the_utilisation_times_the_threads() -> None:
    # 13 req/s: 0.013, 0.585 and 0.13 cores; at 40 req/s the 45 ms unit is capped at
    # its one instance (1.8 -> 1.0)
    assert demand_cores(k3(), ONE, 13.0) == pytest.approx([0.013, 0.585, 0.13])
    assert demand_cores(k3(), ONE, 40.0) == pytest.approx([0.04, 1.0, 0.4])


def test_the_bottleneck_fits_by_demand_where_pinned_threads_pass_the_cores() -> None:
    # 13 req/s: 0.728 busy + 0.585 for the new instance <= 2 cores (3 + 1 pinned
    # threads > 2 cores, within the 4 thread slots)
    assert fits_instance(k3(), ONE, 1, "cpu", CAP, 0.0, 13.0) is None
    # 21 req/s: 0.021 + 0.945 + 0.21 = 1.176 busy + 0.945 > 2
    why = fits_instance(k3(), ONE, 1, "cpu", CAP, 0.0, 21.0)
    assert why == "cpu demand 1.18+0.94 cores busy > 2 cores (m/1's share at 21 requests/s)"
    # without a rate (or physical cores) only the thread slots count, as before
    assert fits_instance(k3(), ONE, 1, "cpu", CAP, 0.0) is None
