"""Keep a running service's pipelines equal to a directory of pipeline files (on Kubernetes,
a mounted ConfigMap) through its model repository API (``load`` replaces a pipeline once
the new one is ready, ``unload`` drains and removes it).

Sources: Kubernetes, "Configure a Pod to Use a ConfigMap"; the kubelet's AtomicWriter.
More: docs/fleet.md, "`infscaler/cli/watcher.py`".
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infscaler.api.client import Client
from infscaler.base.config import load_pipeline
from infscaler.base.errors import ConfigError, InfScalerError
from infscaler.base.threads import NamedThread

__all__ = ["PipelineWatcher", "SyncResult", "read_pipeline_dir", "start_watching"]

SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class SyncResult:
    """What one :meth:`PipelineWatcher.sync` did: names loaded, unloaded, and failed
    (name -> the service's message)."""

    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def read_pipeline_dir(directory: Path, retries: int = 5) -> dict[str, tuple[str, Any, Path]]:
    """``{name: (sha256, parsed pipeline or None if not a YAML mapping, file)}`` of one
    version of the directory's pipeline files.

    Raises:
        OSError: the directory cannot be read (after ``retries`` looks).
    """
    directory = Path(directory)
    for attempt in range(retries):
        root = directory
        data_link = directory / "..data"
        try:
            if data_link.is_symlink():
                root = directory / os.readlink(data_link)
            out: dict[str, tuple[str, Any, Path]] = {}
            for p in sorted(root.iterdir()):
                if p.name.startswith(".") or p.suffix not in SUFFIXES or p.is_dir():
                    continue
                raw = p.read_bytes()
                try:
                    parsed = yaml.safe_load(raw)
                except yaml.YAMLError:
                    parsed = None
                name = p.stem
                if isinstance(parsed, dict) and isinstance(parsed.get("name"), str):
                    name = parsed["name"]
                else:
                    parsed = parsed if isinstance(parsed, dict) else None
                if name in out:
                    continue  # two files, one name: the first (sorted) wins
                out[name] = (hashlib.sha256(raw).hexdigest(), parsed, directory / p.name)
            return out
        except FileNotFoundError:
            if attempt == retries - 1:
                raise
            time.sleep(0.05)  # the kubelet swapped ..data and removed the old version
    raise AssertionError("unreachable")


class PipelineWatcher:
    """Syncs a directory of pipeline files into the service at ``socket``.

    Args:
        directory: the pipelines (a mounted ConfigMap).
        socket: the service's Unix socket (run as the service's user or root).
        known: ``{name: sha256}`` already deployed from this directory.
        log: one line per action.
        timeout: seconds a load may take.
    """

    def __init__(
        self,
        directory: Path,
        socket: str,
        *,
        known: dict[str, str] | None = None,
        log: Callable[[str], None] = lambda _m: None,
        timeout: float = 900.0,
    ) -> None:
        self.directory = Path(directory)
        self.socket = socket
        self.known: dict[str, str] = dict(known or {})  # name -> hash deployed
        self.refused: dict[str, str] = {}  # name -> hash the service refused
        self.log = log
        self.timeout = timeout
        self.stop_event = threading.Event()

    def sync(self) -> SyncResult:
        """One look (see the module docstring); never raises for a refused file."""

        res = SyncResult()
        try:
            files = read_pipeline_dir(self.directory)
        except OSError as exc:
            res.failed["(directory)"] = f"cannot read {self.directory}: {exc}"
            self.log(res.failed["(directory)"])
            return res
        with Client(self.socket, timeout=self.timeout) as c:
            for name, (digest, parsed, path) in files.items():
                if self.known.get(name) == digest or self.refused.get(name) == digest:
                    continue
                try:
                    if parsed is None:
                        raise InfScalerError(f"{path.name} is not a YAML / JSON mapping")
                    c.load(name, parsed)
                except InfScalerError as exc:
                    self.refused[name] = digest
                    res.failed[name] = exc.message
                    self.log(f"pipeline {name} ({path.name}) refused: {exc.message}")
                    continue
                self.known[name] = digest
                self.refused.pop(name, None)
                res.loaded.append(name)
                self.log(f"pipeline {name} loaded from {path.name}")
            for name in sorted(set(self.known) - set(files)):
                try:
                    c.unload(name)
                except InfScalerError as exc:
                    if getattr(exc, "status", None) != 404:
                        res.failed[name] = exc.message
                        self.log(f"pipeline {name}: unload failed: {exc.message}")
                        continue
                del self.known[name]
                res.unloaded.append(name)
                self.log(f"pipeline {name} unloaded (its file is gone)")
            for name in sorted(set(self.refused) - set(files)):
                del self.refused[name]
        return res

    def run(self, interval: float = 2.0) -> None:
        """Sync every ``interval`` s until :meth:`stop`."""
        while not self.stop_event.is_set():
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the service may be restarting
                self.log(f"pipeline watcher: {type(exc).__name__}: {exc}")
            self.stop_event.wait(interval)

    def start(self, interval: float = 2.0, wait_ready: Callable[[], bool] | None = None) -> Any:
        """Run in a daemon thread (after ``wait_ready()`` is true, when given)."""

        def body() -> None:
            while wait_ready is not None and not self.stop_event.is_set():
                if wait_ready():
                    break
                self.stop_event.wait(0.5)
            self.run(interval)

        t = NamedThread(target=body, name="isc-watcher", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self.stop_event.set()


def start_watching(
    directory: Path, socket: str, log: Callable[..., None], interval: float = 2.0
) -> tuple[list[Any], PipelineWatcher]:
    """For ``serve --watch-pipelines DIR``: the pipelines to deploy at start (validated now)
    and a started watcher that syncs once the service is ready.

    Raises:
        ConfigError: DIR is not a directory, or one of its files is not a valid pipeline.
    """

    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(
            f"--watch-pipelines: {directory} is not a directory",
            hint="mount the pipelines ConfigMap there",
        )
    configs = []
    known: dict[str, str] = {}
    for name, (digest, parsed, path) in read_pipeline_dir(directory).items():
        if parsed is None:
            raise ConfigError(f"--watch-pipelines: {path} is not a YAML / JSON mapping")
        try:
            configs.append(load_pipeline({**parsed, "name": name}))
        except ConfigError as exc:
            raise ConfigError(f"--watch-pipelines: {path}: {exc.message}", hint=exc.hint) from None
        known[name] = digest
    watcher = PipelineWatcher(
        directory, socket, known=known, log=lambda m: log(f"watcher: {m}", highlight=False)
    )

    def ready() -> bool:
        with Client(socket, timeout=5.0) as c:
            return c.is_ready()

    watcher.start(interval, wait_ready=ready)
    return configs, watcher
