"""Eager, compiled and compiled + float8 side by side for one layout, and which of them to run.

    from convoy.plan.variants import compare, choose
    options = compare(model, run, layout, hw, global_batch=16, rates=rates)
    [(v.name, v.time.seconds, v.fits, v.why_not) for v in options]     # eager, compile, compile+fp8 tensorwise
    best, reason = choose(options, hw=hw, asked={})                     # the fastest that runs and fits

``convoy plan`` prices the recommended layout three ways (``convoy.plan.speedups`` holds the factors): as it is
(eager, 16-bit GEMMs), with each block compiled (``compile="blocks"``), and compiled with torchao's float8 recipe
(``fp8="tensorwise"``, on a board with float8 tensor cores), plus what the user asked for where it is none of these.
It recommends the fastest that fits and can run; what the user asked for stays fixed. On CPU processes compile is
shown but not chosen unasked: its first step, minutes on a few cores, outweighs it for the short jobs they run.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from convoy.errors import PlanError
from convoy.plan.hardware import Hardware
from convoy.plan.memory import Layout, MemoryBreakdown, memory_per_gpu
from convoy.plan.model import ModelSpec
from convoy.plan.run import RunSpec
from convoy.plan.speed.rates import Rates
from convoy.plan.speedups import compile_seconds
from convoy.plan.timing import StepTime, step_time
from convoy.plan.units import format_seconds

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Variant", "compare", "choose", "AXES"]

#: what the planner chooses unless the user fixes it: ``compile`` and ``fp8`` (``RunSpec``'s fields)
AXES = ("compile", "fp8")


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One way of running the layout: its compile and float8 settings, step time and memory."""

    compile: str
    fp8: str
    time: StepTime | None = None
    """None when it cannot run (``why_not``)."""
    memory: MemoryBreakdown | None = None
    fits: bool = False
    compile_seconds: float = 0.0
    """The first step's one-off compile (an estimate, ``convoy.plan.speedups.compile_seconds``)."""
    why_not: str = ""
    """Why it cannot run here ("" when it can)."""

    @property
    def name(self) -> str:
        """``eager``, ``compile``, ``compile=model``, ``compile+fp8 tensorwise``, ``fp8 rowwise``..."""
        parts = [] if self.compile == "none" else ["compile" if self.compile == "blocks" else f"compile={self.compile}"]
        if self.fp8 != "none":
            parts.append(f"fp8 {self.fp8}")
        return "+".join(parts) or "eager"

    def as_dict(self) -> dict[str, Any]:
        t = self.time
        return {"name": self.name, "compile": self.compile, "fp8": self.fp8, "fits": self.fits,
                "step_seconds": t.seconds if t else None,
                "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu if t else None, "mfu": t.mfu if t else None,
                "memory_bytes": self.memory.total if self.memory else None,
                "activation_bytes": self.memory.activations if self.memory else None,
                "comm_bytes": t.comm_bytes if t else None,
                "compile_seconds": self.compile_seconds, "compile_seconds_is_estimate": True,
                "why_not": self.why_not}


def _combinations(asked: Mapping[str, str]) -> list[tuple[str, str]]:
    """(compile, fp8) to price: eager, compiled, compiled + float8 (compiled as asked, float8 in the recipe asked,
    tensorwise by default), and the combination asked where it is none of them."""
    comp = asked.get("compile", "none")
    comp = comp if comp != "none" else "blocks"
    recipe = asked.get("fp8", "none")
    recipe = recipe if recipe != "none" else "tensorwise"
    out = [("none", "none"), (comp, "none"), (comp, recipe)]
    mine = (asked.get("compile", "none"), asked.get("fp8", "none"))
    return out if mine in out else [*out, mine]


def trainer_refuses(layout: Layout, *, compile: str, fp8: str) -> str | None:
    """Why convoy's trainer would refuse ``layout`` run with ``compile`` and ``fp8`` (None: it runs it), so that
    the plan never prints a line that does not run (``convoy.train.parallel.compile``'s refusals)."""
    if compile != "none" and layout.dims.tp_enabled:
        return "compile with tensor parallelism is not supported yet (pytorch/pytorch#139681)"
    if compile != "none" and layout.dims.cp_enabled:
        return "compile with context parallelism is not supported yet"
    return None


def compare(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, global_batch: int, rates: Rates,
            asked: Mapping[str, str] | None = None, stack: str = "convoy") -> tuple[Variant, ...]:
    """``layout`` priced eager, compiled and compiled + float8 (``_combinations``) at ``run``'s other settings;
    ``asked``: the axes (``AXES``) the user fixed, by name; ``stack``: the software it runs on
    (``convoy.plan.stacks``, convoy's own by default)."""
    out = []
    # convoy's stack is the callers' default: the same remembered step times as theirs
    mine: dict[str, Any] = {} if stack == "convoy" else {"stack": stack}
    for comp, recipe in _combinations(asked or {}):
        refused = trainer_refuses(layout, compile=comp, fp8=recipe)
        if refused is not None:
            out.append(Variant(compile=comp, fp8=recipe, why_not=refused))
            continue
        try:
            own = replace(run, compile=comp, fp8=recipe)
            t = step_time(model, own, layout, hw, global_batch=global_batch, rates=rates, **mine)
        except PlanError as e:  # no float8 tensor cores, a recipe that is not bf16
            out.append(Variant(compile=comp, fp8=recipe, why_not=str(e).split(";")[0]))
            continue
        mem = memory_per_gpu(model, own, layout, **mine)
        out.append(Variant(compile=comp, fp8=recipe, time=t, memory=mem, fits=mem.total <= hw.gpu.memory_bytes,
                           compile_seconds=compile_seconds(model, own)))
    return tuple(out)


def choose(variants: tuple[Variant, ...], *, hw: Hardware, asked: Mapping[str, str]) -> tuple[Variant | None, str]:
    """The variant to run and one sentence saying why: of those matching what was ``asked``, that run and fit, the
    fastest (compile only where asked on CPU processes); None when none of them can."""
    allowed = [v for v in variants if all(getattr(v, axis) == value for axis, value in asked.items())]
    if hw.gpu.kind == "cpu" and "compile" not in asked:
        allowed = [v for v in allowed if v.compile == "none"]
    runnable = [v for v in allowed if v.time is not None and v.fits]
    if not runnable:
        return None, ""
    best = min(runnable, key=lambda v: v.time.seconds)  # type: ignore[union-attr]
    eager = next((v for v in variants if v.compile == "none" and v.fp8 == "none" and v.time is not None), None)
    if best.compile == "none" and best.fp8 == "none":
        return best, ""
    t = best.time
    assert t is not None
    gain = f", {eager.time.seconds / t.seconds - 1:.0%} faster than eager" if eager and eager.time else ""
    first = (f"; its first step compiles for about {format_seconds(best.compile_seconds)} more (an estimate)"
             if best.compile_seconds else "")
    how = "as asked" if all(axis in asked for axis in AXES) else "the fastest way to run it"
    return best, (f"Run {best.name} ({how}): {format_seconds(t.seconds)} per step, {t.tokens_per_s_per_gpu:,.0f} "
                  f"tokens/s per GPU{gain}{first}.")
