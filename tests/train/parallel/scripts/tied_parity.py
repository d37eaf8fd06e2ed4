"""A model whose embedding and head share one weight, under dp x tp x pp layouts, against one process.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/tied_parity.py OUT pp=2 tp=2
    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/tied_parity.py OUT dp=2,pp=2:fsdp strategy=zero3,tp=2

Layouts are written as in ``layout_parity.py``. Each is trained for a few steps with clipping through the
Accelerator and compared with one process (``reference_run``); then the tie must still hold (one tensor in the
unsplit model or in each tensor-parallel module; equal copies on every pipeline stage holding one) and
``save_model``'s file must hold the weight once and load into the unsplit model, every other name present.
Every rank prints one ``<layout> (<distributed type>) ... OK`` line per layout.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*
sys.path.insert(0, str(Path(__file__).resolve().parent))  # layout_parity beside this script

import torch
import torch.distributed as dist
from layout_parity import BATCH, CLIP, STEPS, check_eval, prepare, report, run_steps
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, reference_run

from convoy.train.parallel.pipeline import PipelineModule

TIED = ("embed_tokens.weight", "lm_head.weight")


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def tie_holds(acc, model) -> str:
    """One tensor per module holding the tie, the same on every pipeline stage holding it."""
    if isinstance(model, PipelineModule):
        values = []
        for stage in model.stage_modules():
            held = {}
            for name in TIED:
                try:
                    held[name] = stage.get_parameter(name)
                except AttributeError:
                    continue
            assert len({id(p) for p in held.values()}) <= 1, ("two tensors in one stage", list(held))
            values += [_full(p).detach() for p in list(held.values())[:1]]
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, values)
        copies = [v for part in every for v in part]
        assert len(copies) >= 2, "the tie should be on the first and the last stage"
        assert all(torch.equal(c, copies[0]) for c in copies), max((c - copies[0]).abs().max() for c in copies)
        return f"{len(copies)} copies equal"
    unwrapped = acc.unwrap_model(model)
    assert unwrapped.lm_head.weight is unwrapped.embed_tokens.weight, "the tie was broken"
    kind = type(unwrapped.lm_head.weight.data).__name__
    return f"one {kind}"


def saved_model_loads(acc, model, directory: str, ref) -> None:
    """save_model writes the model's own names (the tied weight under each, equal): the unsplit model loads the file
    strictly, and the tie holds."""
    acc.save_model(model, directory)
    if acc.is_main_process:
        from safetensors.torch import load_file

        state = load_file(str(Path(directory) / "model.safetensors"))
        fresh = TinyGPT(TinyConfig(tied=True))
        missing, unexpected = fresh.load_state_dict(state, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        assert torch.equal(state["lm_head.weight"], state["embed_tokens.weight"])
        assert fresh.lm_head.weight is fresh.embed_tokens.weight
        diff = max((fresh.state_dict()[k] - v).abs().max().item() for k, v in ref.state_dict().items())
        assert diff < 2e-5, diff
    acc.wait_for_everyone()


def main():
    out = Path(sys.argv[1])
    cfg = TinyConfig(tied=True)
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    assert ref.lm_head.weight is ref.embed_tokens.weight
    for i, layout in enumerate(sys.argv[2:]):
        acc, model, opt, dims = prepare(layout, start)
        losses, norms = run_steps(acc, model, opt, dims, cfg, range(STEPS))
        diffs = assert_matches_reference(layout, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                         norms, ref_norms, clip=CLIP)
        held = tie_holds(acc, model)
        check_eval(acc, model, dims, cfg, ref)
        saved_model_loads(acc, model, str(out / f"model{i}"), ref)
        report(acc, layout, f"{diffs}, tie: {held}, saved once")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
