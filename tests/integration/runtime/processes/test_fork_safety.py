"""Fork safety with CUDA (:mod:`infscaler.runtime.processes.zygote`): the zygote checks,
before every fork, that no CUDA library (libcuda, libcudart, libnvinfer) is mapped into
it, since a CUDA context does not survive fork(). Here with a CPU pipeline (the check
runs; the zygote and the service are CUDA-free), and on a GPU host with a gpu pipeline:
a GPU instance killed -9 is restarted (forked again) and the zygote and the service stay
CUDA-free while the instances map CUDA. The GPU test skips with the reason elsewhere.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.procutil import cuda_libraries_mapped
from infscaler.engines import available
from infscaler.service.service import Service
from tests.helpers import wait_for, wait_served
from tests.integration.runtime.processes.test_zygote import relu_pipeline

X = np.array([[1.0, -2.0, 3.0, -4.0]], np.float32)


def _maps(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return cuda_libraries_mapped(f.read())


def _deploy(svc: Service, tmp_path: Path, engine: str, instances: int) -> None:
    spec = relu_pipeline(tmp_path / "relu.onnx", instances)
    spec["stages"][0]["engine"] = engine
    svc.deploy(load_pipeline(spec))


def test_the_zygote_checks_every_fork_and_stays_cuda_free(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        _deploy(svc, tmp_path, "cpu", 2)
        np.testing.assert_array_equal(svc.infer("relu", {"x": X}).outputs["y"], np.maximum(X, 0))
        z = svc.status()["zygote"]
        assert z["started"]["forked"] == 2
        assert z["cuda_free_forks"] == 2  # the check ran before each fork, and passed
        assert _maps(z["pid"]) == []
        assert _maps(os.getpid()) == []  # the service process: availability asked no CUDA


_GPU, _WHY = available("gpu")


@pytest.mark.skipif(not _GPU, reason=f"no gpu engine on this host: {_WHY}")
def test_gpu_instances_killed_and_restarted_leave_the_zygote_cuda_free(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        _deploy(svc, tmp_path, "gpu", 2)
        np.testing.assert_array_equal(svc.infer("relu", {"x": X}).outputs["y"], np.maximum(X, 0))
        z = svc.status()["zygote"]
        assert z["started"]["forked"] == 2 and z["cuda_free_forks"] == 2
        handles = [h for h in svc.supervisor.handles() if h.unit.name == "relu"]
        assert all(_maps(h.pid) for h in handles)  # the instances run CUDA
        victim = handles[0]
        os.kill(victim.pid, signal.SIGKILL)
        back = wait_for(
            lambda: next(
                (h for h in svc.supervisor.handles()
                 if h.unit.name == "relu" and h.state == "ready" and h.pid not in {x.pid for x in handles}),
                None,
            ),
            120,
            "the replacement GPU instance",
        )  # fmt: skip
        assert _maps(back.pid), "the replacement runs CUDA"
        wait_served(svc, "relu")  # the route learns of it just after the handle
        z = svc.status()["zygote"]
        assert z["started"]["forked"] == 3 and z["cuda_free_forks"] == 3
        assert _maps(z["pid"]) == [] and _maps(os.getpid()) == []
        for _ in range(4):
            np.testing.assert_array_equal(
                svc.infer("relu", {"x": X}).outputs["y"], np.maximum(X, 0)
            )
