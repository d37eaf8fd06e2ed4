"""transformers causal LMs trained the transformers way under convoy's layouts, against one process.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/hf_layouts.py OUT llama:ddp gpt2:tp=2 llama:pp=2
    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/hf_layouts.py OUT llama:zero3+tp=2

Each argument after the output directory is ``family:layout`` (``hf_tiny`` families; a layout is ``+``-joined
degrees such as ``tp=2`` and at most one strategy name such as ``zero3``). The loop is the one transformers users
write, ``out = model(input_ids=ids, labels=ids)``, ``accelerator.backward(out.loss)``, with no ``loss_fn``, also
under pp. After a few AdamW steps the losses and every parameter must equal one process's; ``save_model`` must
write exactly the model's own state-dict names, which ``load_state_dict(strict=True)`` reads back to the trained
values (and ``from_pretrained`` for the first layout of each family). ``family:A>B`` also saves the state at layout
A and resumes it at layout B (not a pipeline), which must take the same next step. Every rank prints one
``<family>:<layout> (<distributed type>) ... OK`` line per layout.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.hf_tiny import tiny, token_batch

from convoy.train.accelerator import Accelerator

STEPS, LR = 2, 1e-2
# AdamW turns float-order differences in tiny gradients into visible ones (it divides by their root mean square):
# a wrong split moves parameters by about LR, 100 times this
TOLERANCE = 1e-4


def reference(family):
    """One process: the starting model, the trained one and its losses."""
    start = tiny(family)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        ids = token_batch(step=step)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return start, model, losses


def accelerator(layout):
    parts = layout.split("+")
    dims = {k: int(v) for k, v in (p.split("=") for p in parts if "=" in p)}
    strategy = next((p for p in parts if "=" not in p), None)
    options = {"pp_microbatches": 2} if dims.get("pp", 1) > 1 else {}
    return Accelerator(strategy=strategy, parallelism=dims or None, strategy_options=options, collective_timeout=60)


def prepared(acc, start):
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return acc.prepare(model, opt)


def train(acc, model, opt, steps):
    """Train the given steps (step numbers pick the batches); returns the losses, averaged as one process's."""
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    losses = []
    for step in steps:
        ids = token_batch(step=step).chunk(dp)[dp_rank]
        out = model(input_ids=ids, labels=ids)
        acc.backward(out.loss)
        opt.step()
        opt.zero_grad()
        loss = out.loss.detach().clone()
        dist.all_reduce(loss)  # every rank of a dp replica has its replica's loss
        losses.append(loss.item() / dist.get_world_size())
    return losses


def check_resume(acc, model, opt, other, start, directory):
    """save_state here, load_state at layout ``other``: the same parameters, and the next step as here."""
    acc.save_state(directory)
    acc2 = accelerator(other)
    model2, opt2 = prepared(acc2, start)
    if not isinstance(model2, torch.nn.Module):  # a pipeline is built (and loads) on its first call
        raise NotImplementedError("resume into a pipeline layout: not in this script")
    acc2.load_state(directory)
    before = acc.get_state_dict(model)
    loaded = acc2.get_state_dict(model2)
    if before and loaded:
        assert all(torch.equal(before[k], loaded[k]) for k in before), "resumed parameters differ"
    next_here, next_there = train(acc, model, opt, [STEPS]), train(acc2, model2, opt2, [STEPS])
    assert abs(next_here[0] - next_there[0]) < 1e-5, (next_here, next_there)
    return acc2


def check_saved(acc, model, ref, directory, *, from_pretrained):
    """save_model's names are the model's own, and its files load strictly to the trained values."""
    acc.save_model(model, directory)
    if acc.is_main_process:
        from safetensors.torch import load_file

        saved = load_file(str(Path(directory) / "model.safetensors"))
        want = ref.state_dict()
        assert set(saved) == set(want), sorted(set(saved) ^ set(want))
        fresh = copy.deepcopy(ref)
        fresh.load_state_dict(saved, strict=True)
        diff = max((fresh.state_dict()[k] - want[k]).abs().max().item() for k in want)
        assert diff < TOLERANCE, diff
        if from_pretrained:
            ref.config.save_pretrained(directory)
            loaded = type(ref).from_pretrained(directory)
            diff = max((loaded.state_dict()[k] - want[k]).abs().max().item() for k in want)
            assert diff < TOLERANCE, diff
    acc.wait_for_everyone()


def main():
    out_dir = Path(sys.argv[1])
    refs, saved_once = {}, set()
    for cell in sys.argv[2:]:
        family, layout = cell.split(":")
        layout, _, resume_at = layout.partition(">")
        if family not in refs:
            refs[family] = reference(family)
        start, ref, ref_losses = refs[family]
        acc = accelerator(layout)
        model, opt = prepared(acc, start)
        losses = train(acc, model, opt, range(STEPS))
        ldiff = max(abs(a - b) for a, b in zip(losses, ref_losses))
        full = acc.get_state_dict(model)
        want = ref.state_dict()
        pdiff = max((full[k].float() - want[k]).abs().max().item() for k in want) if full else 0.0
        assert not full or set(full) >= set(want), sorted(set(want) - set(full))
        worst = sorted(((full[k].float() - want[k]).abs().max().item(), k) for k in want)[-3:] if full else []
        assert ldiff < 1e-5 and pdiff < TOLERANCE, (cell, losses, ref_losses, worst)
        check_saved(acc, model, ref, out_dir / family / layout, from_pretrained=family not in saved_once)
        saved_once.add(family)
        resumed = ""
        if resume_at:
            acc2 = check_resume(acc, model, opt, resume_at, start, out_dir / "state" / family / layout)
            resumed = f", resumed at {resume_at} ({acc2.strategy.distributed_type})"
        print(f"rank {dist.get_rank()} {cell} ({acc.strategy.distributed_type}): loss diff {ldiff:.1e} "
              f"param diff {pdiff:.1e} saved{resumed} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
