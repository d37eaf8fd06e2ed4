"""Rank 0 imports torch (so it serves the rendezvous store) and ends at once; rank 1 reaches the store a second
later, as a rank still connecting when rank 0's program is done would: raw torch, no convoy."""
import datetime
import os
import time

import torch.distributed as dist

if os.environ["RANK"] != "0":
    time.sleep(1.0)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=10))
    store.set("key", "reached")
    print("rank 1", store.get("key").decode(), "the store", flush=True)
