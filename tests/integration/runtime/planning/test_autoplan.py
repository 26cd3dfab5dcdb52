"""The planner's search on a real ONNX model (issue 15): measuring a model stage, the
`infscaler plan --explain` CLI, and deploying a pipeline left to the planner (the chosen
plan written with the chosen cuts, threads and instances, then served and checked
against the whole model's output)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from typer.testing import CliRunner

from infscaler.base.config import load_pipeline
from infscaler.base.errors import InfScalerError
from infscaler.cli import app
from infscaler.runtime.planning.autoplan import needs_planning, plan_pipeline
from tests.helpers import f32, make_model, rand, save


def conv_chain(channels: int = 16, size: int = 32) -> object:
    """x -> Conv -> Relu -> Conv -> Relu -> Conv -> y: three operator groups, cuts between."""
    c = channels
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    inits = {
        "w1": rand(c, c, 3, 3, seed=1),
        "w2": rand(c, c, 3, 3, seed=2),
        "w3": rand(c, c, 3, 3, seed=3),
    }
    return make_model(nodes, [f32("x", [1, c, size, size])], [f32("y", [1, c, size, size])], inits)


@pytest.fixture
def chain_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    return save(conv_chain(), tmp_path / "chain.onnx")


def test_a_pipeline_left_to_the_planner_deploys_its_choice(
    chain_path: Path, tmp_path: Path
) -> None:
    from infscaler.base.device import load_profile
    from infscaler.service.service import Service

    cfg = load_pipeline(
        {
            "name": "auto",
            "slo": "500ms",
            "autoscale": {},
            "stages": [{"name": "m", "model": str(chain_path)}],
        }
    )
    assert needs_planning(cfg)
    fixed = load_pipeline(
        {
            "name": "f",
            "slo": "500ms",
            "autoscale": {},
            "stages": [{"name": "m", "model": str(chain_path), "threads": 2}],
        }
    )
    assert not needs_planning(fixed)  # the user named the threads
    assert not needs_planning(
        load_pipeline({"name": "n", "stages": [{"name": "m", "model": str(chain_path)}]})
    )
    profile = load_profile("cpu-host")
    planned, outcome = plan_pipeline(cfg, device=profile, state_dir=tmp_path / "state")
    best = outcome.best
    assert best is not None
    st = planned.stages[0]
    assert st.threads == best.threads[0]
    k = len(best.cuts[0]) + 1
    if k > 1:
        assert st.plan is not None and st.model is None
        assert list(st.instances) == [
            c.total for u, c in zip(best.units, best.config, strict=True) if u.served
        ]
    else:
        assert st.model is not None and st.instances == best.config[-1].total
    x = np.random.default_rng(0).standard_normal((1, 16, 32, 32)).astype(np.float32)
    ref = ort.InferenceSession(str(chain_path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    # The service is given the pipeline left to the planner, as a user gives it, and
    # deploys the decision kept above: same state directory, and no PM QoS request
    # (the wake latency planned for is part of the decision's key). Deploying
    # `planned` instead planned again when the choice was K = 1 at 1 thread x 1
    # instance (the defaults, which count as left open): a second measurement that on a
    # loaded host could choose K = 2.
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=64,
                 cpu_wake_latency_us=None) as svc:  # fmt: skip
        said: list[str] = []
        dep = svc.deploy(cfg, progress=said.append)
        assert any("kept in" in ln for ln in said), said  # nothing measured again
        assert dep.pipeline.config.stages[0] == st
        assert len(dep.pipeline.units) == k
        out = svc.infer("auto", {"x": x}, timeout_s=60).outputs["y"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)

    # the decision is kept: planning the same pipeline again measures nothing and gives
    # the same configuration; another SLO, or reuse=False, plans again
    import infscaler.runtime.planning.autoplan as autoplan

    def no_measuring(*_a, **_k):
        raise AssertionError("the kept decision should have been used")

    kept = list((tmp_path / "state" / "plans" / "decisions").glob("auto-*.json"))
    assert len(kept) == 1
    real = autoplan.planner_inputs
    autoplan.planner_inputs = no_measuring
    try:
        lines: list[str] = []
        again, none = plan_pipeline(
            cfg, device=profile, state_dir=tmp_path / "state", progress=lines.append
        )
        assert none is None and again == planned
        assert any("kept in" in ln for ln in lines), lines
        other = cfg.model_copy(update={"slo": "400ms"})
        with pytest.raises(AssertionError, match="kept decision"):
            plan_pipeline(other, device=profile, state_dir=tmp_path / "state")
        with pytest.raises(AssertionError, match="kept decision"):
            plan_pipeline(cfg, device=profile, state_dir=tmp_path / "state", reuse=False)
        # the memory cap is not in the key (the host's moves with the memory available
        # at each deploy): a cap 10 % smaller or 20 % larger reuses the decision, one
        # below the chosen configuration's memory or past 1.25x plans again
        data = json.loads(kept[0].read_text())
        cap0, need = data["memory_cap_mb"], data["memory_mb"]
        assert cap0 == pytest.approx(profile.memory_cap_mb, abs=0.1) and 0 < need < cap0
        for factor in (0.9, 1.2):
            # (the host profile's sources quote the memory available at load too)
            text = {**profile.sources, "memory_cap_mb": f"{factor} x the memory available"}
            moved = profile.model_copy(update={"memory_cap_mb": cap0 * factor, "sources": text})
            again, none = plan_pipeline(cfg, device=moved, state_dir=tmp_path / "state")
            assert none is None and again == planned
        lines = []
        for cap, why in ((need * 0.9, "more than the cap"), (cap0 * 1.3, "planned under")):
            moved = profile.model_copy(update={"memory_cap_mb": cap})
            with pytest.raises(AssertionError, match="kept decision"):
                plan_pipeline(
                    cfg, device=moved, state_dir=tmp_path / "state", progress=lines.append
                )
            assert any(why in ln for ln in lines), lines
        kept[0].write_text("{not json")  # a damaged file is planned again, not an error
        with pytest.raises(AssertionError, match="kept decision"):
            plan_pipeline(cfg, device=profile, state_dir=tmp_path / "state")
    finally:
        autoplan.planner_inputs = real


def test_deploy_plans_only_what_is_left_to_the_planner(chain_path: Path, tmp_path: Path) -> None:
    # every way a pipeline arrives (serve, the API, the watcher) goes through deploy
    from infscaler.cli.client import pipeline_from_arg, with_slo
    from infscaler.service.service import Service

    bare = with_slo(pipeline_from_arg(str(chain_path)), "500ms", True)
    bare = bare.model_copy(update={"name": "bare"})
    k2 = with_slo(pipeline_from_arg(str(chain_path), 2), "500ms", True)
    k2 = k2.model_copy(update={"name": "k2"})
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        lines: list[str] = []
        dep = svc.deploy(bare, progress=lines.append)
        assert any("chosen" in m for m in lines), lines
        assert all(u.instances >= 1 for u in dep.pipeline.units)
        lines.clear()
        svc.deploy(k2, progress=lines.append)  # -k 2: the user named K
        assert not any("planning" in m for m in lines), lines
        assert len(svc.deployment("k2").pipeline.units) == 2
    with Service(state_dir=tmp_path / "e", control_path="userspace", objective="eq1") as svc:
        lines = []
        svc.deploy(bare, progress=lines.append)  # eq1: deployed as written
        assert not any("planning" in m for m in lines), lines
        assert len(svc.deployment("bare").pipeline.units) == 1
    with pytest.raises(InfScalerError, match="unknown objective"):
        Service(objective="x")
    bad = CliRunner().invoke(app, ["serve", str(chain_path), "--objective", "x"])
    assert bad.exit_code != 0 and "unknown --objective" in str(bad.exception)
