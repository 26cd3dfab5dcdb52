"""The ConfigMap layout reader: ``read_pipeline_dir`` reads one version of a directory laid
out as the kubelet mounts a ConfigMap. The live roll-out (`infscaler serve
--watch-pipelines`) is in tests/integration/test_watcher.py."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from infscaler.watcher import read_pipeline_dir


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


def test_read_pipeline_dir_reads_one_configmap_version(tmp_path: Path) -> None:
    cm = ConfigMapDir(tmp_path / "cm")
    cm.write({"a.yaml": yaml.safe_dump(scale_pipeline("a", 2)), "b.yaml": "name: bee\n"})
    got = read_pipeline_dir(tmp_path / "cm")
    assert sorted(got) == ["a", "bee"]  # the name from the file's `name:`, not its stem
    cm.write({"a.yaml": yaml.safe_dump(scale_pipeline("a", 3))})
    got2 = read_pipeline_dir(tmp_path / "cm")
    assert sorted(got2) == ["a"] and got2["a"][0] != got["a"][0]
    assert got2["a"][1]["stages"][0]["params"]["factor"] == 3
