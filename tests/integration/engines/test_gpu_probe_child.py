"""The gpu / dla provider probe's child process (``python -m infscaler.engines.gpu.probe``)
as it runs on this host, and that asking never maps a CUDA library into the asking
process."""

from __future__ import annotations

from infscaler.base.procutil import cuda_libraries_mapped
from infscaler.engines.gpu import probe as P


def test_the_child_prints_a_report_that_parses():
    r = P.run_probe(timeout_s=120)
    assert r.ok, r.error
    assert r.data["probe"] == P.PROBE_VERSION
    assert "CPUExecutionProvider" in r.data["listed"]
    backend, why = r.gpu_backend()
    if backend is None:  # this host: no CUDA session started, and the reason says why
        assert why
        assert not r.data["sessions"] or all(
            s.get("providers", [""])[:1] != ["CUDAExecutionProvider"] or not r.data["devices"]
            for s in r.data["sessions"].values()
        )
    # whatever the child did, this process has no CUDA library mapped
    assert cuda_libraries_mapped() == []
