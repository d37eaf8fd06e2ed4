"""convoy's checkpoints, in one package: what ``save_state``/``load_state``/``save_model`` write, and how it is
read back.

    from convoy.train import checkpoint
    items = accelerator._checkpoint_items()          # a CheckpointItems: the explicit record of what to save
    result = checkpoint.save_state(items, None)      # project_dir/checkpoints/checkpoint_<n>, atomically
    result = checkpoint.load_state(items, None)      # the newest complete one (convoy's or Accelerate's)

    state.py            save_state / load_state / save_model over a CheckpointItems; the DCP tensor state
    items.py            CheckpointItems (what to save and restore) and CheckpointResult (what comes back)
    hooks.py            the save and load pre-hooks a script registers (register_save_state_pre_hook)
    directories.py      checkpoint directories: staging, the convoy_checkpoint.json marker, commit, naming,
                        pruning, recovery of a save killed mid-commit (no torch use)
    files.py            the files inside: torch.load(weights_only=True), a safe torch.save, DCP's safe reader
    rng.py              each rank's Python, numpy, torch and CUDA random state
    weights.py          save_model's safetensors (or .bin) shards and their index
    accelerate.py       reading Accelerate's save_state directories with the same helpers

Optimizer state keyed by parameter name (how every strategy's is stored) is ``convoy.train.optimizer_names``,
below this package and the strategies, which both use it.

Nothing here imports the Accelerator: it hands its objects over in the record and takes the result back.
"""

from convoy.train.checkpoint.directories import (
                                                 MARKER,
                                                 begin_checkpoint,
                                                 commit_checkpoint,
                                                 is_complete,
                                                 latest_checkpoint,
                                                 next_checkpoint_dir,
                                                 prune_checkpoints,
                                                 read_meta,
                                                 recover_checkpoint,
)
from convoy.train.checkpoint.files import dcp_load, load_file, numpy_rng_globals, save_file
from convoy.train.checkpoint.items import CheckpointItems, CheckpointResult
from convoy.train.checkpoint.state import checkpoint_root, load_state, save_model, save_state

__all__ = ["CheckpointItems", "CheckpointResult", "save_state", "load_state", "save_model", "checkpoint_root",
           "MARKER", "begin_checkpoint", "commit_checkpoint", "is_complete", "latest_checkpoint",
           "next_checkpoint_dir", "prune_checkpoints", "read_meta", "recover_checkpoint", "load_file", "save_file",
           "dcp_load", "numpy_rng_globals"]
