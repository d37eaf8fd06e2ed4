"""zero3 (FSDP2) under ``mixed_precision="fp8"`` (torchao's float8, emulated on the CPU): weights all-gathered in
float8 with their scales precomputed after each optimizer step, losses within fp8's tolerance of bf16 zero3, and a
checkpoint that holds the high-precision weights under the bf16 model's names and loads back exactly.

    convoy launch --devices 0 --nproc-per-node 2 tests/train/parallel/scripts/fsdp_float8.py CHECKPOINT_DIR

Every rank prints ``gathers float8 with precomputed scales OK``, ``losses within fp8 tolerance of bf16 OK`` and
``checkpoint round trip OK`` (save_state/load_state, and save_model's safetensors in the bf16 model's names).
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from convoy.train.accelerator import Accelerator

STEPS, BATCH = 3, 8
CFG = TinyConfig(vocab=64, dim=32, heads=4, layers=2, hidden=64, seq=16)


def main() -> None:
    out = Path(sys.argv[1])
    acc = Accelerator(strategy="zero3", mixed_precision="fp8", fp8_emulate=True, collective_timeout=60)
    rank = dist.get_rank()
    torch.manual_seed(0)
    start = TinyGPT(CFG)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)

    # bf16 zero3 by hand: every block, then the root, gathered in bf16 and reduced in fp32, under autocast
    ref = copy.deepcopy(start)
    mesh = init_device_mesh("cpu", (2,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in ref.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(ref, mesh=mesh, mp_policy=mp)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)

    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    q_proj = model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == "Float8Linear" and type(model.lm_head).__name__ == "Linear"
    assert isinstance(q_proj.weight.to_local(), WeightWithDynamicFloat8CastTensor), type(q_proj.weight.to_local())
    losses, ref_losses = [], []
    for step in range(STEPS):
        x, y = batch(CFG, size=BATCH, step=step)
        x, y = x.chunk(2)[rank], y.chunk(2)[rank]
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        # the step computed every float8 weight's scale (one all-reduce), which the next all-gather uses
        scale = q_proj.weight._local_tensor._precomputed_scale
        full = q_proj.weight.full_tensor()
        assert scale is not None and torch.allclose(scale, 448.0 / full.abs().max().double().clamp(min=1e-12).float(),
                                                    rtol=1e-5), (scale, full.abs().max())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = ref(x)
        ref_loss = lm_loss(logits.float(), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        ref_losses.append(ref_loss.item())
    print(f"rank {rank}: gathers float8 with precomputed scales OK", flush=True)
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert diff < 1e-3 and losses != ref_losses, (losses, ref_losses)  # fp8's tolerance; and not bf16 itself
    print(f"rank {rank}: losses within fp8 tolerance of bf16 OK (max relative diff {diff:.1e})", flush=True)

    saved = acc.save_state(out)
    state = acc.get_state_dict(model)
    acc.save_model(model, out / "model")
    if rank == 0:
        from safetensors.torch import load_file

        assert list(state) == list(start.state_dict()), sorted(set(state) ^ set(start.state_dict()))
        assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in state.values())
        files = sorted((out / "model").glob("*.safetensors"))
        written = {k: v for f in files for k, v in load_file(f).items()}
        assert set(written) == set(state) and all(torch.equal(written[k], state[k]) for k in state)
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    x, y = batch(CFG, size=BATCH, step=STEPS)
    acc.backward(lm_loss(model(x.chunk(2)[rank]), y.chunk(2)[rank]))
    opt.step()  # one step past the checkpoint: the weights, and the scales precomputed from them, move on
    opt.zero_grad()
    acc.load_state(saved)
    for name, param in model.named_parameters():
        assert torch.equal(param.full_tensor(), before[name]), name
    # the scales follow the loaded weights (a stale scale would cast them with the later step's amax)
    scale, full = q_proj.weight._local_tensor._precomputed_scale, q_proj.weight.full_tensor()
    assert torch.allclose(scale, 448.0 / full.abs().max().double().clamp(min=1e-12).float(), rtol=1e-5), scale
    print(f"rank {rank}: checkpoint round trip OK", flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
