"""``mixed_precision="fp8"`` on one CUDA device: on a board with float8 tensor cores (sm_89+), a Llama-shaped block
stack trains within fp8's tolerance of bf16 through the real ``torch._scaled_mm`` (each recipe, eager and with
per-block compile); below sm_89 (A100) fp8 is refused in one line and runs emulated when asked.

    python3 tests/gpu/scripts/float8_cuda.py tensorwise

Prints ``CHECK <what> ok`` per check, and ``REPORT {...}`` with the losses and step times.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

from convoy import Accelerator
from convoy.errors import NotSupportedYetError
from convoy.train.parallel.float8 import has_float8_tensor_cores
from convoy.train.process_view import AcceleratorState

CFG = TinyConfig(vocab=512, dim=1024, heads=8, layers=2, hidden=4096, seq=512)
STEPS = 6


def train(mixed_precision: str, **kwargs) -> tuple[list[float], float, torch.nn.Module]:
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision=mixed_precision, **kwargs)
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    losses, start = [], 0.0
    for step in range(STEPS):
        if step == 2:
            torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = (t.cuda() for t in batch(CFG, size=4, step=step))
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, (time.perf_counter() - start) / (STEPS - 2), model


def main() -> None:
    recipe = sys.argv[1]
    if not has_float8_tensor_cores("cuda:0"):
        try:
            Accelerator(mixed_precision="fp8")
        except NotSupportedYetError as err:
            assert "has no float8 tensor cores" in str(err) and "\n" not in str(err), err
            print("CHECK refused below sm_89 ok", flush=True)
        losses, _, _ = train("fp8", fp8_recipe=recipe, fp8_emulate=True)
        print("CHECK emulated when asked ok", flush=True)
        return
    bf16, bf16_s, _ = train("bf16")
    fp8, fp8_s, model = train("fp8", fp8_recipe=recipe)
    assert type(model.layers[0].mlp.up_proj).__name__ == "Float8Linear"
    assert not model.layers[0].mlp.up_proj.config.emulate  # the real torch._scaled_mm
    diff = max(abs(a - b) / b for a, b in zip(fp8, bf16))
    assert diff < 5e-3 and fp8 != bf16, (fp8, bf16)
    print("CHECK trains within fp8 tolerance of bf16 ok", flush=True)
    print("REPORT " + json.dumps({"recipe": recipe, "bf16": bf16, "fp8": fp8, "bf16_step_s": bf16_s,
                                  "fp8_step_s": fp8_s, "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
