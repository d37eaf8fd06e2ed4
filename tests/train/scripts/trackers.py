"""Every rank logs; only the main process may write (tests/train/test_tracking.py reads the files back).

    convoy launch --nproc-per-node 2 trackers.py DIR
"""

from __future__ import annotations

import sys

from convoy import Accelerator


def main() -> None:
    acc = Accelerator(log_with=["jsonl", "tensorboard"], project_dir=sys.argv[1])
    acc.init_trackers("run", config={"ranks": acc.num_processes})
    for i in range(3):
        acc.log({"rank": acc.process_index, "i": i})
    tracker = acc.get_tracker("jsonl")
    if not acc.is_main_process:
        assert acc.trackers == [] and tracker.log({"x": 1}) is None  # a tracker that records nothing
    acc.end_training()
    print(f"TRACKERS ok {acc.process_index}")


if __name__ == "__main__":
    main()
