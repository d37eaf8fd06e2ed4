"""A rank that ends plainly while gloo's threads still run its collectives: the interpreter's teardown can
abort it (SIGABRT, ``terminate called without an active exception``, pytorch/pytorch#179291). A worker that
``convoy launch`` started ends after its exit handlers, without that teardown, so the job succeeds.

    convoy launch --devices 0 --nproc-per-node 2 busy_at_exit.py

Both ranks start 200 collectives and drop them unwaited, rank 1 a little late; the process group is held past
``destroy_process_group()`` (as a DDP module or a device mesh holds it), and the interpreter's teardown would
take a second. Through the interpreter's teardown, 5 of 6 jobs aborted on a 2-core machine.
"""
import atexit
import time

import torch
import torch.distributed as dist

from convoy import Accelerator


class SlowTeardown:
    def __del__(self):
        print("TEARDOWN", flush=True)  # only the interpreter's teardown frees it
        time.sleep(1.0)


atexit.register(print, "the program's exit handler ran", flush=True)  # runs after the group's teardown
accelerator = Accelerator(strategy="ddp")
model = accelerator.prepare(torch.nn.Linear(4, 4))
GROUP = dist.group.WORLD  # holds the group past destroy_process_group(), until the interpreter's teardown
SLOW = SlowTeardown()
if accelerator.process_index == 1:
    time.sleep(0.3)  # rank 0 is exiting by now
for _ in range(200):
    dist.all_reduce(torch.ones(100_000), async_op=True)  # not waited for: gloo's threads run them
print(f"rank {accelerator.process_index}: done", flush=True)
