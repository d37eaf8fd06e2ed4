"""Measure per-rank parameter, gradient and optimizer bytes of real FSDP2 (ZeRO-3) and ZeRO-1 runs, and of
convoy's own ``Accelerator(strategy="zero2")`` (FSDP2 that keeps the gathered weights from forward to backward).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/plan/scripts/state_bytes.py

Prints one ``STATE_BYTES {json}`` line per rank. ``build`` is also the planner's factory for the estimate
(``convoy plan tests/plan/scripts/state_bytes.py:build``), so measurement and estimate see one model.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.n_head = 4
        self.up = nn.Linear(h, 2 * h)
        self.down = nn.Linear(2 * h, h)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, vocab: int = 256, h: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h) for _ in range(layers))
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build() -> nn.Module:
    return Net()


def _local(t) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor's local shard; a freed one counts 0)."""
    storages = {}
    for t in tensors:
        storage = _local(t).untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _measure(model: nn.Module, opt: torch.optim.Optimizer, state_of, backward=None) -> dict:
    ids = torch.randint(0, 256, (2, 8))
    loss = model(ids).float().pow(2).mean()
    # between the forward and the backward (the activation peak): every weight the optimizer steps and every
    # weight the module computes with now (FSDP2 zero2: the fp32 shards and the gathered weights, both alive)
    stepped = [p for group in opt.param_groups for p in group["params"]]
    at_peak = _storage_bytes(stepped + list(model.parameters()))
    (backward or torch.Tensor.backward)(loss)
    opt.step()
    params = list(model.parameters())
    states = state_of(opt)
    moments = [v for s in states for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
    steps = [v for s in states for k, v in s.items() if k == "step"]
    return {"params": _bytes(params), "grads": _bytes(p.grad for p in params if p.grad is not None),
            "optimizer": _bytes(moments), "step_counters": _bytes(steps), "params_at_peak": at_peak}


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    out = {"rank": rank, "world": world}

    model = build()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out["zero3"] = _measure(model, opt, lambda o: list(o.state.values()))

    model = DDP(build())
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    out["zero1"] = _measure(model, zero, lambda o: list(o.optim.state.values()))

    from convoy import Accelerator

    accelerator = Accelerator(strategy="zero2", cpu=True)
    model = accelerator.prepare(build())
    opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
    out["zero2"] = _measure(model, opt, lambda o: list(o.state.values()), accelerator.backward)

    print("STATE_BYTES " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # gloo sometimes aborts in a C++ destructor at interpreter exit ("terminate called without an active
    # exception", docs/../notes: a rare teardown flake); all work is done, so leave without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
