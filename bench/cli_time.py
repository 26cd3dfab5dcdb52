"""Wall time of the client commands against ``python -c pass``: ``infscaler --help``,
``status`` and ``infer`` (each against a socket with no service, so the time is the
CLI's own: interpreter, imports, argument parsing, the connect error) and ``python -X
importtime``'s top imports of ``infscaler status``. Several runs, the median.

Usage: ``python bench/cli_time.py [--runs 7] [--out bench/results/cli_time]`` writes
``cli_time.json`` and ``cli_time.png`` (matplotlib) there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "infscaler --help": [sys.executable, "-m", "infscaler", "--help"],
    "infscaler status": [
        sys.executable,
        "-m",
        "infscaler",
        "status",
        "--socket",
        "/nonexistent.sock",
    ],
    "infscaler infer": [
        sys.executable,
        "-m",
        "infscaler",
        "infer",
        "m",
        "--random",
        "--socket",
        "/nonexistent.sock",
    ],
}


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("bench/results/cli_time"))
    args = ap.parse_args()
    res: dict[str, dict[str, float | list[float]]] = {}
    for name, cmd in COMMANDS.items():
        _wall(cmd)  # warm the page cache
        runs = [_wall(cmd) for _ in range(args.runs)]
        res[name] = {"median_s": statistics.median(runs), "runs_s": runs}
    base = float(res["python -c pass"]["median_s"])  # type: ignore[arg-type]
    for r in res.values():
        r["overhead_s"] = float(r["median_s"]) - base  # type: ignore[arg-type]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cli_time.json").write_text(json.dumps(res, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    names = list(res)
    ax.barh(names, [float(res[n]["median_s"]) for n in names])  # type: ignore[arg-type]
    ax.axvline(base + 0.3, color="r", ls="--", label="python + 0.3 s")
    ax.set_xlabel("wall time, s (median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "cli_time.png", dpi=100)
    for n in names:
        print(f"{n:<20} {float(res[n]['median_s']):.3f} s  (+{float(res[n]['overhead_s']):.3f})")


if __name__ == "__main__":
    main()
