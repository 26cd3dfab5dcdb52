"""The fork server (:mod:`infscaler.runtime.processes.zygote`): instances forked from it, their
memory (PSS) against a spawned instance's, the zygote killed -9 under load (restarted, no
request lost, no slot leaked, instances untouched), the spawn fallback (forced, and while
the zygote is down), a forked instance killed -9 (exit status from the zygote, tokens
reclaimed), and a preloaded module that starts a thread (rejected, the zygote restarted).

Instances are real processes; their functions come from tests/stagefuncs.py.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from onnx import helper

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.pipeline import FRONTEND_INSTANCE
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, f32, make_model, save, wait_for, wait_served
from tests.load import ClosedLoop

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = np.ones((1, 4), np.float32)


def _svc(tmp_path: Path) -> Service:
    return Service(state_dir=tmp_path, control_path="userspace", pool_mb=64)


def _ppid(pid: int) -> int:
    return psutil.Process(pid).ppid()


def relu_pipeline(path: Path, instances: int) -> dict:
    """One model stage with one operator (Relu on FP32 [1, 4])."""
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [f32("x", [1, 4])],
        [f32("y", [1, 4])],
    )
    save(model, path)
    return {
        "name": "relu",
        "stages": [
            {
                "name": "relu",
                "model": str(path),
                "instances": instances,
            }
        ],
    }


def _cap_eff(pid: int) -> int:
    """The effective capability set of ``pid`` (``/proc/PID/status``, ``CapEff``)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("CapEff:"))
    return int(line.split()[1], 16)


def _pss_mb(pids: list[int]) -> list[float]:
    return [psutil.Process(p).memory_full_info().pss / 2**20 for p in pids]


def test_import_of_the_zygote_modules_leaves_one_thread_after_settling() -> None:
    """What the zygote relies on, checked in a fresh child of this test: with onnxruntime's
    telemetry off, the base imports leave one thread once OpenBLAS's pool is joined."""
    import subprocess
    import sys

    code = textwrap.dedent(
        """
        import os
        os.environ["ORT_DISABLE_TELEMETRY"] = "1"
        import importlib
        from infscaler.runtime.processes import zygote
        for m in zygote.BASE_MODULES:
            importlib.import_module(m)
        print(len(zygote._settle_threads()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "1", out.stderr


def test_instances_are_forked_by_the_zygote(tmp_path: Path) -> None:
    with _svc(tmp_path) as svc:
        svc.deploy(load_pipeline(chain_pipeline()))
        z = svc.status()["zygote"]
        assert z["enabled"] and z["ready"] and z["pid"]
        assert z["started"] == {"forked": 2, "spawned": 0}
        assert "stagefuncs" in z["modules"]  # the function module was preloaded
        for pid in [z["pid"], *(h.pid for h in svc.supervisor.handles())]:
            assert _cap_eff(pid) == 0, pid  # the zygote and its instances hold none
        for h in svc.supervisor.handles():
            assert _ppid(h.pid) == z["pid"]
            assert psutil.Process(h.pid).name() == "infscaler-inst"
            assert psutil.Process(h.pid).cpu_affinity() == h.cores  # pinned as before
        np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)
        # every instance reported its PSS, the figure status and the scaler use
        wait_for(
            lambda: all(h.stats.get("pss_mb", 0) > 0 for h in svc.supervisor.handles()),
            10,
            "pss reports",
        )
        unit = svc.status()["pipelines"][0]["units"][1]["instances"][0]
        assert 0 < unit["uss_mb"] <= unit["pss_mb"] <= unit["rss_mb"]


def test_a_forked_instance_has_less_pss_than_a_spawned_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pss = {}
    for way in ("spawned", "forked"):
        monkeypatch.setenv("INFSCALER_ZYGOTE", "0" if way == "spawned" else "1")
        (tmp_path / way).mkdir()
        with _svc(tmp_path / way) as svc:
            svc.deploy(load_pipeline(relu_pipeline(tmp_path / way / "relu.onnx", 3)))
            assert svc.supervisor.started_by[way] == 3
            np.testing.assert_allclose(svc.infer("relu", {"x": -X}).outputs["y"], 0 * X)
            pss[way] = float(np.mean(_pss_mb([h.pid for h in svc.supervisor.handles()])))
    # spawned: ~45 MB private each; forked: a few MB private plus a share of the zygote's
    assert pss["forked"] < 0.75 * pss["spawned"], pss


def _send(svc: Service) -> bool:
    """One request through ``chain``: whether its answer is right."""
    x = np.random.default_rng().standard_normal((1, 4)).astype(np.float32)
    return bool(np.allclose(svc.infer("chain", {"x": x}).outputs["y"], 2 * x))


def _no_leaked_slots(svc: Service) -> None:
    """Every slot in use is owned by a live instance or the front end."""
    live = {h.iid for h in svc.supervisor.handles()} | {FRONTEND_INSTANCE}
    pool = svc.pool.stats()
    owners = {int(k): v for k, v in pool["owners"].items() if v}
    assert set(owners) <= live, (owners, live)
    assert pool["slots_in_use"] == sum(owners.values()), pool


def test_zygote_killed_under_load_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    with _svc(tmp_path) as svc:
        dep = svc.deploy(load_pipeline(chain_pipeline(ms=3)))
        before = {h.iid: h.pid for h in svc.supervisor.handles()}
        old = svc.supervisor.zygote.pid
        load = ClosedLoop(lambda: _send(svc), 3).start()
        results = load.results
        try:
            wait_for(lambda: len(results) >= 20, 30, "load before the kill")
            os.kill(old, signal.SIGKILL)
            new = wait_for(
                lambda: (p := svc.supervisor.zygote.pid) not in (None, old) and p,
                30,
                "the zygote restarted",
            )
            n = len(results)
            wait_for(lambda: len(results) >= n + 20, 30, "load after the kill")
            # scale out after the restart: forked by the new zygote
            h = svc.scale_out(dep, 1, "cpu")
            svc.supervisor.wait_ready([h], 60)
            assert _ppid(h.pid) == new
            n = len(results)
            wait_for(lambda: len(results) >= n + 20, 30, "load after the scale-out")
        finally:
            load.stop(60)
        assert not load.errors, load.errors[:5]
        assert results and all(results)
        # the running instances were not touched
        after = {h.iid: h.pid for h in svc.supervisor.handles()}
        assert {i: after.get(i) for i in before} == before
        assert svc.supervisor.restarted == 0 and svc.supervisor.zygote.restarts == 1
        assert svc.status()["manager"]["failed"] == 0
        wait_for(lambda: svc.frontend.stats()["pending"] == 0, 10, "nothing pending")
        _no_leaked_slots(svc)
        np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)


def test_forced_spawn_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFSCALER_ZYGOTE", "0")
    with _svc(tmp_path) as svc:
        svc.deploy(load_pipeline(chain_pipeline()))
        z = svc.status()["zygote"]
        assert z["enabled"] is False and z["started"] == {"forked": 0, "spawned": 2}
        for h in svc.supervisor.handles():
            assert _ppid(h.pid) == os.getpid()
        np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)


def test_instances_spawn_while_the_zygote_is_down(tmp_path: Path) -> None:
    with _svc(tmp_path) as svc:
        dep = svc.deploy(load_pipeline(chain_pipeline()))
        svc.supervisor.zygote.close()  # down for good: no restart
        h = svc.scale_out(dep, 1, "cpu")
        svc.supervisor.wait_ready([h], 60)
        assert _ppid(h.pid) == os.getpid()
        assert svc.supervisor.started_by == {"forked": 2, "spawned": 1}
        for _ in range(4):
            np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)


def test_a_forked_instance_killed_is_reaped_reclaimed_and_restarted(tmp_path: Path) -> None:
    with _svc(tmp_path) as svc:
        svc.deploy(load_pipeline(chain_pipeline(ms=300)))
        victim = next(h for h in svc.supervisor.handles() if h.unit.name == "slow")
        inside = svc.submit("chain", {"x": X})
        time.sleep(0.1)  # the request is in the slow instance now (or queued for it)
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: victim.exit_code is not None, 10, "the exit status")
        assert victim.exit_code == -signal.SIGKILL  # reported by the zygote that reaped it
        back = wait_for(
            lambda: next(
                (
                    h
                    for h in svc.supervisor.handles()
                    if h.unit.name == "slow" and h.state == "ready" and h.pid != victim.pid
                ),
                None,
            ),
            60,
            "the replacement",
        )
        assert _ppid(back.pid) == svc.supervisor.zygote.pid
        np.testing.assert_allclose(inside.result(timeout=60).outputs["y"], 2 * X)
        assert svc.status()["manager"]["deaths"] >= 1
        assert not psutil.pid_exists(victim.pid) or (
            psutil.Process(victim.pid).status() == psutil.STATUS_ZOMBIE
        )
        wait_for(lambda: svc.frontend.stats()["pending"] == 0, 10, "nothing pending")
        _no_leaked_slots(svc)


def test_an_instance_whose_zygote_died_dies_with_an_unknown_status_and_is_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A forked instance outlives its zygote (reparented); when it dies later no one can
    report its exit status: the supervisor still sees the exit (its pidfd), says the
    status is unknown and why (not "status None"), and restarts it."""
    import logging

    with _svc(tmp_path) as svc:
        svc.deploy(load_pipeline(chain_pipeline()))
        victim = next(h for h in svc.supervisor.handles() if h.unit.name == "slow")
        old = svc.supervisor.zygote.pid
        assert _ppid(victim.pid) == old
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: svc.supervisor.zygote.pid not in (None, old), 30, "the zygote restarted")
        with caplog.at_level(logging.WARNING):
            os.kill(victim.pid, signal.SIGKILL)
            wait_for(lambda: victim.state in ("exited", "failed"), 10, "the exit seen")
        assert victim.exit_code is None
        assert "died with status unknown (its zygote died first)" in caplog.text
        wait_for(
            lambda: any(
                h.unit.name == "slow" and h.state == "ready" and h.pid != victim.pid
                for h in svc.supervisor.handles()
            ),
            60,
            "the replacement",
        )
        wait_served(svc, "chain")  # the route learns of it just after the handle
        np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)


def test_a_preloaded_module_that_starts_a_thread_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "threadmod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{mods}{os.pathsep}{os.environ['PYTHONPATH']}")
    with _svc(tmp_path) as svc:
        zy = svc.supervisor.zygote
        wait_for(lambda: zy.status()["ready"], 60, "the zygote ready")
        first = zy.pid
        errors = svc.supervisor.preload(["threadmod"])
        assert "started threads" in errors["threadmod"]
        assert "threadmod" not in zy.status()["modules"]
        wait_for(lambda: zy.pid not in (None, first) and zy.status()["ready"], 30, "restart")
        svc.deploy(load_pipeline(chain_pipeline()))
        assert svc.supervisor.started_by["forked"] == 2


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_zygote_killed_while_forking_leaves_no_ghost(tmp_path: Path) -> None:
    """Scale-outs in flight when the zygote dies: each ends with one ready instance
    (forked, or spawned as the fallback); a child forked whose pid never reached the
    service exits by itself (its channel socket is closed), so none serves twice."""
    with _svc(tmp_path) as svc:
        dep = svc.deploy(load_pipeline(chain_pipeline(max_instances=8)))
        old = svc.supervisor.zygote.pid
        got: list = []
        errors: list = []

        def grow() -> None:
            try:
                got.append(svc.scale_out(dep, 1, "cpu"))
            except Exception as exc:  # noqa: BLE001 - the test asserts there is none
                errors.append(repr(exc))

        threads = [threading.Thread(target=grow) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.01)
        os.kill(old, signal.SIGSTOP)  # freeze it: its children are then final
        children = [p.pid for p in psutil.Process(old).children()]
        os.kill(old, signal.SIGKILL)
        for t in threads:
            t.join(120)
        assert not errors, errors
        svc.supervisor.wait_ready(got, 120)
        live = {h.pid for h in svc.supervisor.handles()}
        assert len(live) == 2 + 4
        ghosts = [p for p in children if p not in live]
        wait_for(lambda: all(_gone(p) for p in ghosts), 60, f"ghost children {ghosts} gone")
        st = svc.supervisor.started_by
        assert st["forked"] + st["spawned"] >= 6
        for _ in range(6):
            np.testing.assert_allclose(svc.infer("chain", {"x": X}).outputs["y"], 2 * X)
        wait_for(lambda: svc.supervisor.zygote.pid not in (None, old), 30, "the zygote back")
