"""pp=2 under ``mixed_precision="fp8"`` (torchao's float8, emulated on the CPU): each stage runs the model's own
``Float8Linear`` modules, the last stage keeps the output head high precision, and the losses stay within fp8's
tolerance of the same pipeline in bf16. With ``fsdp`` (4 processes: dp=2 x pp=2, FSDP2 per stage) each stage's
float8 weights are all-gathered in float8, their scales precomputed after each optimizer step.

    convoy launch --devices 0 --nproc-per-node 2 tests/train/parallel/scripts/pp_float8.py
    convoy launch --devices 0 --nproc-per-node 4 tests/train/parallel/scripts/pp_float8.py fsdp

Every rank prints ``float8 stages OK`` and ``losses within fp8 tolerance of the bf16 pipeline OK`` (and with
``fsdp``, ``gathers float8 with precomputed scales per stage OK``).
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

from convoy.train.accelerator import Accelerator
from convoy.train.process_view import AcceleratorState

STEPS, BATCH = 3, 8
CFG = TinyConfig(vocab=64, dim=32, heads=4, layers=2, hidden=64, seq=16)


def train(start, fsdp, **precision):
    """The losses of ``STEPS`` steps of ``start``'s copy on pp=2 (every rank: the mean loss) and the prepared model;
    ``fsdp``: dp=2 x pp=2 with FSDP2 per stage."""
    AcceleratorState._reset_state()
    options = {"loss_fn": lm_loss, "pp_microbatches": 2} | ({"dp_engine": "fsdp"} if fsdp else {})
    acc = Accelerator(parallelism={"pp": 2, "dp": 2} if fsdp else {"pp": 2}, collective_timeout=60, **precision,
                      strategy_options=options)
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    losses = []
    for step in range(STEPS):
        x, y = batch(CFG, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        loss = model(x, target=y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if fsdp and "fp8" in precision.values():
            check_scales(model)
    return losses, model


def check_scales(pipe):
    """Each float8 weight of this process's stage is FSDP2-sharded, gathered in float8, and holds the scale the last
    optimizer step computed from its whole (gathered) weight."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    linears = [m for stage in pipe.stage_modules() for m in stage.modules() if type(m).__name__ == "Float8Linear"]
    assert linears
    for linear in linears:
        assert isinstance(linear.weight.to_local(), WeightWithDynamicFloat8CastTensor), type(linear.weight.to_local())
        scale, full = linear.weight._local_tensor._precomputed_scale, linear.weight.full_tensor()
        assert scale is not None and torch.allclose(scale, 448.0 / full.abs().max().double().clamp(min=1e-12).float(),
                                                    rtol=1e-5), (scale, full.abs().max())


def main() -> None:
    torch.manual_seed(0)
    start = TinyGPT(CFG)
    fsdp = sys.argv[1:] == ["fsdp"]
    ref_losses, _ = train(start, fsdp, mixed_precision="bf16")
    losses, pipe = train(start, fsdp, mixed_precision="fp8", fp8_emulate=True)
    rank = dist.get_rank()
    if fsdp:
        print(f"rank {rank}: gathers float8 with precomputed scales per stage OK", flush=True)
    kinds = {name: type(m).__name__ for stage in pipe.stage_modules() for name, m in stage.named_modules()}
    if pipe.is_first:  # the first block's projections run in float8
        assert kinds["layers.0.self_attn.q_proj"] == "Float8Linear", kinds
    else:  # the last stage: its blocks in float8, the output head in high precision
        assert kinds["layers.1.mlp.down_proj"] == "Float8Linear" and kinds["lm_head"] != "Float8Linear", kinds
    print(f"rank {rank}: float8 stages OK", flush=True)
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert diff < 1e-3 and losses != ref_losses, (losses, ref_losses)  # fp8's tolerance; and not bf16 itself
    print(f"rank {rank}: losses within fp8 tolerance of the bf16 pipeline OK (max relative diff {diff:.1e})",
          flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
