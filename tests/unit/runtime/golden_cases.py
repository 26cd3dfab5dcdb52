"""Inputs of the capacity / latency golden comparison, built from small parameter
tuples so the recorded fixture (``models_golden.json``, written by
``gen_models_golden.py`` from the code before the one-model change) and the test
(``test_models_golden.py``) rebuild the same snapshots. Uses only the data types."""

from __future__ import annotations

import itertools

import numpy as np

from infscaler.modelless.selector import VariantLoad, VariantProfile, VariantState
from infscaler.runtime.planning.livecheck import Expected, LiveState, Observed
from infscaler.runtime.planning.simtypes import EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import (
    EngineOption,
    ResourceCap,
    ScalerConfig,
    ScalerState,
    Snapshot,
    UnitState,
)

CPU = EngineOption("cpu", 40.0, 300.0, 1)


def scaler_params() -> list[tuple]:
    """(service ms per unit, instances per unit, fan-out of unit 1, rate, p99 / SLO, SLO)."""
    out = []
    svcs = [(85.0,), (30.0, 10.0), (12.0, 45.0, 20.0), (None, 25.0)]
    for svc in svcs:
        for inst in itertools.product((0, 1, 2, 3), repeat=len(svc)):
            if len(svc) == 3 and sum(inst) > 5:
                continue
            for fan, rate, p99f, slo in itertools.product(
                (1.0, 3.0), (0.0, 4.0, 25.0), (0.5, 1.4), (120.0, 400.0)
            ):
                out.append((list(svc), list(inst), fan, rate, p99f, slo))
    return out


def snapshot(p: tuple) -> Snapshot:
    svc, inst, fan, rate, p99f, slo = p
    units = []
    for k, (ms, n) in enumerate(zip(svc, inst, strict=True)):
        f = fan if k == 1 else 1.0
        units.append(
            UnitState(
                k,
                f"u{k}",
                ms or 1.0,
                {"cpu": n},
                (CPU,),
                arrival_rate=rate * f,
                queue_len=int(rate // 5),
                service_ms=ms,
                max_instances=4,
            )
        )
    return Snapshot(
        now=100.0,
        slo_ms=slo,
        p99_ms=p99f * slo,
        arrival_rate=rate,
        units=tuple(units),
        cap=ResourceCap(8000.0, 400.0, {"cpu": 8}, cores=8, physical_cores=8),
        instances_used={"cpu": sum(inst)},
        pending=int(rate // 3),
    )


def scaler_state() -> ScalerState:
    return ScalerState()


def scaler_config() -> ScalerConfig:
    return ScalerConfig()


def arrivals(rate: float, seconds: float = 6.0, seed: int = 7) -> np.ndarray:
    """Poisson arrival times over ``seconds`` ending at the snapshot's now (100 s)."""
    if rate <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * seconds * 2) + 10))
    t = t[t < seconds]
    return 100.0 - seconds + t


def admission_params() -> list[tuple]:
    """(ahead, S, interval, SLO, units, remaining, lenience, overloaded)."""
    unit_sets = [None, [(30.0, 1)], [(30.0, 2), (10.0, 1)], [(20.0, 3), (45.0, 2)]]
    out = []
    for ahead, (s, itv), slo, units, rem, len_, ov in itertools.product(
        range(0, 8),
        [(None, None), (40.0, 30.0), (60.0, 45.0)],
        (None, 100.0, 250.0),
        unit_sets,
        (None, [35.0, 20.0, -5.0, 10.0, 60.0, 5.0, 1.0, 0.0]),
        (1.0, 0.7),
        (False, True),
    ):
        out.append((ahead, s, itv, slo, units, rem, len_, ov))
    return out


def livecheck_params() -> list[tuple]:
    """(unit ms, instances, items, measured capacity, offered, live instances)."""
    out = []
    for ms, inst, items in [
        ([30.0, 10.0], [1, 1], [1.0, 1.0]),
        ([30.0], [2], [1.0]),
        ([12.0, 0.0, 20.0], [1, 2, 1], [1.0, 3.0, 1.0]),
        ([12.0, 8.0], [1, 0], [1.0, 2.5]),
    ]:
        for cap, offered, live in itertools.product(
            (None, 10.0, 30.0, 60.0), (5.0, 40.0), (None, [2] * len(ms))
        ):
            out.append((ms, inst, items, cap, offered, live))
    return out


def expected(p: tuple, label: str = "serving", scale: float = 1.0) -> Expected:
    ms, inst, items = p[0], p[1], p[2]
    return Expected(label, tuple(m * scale for m in ms), tuple(inst), tuple(items), 20.0, 0.1)


def observed(p: tuple) -> Observed:
    return Observed(60.0, 200, p[3], 80.0, p[4], 150.0, None if p[5] is None else tuple(p[5]))


def live_state() -> LiveState:
    return LiveState()


def resources_params() -> list[tuple]:
    """(unit specs, instance counts, batch, cores)."""
    out = []
    for spec, inst, batch, cores in itertools.product(
        ["one", "fan", "gpu", "zero"], [(1, 1, 1), (2, 1, 3), (1, 3, 2)], (1, 2), (1, 2, 4)
    ):
        out.append((spec, list(inst), batch, cores))
    return out


def resources_case(p: tuple) -> tuple[list[UnitProfile], list[UnitConfig], int]:
    spec, inst, batch, cores = p
    cpu = lambda ms, c=1: EngineProfile("cpu", ms, cores=c)  # noqa: E731
    if spec == "one":
        units = [UnitProfile("a", {"cpu": cpu(15.0, 2)})]
    elif spec == "fan":
        units = [
            UnitProfile("a", {"cpu": cpu(8.0)}, fan_out=True, items=(2, 4)),
            UnitProfile("b", {"cpu": cpu(10.0)}),
            UnitProfile("c", {"cpu": cpu(1.0)}, fan_in=True, served=False),
        ]
    elif spec == "gpu":
        units = [
            UnitProfile("a", {"cpu": cpu(30.0, 2), "gpu": EngineProfile("gpu", 6.0)}),
            UnitProfile("b", {"cpu": cpu(5.0)}),
        ]
    else:
        units = [UnitProfile("a", {"cpu": cpu(0.0)}), UnitProfile("b", {"cpu": cpu(0.0)})]
    configs = []
    for k, u in enumerate(units):
        n = inst[k % len(inst)]
        eng = {"cpu": n} if "gpu" not in u.engines else {"cpu": 1, "gpu": n}
        configs.append(UnitConfig(eng, batch if k == 0 else 1))
    return units, configs, cores


def selector_params() -> list[tuple]:
    """(current variant, instances, rate, measured service ms, state, can replicate)."""
    out = []
    for cur, inst, rate, svc, st, rep in itertools.product(
        ("mid", "small", "big"),
        (1, 2),
        (0.0, 5.0, 30.0, 90.0),
        (None, 10.0, 40.0, 120.0),
        (VariantState.ACTIVE, VariantState.OVERLOADED),
        (True, False),
    ):
        out.append((cur, inst, rate, svc, st, rep))
    return out


def variants() -> list[VariantProfile]:
    return [
        VariantProfile("small", "t", "m1", 10.0, 0.80, 100.0, 50.0),
        VariantProfile("mid", "t", "m1", 25.0, 0.85, 300.0, 120.0, batch=2),
        VariantProfile("big", "t", "m2", 60.0, 0.90, 900.0, 400.0, throughput_qps=30.0),
        VariantProfile("fast", "t", "m2", 8.0, 0.86, 200.0, 500.0),
    ]


def selector_case(p: tuple) -> tuple[VariantProfile, VariantLoad, bool]:
    cur, inst, rate, svc, st, rep = p
    prof = {v.name: v for v in variants()}[cur]
    return prof, VariantLoad(state=st, instances=inst, rate=rate, service_ms=svc), rep
