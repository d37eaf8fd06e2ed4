"""One plain process (tp=1) loads a checkpoint saved by examples/tiny_gpt_tp.py and prints the next loss."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(REPO), str(REPO / "examples")]  # the repo root, for tests.*, and examples/

import torch  # noqa: E402
from tests.distributed import exit_without_teardown  # noqa: E402

from convoy import Accelerator  # noqa: E402
from tiny_gpt_tp import TinyGPT, lm_loss, make_batch  # noqa: E402


def main() -> None:
    ckpt, step, batch_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    accelerator = Accelerator()
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(ckpt)
    with torch.no_grad():
        x, y = make_batch(step, batch_size)
        print(f"next loss {lm_loss(model(x), y).item():.6f}")


if __name__ == "__main__":
    main()
    exit_without_teardown()
