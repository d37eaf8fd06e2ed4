"""Print, from inside a rank, what the launcher gave it (no torch import: fast)."""
import json
import os

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT",
        "CONVOY_MIXED_PRECISION", "CONVOY_PARALLELISM", "CONVOY_STRATEGY", "CONVOY_COLLECTIVE_TIMEOUT"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
print("KEYS " + json.dumps(sorted(k for k in os.environ if k.startswith(("TORCHELASTIC_", "ROLE_", "GROUP_")) or k in (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))), flush=True)
