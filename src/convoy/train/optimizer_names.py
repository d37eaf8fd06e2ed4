"""Optimizer state keyed by parameter name: the form every checkpoint stores it in, whatever the strategy.

    names = param_names(model, optimizer)                   # model's names of the optimizer's parameters
    by_name = named_optimizer_state(optimizer.state_dict(), names)
    optimizer.load_state_dict(numbered_optimizer_state(by_name, names))

``optimizer.state_dict()`` numbers parameters in its groups' order; a checkpoint names them, so that any
strategy at any world size can load it. Used for ZeRO-1's consolidated state (``strategies/ddp.py``,
``strategies/parallel.py``) and for Accelerate's ``optimizer.bin`` (``checkpoint/accelerate.py``): below both,
so that the strategies, which the checkpoint code calls, never import the checkpoint package.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["param_names", "named_optimizer_state", "numbered_optimizer_state"]


def param_names(model: torch.nn.Module, optimizer: Any) -> list[str]:
    """The names in ``model`` of ``optimizer``'s parameters, in its groups' order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def named_optimizer_state(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``state`` (an ``optimizer.state_dict()``) with each parameter number replaced by its name: the k-th
    parameter of the groups, in order, is ``names[k]`` (``param_names``); ``len(names)`` must match."""
    numbered = [p for group in state["param_groups"] for p in group["params"]]
    name_of = dict(zip(numbered, names))
    return {"state": {name_of[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [name_of[p] for p in g["params"]]} for g in state["param_groups"]]}


def numbered_optimizer_state(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of ``named_optimizer_state``: parameter names back to ``optimizer.load_state_dict``'s numbers."""
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}
