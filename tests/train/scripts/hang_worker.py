"""Run by tests/train/test_hang.py on 2 CPU processes: guarded collectives, out-of-step ranks, a skipped one."""

import datetime
import logging
import sys
import time

import torch
import torch.distributed as dist

from convoy.errors import CollectiveTimeoutError
from convoy.train.hang import CollectiveWatch
from convoy.train.logging import get_logger


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stdout)
    # the ranks' stdout reaches the test through two pipes, whose lines the launcher may interleave in either
    # order; one file both ranks append to keeps the order the lines were written in
    in_order_file = logging.FileHandler(sys.argv[2], mode="a")
    in_order_file.setFormatter(logging.Formatter("LOG %(message)s"))
    logging.getLogger().addHandler(in_order_file)
    logger = get_logger("hang_worker")
    watch = CollectiveWatch(timeout=float(sys.argv[1]))

    for _ in range(3):  # in step: every guarded collective passes
        t = torch.tensor([float(rank + 1)])
        with watch.guard("all_reduce"):
            dist.all_reduce(t)
        assert t.item() == 3.0
    logger.info("main only %d", watch.calls)
    logger.info("in order", main_process_only=False, in_order=True)

    try:  # out of step: both ranks see who is where, and carry on
        watch.arrive("broadcast" if rank == 0 else "all_gather")
    except CollectiveTimeoutError as err:
        print(f"MISMATCH rank {rank}: {err}", flush=True)

    if rank == 1:  # rank 1 skips the next collective and is busy elsewhere
        time.sleep(120)
    started = time.monotonic()
    try:
        with watch.guard("all_reduce grads"):
            dist.all_reduce(torch.ones(1))
    except CollectiveTimeoutError as err:
        print(f"HANG rank {rank} after {time.monotonic() - started:.1f}s: {err}", flush=True)
        raise


if __name__ == "__main__":
    main()
