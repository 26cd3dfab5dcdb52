"""Service(cpu_wake_latency_us): the PM QoS request is held while the service runs, shown
in its status, dropped at close; refused values fail before anything starts."""

from __future__ import annotations

import os

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.scaling.pmqos import CPU_LATENCY_DEVICE, can_request
from infscaler.service.service import Service

CAN_HOLD = can_request()
#: status()["cpu_wake_latency"] of a service asked for no request
NO_REQUEST = {"requested_us": None, "held": False, "reason": "", "auto": False, "auto_reason": ""}


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, "Auto"])
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


def test_the_default_is_auto_and_holds_nothing_until_an_slo_is_missed(tmp_path):
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        st = svc.status()["cpu_wake_latency"]
        assert st["auto"] is True and st["held"] is False and st["requested_us"] is None


def test_none_requests_nothing(tmp_path):
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64,
                 cpu_wake_latency_us=None) as svc:  # fmt: skip
        assert svc.status()["cpu_wake_latency"] == NO_REQUEST


def test_set_while_serving_takes_and_drops_the_request(tmp_path):
    """set_cpu_wake_latency changes the request in force on a running service (the
    bench's per-configuration switch), validates like the constructor, and None drops it."""
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        assert svc.cpu_wake_latency_held is False
        with pytest.raises(InfScalerError, match="cpu_wake_latency_us"):
            svc.set_cpu_wake_latency(-5)
        assert svc.status()["cpu_wake_latency"]["requested_us"] is None  # unchanged
        held = svc.set_cpu_wake_latency(0)
        status = svc.status()["cpu_wake_latency"]
        assert status["requested_us"] == 0 and status["held"] is held is CAN_HOLD
        assert svc.cpu_wake_latency_in_force_us == (0 if CAN_HOLD else None)
        if not CAN_HOLD:
            assert "cannot open" in status["reason"]
        assert svc.set_cpu_wake_latency(None) is False
        assert svc.status()["cpu_wake_latency"] == NO_REQUEST
        assert svc.cpu_wake_latency_in_force_us is None


def test_set_before_start_is_made_at_start(tmp_path):
    svc = Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64)
    assert svc.set_cpu_wake_latency(0) is False  # not started: nothing held yet
    with svc:
        assert svc.cpu_wake_latency_held is CAN_HOLD
    assert svc.cpu_wake_latency_held is False


def test_auto_holds_only_on_the_autoscalers_word(tmp_path):
    """cpu_wake_latency_us="auto": nothing held at start; hold_cpus_awake (the wake
    policy's decision) takes 0 µs and shows why; a fixed setting ignores the policy."""
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64,
                 cpu_wake_latency_us="auto") as svc:  # fmt: skip
        st = svc.status()["cpu_wake_latency"]
        assert st["auto"] is True and st["held"] is False and st["requested_us"] is None
        svc.hold_cpus_awake(True, "m missed its SLO while 60% of unit 0's items ran after idle")
        st = svc.status()["cpu_wake_latency"]
        assert st["requested_us"] == 0 and st["held"] is CAN_HOLD
        assert st["auto_reason"].startswith("m missed its SLO")
        assert svc.cpu_wake_latency_in_force_us == (0 if CAN_HOLD else None)
        svc.hold_cpus_awake(False, "dropped: no pipeline with an SLO deployed for 60 s")
        st = svc.status()["cpu_wake_latency"]
        assert st["held"] is False and st["requested_us"] is None and st["auto"] is True
        # leaving auto: the policy's word no longer applies
        svc.set_cpu_wake_latency(None)
        svc.hold_cpus_awake(True, "x")
        assert svc.status()["cpu_wake_latency"]["held"] is False
        assert svc.status()["cpu_wake_latency"]["auto"] is False
        # and back to auto: from no request
        svc.set_cpu_wake_latency("auto")
        assert svc.cpu_wake_auto and not svc.cpu_wake_latency_held
        # a policy decision taken before the last change of setting is void
        stale = svc.autoscaler.wake_epoch
        svc.set_cpu_wake_latency("auto")
        assert svc.hold_cpus_awake(True, "stale", epoch=stale) is False
        assert svc.status()["cpu_wake_latency"]["requested_us"] is None
        assert svc.hold_cpus_awake(True, "now", epoch=svc.autoscaler.wake_epoch) is True
        assert svc.status()["cpu_wake_latency"]["requested_us"] == 0


def test_the_service_keeps_the_idle_slowdown_it_served(tmp_path, monkeypatch):
    """A whole model served back to back, then after 60 ms idle each: the autoscaler's
    loop keeps the curve (runtime.idlecurve) where the planner's next deploy finds it."""
    import time

    import numpy as np

    from infscaler.base.config import load_pipeline
    from infscaler.runtime.scaling.idlecurve import curve_path, load_curve
    from tests.helpers import save
    from tests.integration.runtime.planning.test_autoplan import conv_chain

    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    model = save(conv_chain(), tmp_path / "chain.onnx")
    cfg = load_pipeline({"name": "m", "stages": [{"name": "m", "model": str(model), "threads": 1}]})
    x = np.zeros((1, 16, 32, 32), np.float32)
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        svc.autoscaler.learn_interval_s = 0.3
        svc.deploy(cfg)
        for _ in range(15):
            svc.infer("m", {"x": x}, timeout_s=30)
        for _ in range(12):
            time.sleep(0.06)
            svc.infer("m", {"x": x}, timeout_s=30)
        deadline = time.monotonic() + 10
        while not curve_path(model, 1, None).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        pts = load_curve(model, 1, None)
    assert pts, "no curve kept"
    assert all(0.05 <= g < 0.2 and f >= 1.0 for g, f in pts)


def test_auto_takes_the_request_when_a_served_slo_is_missed(tmp_path, monkeypatch):
    """Live: the default (auto) service serves a model under an SLO no request can meet
    (10 µs: the front end alone takes longer, on any host);
    the autoscaler's wake policy sees the miss and holds the CPUs awake (where this
    process may: else the reason why not), and says so in status and its decisions."""
    import time

    import numpy as np

    from infscaler.base.config import load_pipeline
    from tests.helpers import save
    from tests.integration.runtime.planning.test_autoplan import conv_chain

    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    model = save(conv_chain(), tmp_path / "chain.onnx")
    cfg = load_pipeline({
        "name": "m", "slo": "0.01ms",
        "autoscale": {"interval_s": 0.2, "window_s": 1.0, "cooldown_s": 0.5, "hold_s": 1.0,
                      "rate_horizon_s": 1.0, "shed": False},
        "stages": [{"name": "m", "model": str(model), "threads": 1, "max_instances": 1}],
    })  # fmt: skip
    x = np.zeros((1, 16, 32, 32), np.float32)
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        svc.deploy(cfg)
        # 2-3 s on a quiet host; the bound is for a loaded CI host, where one request may
        # wait for its instance: short request timeouts keep the loop looking
        deadline = time.monotonic() + 90
        while not svc.cpu_wake_auto_reason and time.monotonic() < deadline:
            try:
                svc.infer("m", {"x": x}, timeout_s=5)
            except Exception:  # noqa: BLE001 - refused for the SLO: that is a miss too
                time.sleep(0.01)
        st = svc.status()["cpu_wake_latency"]
        assert st["auto_reason"].startswith("m missed its SLO"), st
        assert st["requested_us"] == 0 and st["held"] is CAN_HOLD
        acts = [d["action"] for d in svc.autoscaler.decisions("")]
        assert acts == ["hold_cpus_awake"]
        svc.undeploy("m")
        # held on after the last SLO pipeline left (release_after_s, 60 s)
        assert svc.status()["cpu_wake_latency"]["held"] is CAN_HOLD
    assert svc.cpu_wake_latency_held is False  # dropped with the service


#: a gid standing in for infscaler-pmqos (no /etc/group entry needed: root may chown to it)
PMQOS_GID = 4343


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(CPU_LATENCY_DEVICE),
    reason="needs root (to make a device node) and the PM QoS CPU latency device",
)
def test_the_udev_rules_mode_lets_the_service_user_and_no_client_hold_the_cpus():
    """What systemd/70-infscaler-pmqos.rules makes of /dev/cpu_dma_latency (its GROUP,
    its MODE), tried on a node of the same device made here (CI has no udev): a non-root
    process in that group holds a request, and the kernel's target reads its value while
    it does; a non-root process only in the socket's group cannot open it."""
    import shutil
    import stat
    import struct
    import tempfile
    from pathlib import Path

    from infscaler.runtime.scaling.pmqos import CpuLatencyRequest, CpuLatencyUnavailable
    from tests.integration.api.test_security import GROUP, as_user
    from tests.unit.runtime.scaling.test_pmqos import RULES, _udev_rules

    (rule,) = _udev_rules(RULES.read_text())
    mode = int(rule["MODE"][1], 8)
    d = Path(tempfile.mkdtemp(prefix="isc-pmqos-"))
    try:
        os.chmod(d, 0o711)  # nobody may reach the node, not list the directory
        node = d / "cpu_dma_latency"
        try:
            os.mknod(node, stat.S_IFCHR | mode, os.stat(CPU_LATENCY_DEVICE).st_rdev)
            os.close(os.open(node, os.O_RDONLY))
        except OSError as exc:
            pytest.skip(f"cannot make or open a device node here: {exc.strerror}")
        os.chown(node, 0, PMQOS_GID)
        os.chmod(node, mode)

        def target() -> int:
            fd = os.open(node, os.O_RDONLY)
            try:
                return struct.unpack("=i", os.read(fd, 4))[0]
            finally:
                os.close(fd)

        def hold() -> list:
            may = can_request(str(node))
            with CpuLatencyRequest(7, device=str(node)) as req:
                return [may, req.held, target()]

        before = target()
        may, held, during = as_user(hold, groups=(PMQOS_GID,))
        assert may is True and held is True
        assert during <= min(7, before)  # the kernel took it (the least request wins)

        def client() -> list:
            try:
                CpuLatencyRequest(0, device=str(node)).close()
            except CpuLatencyUnavailable as exc:
                return [can_request(str(node)), str(exc)]
            return [can_request(str(node)), "held"]

        may, refused = as_user(client, groups=(GROUP,))
        assert may is False and "Permission denied" in refused
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize(
    ("setting", "planned"),
    [("auto", 0 if CAN_HOLD else None), (None, None), (0, 0 if CAN_HOLD else None)],
)
def test_the_planner_plans_for_the_wake_up_the_policy_converges_to(
    tmp_path, monkeypatch, setting, planned
):
    """Under auto the deploy-time planner plans for the CPUs held awake (0 µs) wherever
    the request can be made: the policy holds them at the first missed SLO, and whether
    it happens to hold them at the deploy must not change the plan; a fixed setting plans
    for what is in force."""
    import infscaler.service.deploy as deploy_mod
    from infscaler.base.config import load_pipeline
    from tests.helpers import chain_pipeline

    seen = []

    def fake_plan(cfg, **kw):
        seen.append(kw["wake_latency_us"])
        return cfg, None

    monkeypatch.setattr(deploy_mod, "plan_pipeline", fake_plan)
    monkeypatch.setattr(deploy_mod, "needs_planning", lambda cfg: True)
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64,
                 cpu_wake_latency_us=setting) as svc:  # fmt: skip
        assert not svc.cpu_wake_latency_held or setting == 0
        assert svc.cpu_wake_latency_planned_us == planned
        svc._planned(load_pipeline(chain_pipeline()), lambda _m: None, None)
    assert seen == [planned]
