"""Random-weight tiny transformers models with tied embeddings (no download) under tp/pp, against one process.

    convoy launch --nproc-per-node 2 tests/train/parallel/scripts/hf_tied_parity.py OUT gpt2:pp=2 gemma:pp=2

Each argument is ``kind:degrees`` (kind ``gpt2`` or ``gemma``). The model trains a few AdamW steps through the
Accelerator (a pipeline with ``model(ids, target=labels)``); its weights must equal one process's, its head
must still be its embedding, and ``save_model``'s directory must load with ``from_pretrained`` into the same
weights. Every rank prints one ``<kind:degrees> (<distributed type>) ... OK`` line per argument.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.distributed import exit_without_teardown

from convoy.train.accelerator import Accelerator
from convoy.train.parallel.pipeline import PipelineModule

STEPS, BATCH, SEQ, VOCAB = 3, 4, 8, 64


def make(kind: str):
    import transformers

    torch.manual_seed(0)
    if kind == "gemma":
        config = transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                          num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                                          max_position_embeddings=32, use_cache=False)
        return transformers.GemmaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=4, n_head=2, n_positions=32, use_cache=False,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout: comparable
    return transformers.GPT2LMHeadModel(config)


def lm_loss(output, labels):
    logits = output.logits if hasattr(output, "logits") else output[0] if isinstance(output, (tuple, list)) else output
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def reference(start):
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for ids in batches():
        lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
    return model


def tied_names(model) -> tuple[str, str]:
    embed = model.get_input_embeddings()
    name = next(n for n, m in model.named_modules() if m is embed)
    return f"{name}.weight", "lm_head.weight"


def train(kind: str, degrees: str, start):
    dims = {k: int(v) for k, v in (part.split("=") for part in degrees.split(","))}
    options = {"loss_fn": lm_loss, "pp_microbatches": 2} if dims.get("pp", 1) > 1 else {}
    acc = Accelerator(parallelism=dims, strategy_options=options, collective_timeout=60)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    for ids in batches():
        x, y = ids[:, :-1], ids[:, 1:]
        loss = model(x, target=y) if options else lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return acc, model


def check(label: str, acc, model, ref, out: Path) -> str:
    full = acc.strategy.full_model_state_dict(model)
    # the weights (a pipeline's stages keep transformers' non-persistent buffers out, which is hf-models' part)
    names = {n for n, _ in ref.named_parameters(remove_duplicate=False)}
    want = {k: v for k, v in ref.state_dict().items() if k in names}
    assert names <= set(full), sorted(names - set(full))
    pdiff = max((full[k] - want[k]).abs().max().item() for k in want)
    assert pdiff < 2e-5, (label, pdiff)
    embed, head = tied_names(ref)
    assert full[embed] is full[head]  # one tensor under both names
    if not isinstance(model, PipelineModule):
        unwrapped = acc.unwrap_model(model)
        assert unwrapped.get_parameter(embed) is unwrapped.get_parameter(head), "the tie was broken"
    acc.save_model(model, out)
    if acc.is_main_process:
        ref.config.save_pretrained(out)
        loaded = type(ref).from_pretrained(out)
        assert loaded.get_parameter(head) is loaded.get_parameter(embed)
        ldiff = max((loaded.state_dict()[k] - v).abs().max().item() for k, v in want.items())
        assert ldiff < 2e-5, (label, ldiff)
    acc.wait_for_everyone()
    return f"param diff {pdiff:.1e}, tie kept, from_pretrained loads it"


def main():
    out = Path(sys.argv[1])
    for i, label in enumerate(sys.argv[2:]):
        kind, degrees = label.split(":")
        start = make(kind)
        ref = reference(start)
        acc, model = train(kind, degrees, start)
        line = check(label, acc, model, ref, out / f"model{i}")
        print(f"rank {dist.get_rank()} {label} ({acc.strategy.distributed_type}): {line} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
