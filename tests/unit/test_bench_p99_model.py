"""bench/p99_model.py's predictions and errors on hand-made figures (no service): the
M/D/c and M/G/c forms of the scaler's P99 model plus the front end's part, and the
relative error's sign (negative: the model is optimistic)."""

from __future__ import annotations

import math

import pytest

from tests.helpers import bench_module


def test_predictions_add_the_front_end_to_each_form() -> None:
    pm = bench_module("p99_model")
    comp = {"compute_p50_ms": 100.0, "compute_p99_ms": 150.0}
    got = pm.predict(5.0, 1, comp, 7.0)
    # M/D/1 at load 0.5 by hand: P(wait) 0.5, decay 2 (1/D - lambda) per s
    md = 100.0 + math.log(0.5 / 0.01) / (2.0 * (10.0 - 5.0)) * 1000.0 + 7.0
    assert got["md_c_ms"] == pytest.approx(md, abs=0.06)
    assert got["mg_c_ms"] > got["md_c_ms"]  # a stretched service waits longer
    assert pm.predict(5.0, 1, {"compute_p50_ms": None, "compute_p99_ms": None}, 7.0) == {
        "md_c_ms": None,
        "mg_c_ms": None,
    }


def test_error_sign_and_missing_figures() -> None:
    pm = bench_module("p99_model")
    assert pm._err(80.0, 100.0) == -0.2  # optimistic
    assert pm._err(130.0, 100.0) == 0.3
    assert pm._err(None, 100.0) is None and pm._err(90.0, None) is None
    assert pm._err(math.inf, 100.0) is None
