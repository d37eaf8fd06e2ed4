"""transformers models under convoy's tensor-parallel styles and pipeline on one CUDA device, run by
tests/gpu/test_transformers_gpu.py in a fresh process (one process: a 1-rank tp mesh; a 1-stage pipeline, traced
and scheduled in 2 micro-batches).

    python transformers_cuda.py styles gpt2      # the model's plan (convoy's for GPT-2) against the plain model
    python transformers_cuda.py pipeline llama   # model(input_ids=..., labels=...).loss through the pipeline

Prints ``CHECK <name> ok`` per check; a failed check raises (exit 1). Without CUDA it runs the same checks on the CPU
(gloo), which is how it was rehearsed on a machine without a GPU.
"""

import copy
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tests.train.parallel.hf_tiny import tiny, token_batch  # noqa: E402

DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
torch.backends.cuda.matmul.allow_tf32 = False


def ok(name: str) -> None:
    print(f"CHECK {name} ok", flush=True)


def init() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29671"), RANK="0",
                      WORLD_SIZE="1")
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")


def grads_match(model, ref, tol=1e-5) -> float:
    from torch.distributed.tensor import DTensor

    want = dict(ref.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        worst = max(worst, (g - want[name].grad).abs().max().item())
    assert worst < tol, worst
    return worst


def styles(family: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from convoy.errors import NotSupportedYetError
    from convoy.train.parallel.styles import packed_parts, packed_weights_gather
    from convoy.train.parallel.tensor import apply_tensor_parallel, resolve_tp_plan

    model = tiny(family).to(DEVICE)
    ref = copy.deepcopy(model)
    plan = resolve_tp_plan(model)
    if any(packed_parts(style) > 1 for _, style in plan.styles) and not packed_weights_gather():
        try:  # torch 2.11's DTensor cannot gather a _StridedShard: refused before any step
            apply_tensor_parallel(model, init_device_mesh(DEVICE.type, (1,)), plan)
        except NotSupportedYetError as err:
            assert "cannot gather or checkpoint" in str(err), err
            ok(f"{family} packed weights refused on torch {torch.__version__}")
            return
        raise AssertionError("packed weights were not refused")
    apply_tensor_parallel(model, init_device_mesh(DEVICE.type, (1,)), plan)
    ids = token_batch(step=0).to(DEVICE)
    loss, want = model(input_ids=ids, labels=ids).loss, ref(input_ids=ids, labels=ids).loss
    loss.backward()
    want.backward()
    assert abs(loss.item() - want.item()) < 1e-5, (loss.item(), want.item())
    grads_match(model, ref)
    ok(f"{family} styles {','.join(sorted({s for _, s in plan.styles}))} on {DEVICE.type}")


def pipeline(family: str) -> None:
    from convoy.train.parallel.pipeline import PipelineConfig, PipelineModule

    model = tiny(family).to(DEVICE)
    ref = copy.deepcopy(model)
    pipe = PipelineModule(model, config=PipelineConfig(schedule="gpipe", microbatches=2), loss_fn=None,
                          group=dist.group.WORLD, device=DEVICE)
    ids = token_batch(step=0).to(DEVICE)
    out = pipe(input_ids=ids, labels=ids)
    want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    assert abs(out.loss.item() - want.item()) < 1e-5, (out.loss.item(), want.item())
    grads_match(model, ref)
    ok(f"{family} pipeline loss on {DEVICE.type}")


if __name__ == "__main__":
    init()
    {"styles": styles, "pipeline": pipeline}[sys.argv[1]](sys.argv[2])
    dist.destroy_process_group()
