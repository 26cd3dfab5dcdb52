"""The API's edge without a service (issue 13): the error token's status, the OCR prep's
declared input error, function output specs reaching the metadata, and the JSON nesting
scan. Malformed input against a live service is in tests/integration/api/test_reliability_edge.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from tests import TESTS_DIR

HERE = TESTS_DIR  # tests/: stagefuncs.py, api_edge.py


def test_error_token_carries_the_status() -> None:
    from infscaler.runtime.serving.pipeline import encode_error, error_status

    assert error_status(encode_error("bad image", 400)) == (400, "bad image")
    assert error_status(encode_error("boom")) == (500, "boom")
    assert error_status(encode_error("x", 400))[1] == "x"
    legacy = np.frombuffer(b"stage a: boom", np.uint8)  # no status prefix: 500
    assert error_status(legacy) == (500, "stage a: boom")


def test_ocr_prep_refuses_empty_images_with_the_declared_error() -> None:
    from infscaler.pipelines.ocr import check_image
    from infscaler.runtime.serving.instance import StageError, StageInputError

    for bad in (np.zeros((0, 0, 3), np.uint8), np.zeros((5, 0, 3), np.uint8)):
        with pytest.raises(StageInputError, match="empty"):
            check_image(bad, "image")
    with pytest.raises(StageInputError, match="HxWx3 uint8"):
        check_image(np.zeros((4, 4), np.float32), "image")
    assert issubclass(StageInputError, StageError) and issubclass(StageInputError, ValueError)
    assert StageInputError.status == 400


def test_function_outputs_spec_reaches_the_metadata(tmp_path: Path) -> None:
    from infscaler.base.errors import ConfigError
    from infscaler.runtime.serving.pipeline import compile_pipeline

    sys.path.insert(0, str(HERE))
    cfg = {
        "name": "f",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["x2"],
        "stages": [
            {"name": "c", "function": "api_edge:check_rows", "inputs": ["x"], "outputs": ["x2"]}
        ],
    }
    cp = compile_pipeline(load_pipeline(cfg), state_dir=tmp_path)
    assert cp.outputs == [{"name": "x2", "datatype": "FP32", "shape": [-1, 4]}]
    bad = dict(cfg, outputs=["z"], stages=[dict(cfg["stages"][0], outputs=["z"])])
    with pytest.raises(ConfigError, match="outputs_spec"):
        compile_pipeline(load_pipeline(bad), state_dir=tmp_path)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    from infscaler.api.codec import ProtocolError, decode_infer_request

    text = "[" * 200 + "{" * 100  # 300 brackets in a string: depth 3 in fact
    doc = {"id": text, "inputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    req = decode_infer_request(json.dumps(doc).encode(), header_length=None)
    assert req.inputs["s"][0] == text.encode() and req.id == text
    deep = '{"inputs": ' + "[" * 65 + "]" * 65 + "}"
    with pytest.raises(ProtocolError, match="nested 66 levels deep; at most 64"):
        decode_infer_request(deep.encode(), header_length=None)
