"""Parameters shared between modules (tied weights), found before a model is split, and kept shared after.

    from convoy.train.parallel.ties import find_ties, reconcile_tp_styles, retie
    ties = find_ties(model)              # (Tie(names=('embed_tokens.weight', 'lm_head.weight')),)
    ties[0].modules                      # ('embed_tokens', 'lm_head')
    styles, notes = reconcile_tp_styles(plan_styles, ties, module_kinds(model), source="model")
    retie(model, ties)                   # after parallelize_module: one Parameter (DTensor) per tie again

A tie is one ``Parameter`` reachable under several names (``named_parameters(remove_duplicate=False)``), such as a
language model's input embedding and output head (GPT-2, Gemma, tied Qwen2 / Llama 3.2 checkpoints). Splitting
the model must keep every name on the same values and sum the gradients of every use:

- tensor parallelism: a tied pair is left whole on every rank, or split alike (an embedding split over the
  vocabulary and a head split over its output features hold the same rows of the same weight), and after
  ``parallelize_module`` (which gives each module a new parameter) the names share one ``DTensor`` again.
  ``reconcile_tp_styles`` decides for a model's own or convoy's default plan, and refuses a user's ``tp_plan``
  that splits tied modules differently.
- pipeline parallelism: torch's splitter gives each stage that uses a tied weight its own copy. The copies are
  made equal at build (``TiedCopies.broadcast``), their gradients are summed over the stages that hold them
  before the optimizer step (``TiedCopies.sum_gradients``, as Megatron does for tied embeddings), and state dicts
  name one tensor per tie (``share_in_state``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from convoy.errors import StrategyError
from convoy.train.parallel.styles import ALIASES

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

__all__ = ["Tie", "find_ties", "declared_ties", "module_kinds", "tp_layout", "reconcile_tp_styles", "retie",
           "share_in_state", "stages_on_one_process", "TiedCopies"]


@dataclass(frozen=True)
class Tie:
    """One tensor reachable under several parameter names."""

    names: tuple[str, ...]
    """Every parameter name of the shared tensor, the first as ``named_parameters()`` reports it (the one kept)."""
    declared: bool = False
    """transformers declares the tie (``_tied_weights_keys`` with ``config.tie_word_embeddings``)."""

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules holding the tensor (``""`` for the model itself)."""
        return tuple(name.rpartition(".")[0] for name in self.names)

    def describe(self) -> str:
        """``"embed_tokens and lm_head"``."""
        shown = [m or "the model" for m in self.modules]
        return ", ".join(shown[:-1]) + f" and {shown[-1]}" if len(shown) > 1 else shown[0]


def declared_ties(model: Any) -> tuple[tuple[str, str], ...]:
    """(tied name, source name) pairs transformers declares for ``model`` when its config ties them:
    ``_tied_weights_keys`` (a mapping in transformers 5, a list of tied names before, whose source is then
    unknown: ``""``). Empty when the config says ``tie_word_embeddings=False`` or the model declares none."""
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", True) is False:
        return ()
    keys = getattr(model, "_tied_weights_keys", None)
    if isinstance(keys, Mapping):
        return tuple((str(k), str(v)) for k, v in keys.items())
    if isinstance(keys, (list, tuple)):
        return tuple((str(k), "") for k in keys)
    return ()


def find_ties(model: nn.Module) -> tuple[Tie, ...]:
    """Every tensor that ``model`` reaches under more than one parameter name, in model order."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    declared = {name for pair in declared_ties(model) for name in pair if name}
    return tuple(Tie(names=tuple(names), declared=bool(declared & set(names)))
                 for names in groups.values() if len(names) > 1)


# --- tensor parallelism -------------------------------------------------------------------------------------

#: how a tensor-parallel style lays out a module's weight and bias, per module kind: "rows" (Shard(0): an
#: embedding over its vocabulary, a Linear over its output features), "cols" (Shard(1)), "replicated" (a whole
#: DTensor), "whole" (left a plain tensor). Styles missing here (another layer's own styles) have no known layout.
_LAYOUTS: dict[tuple[str, str], dict[str, str]] = {
    **{("embedding", s): {"weight": "rows"} for s in ("rowwise", "embedding", "rowwise_rep")},
    ("embedding", "embedding_colwise"): {"weight": "cols"},
    **{("linear", s): {"weight": "rows", "bias": "rows"} for s in ("colwise", "colwise_rep")},
    **{("linear", s): {"weight": "cols", "bias": "replicated"} for s in ("rowwise", "rowwise_rep")},
}


def module_kinds(model: nn.Module) -> dict[str, str]:
    """Module name -> ``"embedding"``, ``"linear"`` or ``"other"`` (what ``tp_layout`` reads)."""
    from torch import nn

    return {name: "embedding" if isinstance(m, nn.Embedding) else "linear" if isinstance(m, nn.Linear) else "other"
            for name, m in model.named_modules()}


def tp_layout(kind: str, style: str | None, attr: str) -> str | None:
    """How ``style`` lays out parameter ``attr`` of a module of ``kind``: ``"whole"`` (no style), ``"rows"``,
    ``"cols"``, ``"replicated"``; None when unknown. Pure."""
    style = ALIASES.get(style, style) if style is not None else None  # transformers' spellings
    if style is None or style == "replicate":
        return "whole"
    if style == "sequence_parallel":
        return "replicated"
    return _LAYOUTS.get((kind, style), {}).get(attr)


def _rows_style(kind: str, style: str | None) -> str | None:
    """The style giving a module of ``kind`` its weight split over rows (the vocabulary of a tied embedding
    and head), keeping ``style`` when it already does; None when the kind has none."""
    if tp_layout(kind, style, "weight") == "rows":
        return style
    return {"embedding": "embedding", "linear": "colwise_rep"}.get(kind)


def reconcile_tp_styles(styles: Mapping[str, str], ties: Sequence[Tie], kinds: Mapping[str, str], *,
                        source: str) -> tuple[dict[str, str], list[str]]:
    """``styles`` (module name -> style) with every tie left whole or split alike, and notes saying what changed.

    Modules whose shared parameter the styles lay out alike keep their styles. Otherwise, for a model's own or
    convoy's default plan (``source`` ``"model"``/``"default"``): every module of the tie is split over the rows
    of the shared weight when one of them already is and all can be (an embedding over its vocabulary, a Linear
    head over its output features, whose output is then gathered), else all are left whole. A user's
    ``tp_plan`` (``source="user"``) that splits them differently is refused: ``StrategyError`` naming both
    modules and the ``tp_plan`` entries that would work. Pure.
    """
    out = dict(styles)
    notes: list[str] = []
    for tie in ties:
        attrs = [name.rpartition(".")[2] for name in tie.names]
        mods = list(tie.modules)
        layouts = [tp_layout(kinds.get(m, "other"), out.get(m), a) for m, a in zip(mods, attrs)]
        if None not in layouts and len(set(layouts)) == 1:
            if layouts[0] != "whole":
                notes.append(f"{tie.describe()} share their weight: both split alike ({layouts[0]}), one tensor")
            continue
        rows = [_rows_style(kinds.get(m, "other"), out.get(m)) if a == "weight" else None
                for m, a in zip(mods, attrs)]
        can_split = None not in rows and "rows" in layouts
        if source == "user":
            raise StrategyError(_refusal(tie, mods, [out.get(m) for m in mods], rows if None not in rows else None))
        for m, style in zip(mods, rows):
            if can_split:
                out[m] = style  # type: ignore[assignment]
            else:
                out.pop(m, None)
        notes.append(f"{tie.describe()} share their weight: "
                     + ("both split over its rows (the vocabulary), one tensor" if can_split else "both left whole"))
    return out, notes


def _refusal(tie: Tie, mods: list[str], styles: list[str | None], rows: list[str | None] | None) -> str:
    shown = ", ".join(f"{m or 'the model'}: {s or 'whole'}" for m, s in zip(mods, styles))
    whole = ", ".join(f"{m!r}: 'replicate'" for m in mods if m)
    split = ", ".join(f"{m!r}: {s!r}" for m, s in zip(mods, rows or []) if m)
    fix = f"tp_plan={{..., {split}}} (both over the vocabulary) or {{..., {whole}}}" if rows else \
        f"tp_plan={{..., {whole}}}"
    return (f"{tie.describe()} share one weight ({tie.names[0]}), but tp_plan splits them differently ({shown}), "
            f"so they would train as two weights; give them the same split: {fix}")


def retie(model: nn.Module, ties: Sequence[Tie]) -> None:
    """Point every name of each tie at the parameter its first name holds now (``parallelize_module`` gave each
    module a parameter of its own; ``reconcile_tp_styles`` made their layouts equal)."""
    for tie in ties:
        shared = model.get_parameter(tie.names[0])
        for name in tie.names[1:]:
            parent, _, leaf = name.rpartition(".")
            module = model.get_submodule(parent)
            if module._parameters.get(leaf) is not shared:
                # a tie's names are parameters (find_ties): one is there under each
                _check_same_layout(tie, shared, cast("nn.Parameter", module._parameters[leaf]))
                module.register_parameter(leaf, shared)


def _check_same_layout(tie: Tie, a: torch.Tensor, b: torch.Tensor) -> None:
    from torch.distributed.tensor import DTensor

    def layout(t: torch.Tensor) -> tuple:
        return (tuple(t.placements), t.device_mesh) if isinstance(t, DTensor) else ("plain",)

    # reconcile_tp_styles made them alike: a difference is convoy's bug, not the user's
    assert a.shape == b.shape and layout(a) == layout(b), (tie.names, layout(a), layout(b))


def share_in_state(state: dict[str, Any], ties: Sequence[Tie]) -> dict[str, Any]:
    """``state`` with the names of each tie pointing at one tensor (the first name's present), so that a loader
    finds it under every name (``train/checkpoint/weights.py`` writes each name)."""
    out = dict(state)
    for tie in ties:
        present = [n for n in tie.names if n in out]
        for name in present[1:]:
            out[name] = out[present[0]]
    return out


# --- pipeline parallelism -----------------------------------------------------------------------------------

def stages_on_one_process(ties: Sequence[Tie], module_order: Sequence[str], boundaries: Sequence[str], pp: int
                          ) -> Tie | None:
    """The first tie whose modules land on two different stages of one process when the model (its modules in
    ``module_order``, their forward order) is cut at ``boundaries`` and stage ``s`` runs on process ``s % pp``;
    None when every tie's stages are on different processes (or in one stage). Pure."""
    position = {name: i for i, name in enumerate(module_order)}
    starts = sorted(position[b] for b in boundaries)
    for tie in ties:
        stages = {sum(start <= position.get(m, 0) for start in starts) for m in tie.modules}
        ranks = [s % pp for s in stages]
        if len(set(ranks)) < len(ranks):
            return tie
    return None


class TiedCopies:
    """This process's copy of each tied weight across its pipeline stages, and the stages holding each.

    ``stage_names[s]`` lists, for every stage ``s`` of the pipeline (all processes'), the parameter names it
    holds; stage ``s`` runs on pipeline rank ``s % pp_size``. ``local`` maps this process's stage indices to their
    (unwrapped) modules. ``originals``: the unsplit model's tensor of each tie; torch's splitter gives each stage
    using a tied weight a copy of its own, which is replaced here by that tensor (every name of the tie in a
    stage then holds it), so that optimizers built on the model's parameters step it, as they step the weights
    of each stage. ``group_for(ranks)`` is the process group joining this process with the processes at the same
    place of the other axes (dp, tp) on pipeline ``ranks`` (None where this process is not among them).
    """

    def __init__(self, ties: Sequence[Tie], *, stage_names: Sequence[Iterable[str]], pp_size: int, pp_rank: int,
                 local: Mapping[int, nn.Module], originals: Sequence[Any], group_for: Any = None) -> None:
        self.ties = tuple(ties)
        self.pp_size = pp_size
        self.pp_rank = pp_rank
        names = [set(s) for s in stage_names]
        #: per tie: the stages holding any of its names (every process's), in order, and their pipeline ranks
        self.holders = [tuple(s for s, held in enumerate(names) if held & set(t.names)) for t in self.ties]
        self.ranks = [tuple(sorted({s % pp_size for s in stages})) for stages in self.holders]
        self.local = dict(local)
        self._group_for = group_for
        for tie, original in zip(self.ties, originals):  # before anything wraps the stages
            for module in self.local.values():
                _tie_in(module, tie, use=original)
        self.copies: list[list[Any]] = []
        self.refresh()

    def refresh(self) -> None:
        """Re-read each tie's parameter from the stage modules (a wrapper such as FSDP2 replaces them): one per
        stage holding it here, distinct objects only."""
        self.copies = []
        for tie in self.ties:
            found: list[Any] = []
            for index in sorted(self.local):
                param = _tie_in(self.local[index], tie)
                if param is not None and all(param is not p for p in found):
                    found.append(param)
            self.copies.append(found)

    def local_holders(self, tie_index: int) -> list[int]:
        """This process's stages holding tie ``tie_index``."""
        return [s for s in self.holders[tie_index] if s in self.local]

    def spread(self) -> list[tuple[Tie, tuple[int, ...]]]:
        """The ties held by more than one stage, with the pipeline ranks holding them."""
        return [(t, r) for t, stages, r in zip(self.ties, self.holders, self.ranks) if len(stages) > 1]

    def group(self, ranks: tuple[int, ...]) -> Any:
        return self._group_for(ranks)

    def _joined(self) -> Iterable[tuple[tuple[int, ...], tuple[int, ...], list[Any]]]:
        """(stages, pipeline ranks, local copies) of each tie this process holds and another stage holds too."""
        for stages, ranks, copies in zip(self.holders, self.ranks, self.copies):
            if len(stages) > 1 and self.pp_rank in ranks and copies:
                yield stages, ranks, copies

    def broadcast(self) -> None:
        """Make every copy equal the copy on the first stage holding it (collective over the holding ranks)."""
        import torch
        import torch.distributed as dist

        for stages, ranks, copies in self._joined():
            with torch.no_grad():
                value = _local(copies[0]).detach().clone()
                if len(ranks) > 1:
                    group = self.group(ranks)
                    src = dist.get_global_rank(group, ranks.index(stages[0] % self.pp_size))
                    dist.broadcast(value, src=src, group=group)
                for param in copies:
                    _local(param).copy_(value)

    def sum_gradients(self) -> None:
        """Give every copy the sum of all copies' gradients (collective over the holding ranks)."""
        import torch
        import torch.distributed as dist

        for _, ranks, copies in self._joined():
            grads = [_grad_as_param(p) for p in copies if p.grad is not None]
            total = torch.stack(grads).sum(0) if grads else torch.zeros_like(_local(copies[0]))
            if len(ranks) > 1:
                dist.all_reduce(total, group=self.group(ranks))
            for param in copies:
                if _same_layout(param.grad, param):
                    _local(param.grad).copy_(total)  # in place: a wrapper may hold the gradient (DDP's buckets)
                else:
                    param.grad = _like_grad(param, total)

    def counted_once(self) -> set[int]:
        """ids of the copies a gradient norm must skip: all but the first holding stage's, so that a tied weight
        counts once in the norm over every stage."""
        skip: set[int] = set()
        for stages, _, copies in self._joined():
            first_here = stages[0] % self.pp_size == self.pp_rank
            skip.update(id(p) for i, p in enumerate(copies) if i > 0 or not first_here)
        return skip


def _tie_in(module: nn.Module, tie: Tie, *, use: Any = None) -> Any:
    """The parameter ``module`` (a stage) holds for ``tie`` (None when it holds none of its names); with ``use``,
    every name of the tie the stage has is pointed at ``use`` first."""
    present = []
    for name in tie.names:
        try:
            present.append((name, module.get_parameter(name)))
        except AttributeError:
            continue
    if not present:
        return None
    if use is None:
        return present[0][1]
    for name, param in present:
        if param is not use:
            parent, _, leaf = name.rpartition(".")
            module.get_submodule(parent).register_parameter(leaf, use)
    return use


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _grad_as_param(param: Any) -> torch.Tensor:
    """This process's part of ``param.grad``, laid out as ``param`` is (a DTensor's gradient can come back in
    another placement: a vocabulary-split embedding's as a whole ``Replicate()``)."""
    from torch.distributed.tensor import DTensor

    grad = param.grad
    if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
        grad = grad.redistribute(param.device_mesh, param.placements)
    return _local(grad)


def _same_layout(grad: Any, param: Any) -> bool:
    from torch.distributed.tensor import DTensor

    if grad is None or isinstance(grad, DTensor) != isinstance(param, DTensor):
        return False
    return not isinstance(grad, DTensor) or tuple(grad.placements) == tuple(param.placements)


def _like_grad(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return DTensor.from_local(local.clone(), param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return local.clone()
