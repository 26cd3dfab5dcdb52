"""Region names (infscaler.api.sysshm.SystemSharedMemoryRegistry.register): at most
REGION_NAME_MAX bytes of UTF-8, no '/' and no control character; refused with 400
naming the bound before the key is looked at, over HTTP and gRPC alike (one registry)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from infscaler.api.codec import ProtocolError
from infscaler.api.sysshm import REGION_NAME_MAX, SharedMemoryRegion, SystemSharedMemoryRegistry


@pytest.fixture
def region() -> Iterator[SharedMemoryRegion]:
    key = f"/infscaler-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with SharedMemoryRegion.create(key, 4096) as r:
        yield r
    if os.path.exists("/dev/shm" + key):
        os.unlink("/dev/shm" + key)


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "x" * (REGION_NAME_MAX + 1), "é" * 128, "tab\there", "nl\n", "nul\0", "del\x7f"],
)
def test_bad_region_names_are_refused_naming_the_bound(region, name: str) -> None:
    with SystemSharedMemoryRegistry() as reg:
        with pytest.raises(ProtocolError) as e:
            reg.register(name, region.key, 0, 4096)
        assert e.value.status == 400
        assert f"at most {REGION_NAME_MAX} bytes" in str(e.value)
        assert reg.status() == []


@pytest.mark.parametrize("name", ["x" * REGION_NAME_MAX, "é" * 127, "in put-0.a_b:c"])
def test_names_within_the_bound_are_registered(region, name: str) -> None:
    with SystemSharedMemoryRegistry() as reg:
        reg.register(name, region.key, 0, 4096)
        assert [r["name"] for r in reg.status()] == [name]
