"""A rank that closes a progress bar on stderr and prints on stdout right after, a few times over (the order the
launcher's console must keep)."""

import os
import sys

from tqdm import tqdm

rank = os.environ["RANK"]
for round_ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for _ in tqdm(range(3), desc=f"bar {round_}", mininterval=0, ncols=60):
        pass
    print(f"done {rank} {round_}", flush=True)
