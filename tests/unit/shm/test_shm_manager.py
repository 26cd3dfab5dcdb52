"""Tensor sharing manager constants: the reserved stage, instance and request values do not
collide with real ones. The manager and instance client end to end (instances as processes)
are in tests/integration/shm/test_shm_manager.py."""

from __future__ import annotations

from infscaler.ebpf.channel import MAX_HOPS
from infscaler.shm.manager import (
    BARRIER_HOP,
    CONTROL_HOP,
    MANAGER_INSTANCE,
    NO_REQUEST,
)

# -- tests ---------------------------------------------------------------------------------------


def test_reserved_values_do_not_collide() -> None:
    assert BARRIER_HOP == MAX_HOPS - 1
    assert CONTROL_HOP > MAX_HOPS and MANAGER_INSTANCE == 0xFFFF
    assert NO_REQUEST == (1 << 64) - 1
