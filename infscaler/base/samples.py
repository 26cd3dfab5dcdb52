"""Sample inputs of known content (an image of known text) for the planner's unit profiles,
the tests, the demo and the bench; PIL and matplotlib are imported on first use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["render_text_image"]


@functools.cache
def _font(font_size: int) -> Any:
    import matplotlib
    from PIL import ImageFont

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not path.is_file():
        raise FileNotFoundError(f"DejaVuSans.ttf not found where matplotlib keeps it: {path}")
    return ImageFont.truetype(str(path), font_size)


def render_text_image(
    lines: Sequence[str],
    *,
    font_size: int = 32,
    margin: int = 24,
    line_spacing: float = 1.6,
) -> np.ndarray:
    """Black ``lines`` on white in DejaVu Sans (matplotlib's copy) -> [H, W, 3] uint8 RGB.

    Raises:
        ValueError: no lines, a non-positive font size / spacing, or a negative margin.
        FileNotFoundError: matplotlib's DejaVuSans.ttf is missing.
    """
    from PIL import Image, ImageDraw

    if not lines:
        raise ValueError("render_text_image needs at least one line")
    if font_size < 1 or line_spacing <= 0 or margin < 0:
        raise ValueError(
            f"need font_size >= 1, line_spacing > 0, margin >= 0; got {font_size}, "
            f"{line_spacing}, {margin}"
        )
    font = _font(int(font_size))
    pitch = font_size * line_spacing
    ascent, descent = font.getmetrics()
    width = math.ceil(max(font.getlength(s) for s in lines)) + 2 * margin
    height = math.ceil(2 * margin + pitch * (len(lines) - 1) + ascent + descent)
    img = Image.new("RGB", (max(width, 1), max(height, 1)), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * pitch), line, font=font, fill=(0, 0, 0))
    return np.asarray(img, dtype=np.uint8).copy()
