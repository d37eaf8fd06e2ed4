"""A transformers Llama (attn_implementation="sdpa") trained under cp=2 through the Accelerator equals one process,
with its own loss (``.loss``): labels shifted before the split (``shift_labels``), positions split with the ids,
``num_items_in_batch`` the whole batch's targets over the cp ranks (each rank sums its own targets' losses).

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/hf_cp_parity.py llama qwen2
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.distributed import exit_without_teardown
from tests.train.parallel.hf_tiny import tiny

from convoy.errors import NotSupportedYetError
from convoy.train.accelerator import Accelerator

STEPS, BATCH, SEQ, VOCAB = 3, 2, 16, 64


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def reference(start):
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        ids = batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


def main():
    for family in sys.argv[1:]:
        start = tiny(family)
        start.config._attn_implementation = "sdpa"
        ref, ref_losses = reference(start)
        acc = Accelerator(parallelism={"cp": 2}, collective_timeout=60)
        model = copy.deepcopy(start)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt = acc.prepare(model, opt)
        cp = acc.parallelism_config.cp_size
        losses = []
        for step in range(STEPS):
            ids = batch(step)
            shift = F.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()  # labels shifted before the split
            pos = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
            targets = int((shift != -100).sum())
            with acc.maybe_context_parallel(buffers=[ids, pos, shift], buffer_seq_dims=[1, 1, 1],
                                            no_restore_buffers={ids, pos, shift}):
                loss = model(input_ids=ids, position_ids=pos, labels=shift, shift_labels=shift,
                             num_items_in_batch=targets / cp).loss
                acc.backward(loss)
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / cp)
        full = acc.strategy.full_model_state_dict(model)
        ref_sd = ref.state_dict()
        pdiff = max((full[k] - ref_sd[k]).abs().max().item() for k in full if k in ref_sd)
        ldiff = max(abs(a - b) for a, b in zip(losses, ref_losses))
        assert ldiff < 1e-5 and pdiff < 2e-5, (family, losses, ref_losses, pdiff)
        print(f"rank {dist.get_rank()} {family} cp=2: loss diff {ldiff:.1e} param diff {pdiff:.1e} OK", flush=True)
        refusals(acc, model, family)
    # a sliding-window model: the mask transformers builds is refused, naming the layer
    start = tiny("granite_swa")
    start.config._attn_implementation = "sdpa"
    start.config.sliding_window = 4
    acc = Accelerator(parallelism={"cp": 2}, collective_timeout=60)
    model = acc.prepare(start)
    ids, pos = batch(0), torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    refused(acc, model, "granite_swa sliding window", "self_attn calls scaled_dot_product_attention with an attn_mask",
            buffers=[ids, pos], call=dict(input_ids=ids, position_ids=pos))
    dist.destroy_process_group()


def refused(acc, model, what, words, *, buffers, call):
    try:
        with acc.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1] * len(buffers)):
            model(**call)
    except NotSupportedYetError as err:
        assert words in str(err) and "\n" not in str(err), str(err)
        print(f"rank {dist.get_rank()} refuses {what} OK", flush=True)
    else:
        raise AssertionError(f"not refused: {what}")


def refusals(acc, model, family):
    ids = batch(0)
    pos = torch.arange(SEQ).expand(BATCH, SEQ).contiguous()
    packed = torch.cat([torch.arange(SEQ // 2)] * 2).expand(BATCH, SEQ).contiguous()  # two documents per row
    # labels= alone: the model would shift them after the split
    refused(acc, model, f"{family} labels=", "shift_labels", buffers=[ids, pos],
            call=dict(input_ids=ids, position_ids=pos, labels=ids))
    refused(acc, model, f"{family} without position_ids", "without position_ids", buffers=[ids],
            call=dict(input_ids=ids))
    refused(acc, model, f"{family} packed documents", "packed documents", buffers=[ids, packed],
            call=dict(input_ids=ids, position_ids=packed))
    padding = torch.ones(BATCH, SEQ, dtype=torch.long)
    padding[0, -3:] = 0
    refused(acc, model, f"{family} padding", "attention_mask masks padding",
            buffers=[ids, pos, padding], call=dict(input_ids=ids, position_ids=pos, attention_mask=padding))
    model.config._attn_implementation = "eager"
    refused(acc, model, f"{family} eager attention", "attn_implementation='eager'", buffers=[ids, pos],
            call=dict(input_ids=ids, position_ids=pos))
    model.config._attn_implementation = "sdpa"


if __name__ == "__main__":
    main()
    exit_without_teardown()
