"""transformers models (random weights from configs, no download) under every layout.

In-process: the tp plans convoy reads or supplies for them, the style registry of the installed transformers, the
refusals, the causal-LM loss a pipeline uses, ``save_model``'s files. On CPU processes (slow): Llama, Qwen2, GPT-2
and Phi3 (with Qwen3 and Granite-SWA for their styles) trained as transformers loops call them
(``model(input_ids=..., labels=...).loss``, no ``loss_fn``) under ddp, zero3, tp=2, zero3 x tp=2, pp=2 and
dp x tp x pp, against one process; ``save_model`` writes the model's own names under each. Several layouts share
one launch (a process start with torch and transformers costs seconds).
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.checkpoint.weights import model_keys, write_model
from convoy.train.parallel import styles
from convoy.train.parallel.causal_lm import PipelineOutput, causal_lm_loss, count_targets, is_causal_lm, trace_failure
from convoy.train.parallel.tensor import check_tp_plan, resolve_tp_plan
from tests.distributed import run_script
from tests.train.parallel.hf_tiny import tiny, token_batch

transformers = pytest.importorskip("transformers")
SCRIPT = Path(__file__).parent / "scripts" / "hf_layouts.py"


def test_every_style_of_the_installed_transformers_is_run_or_refused_by_name():
    import transformers.distributed.expert_parallel  # noqa: F401 -- registers the expert styles
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

    for style in ALL_PARALLEL_STYLES.valid_keys():
        try:
            canonical = styles.canonical_style(style, entry="x", origin="model", owner="M")
        except NotSupportedYetError as err:  # expert-parallel styles
            assert style in styles.EXPERT_STYLES, style
            assert f"style {style!r}" in str(err)
            continue
        assert canonical in styles.STYLES, (style, canonical)


def test_llama_and_qwen2_plans_are_their_own_with_transformers_names():
    for family in ("llama", "qwen2"):
        plan = resolve_tp_plan(tiny(family))
        styles_of = plan.as_dict()
        assert plan.source == "model"
        assert styles_of["model.embed_tokens"] == "embedding"  # embedding_rowwise
        assert styles_of["lm_head"] == "colwise_rep"  # colwise_gather_output
        assert styles_of["model.layers.1.self_attn.o_proj"] == "rowwise"
        check_tp_plan(tiny(family), plan, 2)


def test_a_parameter_entry_splits_that_parameter_and_needs_local_params_on_its_module():
    model = tiny("granite_swa")
    plan = resolve_tp_plan(model)
    assert plan.parameters == (("model.layers.0.self_attn.sinks", 0), ("model.layers.1.self_attn.sinks", 0))
    assert plan.as_dict()["model.layers.1.self_attn"] == "local_params"
    check_tp_plan(model, plan, 2)
    with pytest.raises(StrategyError, match="tp=8 does not divide"):
        check_tp_plan(model, plan, 8)
    with pytest.raises(StrategyError, match="add {'model.layers.0.self_attn': 'local_params'}"):
        resolve_tp_plan(model, {"model.layers.*.self_attn.sinks": "colwise",
                                "model.layers.*.self_attn.q_proj": "colwise"})
    with pytest.raises(NotSupportedYetError, match="'embedding_colwise' on a single parameter"):
        resolve_tp_plan(model, {"model.layers.*.self_attn.sinks": "embedding_colwise"})


def test_gpt2_gets_convoys_plan_with_packed_qkv_and_its_tied_embedding_left_whole():
    model = tiny("gpt2")
    plan = resolve_tp_plan(model)
    assert plan.source == "builtin"
    assert plan.as_dict() == {f"transformer.h.{i}.{name}": style for i in range(2) for name, style in (
        ("attn.c_attn", "packed_qkv"), ("attn.c_proj", "rowwise"), ("mlp.c_fc", "colwise"), ("mlp.c_proj", "rowwise"))}
    assert plan.notes == ("transformer.wte and lm_head share their weight: left replicated",)
    check_tp_plan(model, plan, 2)
    with pytest.raises(StrategyError, match="tp=3"):
        check_tp_plan(model, plan, 3)


def test_packed_weights_are_refused_before_training_where_torch_cannot_gather_them(monkeypatch):
    from convoy.train.parallel import tensor

    assert styles.packed_weights_gather()  # the torch the suite pins gathers a _StridedShard
    monkeypatch.setattr(tensor, "packed_weights_gather", lambda: False)  # torch 2.11's DTensor, seen on an H200
    model = tiny("gpt2")
    with pytest.raises(NotSupportedYetError) as caught:
        check_tp_plan(model, resolve_tp_plan(model), 2)
    assert str(caught.value) == (
        f"tp plan gives 'transformer.h.0.attn.c_attn' 'packed_qkv', a packed weight (a _StridedShard DTensor), which "
        f"torch {torch.__version__}'s DTensor cannot gather or checkpoint ('cannot be interpreted into a corresponding "
        f"shard_order'); use torch 2.13 or later, or train this model with fsdp/zero3")
    check_tp_plan(tiny("llama"), resolve_tp_plan(tiny("llama")), 2)  # a plan without packed weights still runs
    # strategy="auto" then plans gpt2 without tp (fsdp/zero3, which the line names), rather than stopping on it
    from convoy.train.strategies.auto import tp_degrees

    assert tp_degrees(model, world_size=2, options={}) == ()
    monkeypatch.setattr(tensor, "packed_weights_gather", lambda: True)
    assert tp_degrees(model, world_size=2, options={}) == (2,)


def test_a_models_unknown_style_is_one_line_naming_the_module_its_plan_and_the_override():
    model = tiny("llama")
    model._tp_plan = {**model._tp_plan, "model.layers.*.mlp.gate_proj": "colwise_hypothetical"}
    with pytest.raises(StrategyError) as caught:
        resolve_tp_plan(model)
    message = str(caught.value)
    assert "'model.layers.*.mlp.gate_proj'" in message and "'colwise_hypothetical'" in message
    assert "LlamaForCausalLM's own tp plan (_tp_plan)" in message
    assert "strategy_options={'tp_plan'" in message and "\n" not in message
    # the override wins over the model's plan
    plan = resolve_tp_plan(model, {"model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "colwise",
                                   "model.layers.*.mlp.down_proj": "rowwise"})
    assert plan.source == "user" and len(plan.styles) == 6


def test_a_mixture_of_experts_plan_is_refused_naming_the_expert_module():
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)
    with pytest.raises(NotSupportedYetError) as caught:
        resolve_tp_plan(transformers.MixtralForCausalLM(config))
    message = str(caught.value)
    assert "'model.layers.*.mlp.experts'" in message and "'moe_tp_experts'" in message
    assert "mixture-of-experts" in message and "\n" not in message


def test_causal_lms_are_recognised_and_their_own_loss_adds_up_over_micro_batches():
    model = tiny("llama")
    assert is_causal_lm(model) and is_causal_lm(tiny("gpt2"))
    assert not is_causal_lm(model.model)  # the base model has no labels
    assert not is_causal_lm(torch.nn.Linear(2, 2))
    ids = token_batch(step=0)
    labels = ids.clone()
    labels[0, 3:] = -100  # padding: micro-batches with different numbers of targets
    want = model(input_ids=ids, labels=labels).loss
    loss = causal_lm_loss(model)
    n = count_targets(labels)
    assert n == 3 * 7 + 2  # each row predicts 7 next tokens; row 0 keeps its first 2
    parts = [loss(model(input_ids=i).logits, t, num_items=n) for i, t in zip(ids.chunk(2), labels.chunk(2))]
    assert torch.allclose(sum(parts), want, atol=1e-6), (sum(parts), want)


def test_the_pipeline_output_reads_as_transformers_outputs_do():
    out = PipelineOutput(loss=torch.tensor(2.0))
    assert out.loss.item() == out["loss"].item() == out[0].item() == 2.0 and out.keys() == ["loss"]
    with pytest.raises(KeyError):
        out["logits"]


def test_a_trace_failure_is_one_line_and_names_use_cache_when_the_cache_is_the_cause():
    model = tiny("llama")
    cache = RuntimeError("Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a known type."
                         "\n" + "x" * 400)
    message = trace_failure(cache, model)
    assert "use_cache=False" in message and "LlamaForCausalLM" in message and "\n" not in message
    long = trace_failure(RuntimeError("word " * 100 + "\nmore"), model)
    assert "\n" not in long and long.count("word") < 40 and "word ...)" in long


def test_the_plan_report_reads_no_deprecated_attribute():
    from convoy.train.parallel.recompute import checkpoints_itself as _recomputes  # what the plan report reads

    model = tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _recomputes(model) is False
        model.activation_checkpointing_enable()
        assert _recomputes(model) is True


def test_save_model_files_hold_every_name_of_a_tied_model_and_load_strictly(tmp_path):
    from safetensors.torch import load_file

    model = tiny("gpt2")
    state = model_keys(model.state_dict(), model.state_dict().keys())
    write_model(state, tmp_path, max_shard_size="10GB", safe_serialization=True)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert set(saved) == set(model.state_dict())  # lm_head.weight too, though tied to transformer.wte
    fresh = tiny("gpt2", seed=1)
    fresh.load_state_dict(saved, strict=True)
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    llama = tiny("llama")
    assert not any("rotary_emb" in k for k in model_keys({**llama.state_dict(), **dict(llama.named_buffers())},
                                                          llama.state_dict().keys()))


def _cells(output: str, nproc: int) -> set[str]:
    """The cells that every rank printed OK for, from lines ``rank R <family>:<layout> (...) ... OK``."""
    counts: Counter[str] = Counter()
    for line in output.splitlines():
        text = line.split("]: ", 1)[-1]  # the launcher's rank prefix
        if text.startswith("rank ") and text.endswith(" OK"):
            counts[text.split()[2]] += 1
    return {cell for cell, count in counts.items() if count == nproc}


@pytest.mark.slow
def test_llama_qwen2_gpt2_and_phi3_under_ddp_zero3_tp_and_pp_match_one_process(tmp_path):
    cells = [f"{family}:{layout}" for family in ("llama", "qwen2", "gpt2", "phi3")
             for layout in ("ddp", "zero3", "tp=2", "pp=2")]  # gpt2:pp=2: wte and lm_head tied across stages
    cells.append("qwen3:tp=2")  # replicated_with_grad_allreduce (its per-head q/k norms)
    cells.append("granite_swa:tp=2")  # attention sinks: a parameter entry, and local_params
    result = run_script(SCRIPT, nproc=2, args=[str(tmp_path), *cells], timeout=300)
    assert result.returncode == 0, result.output
    assert _cells(result.output, 2) == set(cells), result.output


@pytest.mark.slow
def test_zero3_x_tp2_of_each_family_matches_one_process_and_gpt2s_packed_weights_resume_under_zero3(tmp_path):
    cells = ["llama:zero3+tp=2", "qwen2:zero3+tp=2", "gpt2:zero3+tp=2>zero3", "phi3:zero3+tp=2",
             "granite_swa:zero3+tp=2"]
    result = run_script(SCRIPT, nproc=4, args=[str(tmp_path), *cells], timeout=300)
    assert result.returncode == 0, result.output
    assert _cells(result.output, 4) == set(cells), result.output


@pytest.mark.slow
def test_llama_under_dp2_tp2_pp2_on_eight_processes_matches_one_process(tmp_path):
    result = run_script(SCRIPT, nproc=8, args=[str(tmp_path), "llama:dp=2+tp=2+pp=2"], timeout=300)
    assert result.returncode == 0, result.output
    assert _cells(result.output, 8) == {"llama:dp=2+tp=2+pp=2"}, result.output
