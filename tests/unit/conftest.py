"""Unit tests: no processes (README, "Quick start": the two kinds of tests).

A unit test starts no process: no service, instance, subprocess, fork, multiprocessing
worker and no eBPF load. The guard below enforces that for every test under
``tests/unit/``: during each test's setup, call and teardown (session fixtures it pulls
in included), ``subprocess.Popen`` (and so ``subprocess.run``, ``asyncio`` subprocesses,
``os.popen``), ``os.fork`` / ``forkpty`` / ``posix_spawn(p)``, ``multiprocessing``'s
``Process.start`` and the eBPF loader (``libbpf.probe_sockmap``, ``libbpf.BpfObject``)
raise :class:`ProcessStartForbidden`; and a test whose code caught that error still fails,
naming what it tried to start. A test that needs any of these belongs in
``tests/integration/``. (``os.system`` is left alone: the function allow-list tests
inspect it as the builtin it is, and no project code calls it.)

The guard is a set of hook wrappers, not an autouse fixture, so that it also covers the
session- and module-scoped fixtures a test's setup creates (those are set up before any
function-scoped autouse fixture could patch anything), and so that it
applies only to items under this folder (pytest calls a conftest's runtest hooks only for
the items below it), whichever way the session was started.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from infscaler.ebpf import libbpf


class ProcessStartForbidden(RuntimeError):
    """A unit test tried to start a process or load eBPF; it belongs in tests/integration/."""


def _blocked(what: str, attempts: list[str]) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        attempts.append(what)
        raise ProcessStartForbidden(
            f"a unit test may not start a process or load eBPF: {what} was called. "
            "Move the test to tests/integration/ (README, 'Quick start'), or test the logic "
            "without the process."
        )

    return refuse


@contextlib.contextmanager
def forbid_processes() -> Iterator[list[str]]:
    """While active, every way to start a process (and the eBPF loader) raises
    :class:`ProcessStartForbidden`; yields the list of what was attempted, in order."""
    attempts: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", _blocked("subprocess.Popen", attempts))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                mp.setattr(os, name, _blocked(f"os.{name}", attempts))
        mp.setattr(
            multiprocessing.process.BaseProcess,
            "start",
            _blocked("multiprocessing Process.start", attempts),
        )
        mp.setattr(libbpf, "probe_sockmap", _blocked("eBPF probe (libbpf.probe_sockmap)", attempts))
        mp.setattr(libbpf.BpfObject, "__init__", _blocked("eBPF load (libbpf.BpfObject)", attempts))
        yield attempts


def _guarded(item: pytest.Item, phase: str) -> Any:
    with forbid_processes() as attempts:
        result = yield
    if attempts:
        pytest.fail(
            f"{item.nodeid} ({phase}) tried to start a process or load eBPF: "
            f"{', '.join(attempts)}; unit tests start none (move it to tests/integration/)",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    return (yield from _guarded(item, "teardown"))


def pytest_configure(config: pytest.Config) -> None:
    """Find the host's gpu / dla providers before any test, outside the guard: on a host
    whose onnxruntime has a CUDA or TensorRT EP the answer takes a short child process
    (:mod:`infscaler.engines.gpu.probe`: a session that really starts, never in this
    process), and unit tests that ask for an engine's availability then read it from
    memory. On a CPU-only host it is answered without a child."""
    from infscaler.engines.gpu.probe import probe_providers

    probe_providers()
