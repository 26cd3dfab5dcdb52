"""``python -m infscaler.cli``: the same as the ``infscaler`` command."""

from infscaler.cli import main

main()
