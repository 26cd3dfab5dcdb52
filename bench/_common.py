"""The names scripts not yet on :mod:`harness` import: re-exported from it.

New code imports ``harness`` (bench/README.md, "Writing a benchmark"); this module goes
once the last script using it is converted.
"""

from __future__ import annotations

from typing import Any

from harness.cli import BENCH_DIR, RESULTS_DIR
from harness.host import (
    ForeignLoad,
    busy_cpu_seconds,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    now_utc,
    process_cpu_seconds,
    wait_for_quiet,
)
from harness.models import FALLBACK_RTOL, synthetic_chain
from harness.result import print_table, write_json

__all__ = [
    "BENCH_DIR",
    "FALLBACK_RTOL",
    "RESULTS_DIR",
    "ForeignLoad",
    "busy_cpu_seconds",
    "cpu_steal_seconds",
    "default_cache_dir",
    "environment",
    "host_noise",
    "now_utc",
    "print_table",
    "process_cpu_seconds",
    "synthetic_chain",
    "wait_for_quiet",
    "write_json",
]


def host_noise(quiet: dict, other_cores: float, steal_at_start: float) -> dict[str, Any]:
    """The ``host_noise`` block of the older scripts' JSON: the wait for a quiet host,
    CPU other processes used during the run (cores), and hypervisor steal (s)."""
    return {
        "wait_for_quiet_before_start": quiet,
        "other_processes_cores_during_run": other_cores,
        "per_run": "other_cores in each run: CPU used by other processes, in cores",
        "cpu_steal_seconds": round(cpu_steal_seconds() - steal_at_start, 2),
    }
