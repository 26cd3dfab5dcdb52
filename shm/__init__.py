"""Token-based zero-copy tensor sharing on shared / unified memory (InfScaler §IV-B, Fig. 4).

- :class:`~infscaler.ebpf.token.Token` (re-exported; it lives with the channel) names a slot.
- :mod:`.pool` (:class:`TensorPool`, the manager's slabs, leases and cap), :mod:`.slabmap`
  (:class:`SlabMap`, instances attach slabs by name), :mod:`.slab` (their shared format),
  :mod:`.cleanup` (what a killed service left); :mod:`.tensors`: the slot layout.
- :mod:`.protocol`, :mod:`.manager` (:class:`TensorSharingManager`), :mod:`.reclaim`,
  :mod:`.lease` and :mod:`.client` (:class:`InstanceClient`): the sharing protocol, its
  two sides, dead instances and the lease table.
- :mod:`.unified`: Jetson unified memory, slabs the iGPU / DLA read in place.

More (details, why it is so, history, figures): docs/architecture.md, "`shm/__init__.py`".
"""

from infscaler.ebpf.token import TOKEN_SIZE, Token, TokenError, TokenKind
from infscaler.shm.cleanup import remove_stale_slabs
from infscaler.shm.client import InstanceClient
from infscaler.shm.manager import TensorSharingManager
from infscaler.shm.pool import TensorPool
from infscaler.shm.protocol import BackPressureError, RequestFailed, SharingError
from infscaler.shm.reclaim import ReclaimReport
from infscaler.shm.slab import DEFAULT_SIZE_CLASSES, PoolError, SlotRef, slab_name
from infscaler.shm.slabmap import SlabMap
from infscaler.shm.tensors import (
    SlotFormatError,
    allocate_tensors,
    read_tensors,
    tensors_nbytes,
    write_tensors,
)
from infscaler.shm.unified import (
    UnifiedMemoryUnavailable,
    UnifiedSlab,
    UnifiedSlabMap,
    unified_memory_available,
)

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
    "UnifiedSlabMap",
    "allocate_tensors",
    "read_tensors",
    "remove_stale_slabs",
    "slab_name",
    "tensors_nbytes",
    "unified_memory_available",
    "write_tensors",
]
