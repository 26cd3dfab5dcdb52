"""Tables that fit the terminal without cutting a value a user copies: columns are
``copy`` (never wrapped or cut), ``num`` (right-aligned, never wrapped) or ``text``
(wraps); when the copy and num columns cannot fit side by side, each row prints as a block
of key: value lines instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Kind = Literal["copy", "num", "text"]


@dataclass(frozen=True)
class Col:
    """A column: its header and kind (``copy``, ``num`` or ``text``)."""

    header: str
    kind: Kind = "copy"


def build_table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> Table:
    """The rich table of ``rows`` (cells as strings; rich markup allowed), copyable and
    numeric cells ``no_wrap``, prose cells folding only a word longer than the column."""
    table = Table(title=title)
    for c in cols:
        table.add_column(
            c.header,
            justify="right" if c.kind == "num" else "left",
            no_wrap=c.kind != "text",
            overflow="fold",
        )
    for row in rows:
        table.add_row(*row)
    return table


#: The narrowest a prose column may get before the rows print as key: value lines
#: instead (narrower, a sentence wraps a word or two per line); a column whose longest
#: cell is shorter needs only that.
TEXT_MIN = 24


def fits(console: Console, table: Table) -> bool:
    """Whether ``table`` fits ``console``'s width with no copyable cell cut: its minimum
    width (every ``no_wrap`` column whole, prose at :data:`TEXT_MIN` characters or its
    longest word) is within it."""
    options = console.options
    least = 0
    for c in table.columns:
        m = table._measure_column(console, options, c)
        least += m.minimum if c.no_wrap else max(m.minimum, min(m.maximum, TEXT_MIN))
    return least + table._extra_width <= console.width


def print_table(
    console: Console,
    title: str | None,
    cols: Sequence[Col],
    rows: Sequence[Sequence[str]],
) -> None:
    """Print ``rows`` as a table, or as key: value blocks where the table cannot fit
    (:func:`fits`). ``title`` and cells are rich markup (escape what is not). A multi-line cell (one instance per line) stays multi-line in a
    block, its lines indented under the key."""
    table = build_table(title, cols, rows)
    if fits(console, table):
        console.print(table)
        return
    if title:
        console.print(Text.from_markup(title, style="bold"), soft_wrap=True)
    for row in rows:
        head, *rest = row
        console.print(Text.from_markup(head.replace("\n", " "), style="bold"), soft_wrap=True)
        for c, cell in zip(cols[1:], rest, strict=False):
            if cell == "":
                continue
            lines = cell.split("\n")
            text = Text.from_markup(f"  {c.header}: {lines[0]}")
            for line in lines[1:]:
                text.append("\n" + " " * (len(c.header) + 4))
                text.append_text(Text.from_markup(line))
            console.print(text, soft_wrap=True)
