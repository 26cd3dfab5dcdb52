"""The one plot every benchmark draws: points as lines, grouped into series and panels.

``plot(points, path, x="rate_rps", y="p99_ms", by="config", panel="slo_x")`` draws one
panel per value of ``panel``, in each one line per value of ``by`` (and per key of ``y``
when ``y`` is a list), ``y`` against ``x``; points missing ``x`` or ``y`` (None) are
skipped. Horizontal reference lines (an SLO) come from ``hlines`` (label -> value) or,
per panel, from a key of the points (``hline_key``). Written with matplotlib's Agg
backend as a PNG at 110 dpi.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _groups(points: Sequence[dict[str, Any]], key: str | None) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for p in points:
        out.setdefault(p.get(key) if key else None, []).append(p)
    return out


def plot(
    points: Sequence[dict[str, Any]],
    path: Path,
    *,
    x: str,
    y: str | Sequence[str],
    by: str | None = None,
    panel: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    hlines: dict[str, float] | None = None,
    hline_key: str | None = None,
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """Draw ``points`` (dicts) into ``path`` and return it (see the module docstring).

    Raises:
        ValueError: no point has both ``x`` and a ``y`` key.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = [y] if isinstance(y, str) else list(y)
    if not any(p.get(x) is not None and any(p.get(k) is not None for k in ys) for p in points):
        raise ValueError(f"nothing to plot: no point has {x!r} and one of {ys}")
    panels = _groups(points, panel)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1, 4), squeeze=False)
    for ax, (pv, pts) in zip(axes[0], panels.items(), strict=True):
        for series, sp in _groups(pts, by).items():
            for k in ys:
                xy = sorted(
                    (p[x], p[k]) for p in sp if p.get(x) is not None and p.get(k) is not None
                )
                if not xy:
                    continue
                label = " ".join(
                    str(s) for s in (series, k if len(ys) > 1 else None) if s is not None
                )
                ax.plot(*zip(*xy, strict=True), "o-", label=label or k, markersize=4)
        refs = dict(hlines or {})
        if hline_key and any(p.get(hline_key) is not None for p in pts):
            refs[hline_key] = next(p[hline_key] for p in pts if p.get(hline_key) is not None)
        for label, v in refs.items():
            ax.axhline(v, color="grey", linestyle="--", linewidth=1, label=label)
        if panel:
            ax.set_title(f"{panel} = {pv}")
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(ylabel or ", ".join(ys))
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
