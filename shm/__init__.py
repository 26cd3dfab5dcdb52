"""Token-based zero-copy tensor sharing on shared / unified memory (InfScaler §IV-B, Fig. 4).

- :mod:`infscaler.shm.token` -- the 32-byte token that names a slot (and the control
  path's message kinds: DATA, FAULT, GRANT, FREE, BUSY, ERROR).
- :mod:`infscaler.shm.pool` -- :class:`TensorPool` (manager side: POSIX shared-memory
  slabs carved into slots by size class, lazy allocation on token faults up to a memory
  cap with back-pressure, leases, reclaim, idle release) and :class:`SlabMap` (instance
  side: attach slabs by name, zero copy).
- :mod:`infscaler.shm.tensors` -- the slot layout: named numpy tensors behind a small
  header, read as zero-copy views.
- :mod:`infscaler.shm.manager` -- :class:`TensorSharingManager` (the service's token
  fault / free / handover-receipt / reclaim loop on the control channel) and
  :class:`InstanceClient` (an instance's OutToken queue, faults, handover, inputs);
  leases stay true across in-kernel handovers and instance deaths. Imported on first
  use (it needs :mod:`infscaler.ebpf`, which imports this package).
- :mod:`infscaler.shm.unified` -- Jetson unified memory: register a slab with CUDA so
  the iGPU / DLA read it in place (pycuda, imported lazily; reports unavailability).

A producer's path: FAULT for ``tensors_nbytes(outputs)`` -> GRANT token ->
``SlabMap.slot_view(token)`` -> ``allocate_tensors`` / ``write_tensors`` -> DATA token to
the next stage -> the consumer's ``read_tensors(slab_map.slot_view(token))`` -> FREE.
"""

from infscaler.shm.pool import (
    DEFAULT_SIZE_CLASSES,
    PoolError,
    SlabMap,
    SlotRef,
    TensorPool,
    remove_stale_slabs,
    slab_name,
)
from infscaler.shm.tensors import (
    SlotFormatError,
    allocate_tensors,
    read_tensors,
    tensors_nbytes,
    write_tensors,
)
from infscaler.shm.token import TOKEN_SIZE, Token, TokenError, TokenKind
from infscaler.shm.unified import (
    UnifiedMemoryUnavailable,
    UnifiedSlab,
    unified_memory_available,
)

_MANAGER_NAMES = (
    "BackPressureError",
    "InstanceClient",
    "ReclaimReport",
    "RequestFailed",
    "SharingError",
    "TensorSharingManager",
)


def __getattr__(name: str):
    """Lazy exports of :mod:`infscaler.shm.manager` (avoids an import cycle with
    :mod:`infscaler.ebpf`, whose channel imports :mod:`infscaler.shm.token`)."""
    if name in _MANAGER_NAMES:
        from infscaler.shm import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_SIZE_CLASSES",
    "TOKEN_SIZE",
    "BackPressureError",
    "InstanceClient",
    "PoolError",
    "ReclaimReport",
    "RequestFailed",
    "SharingError",
    "SlabMap",
    "SlotFormatError",
    "SlotRef",
    "TensorPool",
    "TensorSharingManager",
    "Token",
    "TokenError",
    "TokenKind",
    "UnifiedMemoryUnavailable",
    "UnifiedSlab",
    "allocate_tensors",
    "read_tensors",
    "remove_stale_slabs",
    "slab_name",
    "tensors_nbytes",
    "unified_memory_available",
    "write_tensors",
]
