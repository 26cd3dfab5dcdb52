"""Wall time of the client commands against ``python -c pass``: ``infscaler --help``,
``status`` and ``infer`` answered by a served pipeline (a one-stage function pipeline,
``y = x * 2`` on a 1x4 FP32 tensor, on a fresh ``infscaler serve``: ``harness.Sut``, so
the time is the CLI's own plus one small request), the same two against a socket with no
service (the connect error), and for each command the heavy modules ``python -X
importtime`` shows it importing (httpx, anyio, pydantic, onnx, numpy). ``--runs`` runs
each, interleaved; the median. Target: under 0.3 s of overhead (median minus ``python -c
pass``) for ``status`` and ``infer``. Writes ``results/cli_time.json`` and ``.png``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

HEAVY = ("httpx", "anyio", "pydantic", "onnx", "numpy")
PIPELINE = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}],
            "outputs": ["y"], "stages": [{"name": "double", "function": "cli_time:double",
                                          "inputs": ["x"], "outputs": ["y"]}]}  # fmt: skip


def double(tensors: dict) -> dict:
    """The served stage: ``y = 2 x`` (FP32)."""
    import numpy as np

    return {"y": np.asarray(tensors["x"], dtype=np.float32) * np.float32(2)}


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


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--runs", type=int, default=7)

    def quick(a: Any) -> None:
        a.runs = 2

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("cli_time", a)
    here = str(Path(__file__).resolve().parent)  # the stage's module, for the instances
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    args, env = ["--control-path", "userspace"], {"PYTHONPATH": path}
    with harness.Sut([PIPELINE], args=args, env=env) as s:
        res.own_pids[:] = s.processes()
        commands_ = measure(s.sock, a.runs)
    for name, r in commands_.items():
        for i, w in enumerate(r["runs_s"]):
            res.add(command=name, run=i + 1, wall_s=round(w, 4))
    res.summary["commands"] = {
        n: {k: v for k, v in r.items() if k != "runs_s"} for n, r in commands_.items()
    }
    harness.cli.finish(res, a, plot)
    rows = [[n, round(r["median_s"], 3), round(r["overhead_s"], 3), ", ".join(r["imports"]) or "-"]
            for n, r in commands_.items()]  # fmt: skip
    harness.print_table(["command", "median s", "overhead s", "heavy imports"], rows)
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Each command's wall time per run."""
    harness.plot(data["points"], path, x="run", y="wall_s", by="command", ylabel="wall time, s")


if __name__ == "__main__":
    raise SystemExit(main())
