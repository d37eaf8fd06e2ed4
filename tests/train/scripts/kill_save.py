"""Save checkpoint_0, then die (SIGKILL) in the middle of writing checkpoint_1; or, with --load, resume."""
import os
import signal
import sys

import torch

from convoy import Accelerator


class Bomb:
    armed = False

    def state_dict(self):
        if self.armed:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-save: model and optimizer already written
        return {"armed": self.armed}

    def load_state_dict(self, state):
        self.armed = state["armed"]


project = sys.argv[1]
accelerator = Accelerator(project_dir=project)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
bomb = Bomb()
accelerator.register_for_checkpointing(bomb)
if "--load" in sys.argv:
    path = accelerator.load_state()
    print("LOADED", os.path.basename(path), float(model.weight.sum()), bomb.armed, flush=True)
else:
    with torch.no_grad():
        model.weight.fill_(1.0)
    accelerator.save_state()
    with torch.no_grad():
        model.weight.fill_(2.0)
    bomb.armed = True
    accelerator.save_state()
    print("NOT REACHED", flush=True)
