"""`infscaler serve` always stops on SIGTERM within --drain-timeout plus a small bound,
even with a request stuck in an instance that will not finish for a minute."""

from __future__ import annotations

import copy
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from infscaler.api.client import Client
from infscaler.cli.service import STOP_GRACE_S
from tests.helpers import wait_for
from tests.integration.cli.test_serve_cli import INFSCALER, SLOW, _env


def test_sigterm_exits_within_the_drain_bound_with_a_stuck_request(tmp_path: Path) -> None:
    stuck = copy.deepcopy(SLOW)
    stuck["stages"][1]["params"] = {"ms": 120_000}  # the instance sleeps for 2 minutes
    pipeline = tmp_path / "stuck.yaml"
    pipeline.write_text(yaml.safe_dump(stuck))
    sock = tmp_path / "svc.sock"
    drain_s = 2.0
    proc = subprocess.Popen(
        [
            *INFSCALER,
            "serve",
            "--socket",
            str(sock),
            "--control-path",
            "userspace",
            "--drain-timeout",
            str(drain_s),
            str(pipeline),
        ],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                return True
            try:
                with Client(sock) as c:
                    return c.is_ready()
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_for(ready, 90, "the service to be ready")
        assert proc.poll() is None, proc.stdout.read()
        answers: list[object] = []

        def call() -> None:
            try:
                with Client(sock) as c:
                    answers.append(c.infer("slow", {"x": np.ones(2, np.float32)}))
            except Exception as exc:  # noqa: BLE001 - the stop answers it with an error
                answers.append(exc)

        t = threading.Thread(target=call, daemon=True)
        t.start()
        time.sleep(1.0)  # the request sits in the sleeping instance
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(drain_s + STOP_GRACE_S + 15)
        except subprocess.TimeoutExpired:
            raise AssertionError("serve did not exit after SIGTERM") from None
        elapsed = time.monotonic() - t0
        assert elapsed < drain_s + STOP_GRACE_S + 15
        t.join(10)
        assert answers and isinstance(answers[0], Exception)  # answered, not left hanging
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
