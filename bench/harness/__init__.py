"""The bench harness: what every script in bench/ is built from.

- :mod:`.cli`: the argparse base (``--quick``, ``--out``, ``--duration-s``), start / finish;
- :mod:`.result`: the one result schema (environment, settings, points, summary);
- :mod:`.host`: host description, versions, quiet-host wait, other processes' CPU;
- :mod:`.sut`: the system under test, ``infscaler serve`` fresh per arm;
- :mod:`.scenarios`: MLPerf LoadGen's scenarios through ``infscaler.api.loadgen``;
- :mod:`.search`: the max-rate-at-SLO bisection;
- :mod:`.models`: inputs, calibration (L0), pipeline dicts;
- :mod:`.plot`: the one plot function.

Scripts put bench/ on ``sys.path`` and ``import harness`` (bench/README.md, "Writing a
benchmark").
"""

from . import cli, host, models, result, scenarios, search
from .plot import plot
from .result import Result, percentiles, print_table, write_json
from .sut import Sut

__all__ = [
    "Result",
    "Sut",
    "cli",
    "host",
    "models",
    "percentiles",
    "plot",
    "print_table",
    "result",
    "scenarios",
    "search",
    "write_json",
]
