"""Threads named in the kernel as in Python (:mod:`infscaler.base.threads`)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from infscaler.base.threads import COMM_MAX, NamedThread, named_executor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and prctl are Linux")


def _comm() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_named_thread_gives_the_kernel_its_name() -> None:
    seen: list[str] = []
    t = NamedThread(target=lambda: seen.append(_comm()), name="isc-test-name")
    t.start()
    t.join(10)
    assert seen == ["isc-test-name"]


def test_a_long_name_is_cut_to_what_the_kernel_keeps() -> None:
    seen: list[str] = []
    t = NamedThread(target=lambda: seen.append(_comm()), name="isc-a-very-long-thread-name")
    t.start()
    t.join(10)
    assert seen == ["isc-a-very-long-thread-name"[:COMM_MAX]]
    assert t.name == "isc-a-very-long-thread-name"  # Python keeps the whole name


def test_named_executor_threads_carry_the_prefix() -> None:
    with named_executor("isc-t-exec", 1) as ex:
        comm, name = ex.submit(lambda: (_comm(), threading.current_thread().name)).result(10)
    assert name == "isc-t-exec_0"
    assert comm == "isc-t-exec_0"
