"""Activation recomputation under a layout: the same parameters with and without it, and as one process.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/recompute_parity.py ddp zero3 tp=2 pp=2
    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/recompute_parity.py dp=2,tp=2 dp=2,pp=2:fsdp

Each argument is one layout: a strategy name (``ddp``, ``zero1``, ``zero2``, ``zero3``, ``single``) or degrees
(``dp=2,tp=2``; ``:ENGINE`` names the dp engine), then ``@MODE/MODE`` for some modes only (default: none, selective
and full). Each layout trains ``STEPS`` AdamW steps of the tiny GPT with each ``recompute`` mode through the
Accelerator; every rank prints one ``<layout> recompute=<mode> ... OK`` line per mode when the parameters equal the
one-process reference (no recomputation; to 2e-5) and the same layout without recomputation (to 1e-6, when none
ran too), and the blocks' MLPs ran twice per micro-batch (forward, and again in the backward) with recomputation,
once without.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss, reference_run

from convoy.train.accelerator import Accelerator

STEPS, BATCH = 3, 8
MODES = ("none", "selective", "full")


def accelerator(layout: str, mode: str) -> Accelerator:
    degrees, _, engine = layout.partition(":")
    if "=" not in degrees:
        return Accelerator(strategy=degrees, recompute=mode, collective_timeout=60)
    dims = {k: int(v) for k, v in (part.split("=") for part in degrees.split(","))}
    options = {"dp_engine": engine} if engine else {}
    if dims.get("pp", 1) > 1:
        options.update(loss_fn=lm_loss, pp_microbatches=2)
    return Accelerator(parallelism=dims, recompute=mode, collective_timeout=60, strategy_options=options)


def count_mlp_calls(acc: Accelerator, model) -> list:
    """A counter of the calls into this process's blocks' MLPs (in a pipeline, its stages' traced modules)."""
    modules = model.stage_modules() if hasattr(model, "stage_modules") else [acc.unwrap_model(model)]
    calls = [0]
    for module in modules:
        for name, sub in module.named_modules():
            if name.endswith(".mlp"):
                sub.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def train(layout: str, mode: str, start: TinyGPT, cfg: TinyConfig) -> tuple[dict, float]:
    """The full state dict after ``STEPS`` steps, and the MLP calls per block forward in the last step."""
    acc = accelerator(layout, mode)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    pipeline = hasattr(model, "stage_modules")
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    calls = None
    for step in range(STEPS):
        if step == STEPS - 1:
            calls = count_mlp_calls(acc, model)  # a pipeline's stages exist once it has run
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        if pipeline:
            model(x, target=y)
        else:
            acc.backward(lm_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    blocks = sum(1 for m in (model.stage_modules() if pipeline else [acc.unwrap_model(model)])
                 for name, _ in m.named_modules() if name.endswith(".mlp"))
    forwards = blocks * (model.microbatches if pipeline else 1)
    return acc.strategy.full_model_state_dict(model), calls[0] / forwards


def main() -> None:
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, _, _ = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=1e9)
    ref_sd = ref.state_dict()
    for argument in sys.argv[1:]:
        layout, _, modes = argument.partition("@")
        runs = {mode: train(layout, mode, start, cfg) for mode in (modes.split("/") if modes else MODES)}
        plain = runs["none"][0] if "none" in runs else {}
        for mode, (full, calls) in runs.items():
            assert calls == (1 if mode == "none" else 2), (layout, mode, calls)
            compared = "parameters on rank 0"
            if full:  # a strategy may consolidate the parameters on rank 0 only
                assert set(full) == set(ref_sd), (layout, mode, sorted(set(full) ^ set(ref_sd)))
                same = max((full[k] - plain[k]).abs().max().item() for k in plain) if plain else 0.0
                one = max((full[k] - ref_sd[k]).abs().max().item() for k in ref_sd)
                assert same < 1e-6 and one < 2e-5, (layout, mode, same, one)
                compared = (f"vs none {same:.1e}, " if plain else "") + f"vs one process {one:.1e}"
            print(f"rank {dist.get_rank()} {layout} recompute={mode}: {compared}, MLP calls per block forward "
                  f"{calls:g} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
