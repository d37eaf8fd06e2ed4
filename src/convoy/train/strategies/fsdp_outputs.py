"""Forward outputs FSDP2 can see into: the tensors in a ``types.SimpleNamespace``, a dataclass or another plain
object that a model returns, which FSDP2's hooks would not find.

    fully_shard_exposed(module, mesh=mesh)   # fully_shard, and model(x).loss.backward() works for any such output

FSDP2 (``fully_shard``) hooks the backward of a sharded module through its output: its post-forward hook
(``FSDPState._post_forward`` -> ``_register_pre_backward_hook`` in ``torch/distributed/fsdp/_fully_shard/
_fsdp_state.py``) registers ``_pre_backward`` on each output tensor that requires grad. It finds them by walking
the output: torch 2.13 with ``collect_grad_tensors`` (tuples, lists, dicts, namedtuples and dataclasses), earlier
releases with ``torch.utils._pytree.tree_flatten`` (the same but registered types instead of dataclasses: a plain
dataclass is a leaf). Neither opens a ``SimpleNamespace``. A tensor it misses gets no hook, so nothing gathers
the module's weights again for the backward: resharded after forward (zero3) they fail it with "setStorage: ...
out of bounds for storage of size 0"; kept (zero2), the root's final callback, queued by that hook, never runs
and its gradients are not reduced when the inputs need none.

convoy opens such an output for FSDP2's hook and closes it after: a forward hook registered just before
``fully_shard`` registers FSDP2's (so after the user's own hooks) turns each object holding tensors into a plain
tuple every torch walks (the object, kept opaque, and its attribute values), and one registered just after gives
the same object back, whose tensors are now hooked. No pytree node is registered, so nothing changes for other
code; DDP needs none of this (its hooks are on the parameters).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any

import torch

__all__ = ["fully_shard_exposed", "open_output", "close_output"]

_MAX_DEPTH = 32


class _Opened:
    """The object an opened output stood for, and the names of its values (opaque to every tree walker)."""

    __slots__ = ("obj", "names")

    def __init__(self, obj: Any, names: tuple[str, ...]) -> None:
        self.obj = obj
        self.names = names


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple)


def _fields(x: Any) -> dict[str, Any] | None:
    """The values of an object FSDP2 may not walk into: a dataclass's fields, a ``SimpleNamespace``'s or another
    plain object's attributes; None for what every torch walks itself (or holds no values we can read)."""
    if isinstance(x, (torch.Tensor, torch.nn.Module, type, str, bytes)) or type(x) in (dict, list, tuple):
        return None
    if _is_namedtuple(x) or isinstance(x, dict):  # a dict subclass (Hugging Face's ModelOutput): walked by torch
        return None
    if dataclasses.is_dataclass(x):
        return {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    if isinstance(x, types.SimpleNamespace) or type(x).__module__ != "builtins":
        try:
            return dict(vars(x))
        except TypeError:  # __slots__ only: not opened (see fully_shard_exposed)
            return None
    return None


def open_output(x: Any) -> Any:
    """``x`` with every object holding tensors (at any depth of tuples, lists and dicts) replaced by a plain tuple
    of its values; ``x`` itself when there is none (the common case: a tensor, a tuple of tensors)."""
    return _open(x, 0, set())


def _open(x: Any, depth: int, seen: set[int]) -> Any:
    if depth > _MAX_DEPTH or isinstance(x, torch.Tensor) or id(x) in seen:
        return x
    seen.add(id(x))  # an object met twice (or a cycle) is opened once
    if type(x) is dict:
        items = {k: _open(v, depth + 1, seen) for k, v in x.items()}
        return items if any(items[k] is not v for k, v in x.items()) else x
    if type(x) in (list, tuple) or _is_namedtuple(x):
        values = [_open(v, depth + 1, seen) for v in x]
        if all(a is b for a, b in zip(values, x)):
            return x
        return type(x)(*values) if _is_namedtuple(x) else type(x)(values)
    fields = _fields(x)
    if not fields or not _holds_tensor(fields.values(), depth + 1, set()):
        return x
    return (_Opened(x, tuple(fields)), tuple(_open(v, depth + 1, seen) for v in fields.values()))


def _holds_tensor(values: Any, depth: int, seen: set[int]) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if depth > _MAX_DEPTH or id(v) in seen:
            continue
        seen.add(id(v))
        if type(v) is dict:
            inner: Any = v.values()
        elif type(v) in (list, tuple) or _is_namedtuple(v):
            inner = v
        else:
            fields = _fields(v)
            inner = fields.values() if fields else ()
        if _holds_tensor(inner, depth + 1, seen):
            return True
    return False


def close_output(x: Any) -> Any:
    """The inverse of ``open_output``: each opened tuple becomes its object again (the same object when FSDP2 kept
    its tensors, as it does outside ``torch.func`` transforms; else a shallow copy holding the new ones)."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], _Opened):
        opened, values = x
        obj = opened.obj
        closed = dict(zip(opened.names, (close_output(v) for v in values)))
        changed = {k: v for k, v in closed.items() if v is not getattr(obj, k, None)}
        if not changed:
            return obj
        obj = copy.copy(obj)
        for name, value in changed.items():
            object.__setattr__(obj, name, value)  # also on a frozen dataclass
        return obj
    if type(x) is dict:
        items = {k: close_output(v) for k, v in x.items()}
        return items if any(items[k] is not v for k, v in x.items()) else x
    if type(x) in (list, tuple) or _is_namedtuple(x):
        values = [close_output(v) for v in x]
        if all(a is b for a, b in zip(values, x)):
            return x
        return type(x)(*values) if _is_namedtuple(x) else type(x)(values)
    return x


def fully_shard_exposed(module: torch.nn.Module, **kwargs: Any) -> None:
    """``fully_shard(module, **kwargs)`` with its outputs opened for FSDP2's post-forward hook and closed after it
    (hooks the user registered before see the object, as they did). Objects with ``__slots__`` only are not opened
    (a model returning one under FSDP2 still fails in its backward)."""
    from torch.distributed.fsdp import fully_shard

    module.register_forward_hook(_open_hook)  # FSDP2 registers its post-forward hook next, after this one
    fully_shard(module, **kwargs)
    module.register_forward_hook(_close_hook)


def _open_hook(_module: Any, _args: Any, out: Any) -> Any:
    return out if isinstance(out, torch.Tensor) else open_output(out)  # a tensor: nothing to walk (most blocks)


def _close_hook(_module: Any, _args: Any, out: Any) -> Any:
    return out if isinstance(out, torch.Tensor) else close_output(out)
