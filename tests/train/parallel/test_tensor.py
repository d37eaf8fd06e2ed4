"""TP plans: where they come from, how patterns resolve, and the errors for layouts that cannot work."""

from __future__ import annotations

import pytest
from torch import nn

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.parallel.tensor import (
    STYLES,
    apply_tensor_parallel,
    check_tp_plan,
    model_num_heads,
    resolve_tp_plan,
    tracing_stand_ins,
)
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT


def test_default_plan_covers_attention_mlp_embedding_and_head():
    plan = resolve_tp_plan(TinyGPT(TinyConfig(layers=2)))
    styles = plan.as_dict()
    assert plan.source == "default"
    assert styles["layers.0.self_attn.q_proj"] == "colwise"
    assert styles["layers.1.self_attn.o_proj"] == "rowwise"
    assert styles["layers.1.mlp.gate_proj"] == styles["layers.1.mlp.up_proj"] == "colwise"
    assert styles["layers.0.mlp.down_proj"] == "rowwise"
    assert styles["embed_tokens"] == "embedding" and styles["lm_head"] == "colwise_rep"
    assert not any(name.endswith("norm") for name in styles)  # norms only with sequence parallelism
    assert len(styles) == 2 * 7 + 2


def test_sequence_parallel_default_plan_adds_every_norm():
    styles = resolve_tp_plan(TinyGPT(TinyConfig(layers=2)), sequence_parallel=True).as_dict()
    norms = [n for n, s in styles.items() if s == "sequence_parallel"]
    assert sorted(norms) == sorted(["norm", "layers.0.input_layernorm", "layers.0.post_attention_layernorm",
                                    "layers.1.input_layernorm", "layers.1.post_attention_layernorm"])


def test_tied_embedding_and_head_are_split_alike_over_the_vocabulary():
    plan = resolve_tp_plan(TinyGPT(TinyConfig(layers=1, tied=True)))
    assert plan.as_dict()["embed_tokens"] == "embedding" and plan.as_dict()["lm_head"] == "colwise_rep"
    assert any("share their weight: both split alike" in note for note in plan.notes)


def test_declared_hugging_face_plan_wins_and_gets_the_base_model_prefix():
    class Config:
        base_model_tp_plan = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"}
        num_attention_heads = 4

    class ForCausalLM(nn.Module):
        base_model_prefix = "model"
        _tp_plan = {"lm_head": "colwise_gather_output"}

        def __init__(self):
            super().__init__()
            self.config = Config()
            self.model = TinyGPT(TinyConfig(layers=2))
            self.lm_head = nn.Linear(16, 32, bias=False)

    plan = resolve_tp_plan(ForCausalLM())
    assert plan.source == "model"
    assert plan.as_dict() == {"model.layers.0.self_attn.q_proj": "colwise",
                              "model.layers.0.self_attn.o_proj": "rowwise",
                              "model.layers.1.self_attn.q_proj": "colwise",
                              "model.layers.1.self_attn.o_proj": "rowwise", "lm_head": "colwise_rep"}


def test_user_plan_patterns_match_one_name_component_per_star():
    model = TinyGPT(TinyConfig(layers=3))
    plan = resolve_tp_plan(model, {"layers.*.mlp.up_proj": "colwise", "layers.1.mlp.down_proj": "rowwise"})
    assert plan.source == "user"
    assert plan.as_dict() == {"layers.0.mlp.up_proj": "colwise", "layers.1.mlp.up_proj": "colwise",
                              "layers.1.mlp.down_proj": "rowwise", "layers.2.mlp.up_proj": "colwise"}
    with pytest.raises(StrategyError, match="matches no module"):
        resolve_tp_plan(model, {"*.up_proj": "colwise"})  # '*' is one component, not several


@pytest.mark.parametrize("style, error", [("diagonal", StrategyError), ("moe_tp_experts", NotSupportedYetError),
                                          ("grouped_gemm", NotSupportedYetError), ("isolated", NotSupportedYetError)])
def test_unknown_expert_and_not_yet_styles_are_named_with_their_entry(style, error):
    with pytest.raises(error, match=style) as caught:
        resolve_tp_plan(TinyGPT(), {"layers.*.mlp.up_proj": style})
    assert "'layers.*.mlp.up_proj' from strategy_options['tp_plan']" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_transformers_spellings_resolve_to_the_styles_they_name():
    plan = resolve_tp_plan(TinyGPT(TinyConfig(layers=1)), {
        "embed_tokens": "embedding_rowwise", "layers.*.self_attn.q_proj": "local_colwise",
        "layers.*.mlp.up_proj": "packed_colwise", "layers.*.mlp.down_proj": "rowwise_split_input",
        "lm_head": "colwise_gather_output", "layers.*.input_layernorm": "replicated_with_grad_allreduce"})
    assert plan.as_dict() == {"embed_tokens": "embedding", "layers.0.self_attn.q_proj": "colwise",
                              "layers.0.mlp.up_proj": "packed_colwise", "layers.0.mlp.down_proj": "rowwise_rep",
                              "lm_head": "colwise_rep", "layers.0.input_layernorm": "replicated_with_grad_allreduce"}


def test_model_without_a_plan_or_known_names_asks_for_one():
    with pytest.raises(StrategyError, match="pass tp_plan"):
        resolve_tp_plan(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))


def test_checks_heads_features_and_module_kinds():
    model = TinyGPT(TinyConfig(heads=4, dim=16, hidden=32))
    assert model_num_heads(model) == 4
    plan = resolve_tp_plan(model)
    check_tp_plan(model, plan, 2)
    check_tp_plan(model, plan, 4)
    with pytest.raises(StrategyError, match="tp=3 does not divide the model's 4 attention heads"):
        check_tp_plan(model, plan, 3)
    odd = TinyGPT(TinyConfig(heads=4, dim=16, hidden=30))
    with pytest.raises(StrategyError, match="30 output features of 'layers.0.mlp.gate_proj'"):
        check_tp_plan(odd, resolve_tp_plan(odd), 4)
    with pytest.raises(StrategyError, match="splits Linear, Conv1D and Embedding modules, not a LayerNorm"):
        check_tp_plan(model, resolve_tp_plan(model, {"norm": "colwise"}), 2)
    with pytest.raises(StrategyError, match="embeddings take 'embedding'"):
        check_tp_plan(model, resolve_tp_plan(model, {"embed_tokens": "colwise"}), 2)
    with pytest.raises(StrategyError, match=r"30 output features of 'layers.0.mlp.up_proj' \(2 packed parts\)"):
        check_tp_plan(odd, resolve_tp_plan(odd, {"layers.*.mlp.up_proj": "packed_colwise"}), 2)  # 15 per part
    with pytest.raises(StrategyError, match="sequence_parallel is off"):
        check_tp_plan(model, resolve_tp_plan(model, {"norm": "sequence_parallel"}), 2)


def test_head_counts_on_attention_modules_are_checked_before_splitting():
    model = TinyGPT(TinyConfig(heads=4, dim=16))
    model.config = None  # no model-level head count: only the modules' own attributes say it
    for layer in model.layers:
        layer.self_attn.num_key_value_heads = 2  # grouped-query attention: fewer key/value heads
    plan = resolve_tp_plan(model)
    check_tp_plan(model, plan, 2)
    with pytest.raises(StrategyError, match=r"tp=4 does not divide layers.0.self_attn.num_key_value_heads=2"):
        check_tp_plan(model, plan, 4)


def test_sequence_parallel_needs_every_norm_in_the_plan():
    model = TinyGPT(TinyConfig(layers=1))
    plan = resolve_tp_plan(model, {"layers.*.mlp.up_proj": "colwise"}, sequence_parallel=True)
    with pytest.raises(StrategyError, match="missing 'layers.0.input_layernorm'"):
        check_tp_plan(model, plan, 2)


def test_every_documented_style_resolves_to_a_style_convoy_applies():
    model = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
    for style in STYLES:
        plan = resolve_tp_plan(model, {"a": style, "b": "colwise"})
        expected = {"colwise_gather_output": "colwise_rep"}.get(style, style)
        assert plan.as_dict().get("a") == (None if style == "replicate" else expected)


# --- tracing stand-ins (tp x pp): one process on torch's "fake" backend, whose collectives only keep shapes ----

@pytest.fixture
def tp2_mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


def _split_tiny_gpt(mesh, *, sequence_parallel: bool):
    model = TinyGPT(TinyConfig(layers=2))
    plan = resolve_tp_plan(model, sequence_parallel=sequence_parallel)
    apply_tensor_parallel(model, mesh, plan)
    return model, plan


def _module_shapes(model: nn.Module, names, ids) -> dict[str, tuple]:
    """(input shape as passed in, output shape as the caller gets it) of each named module in a forward."""
    seen: dict[str, tuple] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)
        # prepended: runs before DTensor's own input hooks, so it sees what the model's forward passes
        handles.append(module.register_forward_pre_hook(
            lambda _, args, name=name: seen.__setitem__(name, (tuple(args[0].shape),)), prepend=True))
        handles.append(module.register_forward_hook(
            lambda _, args, out, name=name: seen.__setitem__(name, seen[name] + (tuple(out.shape),))))
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _swapped(model: nn.Module, modules: dict) -> dict:
    previous = {name: model.get_submodule(name) for name in modules}
    for name, module in modules.items():
        model.set_submodule(name, module)
    return previous


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_stand_ins_see_and_return_the_shapes_the_split_modules_do(tp2_mesh, sequence_parallel):
    import torch
    from torch.distributed.tensor import DTensor

    model, plan = _split_tiny_gpt(tp2_mesh, sequence_parallel=sequence_parallel)
    ids = torch.randint(0, 32, (2, 8))
    real = _module_shapes(model, plan.as_dict(), ids)
    stand_ins = tracing_stand_ins(model, plan)
    assert set(stand_ins) == set(plan.as_dict())
    assert not any(isinstance(p, DTensor) for m in stand_ins.values() for p in m.parameters())  # traceable
    originals = _swapped(model, stand_ins)
    traced = _module_shapes(model, plan.as_dict(), ids)
    _swapped(model, originals)
    assert traced == real
    seq = 4 if sequence_parallel else 8  # the residual stream: this rank's half of the sequence with sp
    assert real["embed_tokens"][1] == real["layers.0.self_attn.o_proj"][1] == (2, seq, 16)
    assert real["layers.0.self_attn.q_proj"] == ((2, 8, 16), (2, 8, 8))  # local heads, whole sequence
    if sequence_parallel:
        assert real["layers.0.input_layernorm"] == ((2, 4, 16), (2, 8, 16))  # a DTensor: global shape


def test_sequence_parallel_pipeline_stages_pass_sequence_shards(tp2_mesh):
    import torch
    from torch.distributed.pipelining import SplitPoint, pipeline

    from convoy.train.parallel.pipeline import _restore_modules

    model, plan = _split_tiny_gpt(tp2_mesh, sequence_parallel=True)
    stand_ins = tracing_stand_ins(model, plan)
    ids = torch.randint(0, 32, (2, 8))
    originals = _swapped(model, stand_ins)
    try:
        pipe = pipeline(model, mb_args=(ids,), split_spec={"layers.1": SplitPoint.BEGINNING})
    finally:
        _swapped(model, originals)
    first, last = pipe.split_gm.submod_pp_0, pipe.split_gm.submod_pp_1
    assert first(ids).shape == (2, 4, 16)  # traced with the stand-ins
    _restore_modules(first, originals)
    _restore_modules(last, originals)
    assert first.get_submodule("layers.0.input_layernorm") is originals["layers.0.input_layernorm"]
    sent = first(ids)  # the real split modules, put back
    assert type(sent) is torch.Tensor and sent.shape == (2, 4, 16)  # a plain local shard crosses stages
    assert last(sent).shape == (2, 8, 32)  # the LM head gathers the whole sequence


def test_sequence_parallel_stand_ins_need_a_sequence_tp_divides(tp2_mesh):
    import torch

    model, plan = _split_tiny_gpt(tp2_mesh, sequence_parallel=True)
    embed = tracing_stand_ins(model, plan)["embed_tokens"]
    with pytest.raises(StrategyError, match=r"shape \(2, 7, 16\); make the sequence length a multiple of 2"):
        embed(torch.randint(0, 32, (2, 7)))
