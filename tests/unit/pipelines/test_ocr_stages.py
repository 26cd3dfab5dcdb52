"""The OCR pipeline's function stages (``infscaler/pipelines/ocr.py`` + ``ocr.yaml``) on
the real PP-OCR models of rapidocr_onnxruntime==1.4.4 and real images: accuracy on
rendered text of known content, scikit-image's photographs, and the function-stage
contract (declared names, plain dtypes, read-only inputs left alone, fan-out / fan-in)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime", reason="the OCR models come from rapidocr_onnxruntime")
ort = pytest.importorskip("onnxruntime")

from infscaler.base import samples  # noqa: E402
from infscaler.base.models import resolve_model  # noqa: E402
from infscaler.pipelines import ocr  # noqa: E402
from infscaler.runtime.planning.reference import run_pipeline_reference  # noqa: E402

REF_LINES = [
    "InfScaler serves partitioned models",
    "Edge inference on Jetson 2026",
    "The quick brown fox jumps over 13 lazy dogs",
]
ACCEPT_CER = 0.05  # the acceptance bar for the served pipeline


@pytest.fixture(scope="module")
def sessions() -> dict[str, Any]:
    """Whole-model CPU sessions, keyed by the YAML's model stage names."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return {
        stage: ort.InferenceSession(
            str(resolve_model(alias)), so, providers=["CPUExecutionProvider"]
        )
        for stage, alias in (("det", "ppocrv4-det"), ("cls", "ppocr-cls"), ("rec", "ppocrv4-rec"))
    }


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return ocr.load_ocr_spec()


def _run(image: np.ndarray, sessions: dict[str, Any]) -> dict[str, np.ndarray]:
    return ocr.run_ocr_reference(
        image, det_model=sessions["det"], cls_model=sessions["cls"], rec_model=sessions["rec"]
    )


def _check_result(result: dict[str, np.ndarray], image: np.ndarray) -> None:
    """Outputs of the pipeline: consistent shapes and dtypes, boxes inside the image,
    scores in (0, 1]."""
    texts, scores, boxes = result["texts"], result["scores"], result["boxes"]
    n = len(texts)
    assert texts.dtype.kind == "U" and texts.ndim == 1
    assert scores.dtype == np.float32 and scores.shape == (n,)
    assert boxes.dtype == np.float32 and boxes.shape == (n, 4, 2)
    h, w = image.shape[:2]
    assert np.all(boxes[..., 0] >= 0) and np.all(boxes[..., 0] <= w)
    assert np.all(boxes[..., 1] >= 0) and np.all(boxes[..., 1] <= h)
    assert np.all(scores > 0) and np.all(scores <= 1)
    assert all(t.strip() for t in texts)


# ------------------------------------------------------------------------ accuracy


@pytest.mark.parametrize("font_size", [18, 32])
def test_rendered_text_is_read_back(font_size: int, sessions: dict[str, Any]) -> None:
    image = samples.render_text_image(REF_LINES, font_size=font_size)
    result = _run(image, sessions)
    _check_result(result, image)
    reference = ocr.normalize_text(" ".join(REF_LINES))
    cer = ocr.character_error_rate(reference, ocr.join_lines(result["texts"]))
    assert cer <= ACCEPT_CER, (cer, list(result["texts"]))
    # one box per line, in reading order, where the line was drawn (original pixels)
    assert len(result["texts"]) == len(REF_LINES)
    pitch, margin = font_size * 1.6, 24
    for i, box in enumerate(result["boxes"]):
        cy = float(box[:, 1].mean())
        assert margin + i * pitch <= cy <= margin + i * pitch + font_size * 1.3, (i, box)
        assert abs(float(box[:, 0].min()) - margin) <= 6


def test_upside_down_line_is_turned_by_the_classifier(sessions: dict[str, Any]) -> None:
    line = REF_LINES[1]
    image = np.ascontiguousarray(samples.render_text_image([line])[::-1, ::-1])
    result = _run(image, sessions)
    _check_result(result, image)
    assert ocr.character_error_rate(line, ocr.join_lines(result["texts"])) <= ACCEPT_CER


def test_skimage_page(sessions: dict[str, Any]) -> None:
    skdata = pytest.importorskip("skimage.data")
    image = ocr.to_rgb(skdata.page())
    result = _run(image, sessions)
    _check_result(result, image)
    assert len(result["texts"]) >= 4
    text = ocr.join_lines(result["texts"])
    assert "Region-based segmentation" in text
    assert "markers" in text
    # reading order: top to bottom
    tops = result["boxes"][:, 0, 1]
    assert np.all(np.diff(tops) > -10)


def test_skimage_text(sessions: dict[str, Any]) -> None:
    """``data.text()`` is a blurred photograph of handwritten formulas whose strokes are
    too large for PP-OCRv4's detector once the image fits 640 px (it needs ~900 px wide):
    the pipeline must still answer with well-formed (possibly empty) results."""
    skdata = pytest.importorskip("skimage.data")
    image = ocr.to_rgb(skdata.text())
    _check_result(_run(image, sessions), image)


# ----------------------------------------------------------------------- contract


def _stage(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in spec["stages"] if s["name"] == name)


def _call(spec: dict[str, Any], name: str, env: dict[str, np.ndarray]) -> Any:
    """Call a function stage as the runtime does: exactly its inputs, as read-only
    arrays; check that they are left unchanged and that the outputs follow the contract."""
    stage = _stage(spec, name)
    fn = importlib.import_module(stage["function"].split(":")[0])
    fn = getattr(fn, stage["function"].split(":")[1])
    params = stage.get("params") or {}

    def frozen(a: np.ndarray) -> np.ndarray:
        c = np.array(a)
        c.setflags(write=False)
        return c

    if stage.get("fan_in"):
        items = [{k: frozen(it[k]) for k in stage["inputs"]} for it in env["__items__"]]
        before = [{k: v.copy() for k, v in it.items()} for it in items]
        out = fn(items, **params)
        for it, b in zip(items, before, strict=True):
            for k in it:
                np.testing.assert_array_equal(it[k], b[k])
    else:
        tensors = {k: frozen(env[k]) for k in stage["inputs"]}
        before = {k: v.copy() for k, v in tensors.items()}
        out = fn(tensors, **params)
        for k in tensors:
            np.testing.assert_array_equal(tensors[k], before[k])
    for d in out if stage.get("fan_out") else [out]:
        assert isinstance(d, dict)
        assert set(d) == set(stage["outputs"]), (name, sorted(d))
        for k, v in d.items():
            assert isinstance(v, np.ndarray), (name, k, type(v))
            assert v.dtype.kind in "biufU", (name, k, v.dtype)
    return out


def _run_model(sessions: dict[str, Any], spec: dict[str, Any], name: str, env: dict) -> dict:
    stage = _stage(spec, name)
    feeds = {m: env[t] for m, t in stage["inputs"].items()}
    values = sessions[name].run(list(stage["outputs"]), feeds)
    return {stage["outputs"][k]: v for k, v in zip(stage["outputs"], values, strict=True)}


def test_each_stage_honours_the_contract(spec: dict[str, Any], sessions: dict[str, Any]) -> None:
    image = samples.render_text_image(REF_LINES[:2])
    env: dict[str, Any] = {"image": image}
    env.update(_call(spec, "prep", env))
    # ocr.yaml's prep: the resized region alone, longer side 640 at most, multiples of 32
    b, c, hh, ww = env["det_input"].shape
    assert (b, c, max(hh, ww), hh % 32, ww % 32) == (1, 3, 640, 0, 0)
    assert env["det_input"].dtype == np.float32
    assert env["det_meta"].dtype == np.int32 and env["det_meta"].shape == (4,)
    env.update(_run_model(sessions, spec, "det", env))
    items = _call(spec, "crops", env)
    assert isinstance(items, list) and len(items) == 2
    for it in items:
        assert it["crop"].dtype == np.uint8 and it["crop"].ndim == 3 and it["crop"].shape[2] == 3
        assert it["crop"].shape[0] >= 48
        assert it["box"].dtype == np.float32 and it["box"].shape == (4, 2)
        item_env = {**env, **it}
        item_env.update(_call(spec, "cls_prep", item_env))
        assert item_env["cls_input"].shape == (1, 3, 48, 192)
        assert item_env["cls_input"].dtype == np.float32
        item_env.update(_run_model(sessions, spec, "cls", item_env))
        item_env.update(_call(spec, "rec_prep", item_env))
        x = item_env["rec_input"]
        assert x.dtype == np.float32 and x.shape[:3] == (1, 3, 48) and x.shape[3] >= 320
        # the width follows this crop's own aspect ratio (rapidocr's rule, batch of one)
        h, w = it["crop"].shape[:2]
        assert x.shape[3] == int(48 * max(320 / 48, w / h))
        item_env.update(_run_model(sessions, spec, "rec", item_env))
        it.update(_call(spec, "decode", item_env))
    merged = _call(spec, "merge", {"__items__": items})
    assert list(merged["texts"]) == REF_LINES[:2]
    np.testing.assert_array_equal(merged["boxes"], np.stack([it["box"] for it in items]))


def test_fan_out_on_a_blank_image_is_empty(spec: dict[str, Any], sessions: dict[str, Any]) -> None:
    env: dict[str, Any] = {"image": np.full((300, 500, 3), 255, np.uint8)}
    env.update(_call(spec, "prep", env))
    env.update(_run_model(sessions, spec, "det", env))
    assert _call(spec, "crops", env) == []
    result = _run(env["image"], sessions)
    _check_result(result, env["image"])
    assert len(result["texts"]) == 0


def test_merge_of_no_items_gives_empty_arrays(spec: dict[str, Any]) -> None:
    out = _call(spec, "merge", {"__items__": []})
    assert out["texts"].shape == (0,) and out["texts"].dtype.kind == "U"
    assert out["scores"].shape == (0,) and out["scores"].dtype == np.float32
    assert out["boxes"].shape == (0, 4, 2) and out["boxes"].dtype == np.float32


def test_decode_and_merge_drop_low_scores_and_check_shapes() -> None:
    classes = len(ocr._character_list("ppocrv4-rec")) + 2
    prob = np.zeros((1, 10, classes), np.float32)
    prob[0, :, 0] = 1.0  # all blank: empty text, score 0
    box = np.zeros((4, 2), np.float32)
    line = ocr.decode_line({"rec_prob": prob})
    assert line["text"].shape == (1,) and line["text"].dtype.kind == "U"
    assert line["score"].dtype == np.float32 and float(line["score"][0]) == 0.0
    out = ocr.merge_lines([{**line, "box": box}])
    assert out["texts"].shape == (0,)
    with pytest.raises(ValueError, match="rec_prob"):
        ocr.decode_line({"rec_prob": prob[:, :, :100]})
    with pytest.raises(ValueError, match="one element"):
        ocr.merge_lines(
            [{"text": np.array(["a", "b"]), "score": np.ones(2, np.float32), "box": box}]
        )


def test_yaml_functions_and_model_names_resolve(spec: dict[str, Any]) -> None:
    onnx = pytest.importorskip("onnx")
    names = [s["name"] for s in spec["stages"]]
    assert names == [
        "prep",
        "det",
        "crops",
        "cls_prep",
        "cls",
        "rec_prep",
        "rec",
        "decode",
        "merge",
    ]
    assert spec["outputs"] == ["texts", "scores", "boxes"]
    det = _stage(spec, "det")
    assert det["partitions"] == 1 and det["shapes"] == "x:1x3x640x640"
    assert _stage(spec, "prep")["params"] == {"side": 640, "pad": False, "enlarge": False}
    assert _stage(spec, "crops")["fan_out"] and _stage(spec, "merge")["fan_in"]
    for stage in spec["stages"]:
        if "function" in stage:
            module, _, attr = stage["function"].partition(":")
            assert callable(getattr(importlib.import_module(module), attr))
        else:
            model = onnx.load(str(resolve_model(stage["model"])), load_external_data=False)
            ins = {i.name for i in model.graph.input}
            outs = {o.name for o in model.graph.output}
            assert set(stage["inputs"]) <= ins, (stage["name"], ins)
            assert set(stage["outputs"]) <= outs, (stage["name"], outs)
    # and the project's loader accepts it
    from infscaler.base.config import load_pipeline

    assert load_pipeline(ocr.PIPELINE_YAML).name == "ocr"


def test_reference_runner_catches_contract_breaks() -> None:
    spec = {
        "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
        "outputs": ["y"],
        "stages": [
            {"name": "bad", "function": "numpy:asarray", "inputs": ["image"], "outputs": ["y"]}
        ],
    }
    with pytest.raises(TypeError, match="not a dict"):
        run_pipeline_reference(spec, {"image": np.zeros((2, 2, 3), np.uint8)})


# ------------------------------------------------------------------ pre-processing


@pytest.mark.parametrize(
    ("h", "w"), [(1500, 120), (40, 2600), (3, 5), (1, 1), (640, 640), (700, 300)]
)
def test_det_preprocess_is_fixed_size(h: int, w: int) -> None:
    rng = np.random.default_rng(h * 7 + w)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    image.setflags(write=False)
    out = ocr.det_preprocess({"image": image})
    x, meta = out["det_input"], out["det_meta"]
    assert x.shape == (1, 3, 640, 640) and x.dtype == np.float32
    _, _, rh, rw = (int(v) for v in meta)
    assert list(meta[:2]) == [h, w]
    assert rh % 32 == 0 and rw % 32 == 0 and 32 <= rh <= 640 and 32 <= rw <= 640
    assert max(rh, rw) == 640  # fits the canvas, longer side first
    assert np.all(x[:, :, rh:, :] == 0) and np.all(x[:, :, :, rw:] == 0)
    assert x.min() >= -1.0 and x.max() <= 1.0


@pytest.mark.parametrize(
    ("h", "w", "rh", "rw"),
    [(191, 384, 192, 384), (1000, 700, 640, 448), (20, 20, 32, 32), (640, 640, 640, 640)],
)
def test_det_preprocess_unpadded_never_enlarges(h: int, w: int, rh: int, rw: int) -> None:
    # ocr.yaml's whole detector: the resized region alone, a small image only rounded
    # up to multiples of 32, a large one reduced to 640 on its longer side
    image = np.random.default_rng(h + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = ocr.det_preprocess({"image": image}, pad=False, enlarge=False)
    assert out["det_input"].shape == (1, 3, rh, rw) and out["det_input"].dtype == np.float32
    assert list(out["det_meta"]) == [h, w, rh, rw]
    # the same pixels as the padded canvas's region when the resize agrees
    if max(h, w) >= 640:
        padded = ocr.det_preprocess({"image": image})["det_input"]
        np.testing.assert_array_equal(out["det_input"], padded[:, :, :rh, :rw])


def test_det_preprocess_is_bgr_normalised_like_rapidocr() -> None:
    image = np.zeros((64, 64, 3), np.uint8)
    image[..., 0] = 255  # pure red
    x = ocr.det_preprocess({"image": image})["det_input"]
    # BGR planes: blue and green -1, red +1
    assert np.allclose(x[0, 0, :640, :640], -1) and np.allclose(x[0, 1], -1)
    assert np.allclose(x[0, 2], 1)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="uint8"):
        ocr.det_preprocess({"image": np.zeros((10, 10), np.uint8)})
    with pytest.raises(ValueError, match="multiple of 32"):
        ocr.det_preprocess({"image": np.zeros((10, 10, 3), np.uint8)}, side=100)
    det_map = np.zeros((1, 1, 640, 640), np.float32)
    with pytest.raises(ValueError, match="det_meta"):
        ocr.crop_text_boxes(
            {
                "det_map": det_map,
                "det_meta": np.array([20, 20, 640, 640], np.int32),
                "image": np.zeros((10, 10, 3), np.uint8),
            }
        )
    with pytest.raises(ValueError, match="cls_prob"):
        ocr.rec_preprocess(
            {"crop": np.zeros((10, 30, 3), np.uint8), "cls_prob": np.zeros(3, np.float32)}
        )


# ------------------------------------------------------------------------- helpers


def test_render_text_image() -> None:
    img = samples.render_text_image(["Hello", "World wide"], font_size=20, margin=10)
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert np.all(img[:10] == 255) and np.all(img[:, :10] == 255)  # white margins
    assert img.min() < 50  # black text
    with pytest.raises(ValueError):
        samples.render_text_image([])


def test_to_rgb() -> None:
    gray = np.array([[0, 128], [255, 7]], np.uint8)
    rgb = ocr.to_rgb(gray)
    assert rgb.shape == (2, 2, 3) and rgb.dtype == np.uint8
    assert np.all(rgb[..., 0] == gray) and np.all(rgb[..., 2] == gray)
    assert np.array_equal(ocr.to_rgb(gray / 255.0), rgb)
    assert np.array_equal(ocr.to_rgb(gray[..., None]), rgb)
    assert ocr.to_rgb(np.array([[True, False]]))[0, :, 0].tolist() == [255, 0]
    assert ocr.to_rgb(np.array([[0, 65535]], np.uint16))[0, :, 0].tolist() == [0, 255]
    rgba = np.zeros((1, 2, 4), np.uint8)
    rgba[0, 0] = [10, 20, 30, 255]  # opaque
    rgba[0, 1] = [10, 20, 30, 0]  # transparent -> white
    assert ocr.to_rgb(rgba)[0].tolist() == [[10, 20, 30], [255, 255, 255]]
    assert ocr.to_rgb(np.array([[[0, 0]]], np.uint8))[0, 0].tolist() == [255, 255, 255]
    with pytest.raises(ValueError):
        ocr.to_rgb(np.zeros((2, 2, 5)))
    with pytest.raises(ValueError):
        ocr.to_rgb(np.array([[np.nan]]))


def test_character_error_rate_and_join() -> None:
    assert ocr.character_error_rate("abc", "abc") == 0.0
    assert ocr.character_error_rate("abc", "abd") == pytest.approx(1 / 3)
    assert ocr.character_error_rate("abc", "") == 1.0
    assert ocr.character_error_rate("kitten", "sitting") == pytest.approx(3 / 6)
    assert ocr.join_lines(np.array(["  a  b", "c "])) == "a b c"
    with pytest.raises(ValueError):
        ocr.character_error_rate("", "x")
