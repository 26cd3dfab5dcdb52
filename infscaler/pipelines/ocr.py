"""PP-OCRv4 text recognition as an InfScaler pipeline: the function stages of ``ocr.yaml``.

Pre- and post-processing is rapidocr_onnxruntime 1.4.4's (Apache-2.0, a port of PaddleOCR's
``tools/infer``), imported, not re-written; the models are the ones that wheel ships
(``ppocrv4-det``, ``ppocr-cls``, ``ppocrv4-rec``). More: docs/pipelines.md, "`infscaler/pipelines/ocr.py`".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from infscaler.base.errors import ModelLoadError, ModelNotInstalledError
from infscaler.base.models import resolve_model
from infscaler.runtime.planning.reference import run_pipeline_reference
from infscaler.runtime.serving.instance import StageInputError

__all__ = [
    "CLS_LABELS",
    "DET_SIDE",
    "PIPELINE_YAML",
    "character_error_rate",
    "cls_preprocess",
    "crop_text_boxes",
    "decode_line",
    "det_preprocess",
    "join_lines",
    "load_ocr_spec",
    "merge_lines",
    "normalize_text",
    "rec_preprocess",
    "run_ocr_reference",
    "to_rgb",
]

#: The pipeline file served by ``infscaler deploy``.
PIPELINE_YAML = Path(__file__).with_name("ocr.yaml")
#: Side of the detector's fixed square input (the shape it is partitioned at).
DET_SIDE = 640
#: Direction classifier input (C, H, W), as rapidocr's ``Cls.cls_image_shape``.
CLS_SHAPE = (3, 48, 192)
#: Direction classifier labels, as rapidocr's ``Cls.label_list``.
CLS_LABELS = ("0", "180")
#: Recogniser input height and minimum width, as rapidocr's ``Rec.rec_img_shape``.
REC_HEIGHT = 48
REC_MIN_WIDTH = 320
_RAPIDOCR_PIP = "rapidocr_onnxruntime==1.4.4"


# --------------------------------------------------------------------------- helpers


@functools.cache
def _rapid() -> SimpleNamespace:
    """rapidocr's pre/post-processing classes and cv2, imported once (methods needing ``self``
    only for constants are bound to instances made without ``__init__``).

    Raises:
        ModelNotInstalledError: rapidocr_onnxruntime (or opencv) is not installed.
    """
    try:
        import cv2
        from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier
        from rapidocr_onnxruntime.ch_ppocr_cls.utils import ClsPostProcess
        from rapidocr_onnxruntime.ch_ppocr_det.text_detect import TextDetector
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess, DetPreProcess
        from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
        from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode
        from rapidocr_onnxruntime.main import RapidOCR
    except ImportError as exc:
        raise ModelNotInstalledError(
            f"the OCR pipeline needs rapidocr_onnxruntime's pre/post-processing: {exc}",
            hint=f"pip install '{_RAPIDOCR_PIP}'",
        ) from None
    detector = object.__new__(TextDetector)  # only filter_tag_det_res & co: no session
    classifier = object.__new__(TextClassifier)
    classifier.cls_image_shape = list(CLS_SHAPE)
    return SimpleNamespace(
        cv2=cv2,
        RapidOCR=RapidOCR,
        DBPostProcess=DBPostProcess,
        DetPreProcess=DetPreProcess,
        ClsPostProcess=ClsPostProcess,
        CTCLabelDecode=CTCLabelDecode,
        TextRecognizer=TextRecognizer,
        detector=detector,
        classifier=classifier,
        cls_post=ClsPostProcess(list(CLS_LABELS)),
    )


@functools.cache
def _recognizer_resizer(min_width: int) -> Any:
    """A session-less ``TextRecognizer`` whose ``resize_norm_img`` uses [3, 48, min_width]."""
    r = _rapid()
    rec = object.__new__(r.TextRecognizer)
    rec.rec_image_shape = [3, REC_HEIGHT, int(min_width)]
    return rec


@functools.cache
def _db_postprocess(
    thresh: float,
    box_thresh: float,
    max_candidates: int,
    unclip_ratio: float,
    use_dilation: bool,
    score_mode: str,
) -> Any:
    return _rapid().DBPostProcess(
        thresh=thresh,
        box_thresh=box_thresh,
        max_candidates=max_candidates,
        unclip_ratio=unclip_ratio,
        score_mode=score_mode,
        use_dilation=use_dilation,
    )


@functools.cache
def _character_list(rec_model: str) -> tuple[str, ...]:
    """The recogniser's characters: metadata_props ``character``, one per line.

    Raises:
        ModelLoadError: the model has no ``character`` metadata.
    """
    import onnx

    path = resolve_model(rec_model)
    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise ModelLoadError(
            f"recognition model {path} has no 'character' metadata (its character list)",
            hint="use a PP-OCR recogniser exported by rapidocr / paddle2onnx with its keys",
        )
    return tuple(meta["character"].splitlines())


@functools.cache
def _ctc_decoder(rec_model: str) -> Any:
    """rapidocr's ``CTCLabelDecode`` over ``rec_model``'s characters (blank at 0, space last)."""
    return _rapid().CTCLabelDecode(character=list(_character_list(rec_model)))


def check_image(image: Any, name: str) -> np.ndarray:
    """``image`` as an HxWx3 uint8 RGB array (no copy).

    Raises:
        StageInputError: (HTTP 400) another dtype / shape, or an empty image.
    """

    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise StageInputError(
            f"{name} must be an HxWx3 uint8 RGB image, got shape {a.shape} dtype {a.dtype} "
            "(convert with infscaler.pipelines.ocr.to_rgb)"
        )
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise StageInputError(f"{name} is empty: shape {a.shape}; send an image of at least 1x1")
    return a


def _bgr(rgb: np.ndarray) -> np.ndarray:
    """A contiguous BGR copy (cv2 wants positive strides; the input is never written)."""
    return np.ascontiguousarray(rgb[:, :, ::-1])


def _fit_dims(h: int, w: int, side: int) -> tuple[int, int]:
    """(h', w'): the longer side scaled to ``side``, both rounded to multiples of 32 as
    ``DetPreProcess.resize`` rounds them, and kept within [32, side]."""
    ratio = side / max(h, w)
    rh = int(round(int(h * ratio) / 32) * 32)
    rw = int(round(int(w * ratio) / 32) * 32)
    return min(max(rh, 32), side), min(max(rw, 32), side)


# ----------------------------------------------------------------------- stage functions


def det_preprocess(
    tensors: Mapping[str, np.ndarray],
    *,
    side: int = DET_SIDE,
    pad: bool = True,
    enlarge: bool = True,
) -> dict[str, np.ndarray]:
    """Stage ``prep``: the detector's input (rapidocr's ``DetPreProcess``).

    Resized (cv2 bilinear) so the longer side is ``side``, both sides rounded to a multiple of
    32; then BGR, ``(x / 255 - 0.5) / 0.5``, CHW, at the top-left of a zero ``side``-square canvas
    (``pad=False``: the resized image alone). ``enlarge=False`` only rounds a smaller image.

    Returns:
        ``det_input``: [1, 3, side, side] float32 ([1, 3, h', w'] unpadded); ``det_meta``: [4]
        int32 ``(H, W, h', w')``.

    Raises:
        StageInputError: (400) ``image`` is empty or not HxWx3 uint8.
        ValueError: ``side`` is not a positive multiple of 32.
    """
    if side < 32 or side % 32:
        raise ValueError(f"side must be a positive multiple of 32, got {side}")
    image = check_image(tensors["image"], "image")
    h, w = image.shape[:2]
    # not enlarged: the longer side only rounded up to a multiple of 32
    target = side if enlarge or max(h, w) > side else -(-max(h, w) // 32) * 32
    rh, rw = _fit_dims(h, w, target)
    r = _rapid()
    resized = r.cv2.resize(_bgr(image), (rw, rh))
    pre = r.DetPreProcess(side, "max", mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    if not pad:
        det_input = pre.permute(pre.normalize(resized))[None].astype(np.float32)
        return {"det_input": det_input, "det_meta": np.array([h, w, rh, rw], dtype=np.int32)}
    det_input = np.zeros((1, 3, side, side), dtype=np.float32)
    det_input[0, :, :rh, :rw] = pre.permute(pre.normalize(resized))
    return {"det_input": det_input, "det_meta": np.array([h, w, rh, rw], dtype=np.int32)}


def crop_text_boxes(
    tensors: Mapping[str, np.ndarray],
    *,
    thresh: float = 0.3,
    box_thresh: float = 0.5,
    max_candidates: int = 1000,
    unclip_ratio: float = 1.6,
    use_dilation: bool = True,
    score_mode: str = "fast",
    min_height: int = REC_HEIGHT,
) -> list[dict[str, np.ndarray]]:
    """Stage ``crops`` (fan_out): text boxes from the probability map, one item per box.

    rapidocr's ``DBPostProcess`` (``thresh`` .. ``score_mode`` are its parameters),
    ``filter_tag_det_res``, ``sorted_boxes`` and ``get_crop_img_list``; a crop lower than
    ``min_height`` px is enlarged to it (bicubic; 0: never).

    Args:
        tensors: ``det_map``: [1, 1, S, S] float32; ``det_meta``: [4] int from
            :func:`det_preprocess`; ``image``: [H, W, 3] uint8 RGB.

    Returns:
        Per box in reading order: ``crop``: [h, w, 3] uint8 RGB; ``box``: [4, 2] float32
        corners (x, y) in image pixels, clockwise from top-left.

    Raises:
        ValueError: map, meta and image shapes that do not fit together.
    """
    det_map = np.asarray(tensors["det_map"])
    meta = np.asarray(tensors["det_meta"]).reshape(-1)
    image = check_image(tensors["image"], "image")
    if det_map.ndim != 4 or det_map.shape[:2] != (1, 1):
        raise ValueError(f"det_map must be [1, 1, S, S], got {det_map.shape}")
    if meta.size != 4:
        raise ValueError(f"det_meta must hold 4 values (H, W, h', w'), got {meta.size}")
    h, w, rh, rw = (int(v) for v in meta)
    if image.shape[:2] != (h, w):
        raise ValueError(f"det_meta says the image is {h}x{w}, it is {image.shape[:2]}")
    if not (0 < rh <= det_map.shape[2] and 0 < rw <= det_map.shape[3]):
        raise ValueError(f"det_meta's region {rh}x{rw} is not inside the map {det_map.shape}")
    post = _db_postprocess(
        float(thresh),
        float(box_thresh),
        int(max_candidates),
        float(unclip_ratio),
        bool(use_dilation),
        str(score_mode),
    )
    # own float32 copy of the valid region (the input is a read-only view)
    pred = np.array(det_map[:, :, :rh, :rw], dtype=np.float32)
    boxes, _ = post(pred, (h, w))
    if len(boxes) == 0:
        return []
    r = _rapid()
    boxes = r.detector.filter_tag_det_res(boxes.astype(np.float32), (h, w))
    if len(boxes) == 0:
        return []
    items = []
    for box in r.RapidOCR.sorted_boxes(boxes):
        box = np.asarray(box, dtype=np.float32)
        crop = r.RapidOCR.get_crop_img_list(None, image, [box])[0]
        if 0 < crop.shape[0] < min_height:
            # small text: enlarge with bicubic interpolation now, once, rather than let
            # the recogniser's bilinear resize_norm_img do it (it loses word spaces)
            scale = min_height / crop.shape[0]
            size = (max(1, round(crop.shape[1] * scale)), int(min_height))
            crop = r.cv2.resize(np.ascontiguousarray(crop), size, interpolation=r.cv2.INTER_CUBIC)
        items.append({"crop": np.ascontiguousarray(crop, dtype=np.uint8), "box": box.copy()})
    return items


def cls_preprocess(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Stage ``cls_prep``: ``crop`` [h, w, 3] uint8 RGB -> ``cls_input`` [1, 3, 48, 192] float32.

    rapidocr's ``TextClassifier.resize_norm_img`` (height 48, width <= 192, zero-padded right).

    Raises:
        ValueError: ``crop`` is not an HxWx3 uint8 array.
    """
    crop = check_image(tensors["crop"], "crop")
    x = _rapid().classifier.resize_norm_img(_bgr(crop))
    return {"cls_input": np.ascontiguousarray(x[np.newaxis], dtype=np.float32)}


def rec_preprocess(
    tensors: Mapping[str, np.ndarray],
    *,
    cls_thresh: float = 0.9,
    min_width: int = REC_MIN_WIDTH,
) -> dict[str, np.ndarray]:
    """Stage ``rec_prep``: turn the crop by the classifier's verdict, then the recogniser's input.

    Rotated 180 degrees when ``cls_prob`` ([1, 2] over ``('0', '180')``) scores '180' above
    ``cls_thresh``; then ``TextRecognizer.resize_norm_img`` to width
    ``W = int(48 * max(min_width / 48, w / h))``.

    Returns:
        ``rec_input``: [1, 3, 48, W] float32.

    Raises:
        ValueError: ``crop`` is not HxWx3 uint8, or ``cls_prob`` does not hold 2 scores.
    """
    crop = check_image(tensors["crop"], "crop")
    prob = np.asarray(tensors["cls_prob"], dtype=np.float32).reshape(-1)
    if prob.size != len(CLS_LABELS):
        raise ValueError(f"cls_prob must hold {len(CLS_LABELS)} scores, got shape {prob.shape}")
    r = _rapid()
    label, score = r.cls_post(prob[np.newaxis])[0]
    img = _bgr(crop)
    if "180" in label and score > cls_thresh:
        img = r.cv2.rotate(img, r.cv2.ROTATE_180)
    h, w = img.shape[:2]
    max_wh_ratio = max(min_width / REC_HEIGHT, w / h)
    x = _recognizer_resizer(int(min_width)).resize_norm_img(img, max_wh_ratio)
    return {"rec_input": np.ascontiguousarray(x[np.newaxis], dtype=np.float32)}


def decode_line(
    tensors: Mapping[str, np.ndarray], *, rec_model: str = "ppocrv4-rec"
) -> dict[str, np.ndarray]:
    """Stage ``decode``: rapidocr's greedy ``CTCLabelDecode`` of ``rec_prob`` [1, T, C] float32
    over ``rec_model``'s character list.

    Returns:
        ``text``: [1] ``<U``; ``score``: [1] float32, mean probability kept (0 for empty).

    Raises:
        ValueError: C is not the model's character count + 2.
        ModelLoadError / ModelNotInstalledError: ``rec_model`` missing or without characters.
    """
    decoder = _ctc_decoder(str(rec_model))
    classes = len(decoder.character)
    prob = np.asarray(tensors["rec_prob"])
    if prob.ndim != 3 or prob.shape[0] != 1 or prob.shape[2] != classes:
        raise ValueError(f"rec_prob must be [1, T, {classes}], got {prob.shape}")
    text, score = decoder(prob)[0]
    text = str(text)
    return {
        "text": np.array([text], dtype=f"<U{max(1, len(text))}"),
        "score": np.array([float(score) if text else 0.0], dtype=np.float32),
    }


def merge_lines(
    items: Sequence[Mapping[str, np.ndarray]], *, text_score: float = 0.5
) -> dict[str, np.ndarray]:
    """Stage ``merge`` (fan_in): the decoded lines in reading order, those scoring below
    ``text_score`` dropped (``RapidOCR.filter_result``).

    Returns:
        ``texts``: [N] ``<U``; ``scores``: [N] float32; ``boxes``: [N, 4, 2] float32 (N may be 0).

    Raises:
        ValueError: an item's ``text`` / ``score`` is not one element.
    """
    texts: list[str] = []
    scores: list[float] = []
    boxes: list[np.ndarray] = []
    for i, item in enumerate(items):
        text, score = np.asarray(item["text"]).reshape(-1), np.asarray(item["score"]).reshape(-1)
        if text.size != 1 or score.size != 1:
            raise ValueError(f"item {i}: text and score must hold one element each")
        if text[0] and float(score[0]) >= text_score:
            texts.append(str(text[0]))
            scores.append(float(score[0]))
            boxes.append(np.asarray(item["box"], dtype=np.float32).reshape(4, 2))
    return {
        "texts": np.array(texts, dtype=str) if texts else np.zeros(0, dtype="<U1"),
        "scores": np.array(scores, dtype=np.float32),
        "boxes": (np.stack(boxes).astype(np.float32) if boxes else np.zeros((0, 4, 2), np.float32)),
    }


#: The v2 metadata of the pipeline's outputs (``GET /v2/models/ocr``).
merge_lines.outputs_spec = {  # type: ignore[attr-defined]
    "texts": {"datatype": "BYTES", "shape": [-1]},
    "scores": {"datatype": "FP32", "shape": [-1]},
    "boxes": {"datatype": "FP32", "shape": [-1, 4, 2]},
}


def _warm_rapid(**_params: Any) -> None:
    """Warm-up hook (``fn.warmup``, called by the instance at start with the stage's
    params): import rapidocr and OpenCV once, before the first request."""
    _rapid()


def _warm_decoder(rec_model: str = "ppocrv4-rec", **_params: Any) -> None:
    """Warm-up hook of :func:`decode_line`: load the character list."""
    _ctc_decoder(str(rec_model))


for _fn in (det_preprocess, crop_text_boxes, cls_preprocess, rec_preprocess):
    _fn.warmup = _warm_rapid  # type: ignore[attr-defined]
decode_line.warmup = _warm_decoder  # type: ignore[attr-defined]


# ------------------------------------------------------------------ images and metrics


def to_rgb(image: Any) -> np.ndarray:
    """Any common image array -> [H, W, 3] uint8 RGB.

    Floats are taken in [0, 1] (clipped), other integers beyond [0, 255] scaled by the dtype's
    maximum, bool -> 0 / 255; grey is repeated, grey + alpha and RGBA composited over white.

    Raises:
        ValueError: an empty array, an unsupported shape or dtype, or NaN / inf values.
    """
    a = np.asarray(image)
    if a.size == 0 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 2, 3, 4)):
        raise ValueError(f"expected an HxW, HxWx1, HxWx2, HxWx3 or HxWx4 image, got {a.shape}")
    if a.dtype == np.uint8:
        u8 = a
    elif a.dtype == np.bool_:
        u8 = a.astype(np.uint8) * np.uint8(255)
    elif a.dtype.kind == "f":
        if not np.all(np.isfinite(a)):
            raise ValueError("image has NaN or infinite values")
        u8 = np.rint(np.clip(a.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)
    elif a.dtype.kind in "iu":
        if a.min() >= 0 and a.max() <= 255:
            u8 = a.astype(np.uint8)
        else:
            top = float(np.iinfo(a.dtype).max)
            u8 = np.rint(np.clip(a.astype(np.float64), 0, top) * (255.0 / top)).astype(np.uint8)
    else:
        raise ValueError(f"unsupported image dtype {a.dtype}")
    if u8.ndim == 2:
        u8 = u8[:, :, np.newaxis]
    channels = u8.shape[2]
    if channels in (2, 4):  # composite the colour over white by alpha
        alpha = u8[:, :, -1:].astype(np.float64) / 255.0
        colour = u8[:, :, :-1].astype(np.float64)
        u8 = np.rint(colour * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    if u8.shape[2] == 1:
        u8 = np.repeat(u8, 3, axis=2)
    return np.ascontiguousarray(u8, dtype=np.uint8)


def normalize_text(text: str) -> str:
    """``text`` with every run of whitespace replaced by one space, ends stripped."""
    return " ".join(str(text).split())


def join_lines(lines: Iterable[Any]) -> str:
    """Recognised lines (a list, or the ``texts`` array) joined by spaces, whitespace-
    normalised: the string to compare with the reference text."""
    return normalize_text(" ".join(str(s) for s in lines))


def character_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance between the strings / ``len(reference)`` (>= 0; case- and
    space-sensitive).

    Raises:
        ValueError: ``reference`` is empty.
    """
    from infscaler.modelless.accuracy import character_error_rate as cer

    return cer([(reference, hypothesis)])


# ------------------------------------------------------------ in-process reference run


def load_ocr_spec(path: str | os.PathLike[str] = PIPELINE_YAML) -> dict[str, Any]:
    """The OCR pipeline file as a plain mapping (``yaml.safe_load``)."""
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def run_ocr_reference(
    image: np.ndarray,
    *,
    det_model: Any = None,
    cls_model: Any = None,
    rec_model: Any = None,
) -> dict[str, np.ndarray]:
    """OCR of one image by the stages of ``ocr.yaml`` chained in-process on the whole models.

    Args:
        image: [H, W, 3] uint8 RGB.
        det_model, cls_model, rec_model: a session, or an alias / path; None: the YAML's model
            in a CPU session cached here.

    Returns:
        ``texts``: [N] ``<U``; ``scores``: [N] float32; ``boxes``: [N, 4, 2] float32.

    Raises:
        ValueError: ``image`` is not HxWx3 uint8.
        ModelNotInstalledError: rapidocr_onnxruntime is not installed.
    """
    check_image(image, "image")
    models = {"det": det_model, "cls": cls_model, "rec": rec_model}

    return run_pipeline_reference(
        load_ocr_spec(), {"image": image}, models={k: v for k, v in models.items() if v is not None}
    )
