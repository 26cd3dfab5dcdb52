"""Smoke test of an installed wheel (not an editable checkout), run by ``.ci/run``.

Run it with the Python of a fresh virtual environment that has the wheel installed
(with its ``models`` extra). From each working directory given (the repository root,
which holds a folder named ``infscaler`` that must not shadow the installed package,
and ``/``) it starts ``infscaler serve`` on a bundled model (``squeezenet``) and the
bundled ``ocr`` pipeline, waits until ready, infers on both (the OCR pipeline reads a
rendered line of known text), reads ``infscaler status`` through the CLI, and stops the
service with SIGTERM, which must exit 0. First it reads the arrival traces the wheel
ships.

Usage: ``VENV/bin/python scripts/wheel_smoke.py DIR [DIR ...]``; exit status 0 on success.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60


def _fail(msg: str, log: Path | None = None) -> None:
    print(f"wheel smoke: FAILED: {msg}", file=sys.stderr)
    if log is not None and log.exists():
        print("---- service log (tail) ----", file=sys.stderr)
        print("\n".join(log.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)
    sys.exit(1)


def smoke(cwd: str) -> None:
    import numpy as np

    import infscaler
    from infscaler.api.client import Client
    from infscaler.base.samples import render_text_image

    pkg = Path(infscaler.__file__).resolve().parent
    if "site-packages" not in str(pkg):
        _fail(f"infscaler is imported from {pkg}, not from an installed wheel")
    bindir = Path(sys.executable).parent
    cli = str(bindir / "infscaler")
    tmp = Path(tempfile.mkdtemp(prefix="isc-wheel-"))
    sock, log = tmp / "isc.sock", tmp / "serve.log"
    env = {**os.environ, "INFSCALER_CACHE_DIR": str(tmp / "cache")}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [cli, "serve", "--socket", str(sock), "--state-dir", str(tmp / "state"),
             "squeezenet", "ocr"],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with Client(sock, timeout=120) as c:
            while True:
                if proc.poll() is not None:
                    _fail(f"`infscaler serve` (cwd {cwd}) exited {proc.returncode}", log)
                if time.monotonic() - t0 > READY_TIMEOUT_S:
                    _fail(f"not ready after {READY_TIMEOUT_S} s (cwd {cwd})", log)
                try:
                    if c.is_ready():
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                time.sleep(0.5)
            meta = c.model_metadata("squeezenet")
            spec = meta["inputs"][0]
            shape = [d if d > 0 else 1 for d in spec["shape"]]
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            res = c.infer("squeezenet", {spec["name"]: x})
            out = next(iter(res.outputs.values()))
            if not np.isfinite(out).all() or out.size == 0:
                _fail(f"squeezenet output not finite / empty: shape {out.shape}", log)
            image = render_text_image(["INFSCALER 2026"])
            texts = [str(t) for t in c.infer("ocr", {"image": image}).outputs["texts"].tolist()]
            joined = " ".join(texts).upper()
            if "INFSCALER" not in joined.replace(" ", ""):
                _fail(f"ocr read {texts!r}, expected 'INFSCALER 2026'", log)
        st = subprocess.run(
            [cli, "status", "--socket", str(sock)], cwd=cwd, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if st.returncode != 0 or "ocr" not in st.stdout:
            _fail(f"`infscaler status` exited {st.returncode}: {st.stdout}{st.stderr}", log)
        # every instance was forked by the fork server (it, too, starts from the wheel)
        js = subprocess.run(
            [cli, "status", "--json", "--socket", str(sock)], cwd=cwd, env=env,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        started = (json.loads(js.stdout).get("zygote") or {}).get("started") or {}
        if not started.get("forked") or started.get("spawned"):
            _fail(f"instances not forked by the zygote (cwd {cwd}): {started}", log)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _fail(f"still running {STOP_TIMEOUT_S} s after SIGTERM (cwd {cwd})", log)
        if rc != 0:
            _fail(f"exited {rc} after SIGTERM (cwd {cwd})", log)
        print(
            f"wheel smoke: cwd {cwd}: ready, squeezenet + ocr ({texts}) inferred, status, "
            f"stopped in {time.monotonic() - t0:.1f} s"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def traces() -> None:
    """The arrival traces ship in the wheel (``plan --arrivals azure`` needs no checkout)."""
    os.environ.pop("INFSCALER_TRACES", None)
    from infscaler.runtime.planning.arrivals import azure_functions, azure_llm

    a, b = azure_functions(minutes=2), azure_llm(duration_s=60)
    if not (a.size > 0 and b.size > 0):
        _fail(f"the shipped traces are empty: {a.size} and {b.size} arrivals")
    print(f"wheel smoke: traces ok ({a.size} + {b.size} arrivals)")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    traces()
    for cwd in argv:
        smoke(cwd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
