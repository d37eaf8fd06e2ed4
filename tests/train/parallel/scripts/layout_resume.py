"""Save a parallel layout with ``save_state`` and resume it at other layouts, against one unbroken process.

    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/layout_resume.py CKPT tp=2,pp=2 dp=2,pp=2:fsdp dp=4
    ... layout_resume.py CKPT tp=2,pp=2 dp=4 -- dp=2,pp=2 tp=2,pp=2     (two rounds in one launch)

The first layout trains ``SAVED`` steps from the common start and saves; every other layout starts from a
*different* model, loads the checkpoint before its first step (a pipeline reads it when it is built, on
that first call) and trains the remaining steps; its losses, gradient norms and final parameters must equal
an unbroken one-process run. Every rank prints ``resume <layout> (<type>) ... OK`` per resumed layout.
``--`` starts another round (its own saved layout and checkpoint) in the same processes. ``--tied`` first:
the model's head is its embedding (``TinyConfig(tied=True)``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from layout_parity import BATCH, CLIP, prepare, report, run_steps  # noqa: E402
from tests.distributed import exit_without_teardown  # noqa: E402
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, reference_run  # noqa: E402

SAVED, TOTAL = 2, 4


def main():
    root, *rounds = sys.argv[1:]
    tied = rounds[:1] == ["--tied"]
    rounds = rounds[1:] if tied else rounds
    cfg = TinyConfig(tied=tied)
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref = reference_run(start, cfg, steps=TOTAL, size=BATCH, clip=CLIP)
    groups = " ".join(rounds).split(" -- ")
    for number, group in enumerate(groups):
        saved_layout, *resumed = group.split()
        one_round(f"{root}/{number}" if len(groups) > 1 else root, saved_layout, resumed, cfg, start, ref)
    dist.destroy_process_group()


def one_round(ckpt, saved_layout, resumed, cfg, start, reference):
    ref, ref_losses, ref_norms = reference
    acc, model, opt, dims = prepare(saved_layout, start)
    run_steps(acc, model, opt, dims, cfg, range(SAVED))
    acc.save_state(ckpt)

    torch.manual_seed(1)
    other = TinyGPT(cfg)  # a different start: only the checkpoint can make the runs agree
    for layout in resumed:
        acc, model, opt, dims = prepare(layout, other)
        acc.load_state(ckpt)
        losses, norms = run_steps(acc, model, opt, dims, cfg, range(SAVED, TOTAL))
        diffs = assert_matches_reference(layout, acc.strategy.full_model_state_dict(model), ref, losses,
                                         ref_losses[SAVED:], norms, ref_norms[SAVED:], clip=CLIP)
        report(acc, f"resume {layout}", diffs)


if __name__ == "__main__":
    main()
    exit_without_teardown()
