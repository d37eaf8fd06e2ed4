"""Accelerate's test_ddp_comm_hook.py check, on CPU processes: gradients of a model prepared with each DDP
communication hook (DistributedDataParallelKwargs(comm_hook=..., comm_wrapper=..., comm_state_option=...)) match
plain DDP's to 1e-2, and the hook is registered on the model. Accelerate's script builds its reference with
device_ids=[local rank], which needs a GPU per process; here the reference is plain DDP on the CPU."""
import torch
from torch.nn.parallel import DistributedDataParallel

from convoy import Accelerator, DistributedDataParallelKwargs
from convoy import DDPCommunicationHookType as Hook
from convoy.errors import ConfigError


class MockModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.randn(40, 20))

    def forward(self, x, rank):
        return self.p * (x ** (1 + rank))


def grads(model, rank):
    torch.manual_seed(2024)
    model(torch.randn(40, 20), rank).mean().backward()
    return next(model.parameters()).grad


for hook, wrapper, option in [(Hook.NO, Hook.NO, {}), (Hook.FP16, Hook.NO, {}), (Hook.POWER_SGD, Hook.NO, {}),
                              (Hook.POWER_SGD, Hook.FP16, {}),
                              (Hook.POWER_SGD, Hook.NO, {"matrix_approximation_rank": 2}),
                              (Hook.BATCHED_POWER_SGD, Hook.NO, {}), (Hook.BATCHED_POWER_SGD, Hook.FP16, {}),
                              ("bf16", "no", {})]:
    label = f"{getattr(hook, 'value', hook)}+{getattr(wrapper, 'value', wrapper)}{'+rank2' if option else ''}"
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
        comm_hook=hook, comm_wrapper=wrapper, comm_state_option=option)])
    rank = accelerator.local_process_index
    try:
        model = accelerator.prepare(MockModel())
    except ConfigError as err:
        print(f"HOOK {label} refused: {err}", flush=True)
        continue
    registered = len(getattr(model, "_comm_hooks", []))
    got, want = grads(model, rank), grads(DistributedDataParallel(MockModel()), rank)
    close = torch.allclose(got, want, rtol=1e-2, atol=1e-2)
    print(f"HOOK {label} rank={rank} hooks={registered} close={close}", flush=True)

# PowerSGD compresses from start_powerSGD_iter on (Accelerate's test keeps the default, 1000, and never gets
# there): the 40x20 gradient then arrives as its rank-1 approximation, where the first steps' plain all-reduce
# gives a full-rank one
accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
    comm_hook=Hook.POWER_SGD, comm_state_option={"start_powerSGD_iter": 2, "matrix_approximation_rank": 1})])
model = accelerator.prepare(MockModel())
ranks = []
for _ in range(3):
    model.zero_grad()
    ranks.append(int(torch.linalg.matrix_rank(grads(model, accelerator.local_process_index))))
print(f"POWERSGD rank={accelerator.local_process_index} gradient ranks={ranks}", flush=True)
