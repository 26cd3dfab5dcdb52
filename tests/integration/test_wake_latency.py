"""Service(cpu_wake_latency_us): the PM QoS request is held while the service runs, shown
in its status, dropped at close; refused values fail before anything starts."""

from __future__ import annotations

import os

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.pmqos import CPU_LATENCY_DEVICE
from infscaler.service import Service

CAN_HOLD = os.access(CPU_LATENCY_DEVICE, os.W_OK)


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_bad_values_are_refused_before_start(tmp_path, bad):
    with pytest.raises(InfScalerError, match="cpu_wake_latency_us"):
        Service(state_dir=tmp_path / "s", cpu_wake_latency_us=bad)


def test_held_while_serving_or_the_reason_why_not(tmp_path):
    svc = Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64,
                  cpu_wake_latency_us=0)  # fmt: skip
    with svc:
        status = svc.status()["cpu_wake_latency"]
        assert status["requested_us"] == 0
        if CAN_HOLD:
            assert status["held"] is True and status["reason"] == ""
        else:
            assert status["held"] is False and "cannot open" in status["reason"]
    assert svc.cpu_wake_latency_held is False  # dropped with the service


def test_none_requests_nothing(tmp_path):
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        assert svc.status()["cpu_wake_latency"] == {
            "requested_us": None,
            "held": False,
            "reason": "",
        }
