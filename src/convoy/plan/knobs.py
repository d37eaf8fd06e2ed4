"""When nothing fits as asked: the fastest configuration that fits, turning recompute, then offload.

    from convoy.plan.knobs import turn_knobs
    rec = turn_knobs(rec, rows_at, asked="none", knobs=("recompute", "offload"), noun="GPU", case="case 2")
    rec.row.name, rec.recompute, rec.knob       # 'zero3+offload', 'full', 'recompute+offload'

``rows_at(level)`` gives the plan's candidates costed at recompute ``level`` (``convoy.plan.api.plan_for``).
The configurations tried, in the order they win a tie: recomputation (``selective``, then ``full``, above the
level asked for), then CPU offload (the offload candidates at the level asked for), then both. Among those that
fit the fastest wins; within ``TIE`` of it, the first in that order (the guide's order of cost: recomputing a
block is a third more compute, offloading moves the optimizer's states over PCIe every step). Pipelines with
more stages are layouts of the plan itself (every pp the model and loop allow), in every configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from convoy.plan.recommend import TIE, Recommendation, Row, tie_rank
from convoy.plan.run import RECOMPUTE
from convoy.plan.units import format_bytes, format_seconds

__all__ = ["KNOBS", "turn_knobs"]

#: what may be turned when nothing fits as asked, in the order it is turned
KNOBS = ("recompute", "offload")

_SAYS = {"selective": "recompute='selective' (each block keeps its matmul and attention outputs, the rest is "
                       "recomputed)",
         "full": "recompute='full' (every block recomputed in the backward)"}
_OFFLOAD = "CPU offload (optimizer state, gradients and sharded weights in host memory)"


def _configurations(asked: str, knobs: Collection[str]) -> list[tuple[str, str, bool]]:
    """(knob, recompute level, offload) in the order they are turned."""
    above = list(RECOMPUTE[RECOMPUTE.index(asked) + 1:]) if "recompute" in knobs else []
    out = [("recompute", level, False) for level in above]
    if "offload" in knobs:
        out.append(("offload", asked, True))
        out += [("recompute+offload", level, True) for level in above]
    return out


def turn_knobs(rec: Recommendation, rows_at: Callable[[str], list[Row]], *, asked: str, knobs: Collection[str],
               noun: str, case: str) -> Recommendation:
    """``rec`` (nothing fits as asked) with the fastest configuration that fits once a knob is turned, and the
    reasons saying which knob and why; ``rec`` with the advice that is left when none fits."""
    configs = _configurations(asked, knobs)
    found: list[tuple[int, Row]] = []  # (index of the configuration, row)
    cache: dict[str, list[Row]] = {}
    for i, (_knob, level, offload) in enumerate(configs):
        rows = cache.setdefault(level, rows_at(level))
        found += [(i, r) for r in rows if r.fits and r.candidate.layout.offload == offload]
    if not found:
        tried = " or ".join(k for k in ("recompute", "offload") if k in knobs)
        even = f" even with {tried}" if tried else ""
        return replace(rec, reasons=(*rec.reasons, f"Nothing fits{even}: use more {noun}s, a shorter sequence or a "
                                                   f"smaller micro-batch."))
    fastest = min(found, key=lambda f: f[1].time.seconds)[1]
    ties = [f for f in found if f[1].time.seconds <= fastest.time.seconds * (1 + TIE)]
    index, best = min(ties, key=lambda f: (f[0], tie_rank(f[1].candidate, case), f[1].time.seconds))
    knob, level, offload = configs[index]
    turned = " and ".join(([_SAYS[level]] if level != asked else []) + ([_OFFLOAD] if offload else []))
    reasons = [*rec.reasons,
               f"Turning on {turned}: {best.name} fits at {format_bytes(best.memory.total, binary=True)} per {noun} "
               f"and "
               f"takes about {format_seconds(best.time.seconds)} per step, the fastest configuration that fits."]
    others = [f for f in found if configs[f[0]][0] != knob]
    if others:
        other_i, other = min(others, key=lambda f: f[1].time.seconds)
        other_knob, other_level, _ = configs[other_i]
        how = other_knob.replace("recompute", f"recompute={other_level!r}").replace("+", " and ")
        reasons.append(f"With {how} instead, {other.name} would take {format_seconds(other.time.seconds)}.")
    return replace(rec, row=best, reasons=tuple(reasons), knob=knob)
