"""Fixtures of the integration tests: the eBPF control path's availability and the channel
kinds a test runs on (processes and eBPF loads are allowed here, not in tests/unit/)."""

from __future__ import annotations

import pytest

from infscaler.ebpf import ebpf_available


@pytest.fixture(scope="session")
def ebpf_status() -> tuple[bool, str]:
    """(available, reason) of the eBPF control path on this host."""
    return ebpf_available()


@pytest.fixture(params=["ebpf", "userspace"])
def kind(request: pytest.FixtureRequest, ebpf_status: tuple[bool, str]) -> str:
    """Each control-path channel kind; 'ebpf' skips with the reason where unavailable."""
    if request.param == "ebpf" and not ebpf_status[0]:
        pytest.skip(f"eBPF channel unavailable on this host: {ebpf_status[1]}")
    return request.param
