"""The ``train.py`` that ``convoy plan``'s line names: the model you planned, a ``config.json`` or a
``MODULE:FUNCTION`` factory, trained with the launcher's settings, which are the plan's.

    convoy plan examples/tiny_gpt.py:TinyGPT --hardware 2xH100-80GB --seq-len 32
    # run it:  convoy launch --nnodes 1 --nproc-per-node 2 --strategy ddp --mixed-precision bf16 train.py
    convoy launch --nnodes 1 --nproc-per-node 2 --strategy ddp --mixed-precision bf16 \\
        examples/train.py --model examples/tiny_gpt.py:TinyGPT --seq-len 32

    convoy plan path/to/config.json --hardware 8xH100-80GB          # a Hugging Face config.json
    convoy launch <the flags of its line> examples/train.py --model path/to/config.json

A ``config.json`` is built with transformers (``AutoModelForCausalLM.from_config``: random weights, nothing
downloaded); a factory is imported and called as ``convoy plan`` does. The script passes no strategy, precision
or accumulation of its own to ``Accelerator()``, so the line's ``--strategy``, ``--mixed-precision``,
``--gradient-accumulation-steps``, degrees and schedule are what run. A pipeline layout (``--pp``) trains with
``model(inputs, target=labels)`` and the loss function given below. The batches are random tokens, a stand-in:
put your own ``DataLoader`` in ``batches()``; ``--seq-len`` and ``--micro-batch`` are the plan's.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator


def build(model: str) -> tuple[nn.Module, int]:
    """The planned model and its vocabulary size: a config.json through transformers, else MODULE:FUNCTION."""
    if model.endswith(".json") or Path(model).is_dir():
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model)
        return AutoModelForCausalLM.from_config(config), config.vocab_size
    module_name, _, function = model.rpartition(":")
    if module_name.endswith(".py"):  # path/to/file.py:function, as convoy plan reads it
        spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        assert spec is not None and spec.loader is not None, module_name
        sys.path.insert(0, str(Path(module_name).resolve().parent))  # its neighbours import, as under python
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    built = getattr(module, function)()
    embeddings = [m for m in built.modules() if isinstance(m, nn.Embedding)]
    return built, max(m.num_embeddings for m in embeddings)


def logits_of(output) -> torch.Tensor:
    """A transformers model's ``.logits``, or the tensor a plain module returns."""
    return output.logits if hasattr(output, "logits") else output


def next_token_loss(output, target: torch.Tensor) -> torch.Tensor:
    logits = logits_of(output)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def batches(vocab: int, seq_len: int, micro_batch: int, count: int) -> DataLoader:
    """Random tokens (your data goes here): inputs and the next tokens as labels."""
    ids = torch.randint(0, vocab, (count * micro_batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=micro_batch, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="what convoy plan planned: config.json or MODULE:FUNCTION")
    parser.add_argument("--seq-len", type=int, default=2048, help="the plan's --seq-len (default 2048, as its)")
    parser.add_argument("--micro-batch", type=int, default=1, help="the plan's --micro-batch")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    # the launcher's degrees (CONVOY_PARALLELISM, what --pp sets): a pipeline needs the loss function
    pipeline = re.search(r"\bpp=([0-9]+)", os.environ.get("CONVOY_PARALLELISM", ""))
    options = {"loss_fn": next_token_loss} if pipeline and int(pipeline.group(1)) > 1 else {}
    accelerator = Accelerator(strategy_options=options)
    torch.manual_seed(0)
    model, vocab = build(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = batches(vocab, args.seq_len, args.micro_batch, count=4 * args.steps)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"{args.model}: strategy={accelerator.strategy.name}, {accelerator.num_processes} "
                      f"process(es), mixed_precision={accelerator.mixed_precision}, "
                      f"gradient_accumulation_steps={accelerator.gradient_accumulation_steps}")
    for step, (x, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = model(x, target=y) if options else next_token_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if step % 5 == 0 or step == args.steps - 1:
            accelerator.print(f"step {step:3d} loss {accelerator.reduce(loss.detach(), 'mean').item():.3f}")
        if step + 1 == args.steps:
            break
    accelerator.end_training()


if __name__ == "__main__":
    main()
