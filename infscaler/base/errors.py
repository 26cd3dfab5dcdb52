"""Errors raised to users: :class:`InfScalerError` says what was wrong and what to do; the CLI
prints it without a traceback and exits with its ``exit_code``.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InfScalerError",
    "ModelLoadError",
    "ModelNotInstalledError",
    "PartitionError",
    "ShapeError",
    "VerificationError",
]


class InfScalerError(Exception):
    """Base class of user-facing errors: ``message`` (what was wrong) and ``hint`` (what to do)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nHint: {self.hint}"


class ModelLoadError(InfScalerError):
    """The model file is missing, unreadable, not ONNX, invalid, or cannot run."""


class ShapeError(InfScalerError):
    """Shapes cannot be inferred, or dynamic dimensions have no concrete value."""


class PartitionError(InfScalerError):
    """No plan satisfies the request (SLO, number of partitions, valid cuts)."""


class VerificationError(InfScalerError):
    """The chain of partitions does not reproduce the whole model within tolerance."""


class ModelNotInstalledError(InfScalerError):
    """A bundled model alias names a model whose pip package is not installed."""


class ConfigError(InfScalerError):
    """A configuration file (device profile, pipeline) is invalid."""


class ServiceError(InfScalerError):
    """A refused service operation; ``status``: the HTTP status (400, 404, 409, 503)."""

    def __init__(self, message: str, status: int = 400, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
