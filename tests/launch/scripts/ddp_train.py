"""An unmodified torchrun-style DDP script: env:// rendezvous, gloo, a few steps, ranks must agree."""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4) / 32
for _ in range(args.steps):
    opt.zero_grad()
    loss = model(data[rank::world]).pow(2).mean()
    loss.backward()
    opt.step()
weights = model.module.weight.detach().clone()
gathered = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(gathered, weights)
assert all(torch.equal(g, weights) for g in gathered), "ranks diverged"
print(f"trained rank={rank} world={world} local={os.environ['LOCAL_RANK']} port={os.environ['MASTER_PORT']} "
      f"loss={loss.item():.6f}")
dist.destroy_process_group()
# gloo can abort at interpreter shutdown after all work is done (pytorch/pytorch#179291): end here.
sys.stdout.flush()
os._exit(0)
