"""The fleet planner (runtime/planning/fleet.py): hand-computed placements, the lower bound, the
capacity curve from the single-device planner, and `infscaler plan --fleet`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infscaler.base.device import load_profile
from infscaler.cli import app
from infscaler.runtime.planning.fleet import (
    CapacityCurve,
    FleetNode,
    Stream,
    capacity_curve,
    lower_bound,
    place,
    realise,
)
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap


def linear_curve(
    pipeline: str,
    device: str,
    max_rate: float,
    per_rate: dict[str, float],
    resources: tuple[str, ...],
    step: float = 10.0,
    slo: float = 100.0,
):
    """A hand-made curve: ladder every ``step`` requests/s up to ``max_rate``; resource
    use = rate x per_rate[resource] (so a node's use is exactly its streams' sum)."""
    rates = tuple(step * k for k in range(1, int(round(max_rate / step)) + 1))
    vectors = tuple(tuple(r * per_rate.get(m, 0.0) for m in resources) for r in rates)
    return CapacityCurve(pipeline, slo, device, rates[-1], rates, vectors, resources)


def mem_cap(mb: float, gpu: int = 0) -> ResourceCap:
    return ResourceCap(
        memory_cap_mb=mb, memory_used_mb=0.0, max_instances={"gpu": gpu} if gpu else {}, cores=0
    )


RES = ("memory_mb",)


def test_first_fit_decreasing_one_pipeline_hand_computed() -> None:
    # capacity 100/s (memory 1 MB per request/s, cap 100 MB); streams 20..60
    nodes = [FleetNode(f"n{i}", "dev", mem_cap(100)) for i in range(1, 5)]
    curves = {("det", 100.0, "dev"): linear_curve("det", "dev", 100, {"memory_mb": 1}, RES)}
    streams = [Stream(f"s{r}", "det", r, 100.0) for r in (30, 60, 20, 50, 40)]
    res = place(streams, nodes, curves)
    # FFD by hand: 60 -> n1; 50 -> n2 (110 > 100); 40 -> n1 (100); 30 -> n2 (80); 20 -> n2 (100)
    assert [(n.node, sorted(n.streams[("det", 100.0)])) for n in res.nodes] == [
        ("n1", ["s40", "s60"]),
        ("n2", ["s20", "s30", "s50"]),
    ]
    assert res.nodes[0].rates[("det", 100.0)] == 100.0
    assert res.lower_bound == 2 and res.feasible


def test_rates_round_up_to_the_ladder_level() -> None:
    # ladder every 40/s: a node at 50/s runs the 80/s configuration (80 MB): 2 x 50 does
    # not fit a 100 MB node although 100/s is within R*; 50 + 30 = 80 does
    nodes = [FleetNode(f"n{i}", "dev", mem_cap(100)) for i in range(1, 4)]
    curve = CapacityCurve(
        "det", 100.0, "dev", 120.0, (40.0, 80.0, 120.0), ((30.0,), (80.0,), (100.0,)), RES
    )
    res = place(
        [
            Stream("a", "det", 50, 100.0),
            Stream("b", "det", 50, 100.0),
            Stream("c", "det", 30, 100.0),
        ],
        nodes,
        {("det", 100.0, "dev"): curve},
    )
    # a: n1 at level 80 (80 MB); b: n1 would be 100/s -> level 120 (100 MB) fits! -> n1;
    # c: n1 would be 130/s > R* -> n2 (level 40)
    assert [sorted(n.streams[("det", 100.0)]) for n in res.nodes] == [["a", "b"], ["c"]]
    assert res.nodes[0].levels[("det", 100.0)] == 2 and res.nodes[1].levels[("det", 100.0)] == 0


def test_heterogeneous_nodes_open_the_biggest_first() -> None:
    # one big node (R* 100/s) and five small ones (R* 40/s); four streams of 30/s:
    # big takes 3 (90/s), the fourth opens a small one -> 2 nodes
    nodes = [FleetNode(f"small{i}", "small", mem_cap(40)) for i in range(5)]
    nodes.append(FleetNode("big", "big", mem_cap(100)))
    curves = {
        ("det", 100.0, "small"): linear_curve("det", "small", 40, {"memory_mb": 1}, RES),
        ("det", 100.0, "big"): linear_curve("det", "big", 100, {"memory_mb": 1}, RES),
    }
    res = place([Stream(f"s{i}", "det", 30, 100.0) for i in range(4)], nodes, curves)
    assert [(n.node, len(n.streams[("det", 100.0)])) for n in res.nodes] == [
        ("big", 3),
        ("small0", 1),
    ]
    # lower bound: 120 requests/s at the best 1 MB/(request/s) / 100 MB = 1.2 -> 2
    assert res.lower_bound == 2


def test_two_resources_pack_together() -> None:
    # pipeline A needs memory only, B gpu slots only: one node holds one of each
    res_names = ("memory_mb", "slots:gpu")
    nodes = [FleetNode(f"n{i}", "dev", mem_cap(100, gpu=2)) for i in range(4)]
    curves = {
        ("A", 100.0, "dev"): linear_curve("A", "dev", 100, {"memory_mb": 1}, res_names),
        ("B", 100.0, "dev"): linear_curve("B", "dev", 100, {"slots:gpu": 0.02}, res_names),
    }
    streams = [
        Stream("a1", "A", 100, 100.0),
        Stream("a2", "A", 100, 100.0),
        Stream("b1", "B", 100, 100.0),
        Stream("b2", "B", 100, 100.0),
    ]
    res = place(streams, nodes, curves)
    assert len(res.nodes) == 2
    assert all(n.pipelines() == ["A", "B"] for n in res.nodes)
    assert res.lower_bound == 2  # memory 200/100 = gpu 4/2 = 2
    assert all(u <= c for n in res.nodes for u, c in zip(n.used, (100, 2), strict=True))
    # realised: one group (same device, same pipelines), both nodes labelled with it
    k8s = realise(res)
    assert k8s["values"]["groups"] == [
        {
            "name": "g1-dev",
            "device": "dev",
            "nodeSelector": {"infscaler.io/group": "g1-dev"},
            "pipelines": ["A", "B"],
        }
    ]
    assert set(k8s["labels"]) == {"n0", "n1"}


def test_unplaceable_streams_are_reported_not_dropped() -> None:
    nodes = [FleetNode("n1", "dev", mem_cap(100))]
    curves = {("det", 100.0, "dev"): linear_curve("det", "dev", 100, {"memory_mb": 1}, RES)}
    res = place(
        [
            Stream("huge", "det", 150, 100.0),
            Stream("a", "det", 80, 100.0),
            Stream("b", "det", 80, 100.0),
        ],
        nodes,
        curves,
    )
    assert not res.feasible
    assert "exceeds what one node serves" in res.unplaced["huge"]
    assert "no free node" in res.unplaced["b"]  # one node, and it holds a
    assert [n.node for n in res.nodes] == ["n1"]


def test_lower_bound_counts_the_tightest_resource() -> None:
    res_names = ("memory_mb", "slots:gpu")
    curves = {
        ("A", 100.0, "dev"): linear_curve(
            "A", "dev", 100, {"memory_mb": 0.5, "slots:gpu": 0.03}, res_names
        )
    }
    caps = {"dev": mem_cap(100, gpu=2)}
    # 300 requests/s: memory 150/100 = 1.5, gpu 9/2 = 4.5 -> 5, by the gpu slots
    lb, by = lower_bound([Stream("s", "A", 300, 100.0)], ["dev"], curves, caps)
    assert (lb, by) == (5, "slots:gpu")


def _units() -> list[UnitProfile]:
    return [
        UnitProfile(
            "det", {"cpu": EngineProfile("cpu", 10.0, memory_mb=100, cores=1)}, max_instances=1
        )
    ]


def test_capacity_curve_from_the_single_device_planner() -> None:
    # one deterministic 10 ms unit, one instance at most: the ceiling is 100/s; with
    # Poisson arrivals (M/D/1) the P99 stays under 100 ms up to rho ~0.9
    c = capacity_curve(
        "det", _units(), 100.0, "generic-x86", load_profile("generic-x86"), sim_requests=1500
    )
    assert 50.0 < c.max_rate < 100.0
    assert c.rates == tuple(sorted(c.rates)) and c.rates[-1] == c.max_rate
    assert c.planner_runs <= 7 + 8 + 1
    mem = [v[0] for v in c.vectors]
    assert mem == sorted(mem) and mem[-1] == pytest.approx(100.0)  # one instance, 100 MB
    assert all(v[c.resources.index("slots:cpu")] == 1 for v in c.vectors)
    # an SLO below the service time: no rate is feasible, the planner's reason kept
    c0 = capacity_curve("det", _units(), 5.0, "generic-x86", load_profile("generic-x86"))
    assert c0.max_rate == 0.0 and "service time" in c0.reason


def test_plan_fleet_cli(tmp_path: Path) -> None:
    fleet = {
        "pool_mb": 256,
        "nodes": [
            {"prefix": "nano-", "count": 3, "device": "orin-nano"},
            {"name": "agx-1", "device": "orin-agx"},
        ],
        "pipelines": {
            "det": {
                "slo": "100ms",
                "units": [
                    {
                        "name": "det",
                        "engines": {"cpu": {"mean_ms": 10, "memory_mb": 100, "cores": 1}},
                        "max_instances": 1,
                    }
                ],
            }
        },
        "streams": [{"prefix": "cam-", "count": 3, "pipeline": "det", "rate": "30/s"}],
    }
    f = tmp_path / "fleet.yaml"
    f.write_text(yaml.safe_dump(fleet))
    values = tmp_path / "values.yaml"
    r = CliRunner().invoke(app, ["plan", "--fleet", str(f), "--json", "--values", str(values)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{") :])
    # one instance serves < 100/s: 90/s of streams need 2 nodes (two streams fit one)
    assert d["feasible"] and d["nodes_used"] == 2 and d["lower_bound"] <= 2
    assert sum(len(p["streams"]) for n in d["placement"] for p in n["pipelines"]) == 3
    groups = yaml.safe_load(values.read_text())["groups"]
    assert groups and all(g["pipelines"] == ["det"] for g in groups)
    assert set(d["kubernetes"]["labels"]) == {n["node"] for n in d["placement"]}


def test_plan_fleet_measures_a_pipeline_file(tmp_path: Path, stagefuncs_on_path: None) -> None:
    # `file:`: the pipeline is compiled and its units measured in-process, as `plan` does
    (tmp_path / "scale.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "scale",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": ["y"],
                "stages": [
                    {
                        "name": "scale",
                        "function": "stagefuncs:scale",
                        "inputs": ["x"],
                        "outputs": ["y"],
                    }
                ],
            }
        )
    )
    f = tmp_path / "fleet.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"name": "n1", "device": "orin-nano"}],
                "pipelines": {"scale": {"slo": "50ms", "file": "scale.yaml"}},
                "streams": [{"name": "s", "pipeline": "scale", "rate": "10/s"}],
            }
        )
    )
    r = CliRunner().invoke(app, ["plan", "--fleet", str(f), "--json", "--repeats", "2"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{") :])
    assert d["nodes_used"] == 1 and d["capacity"][0]["max_rate"] > 10
    assert "measured on this host" in r.stderr
