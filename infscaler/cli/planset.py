"""``infscaler plan A.yaml B.yaml --rate a=20 --rate b=2``: several pipelines planned
together within one device's cap (:func:`infscaler.runtime.planning.autoplan.plan_set_measured`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from infscaler.base.device import load_profile
from infscaler.base.errors import InfScalerError
from infscaler.base.slo import parse_slo
from infscaler.cli import err, out
from infscaler.cli.client import pipeline_from_arg
from infscaler.runtime.planning.autoplan import plan_set_measured

__all__ = ["per_pipeline", "plan_set_cmd"]


def per_pipeline(values: Sequence[str], names: Sequence[str], option: str) -> dict[str, str]:
    """``--rate a=20 --rate b=2`` -> ``{"a": "20", "b": "2"}``; a value without ``NAME=``
    is every pipeline's that names none.

    Raises:
        InfScalerError: a name that is not one of ``names``, or one given twice.
    """
    given: dict[str, str] = {}
    default: str | None = None
    for v in values:
        name, sep, text = v.partition("=")
        if not sep:
            if default is not None:
                raise InfScalerError(f"{option} without a name given twice",
                                     hint=f"{option} NAME=VALUE per pipeline")  # fmt: skip
            default = v
            continue
        if name not in names:
            raise InfScalerError(
                f"{option} {v}: no pipeline named {name!r} in the set",
                hint=f"the pipelines: {', '.join(names)}",
            )
        if name in given:
            raise InfScalerError(f"{option} for {name} given twice")
        given[name] = text
    if default is not None:
        given = {n: given.get(n, default) for n in names}
    return given


def plan_set_cmd(
    pipelines: Sequence[str],
    *,
    rates: Sequence[str],
    slos: Sequence[str],
    device: str | None,
    explain: bool,
    as_json: bool,
    search: dict[str, Any],
    top_k: int = 6,
) -> int:
    """Plan ``pipelines`` together and print each one's configuration (``explain``: why).
    Returns the exit status (0: every pipeline has a configuration).

    Raises:
        InfScalerError: bad arguments, or a pipeline that fits in no way beside the others.
    """
    from infscaler.cli.units import parse_rate

    cfgs = [pipeline_from_arg(p) for p in pipelines]
    names = [c.name for c in cfgs]
    if len(set(names)) < len(names):
        raise InfScalerError(f"two pipelines of one name in {names}",
                             hint="give each pipeline once")  # fmt: skip
    rate_of = per_pipeline(rates, names, "--rate")
    slo_of = per_pipeline(slos, names, "--slo")
    specs = []
    for c in cfgs:
        text = slo_of.get(c.name) or (str(c.slo) if c.slo is not None else "")
        if not text:
            raise InfScalerError(f"pipeline {c.name} has no SLO",
                                 hint=f"--slo {c.name}=200ms, or slo: in its YAML")  # fmt: skip
        try:
            specs.append(parse_slo(text))
        except InfScalerError as exc:
            raise InfScalerError(f"--slo for {c.name}: {exc.message}",
                                 hint="e.g. --slo a=200ms or a=3x") from None  # fmt: skip
    rate_rps = [parse_rate(rate_of[n]) if n in rate_of else None for n in names]
    profile = load_profile(device or "cpu-host")
    found, joint = plan_set_measured(
        cfgs, specs, rates=rate_rps, device=profile,
        progress=lambda m: err.print(f"  {escape(m)}", highlight=False),
        searching=lambda n, _s, f: err.status(f"searching {n} within {f:.0%} of the cap"),
        top_k=top_k, **search,
    )  # fmt: skip
    if as_json:
        d = joint.to_dict()
        d["device"] = profile.name
        for ms, r, (name, p) in zip(found, rate_rps, d["pipelines"].items(), strict=True):
            p.update({"rate": r, "slo_ms": ms.slo_ms})
            if explain:
                d["pipelines"][name]["search"] = ms.outcome.to_dict()
        print(json.dumps(d, indent=2, default=str))
        return 0
    table = Table(title=escape(joint.explain[0]))
    for col in ("pipeline", "priority", "rate/s", "SLO ms", "plan", "goodput/s", "MB", "rank"):
        table.add_column(col, justify="left" if col in ("pipeline", "plan") else "right")
    for ms, r, ch in zip(found, rate_rps, joint.choices, strict=True):
        table.add_row(
            ch.name, str(ch.priority), "max" if r is None else f"{r:g}", f"{ms.slo_ms:.1f}",
            escape(ch.candidate.label()), escape(ch.candidate.goodput_text()),
            f"{ch.candidate.memory_mb:.0f}", f"#{ch.rank + 1}",
        )  # fmt: skip
    out.print(table)
    if explain:
        for ch in joint.choices:
            out.print(f"[bold]{escape(ch.name)}[/]: {escape(ch.why)}", highlight=False)
    return 0
