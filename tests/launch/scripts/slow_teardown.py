"""Rank 0 serves the store; rank 1 holds an object that only the interpreter's teardown would free.

    slow_teardown.py OUT_DIR [--rank1-fails]

Rank 0 leaves a mark at its exit, after it stopped serving the store. The object in rank 1 waits for that
mark when it is finalized (at most 15 s) and writes to OUT_DIR/rank1 whether it came; a worker that ``convoy
launch`` started lets rank 0 go before it finalizes its objects, so the mark comes. With --rank1-fails rank 1's
program raises after the barrier instead (the mark still comes).
"""
import datetime
import os
import sys
import time
import types

import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
dist.barrier()
dist.destroy_process_group()
mark = os.path.join(out, "rank0-exit")

if os.environ["RANK"] == "0":
    import atexit

    atexit.register(lambda: open(mark, "w").close())  # runs once convoy.launch.record's keep_serving returned
else:
    class WaitsForRank0AtTeardown:
        def __del__(self, exists=os.path.exists, sleep=time.sleep, clock=time.monotonic, open_=os.open,
                    write=os.write, close=os.close, flags=os.O_WRONLY | os.O_CREAT):
            deadline = clock() + 15
            while not exists(mark) and clock() < deadline:
                sleep(0.02)
            fd = open_(os.path.join(out, "rank1"), flags, 0o644)
            write(fd, b"rank 0 ended during rank 1's teardown" if exists(mark) else b"rank 0 was still serving")
            close(fd)

    holder = types.ModuleType("holds_until_teardown")  # a module's globals are freed by the teardown
    holder.keep = WaitsForRank0AtTeardown()
    sys.modules[holder.__name__] = holder
    if "--rank1-fails" in sys.argv:
        raise ValueError("rank 1 fails after rank 0 is done")
