"""Module-level functions for convoy.launch tests (spawn needs importable functions)."""

import datetime
import os


def all_reduce_rank(offset):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    value = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(value)
    result = (dist.get_rank(), dist.get_world_size(), int(value.item()), os.environ["LOCAL_RANK"])
    dist.destroy_process_group()
    return result


class RankOneError(Exception):
    pass


def rank_one_raises():
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    dist.barrier()
    if dist.get_rank() == 1:
        raise RankOneError("rank one broke")
    dist.barrier()  # rank 0 waits here: its later "connection closed" error must not be reported instead
    dist.destroy_process_group()


def rank_zero_dies():
    if os.environ["RANK"] == "0":
        os._exit(7)
    import time

    time.sleep(30)


def env_value(name):
    return os.environ[name]


def second_job(devices):
    """What another job sees while this rank runs: `convoy launch --devices DEVICES` -> (exit code, stderr)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    done = subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", devices, "--no-python", "true"],
                          capture_output=True, text=True, env=env, timeout=60)
    return done.returncode, done.stderr


def raises_value_error():
    raise ValueError("rank failed on purpose")


def interrupts_the_caller():
    import signal
    import time

    # Ctrl-C in the notebook while the ranks run, as a person presses it: after the start, not within microseconds
    # of the fork (a SIGINT that lands while the caller still runs its after-fork hooks, logging's _releaseLock,
    # raises there, and Python only prints it as an ignored exception: a race of the test, not of the launch)
    time.sleep(0.5)
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(30)


def started_by():
    """"spawn" in a freshly started rank, "fork" in a copy of the caller (which has pytest loaded)."""
    import sys

    return "fork" if "pytest" in sys.modules else "spawn"


def store_after_rank0_returned():
    """Rank 0 returns at once; rank 1 reaches the rendezvous store (which rank 0 serves) a second later."""
    import datetime
    import os
    import time

    import torch.distributed as dist

    if os.environ["RANK"] == "0":
        return "rank 0 returned"
    time.sleep(1.0)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=10))
    store.set("key", "value")
    return store.get("key")


def fail_first_starts(counter_path, failures):
    """Rank 0 counts the starts in a file; the first ``failures`` starts raise on rank 0."""
    import os

    if os.environ["RANK"] != "0":
        return None
    starts = int(open(counter_path).read()) + 1 if os.path.exists(counter_path) else 1
    with open(counter_path, "w") as f:
        f.write(str(starts))
    if starts <= failures:
        raise RuntimeError(f"start {starts} fails")
    return f"started {starts} times"


def rank_one_leaves(how):
    """Rank 1 leaves without a result: os._exit(0) ("quietly"), sys.exit(3) ("sys.exit"), or a ConfigError."""
    import os
    import sys

    if os.environ["RANK"] == "1":
        if how == "quietly":
            os._exit(0)
        if how == "sys.exit":
            sys.exit(3)
        from convoy.errors import ConfigError

        raise ConfigError("a wrong setting")
    import time

    time.sleep(30)  # rank 0 would wait for ever: the failure of rank 1 must stop it
