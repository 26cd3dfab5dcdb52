"""The system under test: ``infscaler serve`` in a subprocess, fresh per arm.

``with Sut(targets, env={...}) as s:`` writes each pipeline given as a dict to a YAML
file, starts ``python -m infscaler serve --socket <tmp>/serve.sock <targets> <args>``
with the environment plus ``env`` (this process's environment is left unchanged), waits
until ``GET /v2/health/ready`` answers 200, and on exit stops it with SIGTERM (SIGKILL
after ``stop_timeout_s``) and records the exit code and stop time in ``s.stopped``.
A target is a pipeline dict, or what ``infscaler serve`` takes: a pipeline YAML path, a
``.onnx`` file, a bundled model alias or pipeline name (docs/cli.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Sut:
    """One ``infscaler serve`` process (see the module docstring).

    Args:
        targets: what to serve: pipeline dicts and / or ``serve`` targets (str, Path).
        args: more ``serve`` options (``["--device", "cpu-host"]``).
        env: environment variables for the service only.
        ready_timeout_s: the longest wait for readiness, s (a pipeline planned at deploy
            takes minutes on a loaded 2-core host).

    Raises (from ``__enter__``):
        RuntimeError: the service exited or was not ready in time (the message names
            its log file, kept for reading).
    """

    def __init__(
        self,
        targets: Sequence[dict | str | Path],
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        if not targets:
            raise ValueError("Sut needs at least one target (a pipeline dict, YAML or model)")
        self.targets = list(targets)
        self.args = [str(a) for a in args]
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.tmp = Path(tempfile.mkdtemp(prefix="isc-sut-"))
        self.sock = str(self.tmp / "serve.sock")
        self.log_path = self.tmp / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None
        self.stopped: dict[str, Any] | None = None
        #: with :meth:`watch`, per status poll: (wall time, {pipeline: ready instances}),
        #: (wall time, the service's ``memory_used_mb``), (wall time, {pipeline: its
        #: ``live_check``})
        self.instances: list[tuple[float, dict[str, int]]] = []
        self.memory: list[tuple[float, float]] = []
        self.live: list[tuple[float, dict[str, Any]]] = []
        self._decisions: dict[tuple, dict[str, Any]] = {}
        self._halt = threading.Event()
        self._watcher: threading.Thread | None = None

    def _target_paths(self) -> list[str]:
        import yaml

        out = []
        for i, t in enumerate(self.targets):
            if isinstance(t, dict):
                p = self.tmp / f"pipeline{i}.yaml"
                p.write_text(yaml.safe_dump(t, sort_keys=False))
                out.append(str(p))
            else:
                out.append(str(t))
        return out

    @property
    def pid(self) -> int | None:
        """The service's pid while it runs."""
        return self.proc.pid if self.proc is not None else None

    def __enter__(self) -> Sut:
        cmd = [sys.executable, "-m", "infscaler", "serve", "--socket", self.sock]
        cmd += [*self._target_paths(), *self.args]
        env = {**os.environ, **self.env}
        env.setdefault("INFSCALER_CACHE_DIR", "/tmp/isc-cache")
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in __exit__
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )
        try:
            self._wait_ready(t0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.ready_s = round(time.monotonic() - t0, 2)
        return self

    def _wait_ready(self, t0: float) -> None:
        from infscaler.api.client import Client

        assert self.proc is not None
        while time.monotonic() - t0 < self.ready_timeout_s:
            if self.proc.poll() is not None:
                tail = " | ".join(self.log_path.read_text().strip().splitlines()[-3:])
                raise RuntimeError(
                    f"infscaler serve exited {self.proc.returncode} before it was ready "
                    f"({tail}): see {self.log_path}"
                )
            with contextlib.suppress(Exception), Client(self.sock, timeout=5) as c:
                if c.is_ready():
                    return
            time.sleep(0.3)
        raise RuntimeError(
            f"infscaler serve not ready after {self.ready_timeout_s} s: see {self.log_path}"
        )

    def processes(self) -> list[int]:
        """The service's pid and every descendant's (``/proc/<pid>/task/*/children``)."""
        if self.pid is None:
            return []
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in task.read_text().split()]
        return out

    def watch(self, interval_s: float = 1.0) -> Sut:
        """Poll ``status`` every ``interval_s`` in a thread until exit: ready instances per
        pipeline (:attr:`instances`), the memory the service counts against its cap
        (:attr:`memory`, MB: instances' PSS and the tensor pool), each pipeline's live
        check (:attr:`live`) and every scaling decision it shows (:meth:`since`;
        ``status`` keeps the last 10 per pipeline)."""
        self._watcher = threading.Thread(target=self._watch, args=(interval_s,), daemon=True)
        self._watcher.start()
        return self

    def _watch(self, interval_s: float) -> None:
        while not self._halt.wait(interval_s):
            with contextlib.suppress(Exception):
                st = self.status()
                pipes, now = st.get("pipelines", []), time.time()
                self.instances.append((now, {p.get("name"): _ready(p) for p in pipes}))
                if "memory_used_mb" in st.get("resources", {}):
                    self.memory.append((now, st["resources"]["memory_used_mb"]))
                self.live.append((now, {p.get("name"): p.get("live_check") for p in pipes}))
                for p in pipes:
                    for d in p.get("decisions", []):
                        key = (p.get("name"), d.get("time"), d.get("action"), d.get("unit"))
                        self._decisions[key] = {"pipeline": p.get("name"), **d}

    def since(
        self, wall0: float
    ) -> tuple[list[dict[str, Any]], list[tuple[float, dict[str, int]]]]:
        """The decisions polled from ``wall0`` (``time.time()``) on, each with ``t_s`` (s
        since ``wall0``), in time order; and the instance polls ``(t_s, {pipeline:
        ready})`` from then on."""
        ds = [
            {**d, "t_s": round(d["time"] - wall0, 2)}
            for d in self._decisions.values()
            if d.get("time") and d["time"] >= wall0
        ]
        polls = [(round(t - wall0, 2), n) for t, n in self.instances if t >= wall0]
        return sorted(ds, key=lambda d: d["t_s"]), polls

    def status(self) -> dict[str, Any]:
        """The service's ``status`` answer (pipelines, units, instances)."""
        from infscaler.api.client import Client

        with Client(self.sock, timeout=10) as c:
            return c.status()

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.stopped is not None:
            return
        self._halt.set()
        if self._watcher is not None:
            self._watcher.join(10)
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        self.stopped = {"exit_code": rc, "stop_s": round(time.monotonic() - t0, 2)}
        if rc in (0, -signal.SIGTERM) and exc[0] is None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _ready(pipe: dict[str, Any]) -> int:
    """Instances of a ``status`` pipeline in state ``ready``, all units."""
    return sum(
        i.get("state") == "ready" for u in pipe.get("units", []) for i in u.get("instances", [])
    )
