"""The request parameters ``priority`` and ``timeout`` (Triton's; infscaler.api.codec):
parsed, and refused with a 400 naming the bound."""

from __future__ import annotations

import pytest

from infscaler.api.codec import ProtocolError, check_parameters, parse_queue_params


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, (None, None)),
        ({"priority": 0}, (0, None)),
        ({"priority": 2, "timeout": 1500}, (2, 1500)),
    ],
)
def test_the_request_parameters_priority_and_timeout(params, expected) -> None:
    assert parse_queue_params(params) == expected


@pytest.mark.parametrize(
    "params",
    [{"priority": -1}, {"priority": True}, {"priority": "1"}, {"priority": 1.0},
     {"timeout": -5}, {"timeout": 2.5}, {"timeout": 3_600_000_001}],
)  # fmt: skip
def test_bad_request_parameters_are_400(params) -> None:
    with pytest.raises(ProtocolError, match="must be an integer 0 - "):
        check_parameters(params, "request")
