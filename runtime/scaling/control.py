"""What the runtime's control loop needs of the service: :class:`ScaledService` and
:class:`DeploymentView`, PEP 544 structural types the facade's ``Service`` satisfies, so
the runtime imports nothing above it and a test can drive it with any object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from infscaler.base.device import DeviceProfile
    from infscaler.ebpf.channel import Channel
    from infscaler.runtime.processes.supervisor import Supervisor
    from infscaler.runtime.serving.frontend import FrontEnd
    from infscaler.runtime.serving.pipeline import CompiledPipeline
    from infscaler.shm.pool import TensorPool

__all__ = ["DeploymentView", "ScaledService"]


class DeploymentView(Protocol):
    """A deployed pipeline as the control loop reads it
    (:class:`infscaler.service.service.Deployment`)."""

    @property
    def name(self) -> str: ...

    @property
    def pipeline(self) -> CompiledPipeline: ...

    @property
    def route(self) -> Any:
        """The front end's route of the pipeline (its queue limit, its pending count)."""


class ScaledService(Protocol):
    """The service as the auto-scaler and the monitor use it: its ``supervisor``
    (``handles()``, ``command()``), ``frontend`` (``pending(route)``), ``channel``
    (``stats()``) and ``pool`` (``stats()["mapped_bytes"]``)."""

    supervisor: Supervisor
    frontend: FrontEnd
    channel: Channel
    pool: TensorPool

    def deployments(self) -> Sequence[DeploymentView]:
        """The deployed pipelines."""
        ...

    def device_profile(self) -> DeviceProfile:
        """The device profile whose limits apply (R^m, engine slots)."""
        ...

    def scale_out(self, dep: Any, unit: int, engine: str) -> Any:
        """Start one more instance of ``unit`` on ``engine``; its handle."""
        ...

    def scale_in(self, dep: Any, unit: int, engine: str) -> bool:
        """Stop one instance of ``unit`` on ``engine``; False when none could go."""
        ...

    def scale_threads(
        self, dep: Any, unit: int, threads: int, from_threads: int | None = None
    ) -> bool:
        """Re-pin ``unit``'s instances to ``threads`` intra-op threads (make before break)."""
        ...

    def set_queue_limit(self, dep: Any, limit: int | None, reason: str = "") -> None:
        """Bound (or unbound: None) the pipeline's queue at the front end."""
        ...

    def switch_configuration(self, dep: Any, live: Any) -> Any:
        """Deploy the live check's other configuration of ``dep`` in its place,
        make-before-break (``live``: the plan once it serves); the new deployment."""
        ...
