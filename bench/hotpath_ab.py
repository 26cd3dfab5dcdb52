"""The hot path before and after a change, in one run: the eBPF token handover's P50
(``bench/handover.py``), a served pipeline's closed-loop throughput and its service's CPU
per request (``bench/frontend_cpu.py``: one client, one-stage function pipeline, 602 KB
FP32 input over the Unix-socket API), each measured on two commits of this repository.

Writes ``results/<--name>.json`` and ``.png`` (harness.Result: a point per round and side).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``hotpath_ab.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.host import busy_cpu_seconds  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def unpack(commit: str, root: Path) -> tuple[Path, Path]:
    """``commit``'s tree under ``root/src`` and its package laid out under ``root/path``
    (links, as ``pyproject.toml``'s ``[tool.setuptools] package-dir`` maps it)."""
    src, path = root / "src", root / "path"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]
    pkg = path / "infscaler"
    pkg.mkdir(parents=True)
    for entry in (src / dirs["package-dir"].get("infscaler", "infscaler")).iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name, folder in dirs["package-dir"].items():
        if name.startswith("infscaler."):
            (pkg / name.removeprefix("infscaler.")).symlink_to(src / folder)
    return src, path


def run_side(side: dict, script: str, args: list[str], out_dir: Path) -> float:
    """Run this checkout's ``bench/<script>`` with ``side``'s package first on the path
    (checked: ``infscaler.runtime`` must come from ``side``'s tree) in ``out_dir``; the
    host's busy CPU meanwhile (cores).

    Raises:
        RuntimeError: the package came from elsewhere, or the script failed.
    """
    env = {**os.environ, "PYTHONPATH": str(side["path"])}
    code = "import os, infscaler.runtime as m; print(os.path.realpath(m.__file__))"
    check = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True, cwd="/").stdout.strip()  # fmt: skip
    if not check.startswith(str(side["src"].resolve())):
        raise RuntimeError(f"{side['name']}: imported {check}, not the copy in {side['src']}")
    busy0, t0 = busy_cpu_seconds(), time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args, "--out", str(out_dir)],
                          env=env, capture_output=True, text=True, cwd=str(out_dir), timeout=600)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{side['name']} {script} failed:\n{proc.stdout}\n{proc.stderr}")
    return (busy_cpu_seconds() - busy0) / max(time.monotonic() - t0, 1e-9)


def handover_p50(side: dict, out_dir: Path) -> tuple[float, float]:
    """The eBPF channel's one-hop P50, µs (cross-core, one consumer, quick settings)."""
    args = "--quick --mechanisms ebpf --consumers 1 --placements cross-core --quiet-wait-s 0"
    busy = run_side(side, "handover.py", args.split(), out_dir)
    data = json.loads((out_dir / "handover_quick.json").read_text())
    rows = data["summary"]["results"]  # handover.py's aggregate per (placement, mechanism, N)
    (row,) = [r for r in rows if r["mechanism"] == "ebpf" and r["consumers"] == 1]
    return float(row["p50_us"]), busy


def served_rps(side: dict, out_dir: Path, n: int) -> tuple[float, float, float]:
    """Closed-loop requests per second of one client through the service, the service
    process's CPU per request, ms, and the host's busy cores (frontend_cpu)."""
    busy = run_side(side, "frontend_cpu.py", ["-n", str(n)], out_dir)
    summary = json.loads((out_dir / "frontend_cpu.json").read_text())["summary"]
    rps = 1000.0 / float(summary["client_latency_ms_mean"])
    return rps, float(summary["frontend_cpu_ms_per_request"]), busy


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--before", required=True, help="commit (or ref) before the change")
    ap.add_argument("--after", default="HEAD", help="commit (or ref) after it (default HEAD)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per side (default 4)")
    ap.add_argument("-n", type=int, default=400, help="requests per throughput point")
    ap.add_argument("--name", default="hotpath_ab", help="results/NAME.json and .png")
    args = harness.cli.parse(ap, argv)
    res = harness.cli.start(args.name, args)
    commits = {name: subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, check=True,
                                    capture_output=True, text=True).stdout.strip()
               for name, ref in (("before", args.before), ("after", args.after))}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="infscaler-ab-") as tmp:
        sides = []
        for name, commit in commits.items():
            src, path = unpack(commit, Path(tmp) / name)
            sides.append({"name": name, "commit": commit, "src": src, "path": path})
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                out_dir = Path(tmp) / f"out-{side['name']}-{r}"
                out_dir.mkdir()
                p50, busy_h = handover_p50(side, out_dir)
                rps, cpu_ms, busy_s = served_rps(side, out_dir, args.n)
                res.add(round=r, side=side["name"], commit=side["commit"],
                        ebpf_handover_p50_us=round(p50, 2), served_rps=round(rps, 2),
                        served_cpu_ms_per_request=round(cpu_ms, 4),
                        host_busy_cores_handover=round(busy_h, 3),
                        host_busy_cores_served=round(busy_s, 3))  # fmt: skip
                print(f"round {r} {side['name']:6s} {side['commit']}: handover P50 {p50:6.1f} µs, "
                      f"served {rps:6.1f} req/s, {cpu_ms:.3f} ms CPU a request")  # fmt: skip
    summary = {}
    for metric in ("ebpf_handover_p50_us", "served_rps", "served_cpu_ms_per_request"):
        per = {s: [row[metric] for row in res.points if row["side"] == s] for s in commits}
        med = {s: statistics.median(v) for s, v in per.items()}
        spread = {s: round((max(v) - min(v)) / statistics.median(v), 3) for s, v in per.items()}
        summary[metric] = {
            "median": med,
            "after_over_before": round(med["after"] / med["before"], 3),
            "spread_over_median": spread,
        }
        print(
            f"{metric}: before {med['before']:.2f}, after {med['after']:.2f}, ratio "
            f"{med['after'] / med['before']:.3f} (spread of rounds: {spread})"
        )
    res.summary.update(commits=commits, requests_per_throughput_point=args.n, **summary)
    harness.cli.finish(res, args, plot)
    return 0


def plot(data: dict, path: Path) -> None:
    """Each round's eBPF hand-over P50, served req/s and CPU ms per request, before and
    after, one panel per metric (``harness.plot``)."""
    c = data["summary"]["commits"]
    pts = [{"metric": m, "side": f"{r['side']} {c[r['side']]}", "round": r["round"], "v": r[m]}
           for r in data["points"]
           for m in ("ebpf_handover_p50_us", "served_rps", "served_cpu_ms_per_request")
           if m in r]  # fmt: skip
    harness.plot(pts, path, x="round", y="v", by="side", panel="metric", ylabel="µs, req/s or ms")


if __name__ == "__main__":
    raise SystemExit(main())
