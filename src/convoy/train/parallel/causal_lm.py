"""transformers causal LMs in a pipeline: their own loss, their calling convention, and their cache switched off.

    from convoy.train.parallel.causal_lm import is_causal_lm, causal_lm_loss, PipelineOutput
    is_causal_lm(model)                             # LlamaForCausalLM, GPT2LMHeadModel, ...: True
    loss = causal_lm_loss(model)(logits, labels, num_items=n)   # the model's loss_function, shifted labels
    out = PipelineOutput(loss=loss); out.loss, out["loss"], out[0]

A pipeline trains a causal LM as transformers' loops call it, ``model(input_ids=..., labels=...)`` and ``.loss``:
the labels are the last stage's target, and each micro-batch's loss is the model's own ``loss_function`` (labels
shifted by one, ``-100`` ignored) summed over its tokens and divided by the valid tokens of the whole batch, so the
micro-batches add up to the loss one process computes on that batch. Nothing here imports transformers: a model is
recognised by what it has.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "is_causal_lm", "causal_lm_loss", "count_targets", "cache_off", "PipelineOutput",
           "trace_failure"]

#: the label transformers' losses skip
IGNORE_INDEX = -100


def is_causal_lm(model: nn.Module) -> bool:
    """A transformers model that predicts the next token from ``input_ids`` and takes ``labels``: a registered
    causal-LM class (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) or one whose loss type is ``ForCausalLM``."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False
    try:
        if "labels" not in inspect.signature(model.forward).parameters:
            return False
    except (TypeError, ValueError):
        return False
    if getattr(model, "loss_type", None) == "ForCausalLM":
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(model).__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def count_targets(labels: torch.Tensor) -> int:
    """How many tokens of ``labels`` a causal-LM loss counts: each position's next label, ``-100`` skipped."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def causal_lm_loss(model: nn.Module) -> Callable[..., torch.Tensor]:
    """``loss(output, labels, num_items=n)``: ``model``'s own causal-LM loss of a micro-batch's logits (the output
    itself, or its ``.logits``/first entry), summed and divided by ``n``, the valid targets of the whole batch."""
    config: Any = model.config  # a transformers PretrainedConfig
    vocab_size = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    from transformers.loss.loss_utils import LOSS_MAPPING

    loss_function: Callable[..., Any]
    if hasattr(model, "_loss_function") or getattr(model, "loss_type", None) in LOSS_MAPPING:
        loss_function = cast(Callable[..., Any], model.loss_function)  # transformers' method, not a submodule
    else:  # transformers would warn on every rank, then use ForCausalLM's loss (GPT2LMHeadModel): use it ourselves
        loss_function = cast(Callable[..., Any], LOSS_MAPPING["ForCausalLM"])  # typed as the losses' join

    def loss(output: Any, labels: torch.Tensor, *, num_items: int) -> torch.Tensor:
        logits = _logits(output)
        return loss_function(logits=logits, labels=labels, vocab_size=vocab_size, num_items_in_batch=num_items)

    return loss


def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"a causal LM's pipeline output should hold logits, got {type(output).__name__}")


@contextlib.contextmanager
def cache_off(model: nn.Module) -> Iterator[None]:
    """``model.config.use_cache`` off inside (training keeps no key/value cache, and pipeline stages cannot send
    one), put back after."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "use_cache"):
        yield
        return
    before = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = before


@dataclass(frozen=True)
class PipelineOutput:
    """What a pipeline returns for a transformers-style call: ``.loss`` on every stage (the batch's loss, when
    labels were given), ``.logits`` on the last stage (``None`` elsewhere). Indexing as transformers' outputs:
    ``out["loss"]``, ``out[0]`` (the first field that is set)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key: int | str) -> torch.Tensor:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]


def trace_failure(exc: BaseException, model: nn.Module) -> str:
    """One line saying why ``model`` could not be traced into stages, and what to do."""
    name = type(model).__name__
    text = str(exc)
    if "Cache" in text and ("not a known type" in text or "DynamicCache" in text):
        return (f"pipeline: {name}'s forward returns its key/value cache (use_cache=True), which pipeline stages "
                f"cannot pass on; train with use_cache=False (model.config.use_cache = False)")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if len(first) > 160:
        first = first[:160].rsplit(" ", 1)[0] + " ..."
    return (f"pipeline: {name} could not be traced for splitting ({type(exc).__name__}: {first}); simplify its "
            f"forward or use tp/fsdp instead")
