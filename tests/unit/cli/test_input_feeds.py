"""``--input`` / ``--image`` parsing shared by ``infer`` and ``plan``
(:func:`infscaler.cli.client.input_feeds`)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from infscaler.base.errors import InfScalerError
from infscaler.cli.client import input_feeds


def test_npy_inputs_load_by_name(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "a.npy", a)
    feeds = input_feeds([f"x={tmp_path / 'a.npy'}"], None, "a model", "m", ["x"], [])
    assert list(feeds) == ["x"]
    np.testing.assert_array_equal(feeds["x"], a)


@pytest.mark.parametrize("item", ["x", "=a.npy"])
def test_malformed_item_is_refused(item):
    with pytest.raises(InfScalerError, match="bad --input"):
        input_feeds([item], None, "a model", "m", ["x"], [])


def test_unreadable_file_names_the_input(tmp_path):
    with pytest.raises(InfScalerError, match="for input x"):
        input_feeds([f"x={tmp_path / 'missing.npy'}"], None, "a model", "m", ["x"], [])


def test_image_goes_to_the_one_uint8_input(tmp_path):
    Image.new("RGB", (5, 4), (10, 20, 30)).save(tmp_path / "i.png")
    feeds = input_feeds([], tmp_path / "i.png", "a pipeline", "p", ["image"], ["image"])
    assert feeds["image"].shape == (4, 5, 3)
    assert feeds["image"].dtype == np.uint8


def test_image_needs_exactly_one_uint8_input(tmp_path):
    Image.new("RGB", (2, 2)).save(tmp_path / "i.png")
    with pytest.raises(InfScalerError, match=r"--image needs a model with one UINT8 input; m has"):
        input_feeds([], tmp_path / "i.png", "a model", "m", ["a", "b"], ["a", "b"])
