"""notebook_launcher on 2 CPU processes: python tests/train/scripts/notebook_launch.py prints rank 0's result."""

import convoy


def train(x):
    acc = convoy.Accelerator()
    out = (acc.process_index, acc.num_processes, str(acc.distributed_type), x)
    acc.end_training()
    return out

if __name__ == "__main__":
    print("RESULT", convoy.notebook_launcher(train, args=(7,), num_processes=2))
