"""The ConfigMap roll-out path against a live service: `infscaler serve
--watch-pipelines DIR` on a directory laid out as the kubelet lays out a mounted
ConfigMap (``..data`` symlink swapped atomically); add, change and remove a pipeline file
and the service reloads without restarting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from infscaler.api.client import Client
from tests import TESTS_DIR
from tests.helpers import wait_for

HERE = TESTS_DIR  # tests/: stagefuncs.py
INFSCALER = [sys.executable, "-m", "infscaler"]


def scale_pipeline(name: str, factor: float) -> dict:
    return {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["y"],
        "stages": [
            {
                "name": "scale",
                "function": "stagefuncs:scale",
                "params": {"factor": factor},
                "inputs": ["x"],
                "outputs": ["y"],
            }
        ],
    }


class ConfigMapDir:
    """A directory updated the way the kubelet's AtomicWriter updates a ConfigMap
    volume: a new timestamped directory, ``..data`` swapped to it by rename, the
    per-key symlinks made / removed, the old directory deleted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def write(self, files: dict[str, str]) -> None:
        self.n += 1
        ts = f"..2026_11_24_22_00_{self.n:02d}.{os.getpid()}"
        (self.root / ts).mkdir()
        for k, v in files.items():
            (self.root / ts / k).write_text(v)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        tmp = self.root / "..data_tmp"
        os.symlink(ts, tmp)
        os.rename(tmp, self.root / "..data")
        for k in files:
            link = self.root / k
            if not link.is_symlink():
                os.symlink(f"..data/{k}", link)
        for p in self.root.iterdir():
            if p.is_symlink() and not p.name.startswith("..") and p.name not in files:
                p.unlink()
        if old:
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()


def _names(sock: Path) -> set[str]:
    with Client(sock) as c:
        return {m["name"] for m in c.models()}


def _y(sock: Path, name: str) -> float:
    with Client(sock) as c:
        return float(c.infer(name, {"x": np.ones(2, np.float32)}).outputs["y"][0])


def test_serve_watch_pipelines_add_change_remove_without_restart(tmp_path: Path) -> None:
    cm = ConfigMapDir(tmp_path / "pipelines")
    cm.write({"alpha.yaml": yaml.safe_dump(scale_pipeline("alpha", 2))})
    sock = tmp_path / "svc.sock"
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env["INFSCALER_STATE_DIR"] = str(tmp_path / "state")
    # the watched pipelines come through the repository API: their function module must
    # be allowed (docs/security.md, "What the service refuses")
    env["INFSCALER_ALLOW_FUNCTIONS"] = "stagefuncs"
    proc = subprocess.Popen(
        [
            *INFSCALER,
            "serve",
            "--socket",
            str(sock),
            "--control-path",
            "userspace",
            "--watch-pipelines",
            str(tmp_path / "pipelines"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: Client(sock).is_ready() or proc.poll() is not None, 90, "ready")
        assert proc.poll() is None, proc.stdout.read()
        assert _names(sock) == {"alpha"} and _y(sock, "alpha") == 2.0
        # add a pipeline
        cm.write(
            {
                "alpha.yaml": yaml.safe_dump(scale_pipeline("alpha", 2)),
                "beta.yaml": yaml.safe_dump(scale_pipeline("beta", 5)),
            }
        )
        wait_for(lambda: "beta" in _names(sock), 60, "beta loaded")
        wait_for(lambda: Client(sock).model_ready("beta"), 30, "beta ready")
        assert _y(sock, "beta") == 5.0
        # change one: replaced in place (the old one answers until the new one is ready)
        cm.write(
            {
                "alpha.yaml": yaml.safe_dump(scale_pipeline("alpha", 7)),
                "beta.yaml": yaml.safe_dump(scale_pipeline("beta", 5)),
            }
        )
        wait_for(lambda: _y(sock, "alpha") == 7.0, 60, "alpha reloaded with factor 7")
        # a bad file is refused and the running version stays
        cm.write(
            {
                "alpha.yaml": yaml.safe_dump(scale_pipeline("alpha", 7)),
                "beta.yaml": "name: beta\nstages: not-a-list\n",
            }
        )
        time.sleep(5)
        assert _y(sock, "beta") == 5.0
        # one deployed by hand (not from the directory) is left alone
        with Client(sock) as c:
            c.load("gamma", scale_pipeline("gamma", 1))
        # remove one
        cm.write({"alpha.yaml": yaml.safe_dump(scale_pipeline("alpha", 7))})
        wait_for(lambda: "beta" not in _names(sock), 60, "beta unloaded")
        assert _names(sock) == {"alpha", "gamma"}
        assert proc.poll() is None  # the same process all along: no restart
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "refused" in out and "beta" in out, out
