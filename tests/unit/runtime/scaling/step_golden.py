"""What :meth:`Autoscaler.step` does on recorded snapshot sequences, for the golden
comparison of the loop before and after it was drawn as named steps
(``step_golden.json``, written by running this module from the repository root:
``PYTHONPATH=$PWD python -m tests.unit.runtime.scaling.step_golden``).

A fake service records the actions; a fake monitor hands out the snapshots (the
capacity goldens' grid, a threads-merge and a Tuner sequence) on a fake clock; threads
run at once. Per look: the window asked for, the service calls, the kept decisions,
the scaler and threads states, the arbitration view and the wake evidence."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from infscaler.base.config import AutoscaleConfig
from infscaler.runtime.scaling import autoscaler as mod
from infscaler.runtime.scaling.types import EngineOption, ResourceCap, Snapshot, UnitState
from tests.unit.runtime import golden_cases as cases

OUT = Path(__file__).with_name("step_golden.json")
#: (seconds after the first look, P99 factor over the recorded one) per look
LOOKS = ((0.0, 1.0), (1.5, 1.0), (4.0, 1.0), (6.5, 1.0), (9.0, 0.4), (26.0, 0.4), (60.0, 1.0))


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t

    time = monotonic


class _Thread:
    """Runs its target at ``start`` (the order of actions is then the code's)."""

    def __init__(self, target: Any, args: tuple = (), **_: Any) -> None:
        self.target, self.args = target, args

    def start(self) -> None:
        self.target(*self.args)


class _Service:
    def __init__(self, wake: bool) -> None:
        self.calls: list[list[Any]] = []
        self.cpu_wake_auto = wake

    def scale_out(self, dep: Any, unit: int, engine: str) -> None:
        self.calls.append(["scale_out", unit, engine])

    def scale_in(self, dep: Any, unit: int, engine: str) -> bool:
        self.calls.append(["scale_in", unit, engine])
        return True

    def scale_threads(self, dep: Any, unit: int, threads: int, old: int | None) -> None:
        self.calls.append(["scale_threads", unit, threads, old])

    def set_queue_limit(self, dep: Any, limit: int | None, reason: str) -> None:
        self.calls.append(["set_queue_limit", limit])


def _dep(snaps: list[Snapshot], auto: AutoscaleConfig, arrivals: Any, born: float) -> Any:
    units = [SimpleNamespace(kind="model") for _ in snaps[0].units]
    stats = SimpleNamespace(
        offered_times=lambda since: arrivals()[arrivals() >= since], idle_summaries=lambda: []
    )
    cfg = SimpleNamespace(autoscale=auto, priority=1)
    return SimpleNamespace(
        name="p",
        pipeline=SimpleNamespace(config=cfg, units=units),
        route=SimpleNamespace(stats=stats, accepting=True),
        deployed_at=born,
        live=None,
    )


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=repr))


def run(snaps: list[Snapshot], auto: AutoscaleConfig, wake: bool, threads: bool, rate: float):
    """Every look of ``snaps`` (their ``now`` the clock) through one Autoscaler."""
    clock = _Clock(snaps[0].now)
    saved = (mod.time, mod.Monitor, mod.NamedThread, mod.os.environ.get(mod.thread_merge.ENV))
    queue = list(snaps)

    class Monitor:
        def __init__(self, service: Any, window_s: float) -> None:
            self.window_s = window_s

        def pipeline(self, dep: Any, window: float) -> float:
            return window

        def snapshot(self, dep: Any, window: float) -> Snapshot:
            out.append({"window": round(window, 9)})
            return queue.pop(0)

    def arrivals() -> np.ndarray:
        return cases.arrivals(rate) + (clock.t - 100.0)

    mod.time, mod.Monitor, mod.NamedThread = clock, Monitor, _Thread  # type: ignore[assignment]
    mod.os.environ[mod.thread_merge.ENV] = "on" if threads else "off"
    out: list[dict] = []
    try:
        svc = _Service(wake)
        a = mod.Autoscaler(svc)  # type: ignore[arg-type]
        dep = _dep(snaps, auto, arrivals, snaps[0].now - 3.0)
        for s in snaps:
            clock.t = s.now
            ds = a.step(dep)
            out[-1].update(
                decisions=[dataclasses.asdict(d) for d in ds],
                calls=svc.calls,
                history=[{k: v for k, v in h.items() if k != "time"} for h in a.history],
                state=dataclasses.asdict(a.state("p")),
                threads=dataclasses.asdict(a._threads["p"]) if "p" in a._threads else None,
                view=[a._views["p"].violated, a._views["p"].blocked],
                wake=[dataclasses.asdict(e) for e in a._wake_evidence.values()],
            )
            svc.calls, a.history = [], type(a.history)(maxlen=200)
    finally:
        mod.time, mod.Monitor, mod.NamedThread, env = saved  # type: ignore[assignment]
        if env is None:
            mod.os.environ.pop(mod.thread_merge.ENV, None)
        else:
            mod.os.environ[mod.thread_merge.ENV] = env
    return _jsonable(out)


def _merge_unit(n: int, t: int) -> UnitState:
    return UnitState(
        0, "m/0", 1.0, {"cpu": n}, (EngineOption("cpu", 85.0, 100.0, 1),),
        service_ms=85.0, min_instances=n, threads={t: n}, latency_ms_by_threads={1: 85.0, 2: 47.0},
        max_threads=2,
    )  # fmt: skip


def _merge_looks() -> list[Snapshot]:
    cap = ResourceCap(4000.0, 500.0, {"cpu": 8}, cores=2, physical_cores=2)
    return [
        Snapshot(
            now=100.0 + i,
            units=(_merge_unit(2 if i < 13 else 1, 1 if i < 14 else 2),),
            pending=1,
            slo_ms=255.0,
            p99_ms=90.0,
            arrival_rate=11.0,
            served_rate=11.0,
            cap=cap,
            cores_busy=1.1,
            instances_used={"cpu": 2 if i < 13 else 1},
            cores_used=2 if i < 13 else 1,
        )  # fmt: skip
        for i in range(45)
    ]


def record() -> list[dict]:
    """Every scenario's looks (the fixture's content)."""
    out = []
    params = cases.scaler_params()
    for i, p in enumerate(params[::11]):
        base = cases.snapshot(p)
        if i % 2:  # every engine slot taken: the cap refuses, the queue is bounded
            slots = {"cpu": max(1, sum(p[1]))}
            base = dataclasses.replace(base, cap=dataclasses.replace(base.cap, max_instances=slots))
        snaps = [
            dataclasses.replace(base, now=base.now + dt, p99_ms=base.p99_ms * f) for dt, f in LOOKS
        ]
        auto = AutoscaleConfig(tuner=i % 4 in (1, 2), hold_s=15.0 if i % 3 else 5.0)
        looks = run(snaps, auto, wake=i % 3 == 0, threads=i % 4 != 2, rate=max(p[3], 1.0) * 3)
        out.append({"params": _jsonable(p), "looks": looks})
    for threads in (True, False):
        auto = AutoscaleConfig(settle_s=2.0, sustain_s=0.0)
        looks = run(_merge_looks(), auto, wake=False, threads=threads, rate=11.0)
        out.append({"params": ["threads merge", threads], "looks": looks})
    return out


if __name__ == "__main__":
    data = record()
    OUT.write_text(json.dumps(data, sort_keys=True) + "\n")
    print(len(data), "scenarios,", sum(len(d["looks"]) for d in data), "looks ->", OUT)
    sys.exit(0)
