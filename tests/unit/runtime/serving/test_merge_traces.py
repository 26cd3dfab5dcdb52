"""A request's trace from its tokens' traces (:func:`~infscaler.runtime.serving.route.merge_traces`):
the same rows as ``np.unique`` of them all, with or without its fast path."""

from __future__ import annotations

import numpy as np
import pytest

from infscaler.runtime.serving.route import merge_traces


def rows(*r: tuple[int, int, int, int]) -> np.ndarray:
    return np.array(r, dtype=np.int64).reshape(-1, 4)


@pytest.mark.parametrize(
    "traces",
    [
        [],
        [rows()],
        [rows((0, 3, 10, 20))],
        [rows((0, 3, 10, 20), (1, 4, 21, 30), (2, 5, 31, 40))],  # a chain: the fast path
        [rows((1, 4, 21, 30), (0, 3, 10, 20))],  # not in unit order: sorted
        [rows((0, 3, 10, 20), (0, 3, 10, 20))],  # a repeated row: kept once
        # fan-out items repeat the row of the unit before the fan-out
        [rows((0, 3, 10, 20), (1, 4, 21, 30)), rows((0, 3, 10, 20), (1, 5, 22, 33))],
    ],
)
def test_merge_traces_is_the_unique_rows(traces: list[np.ndarray]) -> None:
    got = merge_traces(traces)
    want = np.unique(np.concatenate(traces), axis=0) if traces else np.zeros((0, 4), np.int64)
    assert got.dtype == np.int64 and got.shape[1:] == (4,)
    np.testing.assert_array_equal(got, want)
