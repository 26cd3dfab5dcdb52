"""Device profiles (sources, validation, cpu-host), pipeline-vs-profile checks, and host
telemetry (psutil here; jetson-stats on a Jetson)."""

from __future__ import annotations

import psutil
import pytest

from infscaler.runtime.scaling.telemetry import (
    ProcessMemoryError,
    process_memory,
)


def test_process_memory_of_a_missing_process_says_so():
    proc = psutil.Popen(["true"])
    proc.wait()
    with pytest.raises(ProcessMemoryError, match=f"process {proc.pid} does not exist"):
        process_memory(proc.pid)
