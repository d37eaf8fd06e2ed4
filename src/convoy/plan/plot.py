"""Per-GPU memory of each candidate as stacked bars against the GPU's memory line (``convoy plan --plot``).

    from convoy.plan.plot import plot_memory
    plot_memory(p, "plan.png")          # needs matplotlib; NotSupportedYetError without it

matplotlib is optional: it is imported here only, and only when a plot is asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from convoy.errors import NotSupportedYetError
from convoy.plan.units import GiB

__all__ = ["plot_memory", "PARTS"]

PARTS = ("params", "grads", "optimizer", "master", "activations", "buffers", "temporary", "reserve")


def plot_memory(plan, path: str | Path) -> Path:
    """Draw ``plan``'s per-GPU memory breakdown per candidate to ``path`` (PNG, SVG or PDF by its suffix)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise NotSupportedYetError("--plot needs matplotlib, which is not installed (pip install matplotlib); "
                                   "--json gives the same numbers")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(plan.rows, key=lambda r: r.memory.total)
    names = [r.name for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.5))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [getattr(r.memory, part) / GiB for r in rows]
        ax.bar(names, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    limit = plan.hardware.gpu.memory_bytes / GiB
    ax.axhline(limit, color="black", linestyle="--", linewidth=1)
    ax.text(len(rows) - 0.5, limit, f" {plan.hardware.gpu.name}: {limit:.1f} GiB", va="bottom", ha="right")
    rec = plan.recommendation.row
    if rec is not None:
        ax.get_xticklabels()[names.index(rec.name)].set_fontweight("bold")
    ax.scatter(names, [r.memory.total / GiB for r in rows], marker="_", s=200, color="black", zorder=3,
               label="peak (grads and activations do not all coincide)")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"{plan.model.name}: per-GPU memory on {plan.hardware.describe()}")
    ax.tick_params(axis="x", rotation=60)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
