"""A training script in the shape of Accelerate's ``examples/by_feature/*.py`` (written here): a tiny text
classifier on synthetic token ids, one feature per run, and only the import lines differ between the libraries.

    python example_features.py accelerate|convoy FEATURE[,feature...] [OUT_DIR]   # one process: both libraries
    convoy launch --devices 0 --nproc-per-node 2 example_features.py convoy FEATURE[,...] [OUT_DIR]

FEATURE: ``memory`` (find_executable_batch_size: the first sizes fail in the CPU allocator or with CUDA's
out-of-memory error), ``profiler`` (ProfileKwargs + accelerator.profile(), a trace per process), ``local_sgd``
(LocalSGD every 2 steps), ``logging`` (get_logger's main_process_only and in_order). Rank 0 prints
``RESULT {json}`` per feature: the losses, the printouts, and what the feature did.
"""
import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

if sys.argv[1] == "accelerate":
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD
    from accelerate.logging import get_logger
    from accelerate.utils import ProfileKwargs, find_executable_batch_size, set_seed
else:
    from convoy import Accelerator
    from convoy.local_sgd import LocalSGD
    from convoy.logging import get_logger
    from convoy.utils import ProfileKwargs, find_executable_batch_size, set_seed

FEATURES = sys.argv[2].split(",")
OUT = sys.argv[3] if len(sys.argv) > 3 else None
logger = get_logger(__name__, log_level="INFO")


class TinyClassifier(torch.nn.Module):
    """Embeddings, a mean over the sequence, a hidden layer, two classes: a BERT-shaped head on a toy body."""

    def __init__(self, vocab=64, hidden=16, labels=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.hidden = torch.nn.Linear(hidden, hidden)
        self.classifier = torch.nn.Linear(hidden, labels)

    def forward(self, input_ids, labels):
        pooled = torch.tanh(self.hidden(self.embed(input_ids).mean(dim=1)))
        return torch.nn.functional.cross_entropy(self.classifier(pooled), labels)


def dataset(n=64, length=8):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (n, length), generator=g)
    return TensorDataset(ids, (ids.sum(dim=1) % 2).long())


def train(accelerator, batch_size, epochs=2, wrap_step=None, local_sgd=None):
    set_seed(42)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(dataset(), batch_size=batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(epochs):
        model.train()
        for input_ids, labels in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids, labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if local_sgd is not None:
                    local_sgd(model).step()
            losses.append(round(accelerator.gather(loss.detach()).mean().item(), 7))
            if wrap_step is not None:
                wrap_step()
    return model, losses


def run(feature):
    profile_handler = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=OUT)
    accelerator = Accelerator(kwargs_handlers=[profile_handler] if feature == "profiler" else None)
    result = {"feature": feature, "distributed_type": str(accelerator.distributed_type),
              "device": str(accelerator.device), "state": str(accelerator.state)}
    if feature == "memory":
        tried = []

        @find_executable_batch_size(starting_batch_size=128)
        def inner_training_loop(batch_size):
            tried.append(batch_size)
            accelerator.free_memory()  # what the failed try prepared, as Accelerate's memory.py example does
            if batch_size > 40:  # a real request the CPU allocator refuses ("DefaultCPUAllocator: can't allocate")
                torch.empty(batch_size, 2**45, dtype=torch.uint8)
            if batch_size > 16:  # what CUDA raises when a batch does not fit
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch_size} GiB.")
            return train(accelerator, batch_size)[1]

        result["losses"] = inner_training_loop()
        result["tried"] = tried
    elif feature == "profiler":
        with accelerator.profile() as prof:
            _, result["losses"] = train(accelerator, 8, epochs=1)
        result["recorded_linear"] = any("linear" in e.key for e in prof.key_averages())
    elif feature == "local_sgd":
        sgd = {}

        def replicas_equal(model):
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            every = accelerator.gather(flat[None])
            return bool((every == every[0]).all())

        def local(model):
            if "it" not in sgd:
                sgd["it"] = LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2, enabled=True)
                sgd["it"].__enter__()
            elif sgd["it"].num_steps % 2 == 1:  # one local step since the last averaging
                sgd.setdefault("apart_between", []).append(not replicas_equal(model))
            return sgd["it"]

        model, result["losses"] = train(accelerator, 8, local_sgd=local)
        sgd["it"].__exit__(None, None, None)
        result["replicas_equal"] = replicas_equal(model)
        result["apart_between"] = sgd.get("apart_between", [])
        result["local_steps"] = sgd["it"].num_steps
    elif feature == "logging":
        logger.info("MAIN ONLY %d", 1)
        logger.info("EVERY PROCESS", main_process_only=False)
        logger.info("IN ORDER", main_process_only=False, in_order=True)
        _, result["losses"] = train(accelerator, 16, epochs=1)
    if accelerator.is_main_process:
        print("RESULT " + json.dumps(result), flush=True)
    return accelerator


def main():
    for feature in FEATURES:  # a new Accelerator for each, as a notebook would make them
        accelerator = run(feature)
    accelerator.end_training()


if __name__ == "__main__":
    main()
    if sys.argv[1] == "convoy":
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
        from tests.distributed import exit_without_teardown

        exit_without_teardown()
