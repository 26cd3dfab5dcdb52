"""The function stages of the model-less pipelines (``infscaler.modelless.stages:NAME``),
also called in-process by :mod:`infscaler.modelless.accuracy`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "REC_HEIGHT",
    "REC_MIN_WIDTH",
    "ctc_decode",
    "decode_ctc",
    "load_charset",
    "load_tokenizer",
    "mean_pool",
    "rec_input",
    "tokenize",
]

#: Recogniser input height and minimum width (PaddleOCR's ``rec_image_shape`` 3x48x320).
REC_HEIGHT = 48
REC_MIN_WIDTH = 320


# -- function stages (run in the instances) ------------------------------------------------


def rec_input(tensors: Mapping[str, np.ndarray], *, min_width: int = REC_MIN_WIDTH) -> dict:
    """Stage ``prep``: ``image`` [H, W, 3] uint8 RGB -> ``rec_input`` [1, 3, 48, W] float32, as
    PaddleOCR's ``resize_norm_img`` (``W = int(48 * max(min_width / 48, w / h))``).

    Raises:
        ValueError: the image is not HxWx3 uint8 with H, W >= 1.
    """
    import cv2

    img = np.asarray(tensors["image"])
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or min(img.shape[:2]) < 1:
        raise ValueError(f"image must be HxWx3 uint8 (a text line), got {img.shape} {img.dtype}")
    bgr = np.ascontiguousarray(img[:, :, ::-1])
    h, w = bgr.shape[:2]
    width = int(REC_HEIGHT * max(min_width / REC_HEIGHT, w / h))
    resized_w = max(1, min(width, int(math.ceil(REC_HEIGHT * w / h))))
    x = cv2.resize(bgr, (resized_w, REC_HEIGHT)).astype(np.float32)
    x = (x / 255.0 - 0.5) / 0.5
    out = np.zeros((1, 3, REC_HEIGHT, width), dtype=np.float32)
    out[0, :, :, :resized_w] = x.transpose(2, 0, 1)
    return {"rec_input": out}


@functools.cache
def load_charset(path: str) -> tuple[str, ...]:
    """A recogniser's characters, one per line (PaddleOCR's ``character_dict``)."""
    with open(path, encoding="utf-8") as f:
        return tuple(line.rstrip("\r\n") for line in f)


@functools.cache
def _ctc_table(path: str) -> np.ndarray:
    chars = ["", *load_charset(path), " "]  # blank first, space last (use_space_char)
    return np.array(chars, dtype=object)


def ctc_decode(tensors: Mapping[str, np.ndarray], *, charset: str) -> dict:
    """Stage ``decode``: greedy CTC (PaddleOCR's ``CTCLabelDecode``) of ``rec_prob`` [1, T, C]
    float32 (C = characters + 2) over the ``charset`` file.

    Returns:
        ``text``: [1] unicode; ``score``: [1] float32 (mean kept probability; 0 when empty).

    Raises:
        ValueError: ``rec_prob`` is not [1, T, C] with C matching the character list.
    """
    table = _ctc_table(str(charset))
    prob = np.asarray(tensors["rec_prob"])
    if prob.ndim != 3 or prob.shape[0] != 1 or prob.shape[2] != len(table):
        raise ValueError(f"rec_prob must be [1, T, {len(table)}], got {prob.shape}")
    text, score = decode_ctc(prob[0], table)
    return {
        "text": np.array([text], dtype=f"<U{max(1, len(text))}"),
        "score": np.array([score], dtype=np.float32),
    }


def decode_ctc(prob: np.ndarray, table: np.ndarray) -> tuple[str, float]:
    """Greedy CTC over one [T, C] probability matrix; ``table[i]`` is class i's text."""
    idx = prob.argmax(axis=1)
    keep = idx != 0
    keep[1:] &= idx[1:] != idx[:-1]
    if not keep.any():
        return "", 0.0
    text = "".join(table[idx[keep]])
    score = float(prob[np.arange(len(idx))[keep], idx[keep]].mean())
    return text, score


@functools.cache
def load_tokenizer(path: str, max_length: int = 128) -> Any:
    """A HuggingFace ``tokenizers`` tokenizer from ``tokenizer.json``, truncating to
    ``max_length`` and padding to the longest sentence of a batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(int(max_length))
    tok.enable_padding()
    return tok


def _sentences(value: Any) -> list[str]:
    arr = np.asarray(value).reshape(-1)
    out = []
    for s in arr.tolist():
        out.append(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else str(s))
    return out


def tokenize(
    tensors: Mapping[str, np.ndarray],
    *,
    tokenizer: str,
    max_length: int = 128,
    token_type_ids: bool = True,
) -> dict:
    """Stage ``tokenize``: ``text`` [N] UTF-8 sentences -> WordPiece ``input_ids``,
    ``attention_mask`` (and zero ``token_type_ids``), [N, L] int64, padded to the longest,
    at most ``max_length`` tokens (``tokenizer``: a ``tokenizer.json`` path).

    Raises:
        ValueError: no sentence.
    """
    sentences = _sentences(tensors["text"])
    if not sentences:
        raise ValueError("text must hold at least one sentence")
    enc = load_tokenizer(str(tokenizer), int(max_length)).encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    out = {
        "input_ids": ids,
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }
    if token_type_ids:
        out["token_type_ids"] = np.zeros_like(ids)
    return out


def mean_pool(tensors: Mapping[str, np.ndarray], *, normalize: bool = True) -> dict:
    """Stage ``pool``: ``tokens`` [N, L, D] mean over ``attention_mask`` [N, L], L2-normalised:
    ``embedding`` [N, D] float32 (sentence-transformers' pooling).
    """
    tokens = np.asarray(tensors["tokens"], dtype=np.float32)
    mask = np.asarray(tensors["attention_mask"]).astype(np.float32)[..., None]
    emb = (tokens * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    if normalize:
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return {"embedding": np.ascontiguousarray(emb, dtype=np.float32)}
