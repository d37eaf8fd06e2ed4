"""A rank that shows a progress bar (convoy's progress_bar on rank 0, tqdm itself on the others), then a line."""

import os
import sys
import time

from tqdm import tqdm

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
for _ in tqdm(range(steps), desc="train", mininterval=0.02, ncols=60):
    time.sleep(0.03)
print(f"done {os.environ['RANK']}", flush=True)
