"""Rank 1 reaches wait_for_everyone() long after the collective timeout; rank 0 must name it and stop."""
import os
import sys
import time

from convoy import Accelerator, CollectiveTimeoutError

accelerator = Accelerator()
if accelerator.process_index == 1:
    time.sleep(120)
started = time.monotonic()
try:
    accelerator.wait_for_everyone()
except CollectiveTimeoutError as err:
    print(f"LATE after {time.monotonic() - started:.1f}s: {err}", flush=True)
    sys.stderr.flush()
    os._exit(3)
print("NO TIMEOUT", flush=True)
os._exit(0)
