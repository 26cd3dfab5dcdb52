"""Latency SLOs as the CLI and ``pipeline.yaml`` write them (InfScaler §V-B's "1.5x"),
without importing onnx."""

from __future__ import annotations

import re
from dataclasses import dataclass

from infscaler.base.errors import InfScalerError

__all__ = ["SLO", "parse_slo", "slo_ms"]


@dataclass(frozen=True)
class SLO:
    """A latency SLO: absolute (``ms``) or a multiple of the model's own time (``factor``,
    the paper's "1.5x" convention, §V-B)."""

    ms: float | None = None
    factor: float | None = None

    def resolve(self, t_o_ms: float) -> float | None:
        """The SLO in ms given the measured whole-model time T_o (ms)."""
        if self.factor is not None:
            return self.factor * t_o_ms
        return self.ms

    def __str__(self) -> str:
        if self.factor is not None:
            return f"{self.factor:g}x"
        return "none" if self.ms is None else f"{self.ms:g}ms"


def parse_slo(text: str | float | None) -> SLO:
    """Parse ``100ms``, ``0.1s``, ``100`` (ms), ``1.5x`` (times T_o), or ``none``.

    Raises:
        InfScalerError: anything else, or a non-positive value.
    """
    if text is None:
        return SLO()
    if isinstance(text, int | float):
        value, unit = float(text), "ms"
    else:
        s = text.strip().lower()
        if s in ("", "none"):
            return SLO()
        m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*(ms|s|us|x)?", s)
        if not m:
            raise InfScalerError(
                f"cannot read SLO '{text}'",
                hint="write e.g. --slo 100ms, --slo 0.25s, or --slo 1.5x (times the model's own latency)",
            )
        value, unit = float(m.group(1)), m.group(2) or "ms"
    if value <= 0:
        raise InfScalerError(f"the SLO must be positive, got '{text}'")
    if unit == "x":
        if value < 1:
            raise InfScalerError(
                f"an SLO of {value:g}x the model's own latency can never be met",
                hint="use a factor >= 1, e.g. --slo 1.5x",
            )
        return SLO(factor=value)
    scale = {"ms": 1.0, "s": 1000.0, "us": 0.001}[unit]
    return SLO(ms=value * scale)


def slo_ms(text: str | float) -> float:
    """An absolute SLO in ms: ``200ms`` / ``0.2s`` / ``200`` / ``500us`` -> 200.0 / ... .

    Raises:
        InfScalerError: unreadable, not positive, ``none``, or a factor (``1.5x``: only
            the partitioner knows the model's own latency).
    """
    if str(text).strip().startswith("-"):
        raise InfScalerError(f"the SLO must be positive, got '{text}'", hint="e.g. 200ms")
    try:
        slo = parse_slo(text)
    except InfScalerError as exc:
        raise InfScalerError(exc.message, hint="write e.g. 200ms or 0.2s") from None
    if slo.factor is not None:
        raise InfScalerError(
            f"SLO '{text}' is a factor of the model's own latency; an absolute one is needed here",
            hint="write e.g. 200ms or 0.2s",
        )
    if slo.ms is None:
        raise InfScalerError(f"SLO '{text}' is not a latency", hint="write e.g. 200ms or 0.2s")
    return slo.ms
