"""The ConfigMap layout reader: ``read_pipeline_dir`` reads one version of a directory laid
out as the kubelet mounts a ConfigMap. The live roll-out (`infscaler serve
--watch-pipelines`) is in tests/integration/cli/test_watcher.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from infscaler.cli.watcher import read_pipeline_dir
from tests.integration.cli.test_watcher import ConfigMapDir, scale_pipeline


def test_read_pipeline_dir_reads_one_configmap_version(tmp_path: Path) -> None:
    cm = ConfigMapDir(tmp_path / "cm")
    cm.write({"a.yaml": yaml.safe_dump(scale_pipeline("a", 2)), "b.yaml": "name: bee\n"})
    got = read_pipeline_dir(tmp_path / "cm")
    assert sorted(got) == ["a", "bee"]  # the name from the file's `name:`, not its stem
    cm.write({"a.yaml": yaml.safe_dump(scale_pipeline("a", 3))})
    got2 = read_pipeline_dir(tmp_path / "cm")
    assert sorted(got2) == ["a"] and got2["a"][0] != got["a"][0]
    assert got2["a"][1]["stages"][0]["params"]["factor"] == 3
