"""The argparse base every benchmark script shares.

:func:`parser` makes an ``ArgumentParser`` with ``--quick`` (a smoke run: short points,
output named ``<name>_quick``, no result), ``--out`` (the results folder, default
``bench/results``), ``--duration-s`` (the measured time of one load point, s),
``--quiet-wait-s`` (the longest wait for a quiet host before starting, s) and ``--seed``;
the script adds its own arguments. :func:`start` parses, waits for a quiet host and opens
the run's :class:`~harness.result.Result`; :func:`finish` writes its JSON and plot.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .host import default_cache_dir, wait_for_quiet
from .result import Result

BENCH_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BENCH_DIR / "results"


def parser(
    doc: str | None, *, duration_s: float, quiet_wait_s: float = 60.0
) -> argparse.ArgumentParser:
    """The shared parser; ``doc`` (the script's docstring) gives the description (its
    first paragraph) and the epilog (the rest)."""
    head, _, rest = (doc or "").strip().partition("\n\n")
    ap = argparse.ArgumentParser(
        description=head, epilog=rest or None, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: short points, no result")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    ap.add_argument(
        "--duration-s", type=float, default=duration_s, help="measured time per load point, s"
    )
    ap.add_argument(
        "--quiet-wait-s",
        type=float,
        default=quiet_wait_s,
        help="wait up to this long for other processes to go quiet before starting, s",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of inputs and arrivals")
    return ap


def parse(
    ap: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    quick: Callable[[argparse.Namespace], None] | None = None,
) -> argparse.Namespace:
    """Parse ``argv``; with ``--quick``, shorten the points (``duration_s`` at most 4 s,
    ``quiet_wait_s`` 0) and call ``quick(args)`` for the script's own cuts.

    Raises:
        SystemExit: argparse's error (2) for a bad argument, or a non-positive
            ``--duration-s``.
    """
    a = ap.parse_args(argv)
    if a.duration_s <= 0:
        ap.error(f"--duration-s must be positive, got {a.duration_s}")
    if a.quick:
        a.duration_s = min(a.duration_s, 4.0)
        a.quiet_wait_s = 0.0
        if quick is not None:
            quick(a)
    return a


def start(name: str, args: argparse.Namespace) -> Result:
    """Set the model cache default, wait for a quiet host (``args.quiet_wait_s``) and
    open the result ``name`` (``name_quick`` with ``--quick``) with ``args`` as its
    settings."""
    default_cache_dir()
    quiet = wait_for_quiet(args.quiet_wait_s, window_s=1.0 if args.quick else 3.0)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return Result(name + ("_quick" if args.quick else ""), settings, quiet_before=quiet)


def finish(
    result: Result, args: argparse.Namespace, plot: Callable[[dict, Path], Any] | None
) -> Path:
    """Write the result's JSON, then ``plot(data, png_path)`` if given (a ``ValueError``
    from it, nothing to draw, is printed, not raised); returns the JSON's path. The
    loaded-host label is printed so a smoke figure is not read as a result."""
    path = result.save(args.out)
    data = result.to_dict()
    if plot is not None:
        try:
            plot(data, path.with_suffix(".png"))
        except ValueError as exc:  # harness.plot: no point to draw (every arm failed)
            print(f"no plot: {exc}")
    env = data["environment"]
    label = "LOADED HOST, not a result" if env["loaded_host"] else "quiet host"
    print(f"wrote {path} (other processes {env['other_processes_cores']} cores: {label})")
    return path
