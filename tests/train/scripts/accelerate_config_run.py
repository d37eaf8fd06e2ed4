"""A short training run under what the launcher (an Accelerate config file, or convoy's flags) and the script's
Accelerate plugin say; rank 0 writes the final parameters and what ran.

    convoy launch --devices 0 --config_file tests/config/accelerate/fsdp2_offload.yaml \
        tests/train/scripts/accelerate_config_run.py --out run.pt
    convoy launch --devices 0 --nproc-per-node 2 tests/train/scripts/accelerate_config_run.py --out run.pt \
        --plugin fsdp2            # Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))

On GPUs (``convoy launch --devices 1 --num_processes 1 ...``) the prepared model and batches are on ``cuda``.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
import torch.nn.functional as F
from tests.distributed import exit_without_teardown
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--plugin", default="none", choices=["none", "fsdp2", "fsdp2-recompute", "zero1-clip"])
    args = parser.parse_args()
    plugin = deepspeed = None
    if args.plugin == "zero1-clip":  # as tests/config/accelerate/deepspeed_clipping.yaml says it
        deepspeed = DeepSpeedPlugin(zero_stage=1, gradient_clipping=0.05)
    elif args.plugin != "none":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2,
                                                activation_checkpointing=args.plugin == "fsdp2-recompute")
    accelerator = Accelerator(fsdp_plugin=plugin, deepspeed_plugin=deepspeed)
    torch.manual_seed(0)
    model = Net()
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(2):
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in accelerator.settings.options.items()
                   if k in ("cpu_offload", "auto_wrap")}
        torch.save({"params": {k: v.detach().cpu() for k, v in state.items()}, "strategy": accelerator.strategy.name,
                    "options": options, "accumulation": accelerator.gradient_accumulation_steps,
                    "processes": accelerator.num_processes, "device": accelerator.device.type}, args.out)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
    exit_without_teardown()
