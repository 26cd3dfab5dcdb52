"""Write ``models_golden.json``: :mod:`.record`'s output from the code as it is.
Run from the repository root (``PYTHONPATH=$PWD python -m
tests.unit.runtime.golden.gen_models_golden``); it was run once, on the code before the
capacity and latency copies were folded into :mod:`infscaler.runtime.queueing`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.runtime.golden_record import ALL

OUT = Path(__file__).with_name("models_golden.json")


def main() -> None:
    data = {name: fn() for name, fn in ALL.items()}
    OUT.write_text(json.dumps(data, sort_keys=True) + "\n")
    print({k: len(v) for k, v in data.items()}, OUT)


if __name__ == "__main__":
    main()
