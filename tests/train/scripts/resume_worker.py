"""Run by tests/train/test_resume.py under ``convoy launch --max-restarts 1`` on 2 CPU processes.

Trains a small model for 2 epochs (6 steps each), saving every 3 steps under --project-dir. With --kill-at N
rank 1 SIGKILLs itself right after step N on the first attempt; the restarted group resumes from the newest
complete checkpoint. Every rank appends (attempt, step, sample ids) to trace_rank<R>.jsonl; rank 0 writes the
final parameters to final.pt.
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator


class Progress:
    def __init__(self) -> None:
        self.epoch, self.step = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state):
        self.epoch, self.step = state["epoch"], state["step"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project-dir", required=True)
    parser.add_argument("--kill-at", type=int, default=0)
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 4), torch.randn(48, 1), torch.arange(48))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loader = DataLoader(data, batch_size=4, shuffle=True)

    accelerator = Accelerator(project_dir=args.project_dir, strategy="ddp")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    resumed = ""
    if any(Path(args.project_dir, "checkpoints").glob("checkpoint_*")):
        resumed = accelerator.load_state()
    Path(args.project_dir).mkdir(parents=True, exist_ok=True)
    trace = open(Path(args.project_dir) / f"trace_rank{accelerator.process_index}.jsonl", "a")
    print(f"attempt {attempt} rank {accelerator.process_index} starts at step {progress.step} "
          f"{'from ' + Path(resumed).name if resumed else 'fresh'}", flush=True)
    while progress.epoch < 2:
        for x, y, ids in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            trace.write(json.dumps({"attempt": attempt, "step": progress.step, "ids": ids.tolist()}) + "\n")
            trace.flush()
            if progress.step % 3 == 0:
                accelerator.save_state()
            if args.kill_at and attempt == 0 and progress.step == args.kill_at and accelerator.process_index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
        progress.epoch += 1
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), Path(args.project_dir) / "final.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
    exit_without_teardown()
