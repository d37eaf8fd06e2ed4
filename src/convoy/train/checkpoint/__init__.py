"""convoy's checkpoints, in one package: what ``save_state``/``load_state``/``save_model`` write, and how it is
read back.

    from convoy.train import checkpoint
    checkpoint.begin_checkpoint(final_dir)          # directories.py: staged, committed, found, pruned, recovered
    checkpoint.load_file(path / "state.pt")         # files.py: read without unpickling code

    directories.py      checkpoint directories: staging, the convoy_checkpoint.json marker, commit, naming,
                        pruning, recovery of a save killed mid-commit (no torch)
    files.py            the files inside: torch.load(weights_only=True), a safe torch.save, DCP's reader
    optimizer_state.py  optimizer state keyed by parameter name (how every strategy's is stored)
    rng.py              each rank's Python, numpy, torch and CUDA random state
    weights.py          save_model's safetensors (or .bin) shards and their index
"""

from convoy.train.checkpoint.directories import (MARKER, begin_checkpoint, commit_checkpoint, is_complete,
                                                 latest_checkpoint, next_checkpoint_dir, prune_checkpoints,
                                                 read_meta, recover_checkpoint)
from convoy.train.checkpoint.files import dcp_load, load_file, numpy_rng_globals, save_file

__all__ = ["MARKER", "begin_checkpoint", "commit_checkpoint", "is_complete", "latest_checkpoint",
           "next_checkpoint_dir", "prune_checkpoints", "read_meta", "recover_checkpoint", "load_file", "save_file",
           "dcp_load", "numpy_rng_globals"]
