"""Each candidate's per-GPU memory beside its step time, what fits marked (``convoy plan --plot``).

    from convoy.plan.plot import plot_plan
    out = plot_path("plan")             # plan.png: the path checked before planning (suffix, writable)
    plot_plan(p, out)                   # needs matplotlib (pip install 'convoy[plot]'); NotSupportedYetError without

One row per candidate, the ones that fit first (fastest on top), then the rest. Left, memory per GPU in three
parts that add up to the plan's total: what stays all step (weights, optimizer state, master weights, buffers),
the step's peak above it (activations and temporaries, or the gradients, whichever is larger when they do not
coincide), and the reserve (CUDA context, fragmentation); the GPU's memory is a line. The axis ends a little past
the GPU's memory, so the layouts that fit stay readable: a bar beyond it is cut and labelled with its total.
Right, the step time (on a log axis when the layouts' times are orders of magnitude apart). Layouts that do
not fit are hatched and pale; the recommended one is named in bold with a star. matplotlib is imported here
only, when a plot is asked for.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from convoy.errors import NotSupportedYetError, PlanError, shown
from convoy.plan.units import GiB
from convoy.reading import shown_path

__all__ = ["plot_plan", "plot_path", "PARTS", "segments"]

PARTS = ("kept all step", "step's peak above it", "reserve")
"""The memory bar's parts, bottom to top (``segments``)."""
_COLORS = ("#4c72b0", "#dd8452", "#a0a0a0")
_AXIS_PAST_LIMIT = 1.5  # the memory axis ends at this multiple of the GPU's memory (or the largest fitting bar)


def segments(memory) -> tuple[float, float, float]:
    """``memory`` (a ``MemoryBreakdown``) in GiB as ``PARTS``: they add up to ``memory.total``."""
    kept = memory.params + memory.optimizer + memory.master + memory.buffers
    return kept / GiB, (memory.allocated - kept) / GiB, memory.reserve / GiB


def _ordered(rows):
    fit = sorted((r for r in rows if r.fits), key=lambda r: r.time.seconds)
    rest = sorted((r for r in rows if not r.fits), key=lambda r: r.memory.total)
    return fit + rest


def plot_path(path: str | Path) -> Path:
    """Where ``plot_plan`` will write, checked before any planning: ``path`` with ``.png`` added when it has no
    suffix; ``PlanError`` (one line) for a suffix matplotlib does not write (naming those it does) or a place no
    file can be written (a missing or read-only directory, ``/proc``); ``NotSupportedYetError`` without
    matplotlib."""
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(path)
    if not out.name or out.name in (".", ".."):
        raise PlanError(f"--plot {shown_path(path)}: give a file name such as plan.png")
    suffix = out.suffix.lower().lstrip(".")
    if not suffix:
        out = out.with_name(out.name + ".png")
    elif suffix not in FigureCanvasBase.get_supported_filetypes():
        kinds = ", ".join("." + k for k in sorted(FigureCanvasBase.get_supported_filetypes()))
        raise PlanError(f"--plot {shown_path(path)}: matplotlib does not write {shown('.' + suffix)} files; end the "
                        f"name in one of {kinds}")
    if out.is_dir():
        raise PlanError(f"--plot {shown_path(out)} is a directory; give a file name such as "
                        f"{shown_path(out / 'plan.png')}")
    existed = os.path.lexists(out)
    try:  # the one true test of writability (root passes every access() check, /proc refuses files)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        os.close(fd)
    except OSError as err:
        raise PlanError(f"--plot {shown_path(out)}: cannot write there ({err.strerror or err}); give a path in a "
                        f"writable directory") from None
    if not existed:
        os.unlink(out)
    return out


def plot_plan(plan, path: str | Path) -> Path:
    """Draw ``plan``'s candidates (memory beside step time) to ``path`` (its suffix picks the format: PNG, SVG,
    PDF, ...; ``plot_path`` checks it first)."""
    plt = _pyplot()
    rows = _ordered(plan.rows)
    y = list(range(len(rows)))[::-1]  # the first row on top
    fig, (mem, tim) = plt.subplots(1, 2, sharey=True, figsize=(11, max(3.5, 0.32 * len(rows) + 1.8)),
                                   gridspec_kw={"width_ratios": (3, 2)})
    _draw_memory(mem, rows, y, plan.hardware.gpu)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS]
    fig.legend(handles, PARTS, fontsize="small", loc="lower center", ncol=3, frameon=False)
    _draw_time(tim, rows, y)
    _name_rows(mem, rows, y, plan.recommendation.row)
    rec = plan.recommendation.row
    fig.suptitle(f"{Path(str(plan.model.name)).name} on {plan.hardware.describe()}"
                 + (f": * {rec.name} recommended" if rec is not None else ": no layout fits"), fontsize="medium")
    fig.tight_layout(rect=(0, 0.04, 1, 1))  # the legend below
    out = Path(path)
    try:
        fig.savefig(out, dpi=120)
    except OSError as err:  # a disk that filled up after plot_path's check
        raise PlanError(f"--plot {shown_path(out)}: cannot write the plot ({err.strerror or err})") from None
    finally:
        plt.close(fig)
    return out


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display); NotSupportedYetError when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise NotSupportedYetError("--plot needs matplotlib, which is not installed (pip install 'convoy[plot]', "
                                   "or pip install matplotlib); --json gives the same numbers")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_memory(mem, rows, y, gpu) -> None:
    """The memory bars in ``PARTS``, cut and labelled past the axis end, with the GPU's memory as a line."""
    limit = gpu.memory_bytes / GiB
    fitting = [r.memory.total / GiB for r in rows if r.fits]
    right = max([limit * _AXIS_PAST_LIMIT, *(t * 1.05 for t in fitting)])
    left = [0.0] * len(rows)
    for _part, color, index in zip(PARTS, _COLORS, range(3)):
        widths = [segments(r.memory)[index] for r in rows]
        shown = [max(0.0, min(w, right - start)) for w, start in zip(widths, left)]  # cut at the axis end
        for yi, start, w, row in zip(y, left, shown, rows):
            mem.barh(yi, w, left=start, color=color, alpha=1.0 if row.fits else 0.35,
                     hatch=None if row.fits else "//", edgecolor="white" if row.fits else color, linewidth=0.5)
        left = [start + w for start, w in zip(left, widths)]
    for yi, row in zip(y, rows):
        total = row.memory.total / GiB
        if total > right:
            mem.text(right, yi, f" {total:,.0f} GiB ->", va="center", ha="right", fontsize="x-small",
                     color="black", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    mem.axvline(limit, color="black", linestyle="--", linewidth=1)
    mem.set_xlim(0, right)
    mem.set_xlabel("GiB per GPU (dashed: the GPU's memory; hatched: does not fit)")
    mem.set_title(f"memory per GPU ({gpu.name}: {limit:.1f} GiB)", fontsize="medium")


def _draw_time(tim, rows, y) -> None:
    """The step-time bars, each labelled, on a log axis when the times are orders of magnitude apart."""
    seconds = [r.time.seconds for r in rows]
    for yi, row, s in zip(y, rows, seconds):
        tim.barh(yi, s, color="#55a868", alpha=1.0 if row.fits else 0.35, hatch=None if row.fits else "//",
                 edgecolor="white" if row.fits else "#55a868", linewidth=0.5)
        tim.text(s, yi, f" {_seconds(s)}", va="center", fontsize="x-small")
    if max(seconds) > 20 * min(seconds):  # orders of magnitude apart: a log axis, labelled at its decades only
        from matplotlib.ticker import NullFormatter

        tim.set_xscale("log")
        tim.xaxis.set_minor_formatter(NullFormatter())
        tim.set_xlim(min(seconds) / 2, max(seconds) * 8)  # room for the labels
        tim.set_xlabel("seconds per step (log scale)")
    else:
        tim.set_xlim(0, max(seconds) * 1.3)
        tim.set_xlabel("seconds per step")
    tim.set_title("step time", fontsize="medium")


def _name_rows(mem, rows, y, rec) -> None:
    """The candidates' names down the left, the recommended one (``rec``) starred and bold."""
    names = [r.name for r in rows]
    chosen = names.index(rec.name) if rec is not None else -1
    mem.set_yticks(y)
    mem.set_yticklabels([f"* {n}" if i == chosen else n for i, n in enumerate(names)], fontsize="small")
    if chosen >= 0:
        mem.get_yticklabels()[chosen].set_fontweight("bold")


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s" if s < 100 else f"{s:,.0f} s"
