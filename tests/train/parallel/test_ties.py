"""Tied weights found before a split, and the decisions tp, pp and ``strategy="auto"`` take for them.

The layouts themselves train tied models in ``test_ties_parity.py`` (several processes); these tests are pure.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from convoy.errors import StrategyError
from convoy.train.parallel.tensor import check_tp_plan, resolve_tp_plan
from convoy.train.parallel.ties import (
    Tie,
    TiedCopies,
    declared_ties,
    find_ties,
    reconcile_tp_styles,
    share_in_state,
    stages_on_one_process,
    tp_layout,
)
from convoy.train.strategies.auto import choose_strategy, planner_hook, pp_degrees, tp_degrees
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, lm_loss

EMBED_HEAD = Tie(names=("embed_tokens.weight", "lm_head.weight"))
KINDS = {"embed_tokens": "embedding", "lm_head": "linear"}


def test_ties_are_every_name_of_one_tensor_in_model_order():
    assert find_ties(TinyGPT(TinyConfig(layers=1))) == ()
    (tie,) = find_ties(TinyGPT(TinyConfig(layers=1, tied=True)))
    assert tie.names == ("embed_tokens.weight", "lm_head.weight") and tie.modules == ("embed_tokens", "lm_head")
    assert tie.describe() == "embed_tokens and lm_head" and not tie.declared


def test_transformers_declared_ties_are_read_and_marked():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    assert declared_ties(model) == (("lm_head.weight", "transformer.wte.weight"),)
    (tie,) = find_ties(model)
    assert tie.names == ("transformer.wte.weight", "lm_head.weight") and tie.declared
    untied = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**config.to_dict(), "tie_word_embeddings": False}))
    assert declared_ties(untied) == () and find_ties(untied) == ()


@pytest.mark.parametrize("kind, style, attr, layout", [
    ("embedding", None, "weight", "whole"), ("embedding", "embedding", "weight", "rows"),
    ("linear", "colwise_rep", "weight", "rows"), ("linear", "rowwise", "weight", "cols"),
    ("linear", "rowwise", "bias", "replicated"), ("other", "sequence_parallel", "weight", "replicated"),
    ("linear", "packed_colwise", "weight", None),
])
def test_how_each_style_lays_out_a_parameter(kind, style, attr, layout):
    assert tp_layout(kind, style, attr) == layout


def test_a_model_plan_that_splits_only_the_head_splits_the_tied_embedding_alike():
    # Gemma's own plan: lm_head gathered over the vocabulary, embed_tokens absent (whole): trained apart before
    styles, notes = reconcile_tp_styles({"lm_head": "colwise_rep", "layers.0.q_proj": "colwise"}, [EMBED_HEAD],
                                        KINDS, source="model")
    assert styles == {"lm_head": "colwise_rep", "embed_tokens": "embedding", "layers.0.q_proj": "colwise"}
    assert notes == ["embed_tokens and lm_head share their weight: both split over its rows (the vocabulary), "
                     "one tensor"]


def test_a_tie_that_cannot_be_split_alike_is_left_whole():
    styles, notes = reconcile_tp_styles({"lm_head": "rowwise", "q": "colwise"}, [EMBED_HEAD], KINDS, source="default")
    assert styles == {"q": "colwise"} and "both left whole" in notes[0]
    # a tied module kind that has no row split (e.g. a custom layer): whole as well
    styles, _ = reconcile_tp_styles({"lm_head": "colwise_rep"}, [EMBED_HEAD], {"lm_head": "linear"}, source="model")
    assert styles == {}


def test_a_user_plan_that_splits_a_tie_apart_is_refused_naming_both_modules_and_the_fix():
    model = TinyGPT(TinyConfig(layers=1, tied=True))
    with pytest.raises(StrategyError) as err:
        resolve_tp_plan(model, {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
                                "lm_head": "colwise_rep"})
    message = str(err.value)
    assert "\n" not in message and "embed_tokens and lm_head share one weight" in message
    assert "'embed_tokens': 'embedding', 'lm_head': 'colwise_rep'" in message
    assert "'embed_tokens': 'replicate', 'lm_head': 'replicate'" in message
    # alike, or both whole, is taken as written
    for extra in ({"embed_tokens": "embedding", "lm_head": "colwise"}, {}):
        plan = resolve_tp_plan(model, {"layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
                                       **extra})
        check_tp_plan(model, plan, 2)


def test_auto_offers_no_tp_for_a_user_plan_that_splits_a_tie_apart():
    model = TinyGPT(TinyConfig(tied=True))
    apart = {"tp_plan": {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
                         "lm_head": "colwise_rep"}}
    assert tp_degrees(model, world_size=2, options=apart) == ()
    assert tp_degrees(model, world_size=2, options={}) == (2,)  # the default plan splits the tie alike


def test_a_state_dict_names_one_tensor_per_tie():
    a, b = torch.ones(2), torch.ones(2)
    state = share_in_state({"embed_tokens.weight": a, "lm_head.weight": b, "norm.weight": b}, [EMBED_HEAD])
    assert state["lm_head.weight"] is a and state["norm.weight"] is b
    assert share_in_state({"lm_head.weight": b}, [EMBED_HEAD]) == {"lm_head.weight": b}  # one stage's names


def _order(layers: int) -> list[str]:
    return [n for n, _ in TinyGPT(TinyConfig(layers=layers)).named_modules()]


def test_which_tie_lands_on_two_stages_of_one_process():
    # 4 stages of 4 layers on 2 processes (interleaved): stage s on process s % 2
    cut = ("layers.1", "layers.2", "layers.3")
    assert stages_on_one_process([EMBED_HEAD], _order(4), cut, 2) is None  # stages 0 and 3: processes 0 and 1
    odd = Tie(names=("embed_tokens.weight", "layers.2.mlp.gate_proj.weight"))
    assert stages_on_one_process([odd], _order(4), cut, 2) == odd  # stages 0 and 2: both on process 0
    assert stages_on_one_process([odd], _order(4), cut, 4) is None


def test_auto_offers_no_pipeline_cut_that_puts_a_tie_twice_on_one_process():
    model = TinyGPT(TinyConfig(layers=4))
    model.layers[2].mlp.gate_proj.weight = model.embed_tokens.weight  # [32, 16] both
    interleaved = {"loss_fn": lm_loss, "pp_schedule": "interleaved_1f1b"}
    assert pp_degrees(model, world_size=2, options=interleaved) == ()
    assert pp_degrees(model, world_size=2, options={"loss_fn": lm_loss}) == (2,)  # two stages, one per process


class _Stage(nn.Module):
    """A stage as torch's splitter leaves it: the tied weight under the names the stage uses."""

    def __init__(self, names: tuple[str, ...], tensor: nn.Parameter) -> None:
        super().__init__()
        for name in names:
            module = nn.Module()
            module.register_parameter("weight", nn.Parameter(tensor.detach().clone()))
            self.add_module(name.split(".")[0], module)


def test_each_stage_holds_the_models_tensor_and_a_norm_counts_it_once():
    original = nn.Parameter(torch.ones(3))
    names = [["embed_tokens.weight", "layers.0.w"], ["layers.1.w"], ["lm_head.weight"]]
    # 3 stages on 3 processes; this is process 2, holding the last stage (the head)
    stage = _Stage(("lm_head.weight",), original)
    tied = TiedCopies([EMBED_HEAD], stage_names=names, pp_size=3, pp_rank=2, local={2: stage},
                      originals=[original])
    assert tied.holders == [(0, 2)] and tied.ranks == [(0, 2)]
    assert stage.lm_head.weight is original and tied.copies == [[original]]
    assert tied.spread() == [(EMBED_HEAD, (0, 2))]
    assert tied.counted_once() == {id(original)}  # the first stage's copy counts; this one is skipped
    first = _Stage(("embed_tokens.weight", "lm_head.weight"), original)  # a second name left by the splitter
    tied = TiedCopies([EMBED_HEAD], stage_names=names, pp_size=3, pp_rank=0, local={0: first}, originals=[original])
    assert first.embed_tokens.weight is first.lm_head.weight is original and tied.counted_once() == set()


def test_auto_never_splits_a_tied_model_that_fits_one_process():
    """The loop trains with model(x, target=y) (loss_fn), which used to mean pipeline layouts only: a tiny tied
    model got pp=2, trained wrong, and the line said data parallelism was the guide's choice."""
    model = TinyGPT(TinyConfig(tied=True))
    n = sum(p.numel() for p in model.parameters())
    for options in ({"loss_fn": lm_loss}, {}):
        layout = choose_strategy(world_size=2, num_parameters=n, device_bytes=8 * 2**30, model=model,
                                 planner=planner_hook(None, device_type="cpu"), options=options)
        assert layout.dims is None or (layout.dims.pp, layout.dims.tp) == (1, 1), layout
        assert "data parallelism" in layout.reason and "only pipeline layouts" not in layout.reason, layout.reason
