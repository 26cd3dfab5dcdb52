"""Errors raised to users.

Every error a user can cause (bad model file, bad option, infeasible SLO) is an
:class:`InfScalerError` whose message says what was wrong and what to do. The CLI
prints the message (no traceback) and exits with :attr:`InfScalerError.exit_code`.
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
    """Base class of user-facing errors.

    Args:
        message: what was wrong, in one or two sentences.
        hint: what to do about it (printed on its own line by the CLI).
    """

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
    """A service operation was refused (unknown pipeline, no free stage ids, ...).

    Attributes:
        status: the HTTP status the API answers with (400, 404, 409, 503).
    """

    def __init__(self, message: str, status: int = 400, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
