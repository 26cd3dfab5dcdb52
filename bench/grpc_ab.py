"""The gRPC path's CPU per request on several commits, in one run: the service
process's CPU per ModelInfer over gRPC (``bench/frontend_cpu.py --threads --protocols
grpc``: ``tritonclient.grpc`` over ``unix:``, closed loop, one-stage function pipeline,
FP32 inputs of each ``--sizes``), split by thread, for each commit of ``--refs``.

Each commit's package is unpacked and put first on ``PYTHONPATH`` as
``bench/hotpath_ab.py`` does (:func:`hotpath_ab.unpack`; the benchmark scripts are this
checkout's for every side); the sides alternate round by round (the order reversed
every other round), so a drift of the host hits all of them. The figure per side and
size is the median over rounds (CPU time, not wall-clock: fair on a loaded host; the
load average is recorded by ``frontend_cpu``).

Writes ``results/grpc_ab.json``.

Usage::

    .venv/bin/python bench/grpc_ab.py --refs 33cbb21,HEAD --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.cli import RESULTS_DIR  # noqa: E402
from harness.host import default_cache_dir, environment  # noqa: E402
from harness.result import write_json  # noqa: E402
from hotpath_ab import REPO, run_side, unpack  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refs", required=True, help="commits (or refs), comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side (default 3)")
    ap.add_argument("-n", type=int, default=600, help="requests per point (default 600)")
    ap.add_argument("--sizes", default="1x3x224x224,1x3x736x736", help="FP32 input shapes")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "grpc_ab.json")
    args = ap.parse_args(argv)
    default_cache_dir()
    refs = args.refs.split(",")
    commits = [
        subprocess.run(
            ["git", "rev-parse", "--short", r], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        for r in refs
    ]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="infscaler-grpc-ab-") as tmp:
        sides = []
        for k, commit in enumerate(commits):
            src, path = unpack(commit, Path(tmp) / f"s{k}")
            sides.append({"name": f"s{k}", "commit": commit, "src": src, "path": path})
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                out_dir = Path(tmp) / f"out-{side['name']}-{r}"
                out_dir.mkdir()
                tag = f"grpc_ab_{side['name']}_{r}"
                cmd = ["--threads", "--protocols", "grpc", "-n", str(args.n), "--idle-s", "0.5"]
                more = [*cmd, "--sizes", args.sizes, "--tag", tag]
                run_side(side, "frontend_cpu.py", more, out_dir, "infscaler.api.grpc", 900)
                data = json.loads((RESULTS_DIR / f"frontend_cpu_threads_{tag}.json").read_text())
                for run in data["points"]:
                    row = {
                        "round": r,
                        "commit": side["commit"],
                        "input_bytes": run["input_bytes"],
                        "cpu_ms_per_request": run["cpu_ms_per_request"],
                        "threads_ms_per_request": run["threads_ms_per_request"],
                        "load_average_1m": run["load_average_1m"],
                    }
                    rows.append(row)
                    print(
                        f"round {r} {side['commit']} {run['input_bytes'] / 1e6:5.2f} MB: "
                        f"{run['cpu_ms_per_request']:.3f} ms CPU/request, api thread "
                        f"{run['threads_ms_per_request'].get('isc-api / isc-api', 0):.3f}",
                        flush=True,
                    )
    summary = []
    for size in sorted({row["input_bytes"] for row in rows}):
        for commit in commits:
            mine = [x for x in rows if x["commit"] == commit and x["input_bytes"] == size]
            cpu = [x["cpu_ms_per_request"] for x in mine]
            api = [x["threads_ms_per_request"].get("isc-api / isc-api", 0.0) for x in mine]
            summary.append(
                {
                    "commit": commit,
                    "input_bytes": size,
                    "cpu_ms_median": statistics.median(cpu),
                    "cpu_ms_all": cpu,
                    "api_thread_ms_median": statistics.median(api),
                }
            )
            print(
                f"{commit} {size / 1e6:5.2f} MB: median {statistics.median(cpu):.3f} ms CPU/request "
                f"(rounds {cpu}), api thread {statistics.median(api):.3f}"
            )
    write_json(
        args.out,
        {
            "benchmark": "grpc_ab",
            "environment": environment(),
            "commits": commits,
            "rounds": args.rounds,
            "requests": args.n,
            "rows": rows,
            "summary": summary,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
