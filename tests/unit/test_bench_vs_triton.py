"""bench/vs_triton.py's command line (``--quick`` fills only what was not given) and its
per-point CPU reading of a server's process tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers import bench_module


def test_quick_keeps_the_models_and_points_given() -> None:
    vt = bench_module("vs_triton")
    a = vt.parse_args(["--quick", "--models", "resnet50", "--concurrency", "1,2,4", "--loads", ""])
    assert a.models == ["resnet50"] and a.concurrency == [1, 2, 4] and a.loads == []
    assert a.duration_s == 5.0 and a.name == "vs_triton_quick" and a.state_dir is None
    q = vt.parse_args(["--quick"])
    assert q.models == ["squeezenet"] and q.concurrency == [1, 4] and q.loads == [0.5]
    full = vt.parse_args(["--state-dir", "/tmp/s", "--name", "x", "--settle-s", "0"])
    assert full.models == ["resnet50", "ppocrv4-det", "squeezenet"]
    assert full.concurrency == [1, 2, 4, 8] and full.duration_s == 15.0
    assert full.state_dir == Path("/tmp/s") and full.name == "x" and full.settle_s == 0.0


def test_baseline_adds_an_auto_served_by_another_install() -> None:
    vt = bench_module("vs_triton")
    a = vt.parse_args(["--configs", "triton 1x2", "--baseline", "/opt/other/bin/infscaler"])
    names = [s.name for s in vt.suts(a)]
    assert names == ["ours auto", "triton 1x2"]
    a = vt.parse_args(
        ["--configs", "ours auto baseline,ours auto", "--baseline", "/opt/other/bin/infscaler"]
    )
    got = vt.suts(a)
    assert [s.name for s in got] == ["ours auto baseline", "ours auto"]
    assert got[0].exe == Path("/opt/other/bin/infscaler") and got[1].exe == vt.INFSCALER


def test_tree_cpu_counts_the_serving_process_apart_from_the_rest() -> None:
    vt = bench_module("vs_triton")
    tree = vt.TreeCpu(os.getpid(), [os.getpid()], interval_s=0.05)
    t_end = time.process_time() + 0.2
    while time.process_time() < t_end:  # 0.2 s of this process's CPU
        sum(range(1000))
    server, rest = tree.stop()
    assert server >= 0.1
    assert rest == 0.0  # no child process
    assert tree.pids() == 1
