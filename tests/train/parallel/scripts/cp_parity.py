"""Context parallel through the Accelerator, against one process: each layout trains the tiny GPT a few AdamW
steps (clipped) with ``maybe_context_parallel`` around forward and backward, then checks the refusals once.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/cp_parity.py cp=2 cp=2:alltoall
    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/cp_parity.py dp=2,cp=2 strategy=zero3,cp=2

Each argument is ``launcher`` (a bare ``Accelerator()``: what ``convoy launch`` says, e.g. from
``--config_file tests/config/accelerate/context_parallel.yaml``) or ``degrees[:rotation[:recompute]]``
(``strategy=NAME`` among the degrees names the data-parallel strategy beside cp); every rank prints one
``<layout> (<distributed type>) ... OK`` line per layout, and one ``refuses ... OK`` line per refusal.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss, reference_run

from convoy.errors import ConfigError, NotSupportedYetError
from convoy.train.accelerator import Accelerator

STEPS, SAVED, BATCH, CLIP = 3, 2, 4, 0.5


def prepare(layout, start):
    if layout == "launcher":  # the degrees and options from convoy launch (an Accelerate config file's): Accelerator()
        acc = Accelerator(collective_timeout=60)
        pc = acc.parallelism_config
        dims = {"dp": pc.data_parallel_size, "cp": pc.cp_size}
        model = copy.deepcopy(start)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = acc.prepare(model, opt)
        return acc, model, opt, dims
    degrees, rotate, recompute = (layout.split(":") + [None, None])[:3]
    parts = degrees.split(",")
    named = [part.split("=")[1] for part in parts if part.startswith("strategy=")]
    dims = {k: int(v) for k, v in (part.split("=") for part in parts if not part.startswith("strategy="))}
    options = {"cp_comm_strategy": rotate} if rotate else None
    acc = Accelerator(parallelism=dims, strategy=named[0] if named else "parallel", strategy_options=options,
                      collective_timeout=60, recompute=recompute or None)
    assert getattr(acc.strategy.config, "cp_comm_strategy", "allgather") == (rotate or "allgather")
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt, dims


def run_steps(acc, model, opt, cfg, steps=range(STEPS)):
    dp_rank, dp = acc.data_parallel_rank, acc.strategy.data_parallel_size
    cp = acc.parallelism_config.cp_size if acc.parallelism_config else 1
    losses, norms = [], []
    for step in steps:
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank].clone(), y.chunk(dp)[dp_rank].clone()
        with acc.maybe_context_parallel(buffers=[x, y], buffer_seq_dims=[1, 1], no_restore_buffers={x, y}):
            assert x.shape[1] == cfg.seq // cp, x.shape
            loss = lm_loss(model(x), y)
            acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()  # each rank's loss is over its own tokens, as many on every rank
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())  # the tp ranks' losses are equal
    return losses, norms


def check_names(acc, dims):
    pc = acc.parallelism_config
    cp = dims["cp"]
    assert pc.cp_enabled and pc.cp_size == cp and "cp" in pc.dp_cp_dim_names, pc
    tp = dims.get("tp", 1)
    assert acc.non_data_parallel_size == cp * tp, acc.non_data_parallel_size
    mesh = acc.torch_device_mesh
    assert acc.context_parallel_rank == mesh.get_local_rank("cp")
    # Accelerate's flattened names, whatever the other degrees: FSDP's mesh and the loss-averaging one
    dp = acc.strategy.data_parallel_size
    assert mesh["dp_shard_cp"].size() == cp * dp and mesh["dp_cp"].size() == cp * dp, (mesh, dp)
    assert acc.tensor_parallel_rank == (mesh.get_local_rank("tp") if tp > 1 else 0) and acc.pipeline_parallel_rank == 0
    # the cp (and tp) ranks of one data shard read the same samples
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (acc.data_parallel_rank, acc.context_parallel_rank, acc.tensor_parallel_rank))
    assert sorted(ranks) == sorted((d, c, t) for d in range(acc.strategy.data_parallel_size) for c in range(cp)
                                   for t in range(tp)), ranks


class MaskedAttention(torch.nn.Module):
    def forward(self, x):
        mask = torch.ones(x.size(-2), x.size(-2), dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


class EagerAttention(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x @ x.transpose(-1, -2), dim=-1) @ x


class ShiftsInside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, labels=None):
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def check_refusals(acc, cp):
    for model, want in ((MaskedAttention(), "layers.0 calls scaled_dot_product_attention with an attn_mask"),
                        (EagerAttention(), "without calling torch.nn.functional.scaled_dot_product_attention")):
        wrapper = torch.nn.Module()
        wrapper.layers = torch.nn.ModuleList([model])
        wrapper.forward = lambda x, wrapper=wrapper: wrapper.layers[0](x)
        acc._models.append(wrapper)
        x = torch.randn(1, 2, 4 * cp, 4)
        try:
            with acc.maybe_context_parallel(buffers=[x], buffer_seq_dims=[2]):
                wrapper(x)
        except NotSupportedYetError as err:
            message = str(err)
            assert want in message, message
        else:
            raise AssertionError(f"not refused: {want}")
        finally:
            acc._models.pop()
        print(f"rank {dist.get_rank()} refuses {type(model).__name__}: {message[:60]}... OK", flush=True)
    ids = torch.zeros(1, 8 * cp, dtype=torch.long)
    model = ShiftsInside()
    acc._models.append(model)
    try:
        with acc.maybe_context_parallel(buffers=[ids, ids.clone()], buffer_seq_dims=[1, 1]):
            model(torch.randn(1, 2, 4, 4), labels=ids)
    except NotSupportedYetError as err:
        assert "shift_labels" in str(err), str(err)
        print(f"rank {dist.get_rank()} refuses labels= under cp OK", flush=True)
    else:
        raise AssertionError("labels= not refused")
    finally:
        acc._models.pop()
    try:
        with acc.maybe_context_parallel(buffers=[torch.zeros(1, 4 * cp + 2)], buffer_seq_dims=[1]):
            pass
    except ConfigError as err:
        assert "does not split into" in str(err), str(err)
        print(f"rank {dist.get_rank()} refuses an uneven sequence OK", flush=True)


def resume(ckpt, layouts, cfg, start, reference):
    """A checkpoint saved under one cp degree resumes under another (DCP reshards the FSDP shards)."""
    ref, ref_losses, ref_norms = reference
    acc, model, opt, _ = prepare(layouts[0], start)
    run_steps(acc, model, opt, cfg, range(SAVED))
    acc.save_state(ckpt)
    torch.manual_seed(1)
    acc, model, opt, _ = prepare(layouts[1], TinyGPT(cfg))  # a different start: only the checkpoint can agree
    acc.load_state(ckpt)
    losses, norms = run_steps(acc, model, opt, cfg, range(SAVED, STEPS))
    diffs = assert_matches_reference(layouts[1], acc.strategy.full_model_state_dict(model), ref, losses,
                                     ref_losses[SAVED:], norms, ref_norms[SAVED:], clip=CLIP)
    print(f"rank {dist.get_rank()} resume {layouts[0]} -> {layouts[1]}: {diffs} OK", flush=True)


def main():
    cfg = TinyConfig(seq=16)
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    layouts = sys.argv[1:]
    if layouts[0].startswith("--resume="):  # save at the first layout after SAVED steps, resume at the second
        resume(layouts[0].removeprefix("--resume="), layouts[1:3], cfg, start, (ref, ref_losses, ref_norms))
        layouts = layouts[3:]
    for i, layout in enumerate(layouts):
        acc, model, opt, dims = prepare(layout, start)
        check_names(acc, dims)
        losses, norms = run_steps(acc, model, opt, cfg)
        diffs = assert_matches_reference(layout, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                         norms, ref_norms, clip=CLIP)
        print(f"rank {dist.get_rank()} {layout} ({acc.strategy.distributed_type}) dp {acc.data_parallel_rank} "
              f"cp {acc.context_parallel_rank}: {diffs} OK", flush=True)
        if i == 0:
            check_refusals(acc, dims["cp"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
