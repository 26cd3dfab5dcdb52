"""Rates and SLOs as the planning commands read them from the command line."""

from __future__ import annotations

import re

from infscaler.base.errors import InfScalerError
from infscaler.base.slo import slo_ms

__all__ = ["parse_rate", "parse_slo_ms"]

_NUMBER = r"([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)"


def parse_rate(text: str) -> float:
    """``40/s``, ``40``, ``40rps``, ``2400/min`` -> requests per second.

    Raises:
        InfScalerError: unreadable, zero or negative.
    """
    s = str(text).strip().lower()
    if s.startswith("-"):
        raise InfScalerError(f"the rate must be positive, got '{text}'", hint="e.g. --rate 40/s")
    m = re.fullmatch(_NUMBER + r"\s*(/s|/sec|rps|/min|/m)?", s)
    if not m:
        raise InfScalerError(
            f"cannot read rate '{text}'", hint="write requests per second: --rate 40/s or --rate 40"
        )
    value = float(m.group(1)) / (60.0 if m.group(2) in ("/min", "/m") else 1.0)
    if not value > 0:
        raise InfScalerError(f"the rate must be positive, got '{text}'", hint="e.g. --rate 40/s")
    return value


def parse_slo_ms(text: str) -> float:
    """``200ms``, ``0.2s``, ``200`` (ms) -> ms (:func:`infscaler.base.slo.slo_ms`);
    a factor (``1.5x``) or ``none`` is refused: the plan needs an absolute end-to-end SLO.

    Raises:
        InfScalerError: unreadable, zero or negative, a factor, or none.
    """

    try:
        return slo_ms(text)
    except InfScalerError as exc:
        raise InfScalerError(
            f"--slo: {exc.message}", hint="e.g. --slo 200ms or --slo 0.2s"
        ) from None
