"""torch.compile under a layout: the same training compiled per block as in eager mode.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/compile_parity.py ddp@none zero3@selective pp=2@full

Each argument is one layout, a strategy name (``ddp``, ``zero3``, ...; ``zero2:offload`` with ``cpu_offload``) or
degrees (``pp=2``), ``#model`` to compile the whole model, then ``@MODE``, its recompute mode. Each layout trains
``STEPS`` AdamW steps of the tiny GPT through the Accelerator eagerly and compiled (``compile="blocks"``, or
``"model"``); every rank prints one ``<layout> recompute=<mode> compiled ... OK`` line when the losses (where this
rank sees them) equal eager's to 1e-6 and the parameters to 1e-5 (fp32). The arguments ``tp=2+sp`` and ``tp=2``
instead check that tensor parallelism (with sequence parallelism, and without) is refused in one line naming the
torch issue, and print ``<argument> refused OK``.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

from convoy.errors import NotSupportedYetError
from convoy.train.accelerator import Accelerator

STEPS, BATCH = 3, 8


def accelerator(layout: str, mode: str, compiled: str, **options) -> Accelerator:
    layout, _, offload = layout.partition(":")
    if offload:  # zero2:offload: FSDP2's shards in host memory
        options["cpu_offload"] = True
    if "=" not in layout:
        return Accelerator(strategy=layout, recompute=mode, compile=compiled, collective_timeout=120,
                           strategy_options=options or None)
    dims = {k: int(v) for k, v in (part.split("=") for part in layout.split(","))}
    if dims.get("pp", 1) > 1:
        options.update(loss_fn=lm_loss, pp_microbatches=2)
    return Accelerator(parallelism=dims, recompute=mode, compile=compiled, collective_timeout=120,
                       strategy_options=options)


def train(layout: str, mode: str, compiled: str, start: TinyGPT, cfg: TinyConfig) -> tuple[list, dict]:
    """The losses this rank saw, and the full state dict after ``STEPS`` steps."""
    acc = accelerator(layout, mode, compiled)
    model = copy.deepcopy(start)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    pipeline = hasattr(model, "stage_modules")
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    losses = []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        if pipeline:
            loss = model(x, target=y)
        else:
            loss = lm_loss(model(x), y)
            acc.backward(loss)
        if isinstance(loss, torch.Tensor):
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    modules = model.stage_modules() if pipeline else [acc.unwrap_model(model)]
    blocks = sum(getattr(m, "_compiled_call_impl", None) is not None for module in modules for m in module.modules())
    assert (blocks > 0) == (compiled != "none"), (layout, compiled, blocks)  # the stages of a pipeline too
    return losses, acc.strategy.full_model_state_dict(model)


def refused_with_tensor_parallel(cfg: TinyConfig, argument: str) -> None:
    acc = Accelerator(parallelism={"tp": 2}, compile="blocks", collective_timeout=120,
                      strategy_options={"sequence_parallel": argument.endswith("+sp")})
    try:
        acc.prepare(TinyGPT(cfg))
    except NotSupportedYetError as err:
        assert "pytorch/pytorch#139681" in str(err) and "compile='none'" in str(err), err
        assert "\n" not in str(err), err
        print(f"rank {dist.get_rank()} {argument} refused OK", flush=True)
        return
    raise AssertionError(f"compile with {argument} was not refused")


def main() -> None:
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    for argument in sys.argv[1:]:
        if argument.startswith("tp=2") and "@" not in argument:
            refused_with_tensor_parallel(cfg, argument)
            continue
        layout, _, mode = argument.partition("@")
        layout, _, scope = layout.partition("#")
        eager_losses, eager = train(layout, mode, "none", start, cfg)
        losses, compiled = train(layout, mode, scope or "blocks", start, cfg)
        loss_gap = max((abs(a - b) for a, b in zip(losses, eager_losses, strict=True)), default=0.0)
        assert len(losses) == len(eager_losses) and loss_gap < 1e-6, (argument, losses, eager_losses)
        param_gap = 0.0
        if eager:  # a strategy may consolidate the parameters on rank 0 only
            assert set(compiled) == set(eager), (argument, sorted(set(compiled) ^ set(eager)))
            param_gap = max((compiled[k] - eager[k]).abs().max().item() for k in eager)
            assert param_gap < 1e-5, (argument, param_gap)
        print(f"rank {dist.get_rank()} {layout} recompute={mode} compiled: losses {loss_gap:.1e}, parameters "
              f"{param_gap:.1e} from eager OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
