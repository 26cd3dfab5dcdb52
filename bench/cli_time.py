"""Wall time of the client commands against ``python -c pass``: ``infscaler --help``,
``status`` and ``infer`` answered by a served pipeline (a one-stage function pipeline,
``y = x * 2`` on a 1x4 FP32 tensor, in a service started by this script, so the time is
the CLI's own plus one small request), the same two against a socket with no service
(the connect error), and for each command the heavy modules ``python -X importtime``
shows it importing (httpx, anyio, pydantic, onnx, numpy). Several runs each,
interleaved; the median.

Usage: ``python bench/cli_time.py [--runs 7] [--out bench/results]`` writes
``cli_time.json`` and ``cli_time.png`` (matplotlib) there. Target: under 0.3 s of
overhead (median minus ``python -c pass``) for ``status`` and ``infer``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, wait_for_quiet  # noqa: E402

HEAVY = ("httpx", "anyio", "pydantic", "onnx", "numpy")
STAGE = """
import numpy as np


def double(tensors):
    return {"y": np.asarray(tensors["x"], dtype=np.float32) * np.float32(2)}
"""
PIPELINE = {
    "name": "m",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}],
    "outputs": ["y"],
    "stages": [
        {"name": "double", "function": "cli_time_stage:double", "inputs": ["x"], "outputs": ["y"]}
    ],
}


def commands(sock: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "infscaler"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import numpy'": [sys.executable, "-c", "import numpy"],
        "infscaler --help": [*cli, "--help"],
        "infscaler status": [*cli, "status", "--socket", sock],
        "infscaler infer": [*cli, "infer", "m", "--random", "--socket", sock],
        "status (no service)": [*cli, "status", "--socket", "/nonexistent.sock"],
        "infer (no service)": [*cli, "infer", "m", "--random", "--socket", "/nonexistent.sock"],
    }


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, check=False)
    took = time.perf_counter() - t
    if "/nonexistent.sock" not in cmd and proc.returncode != 0:
        raise SystemExit(f"{cmd} failed: {proc.stderr.decode()[-500:]}")
    return took


def _heavy_imports(cmd: list[str]) -> list[str]:
    if cmd[1] != "-m":
        return []
    proc = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, check=False
    )
    names = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln}
    return sorted(h for h in HEAVY if h in names)


def measure(sock: str, runs: int) -> dict[str, dict]:
    cmds = commands(sock)
    for cmd in cmds.values():
        _wall(cmd)  # warm the page cache
    walls: dict[str, list[float]] = {n: [] for n in cmds}
    for _ in range(runs):  # interleaved: drift on a shared host hits every command alike
        for n, cmd in cmds.items():
            walls[n].append(_wall(cmd))
    res = {
        n: {"median_s": statistics.median(w), "runs_s": w, "imports": _heavy_imports(cmds[n])}
        for n, w in walls.items()
    }
    base = res["python -c pass"]["median_s"]
    for r in res.values():
        r["overhead_s"] = r["median_s"] - base
    return res


def _own_cpu_seconds() -> float:
    """CPU seconds of this process, its exited children (the timed commands) and its
    live descendants (the service's instances)."""
    import resource

    import psutil

    me = psutil.Process()
    total = sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    for proc in (me, *me.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quiet-wait-s", type=float, default=120.0)
    args = ap.parse_args()
    from infscaler.api.server import ServerThread
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service

    with tempfile.TemporaryDirectory(prefix="cli-time-") as tmp:
        (Path(tmp) / "cli_time_stage.py").write_text(STAGE)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p
        )
        sys.path.insert(0, tmp)  # the service checks the stage imports here too
        sock = str(Path(tmp) / "api.sock")
        with Service(state_dir=Path(tmp) / "state", control_path="userspace", pool_mb=16) as svc:
            svc.deploy(load_pipeline(PIPELINE))
            with ServerThread(svc, sock):
                quiet = wait_for_quiet(args.quiet_wait_s)
                fl = ForeignLoad(_own_cpu_seconds)
                res = measure(sock, args.runs)
                other = fl.cores()
    doc = {
        "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "host_noise": {
            "wait_for_quiet_before_start": quiet,
            "other_processes_cores_during_run": other,
        },
        "python": sys.version.split()[0],
        "commands": res,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cli_time.json").write_text(json.dumps(doc, indent=2))
    _plot(res, args.out / "cli_time.png")
    print(f"other processes: {other} cores")
    for n, r in res.items():
        print(
            f"{n:<22} {r['median_s']:.3f} s  (+{r['overhead_s']:.3f})  "
            f"imports {', '.join(r['imports']) or '-'}"
        )


def _plot(res: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = res["python -c pass"]["median_s"]
    fig, ax = plt.subplots(figsize=(7, 3))
    names = list(res)
    ax.barh(names, [res[n]["median_s"] for n in names])
    ax.axvline(base + 0.3, color="r", ls="--", label="python + 0.3 s")
    ax.set_xlabel("wall time, s (median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
