"""Token-based zero-copy tensor sharing on shared / unified memory (InfScaler §IV-B, Fig. 4).

- :class:`~infscaler.ebpf.token.Token` (re-exported here; it lives with the channel that
  routes it) -- the 32-byte token that names a slot (and the control path's message
  kinds: DATA, FAULT, GRANT, FREE, BUSY, ERROR).
- :mod:`infscaler.shm.pool` -- :class:`TensorPool` (manager side: POSIX shared-memory
  slabs carved into slots by size class, lazy allocation on token faults up to a memory
  cap with back-pressure, leases, reclaim, idle release, validation and stats);
  :mod:`infscaler.shm.slabmap` -- :class:`SlabMap` (instance side: attach slabs by name,
  zero copy); :mod:`infscaler.shm.slab` -- what both share (slab names and header,
  size classes, :class:`SlotRef`, :class:`PoolError`); :mod:`infscaler.shm.cleanup` --
  the slabs a killed service left (pool records, stale-slab removal).
- :mod:`infscaler.shm.tensors` -- the slot layout: named numpy tensors behind a small
  header, read as zero-copy views.
- :mod:`infscaler.shm.protocol` -- the tensor sharing protocol (tokens, rules, reserved
  ids) and its errors; :mod:`infscaler.shm.manager` -- :class:`TensorSharingManager`, the
  service's token fault / free / handover-receipt loop on the control channel, with
  :mod:`infscaler.shm.reclaim` (what a dead instance held) and :mod:`infscaler.shm.lease`
  (lease roles, instance states, the one table of their legal moves);
  :mod:`infscaler.shm.client` -- :class:`InstanceClient`, an instance's OutToken queue,
  faults, handover and inputs. Leases stay true across in-kernel handovers and deaths.
- :mod:`infscaler.shm.unified` -- Jetson unified memory: slabs the iGPU / DLA read in place.

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
