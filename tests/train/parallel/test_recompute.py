"""Activation recomputation in the trainer (``Accelerator(recompute=...)``): the same training with and without it,
under every strategy and layout, and one clear line where it cannot run.

The multi-process checks run ``scripts/recompute_parity.py``: each layout trains with recompute selective and full
(ddp and one process also none), and must equal the one-process reference without recomputation (and itself
without, bit for bit, where that ran too), with every block's MLP run twice per micro-batch (forward, then again
in the backward). What recomputation saves is checked against the planner
with MemTracker in ``tests/plan/test_activations.py``; on a GPU in ``tests/gpu/test_recompute_gpu.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from convoy import Accelerator
from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.parallel.recompute import _policy, _scores, apply_recompute, recompute_units
from tests.distributed import run_script
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

SCRIPT = Path(__file__).parent / "scripts" / "recompute_parity.py"


def _ok(output: str, layout: str, mode: str) -> int:
    return sum(f" {layout} recompute={mode}:" in line and line.endswith(" OK") for line in output.splitlines())


def _train(mode: str, steps: int = 3) -> tuple[dict, int]:
    """One process through the Accelerator: the parameters after ``steps`` AdamW steps, and the MLP calls."""
    torch.manual_seed(0)
    cfg = TinyConfig()
    acc = Accelerator(cpu=True, recompute=mode)
    model = TinyGPT(cfg)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    calls = [0]
    for layer in model.layers:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    for step in range(steps):
        x, y = batch(cfg, size=4, step=step)
        acc.backward(lm_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, calls[0]


def test_one_process_trains_the_same_parameters_and_recomputes_every_block():
    plain, calls = _train("none")
    for mode in ("selective", "full"):
        got, again = _train(mode)
        assert set(got) == set(plain)  # the checkpoint hooks leave the parameter names alone
        assert all(torch.equal(got[k], plain[k]) for k in plain), mode
        assert again == 2 * calls, (mode, again, calls)


def test_a_transformers_model_checkpoints_its_own_layers_without_its_kv_cache():
    """A causal LM keeps a KV cache while it trains unless told otherwise; a layer recomputed with it appends to the
    cache twice (the backward failed on a mismatched op). Its own checkpointing turns the cache off."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64)
    torch.manual_seed(0)
    start = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 12))
    grads = {}
    for mode in ("none", "selective", "full"):
        acc = Accelerator(cpu=True, recompute=mode)
        model = acc.prepare(copy.deepcopy(start))
        acc.backward(model(ids, labels=ids).loss)
        grads[mode] = {n: p.grad for n, p in model.named_parameters()}
        layers = [layer.gradient_checkpointing for layer in model.model.layers]
        assert layers == [mode != "none"] * 2, (mode, layers)
    for mode in ("selective", "full"):
        assert all(torch.equal(grads[mode][n], grads["none"][n]) for n in grads["none"]), mode
    mine = copy.deepcopy(start)
    mine.activation_checkpointing_enable()  # the model checkpoints itself already: one of the two, in one line
    with pytest.raises(StrategyError, match="already checkpoints its layers") as info:
        apply_recompute(mine, "selective")
    assert "\n" not in str(info.value)


def test_blocks_are_the_outermost_entries_of_the_model_lists():
    class Expert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    model = nn.Module()
    model.layers = nn.ModuleList([Expert(), Expert()])
    model.head = nn.Linear(4, 4)
    assert [name for name, _ in recompute_units(model)] == ["layers.0", "layers.1"]
    assert [name for name, _ in recompute_units(model, {nn.Linear})] == [
        "layers.0.experts.0", "layers.0.experts.1", "layers.1.experts.0", "layers.1.experts.1", "head"]


def test_blocks_of_a_sequential_are_its_repeated_entries():
    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))  # its own repeated Linears stay inside

    assert [name for name, _ in recompute_units(nn.Sequential(nn.Embedding(8, 4), block(), block(), nn.Linear(4, 2)))
            ] == ["1", "2"]
    model = nn.Module()
    model.body, model.head = nn.Sequential(block(), nn.ReLU(), block()), nn.Linear(4, 2)
    assert [name for name, _ in recompute_units(model)] == ["body.0", "body.2"]
    # FullyShardedDataParallelPlugin(activation_checkpointing=True) and recompute="full" on a Sequential of blocks:
    # the same gradients as without recomputation
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 4), block(), block(), nn.Linear(4, 1))
    grads = []
    for mode in ("none", "full"):
        model = Accelerator(cpu=True, recompute=mode).prepare(copy.deepcopy(plain))
        model(torch.ones(3, 4)).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    assert type(model[1].__dict__.get("forward")).__name__ == "_Checkpointed"
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_what_cannot_recompute_is_one_line():
    with pytest.raises(StrategyError) as info:  # nothing to checkpoint: recomputing the whole forward saves nothing
        Accelerator(cpu=True, recompute="full").prepare(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    assert "has no blocks to checkpoint" in str(info.value) and "\n" not in str(info.value)
    frozen = TinyGPT(TinyConfig()).requires_grad_(False)
    assert apply_recompute(frozen, "full") == 0  # no backward: nothing to recompute, nothing refused
    assert apply_recompute(TinyGPT(TinyConfig()), "none") == 0


def test_data_parallel_in_one_process_refuses_recompute():
    with pytest.raises(NotSupportedYetError) as info:
        Accelerator(cpu=True, strategy="dp", recompute="full").prepare(TinyGPT(TinyConfig()))
    assert "recompute='full' with strategy='dp' is not supported yet" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_every_strategy_and_tp_and_pp_train_the_same_with_recomputation():
    # ddp also without recomputation (bit for bit the same parameters); the others against the one-process reference
    layouts = ["ddp", "zero1@selective", "zero2@selective/full", "zero3@selective/full", "tp=2@selective/full",
               "pp=2@selective/full"]
    result = run_script(SCRIPT, nproc=2, args=layouts, timeout=400)
    assert result.returncode == 0, result.output
    for layout in layouts:
        name, _, modes = layout.partition("@")
        for mode in (modes.split("/") if modes else ("none", "selective", "full")):
            assert _ok(result.output, name, mode) == 2, (layout, mode, result.output)


@pytest.mark.slow
def test_parallel_combinations_train_the_same_with_recomputation():
    layouts = ["dp=2,tp=2@selective/full", "dp=2,pp=2@selective", "dp=2,pp=2:fsdp@full", "tp=2,pp=2@selective/full"]
    result = run_script(SCRIPT, nproc=4, args=layouts, timeout=400)
    assert result.returncode == 0, result.output
    for layout in layouts:
        name, _, modes = layout.partition("@")
        for mode in modes.split("/"):
            assert _ok(result.output, name, mode) == 4, (layout, mode, result.output)


def test_selective_tells_the_attention_scores_from_their_operands_alone():
    """torch before 2.12 gives the policy no ``op_output`` (every selective step raised on an H200 with torch
    2.11): eager attention's s x s scores are known by their operands' shapes, and the policy needs nothing else."""
    from types import SimpleNamespace

    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    q, k_t, probs, v = torch.empty(2, 64, 16), torch.empty(2, 16, 64), torch.empty(2, 64, 64), torch.empty(2, 64, 16)
    assert _scores(aten.bmm.default, (q, k_t))  # QK^T: 64 x 64 from 64 x 16 and 16 x 64
    assert not _scores(aten.bmm.default, (probs, v))  # AV: 64 x 16, kept
    assert _scores(aten.baddbmm.default, (torch.empty(2, 64, 64), q, k_t))  # the bias first, as aten takes it
    assert not _scores(aten.mm.default, (torch.empty(64, 16), torch.empty(16, 64)))
    ctx = SimpleNamespace()  # a context without op_output
    assert _policy(ctx, aten.bmm.default, q, k_t) == CheckpointPolicy.PREFER_RECOMPUTE
    assert _policy(ctx, aten.bmm.default, probs, v) == CheckpointPolicy.MUST_SAVE
