"""Rank --bad fails (--how raise|kill|exit) after a barrier; the others wait in a collective."""
import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--bad", type=int, default=1)
parser.add_argument("--how", default="raise")
parser.add_argument("--until-restart", type=int, default=99, help="fail only while restart count < this")
parser.add_argument("--others", default="sleep", help="sleep: far from any collective; collective: in one (they "
                    "then fail too, losing their peer)")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print(f"started rank={rank} restart={restart} pid={os.getpid()}", flush=True)
dist.barrier()
if rank == args.bad and restart < args.until_restart:
    if args.how == "raise":
        raise ValueError(f"boom from rank {rank}")
    if args.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)
if restart >= args.until_restart:
    dist.barrier()
    print(f"recovered rank={rank} restart={restart}", flush=True)
elif args.others == "collective":
    dist.all_reduce(torch.ones(1))  # fails with "Connection closed by peer" once the bad rank is gone
else:
    time.sleep(60)  # a survivor stuck far from any collective: the launcher must stop it
dist.destroy_process_group()
