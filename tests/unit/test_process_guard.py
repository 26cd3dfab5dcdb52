"""The guard of tests/unit/conftest.py: a unit test that starts a process fails, naming
what it started and where such a test belongs; one that starts none passes.

The guard is run on small test files in a temporary directory through pytest's own
``pytester`` (in-process, so this test starts no process either)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infscaler.ebpf import ebpf_available
from tests.unit.conftest import ProcessStartForbidden, forbid_processes

pytest_plugins = ["pytester"]

GUARD = Path(__file__).with_name("conftest.py")


def test_the_guard_refuses_each_way_to_start_a_process() -> None:
    # a guard nested in the one this test runs under records into its own list
    with forbid_processes() as attempts:
        with pytest.raises(ProcessStartForbidden, match=r"subprocess\.Popen.*tests/integration/"):
            subprocess.run([sys.executable, "-c", "pass"], check=False)
        with pytest.raises(ProcessStartForbidden, match=r"os\.fork"):
            os.fork()
        with pytest.raises(ProcessStartForbidden, match=r"os\.posix_spawn"):
            os.posix_spawn("/bin/true", ["true"], {})
        with pytest.raises(ProcessStartForbidden, match="Process.start"):
            multiprocessing.get_context("spawn").Process(target=print).start()
        with pytest.raises(ProcessStartForbidden, match="eBPF probe"):
            ebpf_available()
    assert attempts == [
        "subprocess.Popen",
        "os.fork",
        "os.posix_spawn",
        "multiprocessing Process.start",
        "eBPF probe (libbpf.probe_sockmap)",
    ]


def test_a_unit_test_that_starts_a_process_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(GUARD.read_text())
    pytester.makepyfile(
        test_sample="""
        import subprocess, sys

        def test_pure():
            assert sum([1, 2]) == 3

        def test_starts_a_process():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_swallows_the_refusal():
            try:
                subprocess.check_output(["true"])
            except Exception:
                pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "test_starts_a_process" in out and "test_swallows_the_refusal" in out
    assert "a unit test may not start a process or load eBPF: subprocess.Popen" in out
    # the swallowed refusal is still reported, after the test body
    assert "test_swallows_the_refusal (call) tried to start a process" in out


def test_a_fixture_that_starts_a_process_is_caught_too(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(GUARD.read_text())
    pytester.makepyfile(
        test_sample="""
        import os, pytest

        @pytest.fixture(scope="session")
        def worker():
            pid = os.fork()  # refused: never returns in a child
            yield pid

        def test_uses_a_worker(worker):
            assert worker
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "os.fork" in result.stdout.str()
