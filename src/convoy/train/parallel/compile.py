"""torch.compile as one step of the layout: each repeated block compiled in place, or the whole model.

    from convoy.train.parallel.compile import CompileConfig, apply_compile
    apply_compile(model, CompileConfig(scope="blocks"))     # each block: block.compile(fullgraph=True), in place
    apply_compile(model, CompileConfig(scope="model", backend="aot_eager"))
    apply_compile(stage, config, names=[n for n, _ in recompute_units(model)])   # a pipeline stage, by name

What ``Accelerator(compile=...)``, ``convoy launch --compile`` and ``CONVOY_COMPILE`` turn on (with
``compile_backend``, ``compile_mode`` and ``compile_dynamic`` passed to ``torch.compile``; Accelerate's
``dynamo_config`` / ``TorchDynamoPlugin`` / ``dynamo_backend`` map onto them). Each strategy calls ``apply_compile``
right after ``apply_recompute``: after tensor parallelism and recomputation, before FSDP2, DDP or replicate, and on
each pipeline stage once it is built -- torchtitan's order (``models/llama3/parallelize.py``: "turn on
per-TransformerBlock compile after AC wrapping and before FSDP"; ``distributed/compile.py``).

* ``"blocks"``: ``block.compile(fullgraph=True)`` for each block (``recompute_units``): in place, so the module
  keeps its class, names and hooks, and FSDP2's hooks, which run around the compiled call, fire (an
  ``OptimizedModule`` wrapper skips them: huggingface/accelerate PR #4022). Blocks of one class share their
  compiled code. What buys torchtitan's +15.7 % on Llama 3.1 8B (docs/performance.md).
* ``"model"``: ``module.compile()`` of the whole model (graph breaks allowed: a model's own Python, and FSDP2's
  hooks, which dynamo leaves to eager).

Refused: tensor parallelism (with or without sequence parallelism), whose compiled backward fails in DTensor's
``Redistribute.backward`` on torch 2.13 (pytorch/pytorch#139681). ``CompileWatch`` counts the graphs and graph
breaks for the plan line ("compiled: 4 graphs, 0 breaks") and names, once, a recompile after the first optimizer step
(a shape that changes: a ragged last batch, another sequence length), with the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from convoy.config.schema import COMPILE_MODES, COMPILE_SCOPES
from convoy.errors import ConfigError, NotSupportedYetError, shown
from convoy.train.logging import get_logger
from convoy.train.parallel.recompute import recompute_units

__all__ = ["CompileConfig", "CompileWatch", "apply_compile", "compile_config", "refuse_tensor_parallel"]

logger = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """What ``apply_compile`` compiles, and how."""

    scope: str = "none"
    """``"none"``, ``"blocks"`` (each repeated block, ``fullgraph=True``) or ``"model"`` (the whole model)."""
    backend: str = "inductor"
    """``torch.compile(backend=...)``."""
    mode: str | None = None
    """``torch.compile(mode=...)``; None: torch's default."""
    dynamic: bool | None = None
    """``torch.compile(dynamic=...)``; None: static shapes first, dynamic after a shape changes."""

    def __post_init__(self) -> None:
        if self.scope not in COMPILE_SCOPES:
            raise ConfigError(f"compile={shown(self.scope)} is not supported; choose one of "
                              f"{', '.join(COMPILE_SCOPES)}")
        if self.mode is not None and self.mode not in COMPILE_MODES:
            raise ConfigError(f"compile_mode={shown(self.mode)} is not supported; choose one of "
                              f"{', '.join(COMPILE_MODES)}")

    @property
    def enabled(self) -> bool:
        return self.scope != "none"

    def kwargs(self, *, fullgraph: bool) -> dict[str, Any]:
        """The ``torch.compile`` keyword arguments."""
        out: dict[str, Any] = {"backend": self.backend, "fullgraph": fullgraph}
        if self.mode is not None:
            out["mode"] = self.mode
        if self.dynamic is not None:
            out["dynamic"] = self.dynamic
        return out


def compile_config(settings: Any) -> CompileConfig:
    """The ``CompileConfig`` of a ``TrainSettings`` (its ``compile``, ``compile_backend``, ``compile_mode`` and
    ``compile_dynamic``)."""
    return CompileConfig(scope=settings.compile, backend=settings.compile_backend, mode=settings.compile_mode,
                         dynamic=settings.compile_dynamic)


def refuse_tensor_parallel(config: CompileConfig, sequence_parallel: bool) -> None:
    """``NotSupportedYetError`` for compile beside tensor parallelism: the compiled block's backward hands DTensor's
    ``Redistribute.backward`` a plain tensor (``'Tensor' object has no attribute '_local_tensor'``, measured on
    torch 2.13 with convoy's tp plans with and without sequence parallelism; pytorch/pytorch#139681)."""
    if not config.enabled:
        return
    sp = " with sequence_parallel" if sequence_parallel else ""
    raise NotSupportedYetError(
        f"compile={config.scope!r} with tensor parallelism{sp} is not supported yet: the compiled backward fails in "
        "DTensor's Redistribute.backward (pytorch/pytorch#139681); compile dp and pp layouts, or run tp with "
        "compile='none'")


def refuse_context_parallel(config: CompileConfig) -> None:
    """``NotSupportedYetError`` for compile beside context parallelism: the ring replaces
    ``F.scaled_dot_product_attention`` only while ``maybe_context_parallel`` is open, and a block compiled outside
    it would keep whichever it traced (untested, so refused rather than risked)."""
    if config.enabled:
        raise NotSupportedYetError(
            f"compile={config.scope!r} with context parallelism (cp > 1) is not supported yet: the ring attention is "
            "swapped in per step, which a compiled block does not follow; run cp with compile='none'")


def apply_compile(module: nn.Module, config: CompileConfig, *, classes: Iterable[type] | None = None,
                  names: Sequence[str] | None = None) -> int:
    """Compile ``module`` in place as ``config`` says and return how many modules were compiled (0: none).

    ``"blocks"``: the blocks named ``names`` (a pipeline stage, which keeps the model's names but not its lists),
    else ``recompute_units(module, classes)``; a model without blocks is compiled whole. A frozen model (a teacher,
    an EMA copy) is compiled too: it runs forward."""
    if not config.enabled:
        return 0
    import torch._dynamo

    # torchtitan's two flags (distributed/compile.py): a checkpointed block's side effects are replayed once, and
    # data-dependent scalars (.item()) stay in the graph
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    torch._dynamo.config.capture_scalar_outputs = True
    if config.scope == "model":
        module.compile(**config.kwargs(fullgraph=False))
        return 1
    if names is not None:
        present = dict(module.named_modules())
        blocks = [present[name] for name in names if name in present]
    else:
        blocks = [block for _, block in recompute_units(module, classes)]
    if not blocks and names is None:
        module.compile(**config.kwargs(fullgraph=False))  # nothing repeated to compile one by one
        return 1
    for block in blocks:
        block.compile(**config.kwargs(fullgraph=True))
    return len(blocks)


class CompileWatch:
    """What torch.compile did in this process since the watch began: graphs compiled, graph breaks, and the first
    recompile after the first optimizer step, named once (a warning) with its reason and the fix.

    ``summary()``: ``"compiled: 4 graphs, 0 breaks"`` (torch._dynamo's counters, process-wide: the difference since
    this watch began). ``step()`` after each optimizer step; ``close()`` stops watching. dynamo's compiles are
    process-wide, so one watch listens at a time: a new one (the next ``Accelerator`` that compiles) closes the one
    before it, whose run is over."""

    _active: CompileWatch | None = None

    def __init__(self) -> None:
        from torch._dynamo import callback
        from torch._dynamo.utils import counters

        if CompileWatch._active is not None:
            CompileWatch._active.close()
        CompileWatch._active = self

        self._graphs0 = counters["stats"]["unique_graphs"]
        self._breaks0 = sum(counters["graph_break"].values())
        self._steps = 0
        self.recompiled: str = ""
        """The warning given for a recompile after the first step ("" while none happened)."""
        self._callback = self._on_compile
        callback.callback_handler.register_start_callback(self._callback)

    def step(self, *_: Any) -> None:
        """One optimizer step done (an optimizer step post-hook)."""
        self._steps += 1

    def summary(self) -> str:
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"] - self._graphs0
        breaks = sum(counters["graph_break"].values()) - self._breaks0
        return f"compiled: {graphs} graph{'s' * (graphs != 1)}, {breaks} break{'s' * (breaks != 1)}"

    def close(self) -> None:
        from torch._dynamo import callback

        if self._callback is not None:
            callback.callback_handler.remove_start_callback(self._callback)
            self._callback = None  # type: ignore[assignment]
        if CompileWatch._active is self:
            CompileWatch._active = None

    def _on_compile(self, *_: Any) -> None:
        if self._steps < 1 or self.recompiled:
            return
        why = _guard_failure()
        self.recompiled = (
            f"torch.compile compiled again after optimizer step {self._steps}{f' ({why})' if why else ''}: most "
            "often an input shape changed (a ragged last batch, another sequence length), and each new shape costs "
            "a compile and may run slower; keep shapes fixed (DataLoader(drop_last=True), pad to one length) or "
            "compile for changing shapes (compile_dynamic=True)")
        logger.warning("convoy: %s", self.recompiled)


def _guard_failure() -> str:
    """The latest reason dynamo kept for recompiling (``torch._dynamo.utils.guard_failures``, filled where its
    recompile logging asks for it), short; "" when it kept none."""
    from torch._dynamo.utils import guard_failures

    reasons = [str(r).strip() for failures in guard_failures.values() for r in failures if str(r).strip()]
    if not reasons:
        return ""
    text = reasons[-1].splitlines()[0]
    return text if len(text) <= 120 else text[:117] + "..."
