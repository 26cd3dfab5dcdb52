"""Per-operator complexity plot in the style of InfScaler Fig. 2 (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_operator_costs(
    values: Sequence[float],
    representative: Sequence[bool],
    path: str | Path,
    *,
    title: str,
    ylabel: str = "GFLOPs",
    cuts: Sequence[int] = (),
    scale: float = 1e-9,
) -> Path:
    """Write a PNG bar chart of per-operator complexity ``values`` (times ``scale``), the
    ``representative`` ones red, the mean as a line, ``cuts`` as vertical lines; returns ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ys = [v * scale for v in values]
    xs = list(range(len(ys)))
    colors = ["tab:red" if r else "tab:gray" for r in representative]
    width = min(16.0, max(6.0, len(ys) * 0.05 + 4))
    fig, ax = plt.subplots(figsize=(width, 4.0), dpi=110)
    ax.bar(xs, ys, color=colors, width=0.9)
    if ys:
        mean = sum(ys) / len(ys)
        ax.axhline(mean, color="tab:blue", linestyle="--", linewidth=1, label=f"mean = {mean:.3g}")
    for i, c in enumerate(cuts):
        ax.axvline(c + 0.5, color="black", linewidth=1.2, label="cut" if i == 0 else None)
    ax.set_xlabel("operator # (topological order)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    from matplotlib.patches import Patch

    handles, _ = ax.get_legend_handles_labels()
    handles.append(Patch(color="tab:red", label="representative (c_n > mean)"))
    handles.append(Patch(color="tab:gray", label="other operators"))
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    ax.set_xlim(-1, max(len(ys), 1))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
