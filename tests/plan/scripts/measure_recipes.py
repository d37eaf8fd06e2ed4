"""The planner's activations, recipe by recipe, against what PyTorch saves and what MemTracker sees, on the CPU.

    OMP_NUM_THREADS=1 .venv/bin/python tests/plan/scripts/measure_recipes.py          # prints markdown tables
    OMP_NUM_THREADS=1 .venv/bin/python tests/plan/scripts/measure_recipes.py --full-size   # the benchmark's
                                                       # models at full size under FakeTensorMode (minutes)

Models: benchmarks/planner_models.py (plain-PyTorch copies of transformers' GPT2Block, LlamaDecoderLayer and
GPTNeoXLayer). Autocast runs use CPU autocast with ``cuda_rules=True``: the explicit fp32 casts CUDA autocast
makes for softmax / pow / layer_norm, so the saved tensors are those a GPU keeps. Two checks per case:

1. ``saved_per_block``: the unique storages autograd saves in one block (saved_tensors_hooks), weights and
   their autocast copies separated out, against ``block_bytes`` and ``weight_cast_bytes``; ``kept_per_block``:
   what one block keeps under the trainer's ``recompute="selective"`` (``convoy.train.parallel.recompute``).
2. ``step``: one training step (the second) under ``torch.distributed._tools.mem_tracker.MemTracker``; its
   categories at the peak against ``memory_per_gpu``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "src")]

from convoy.plan.activations import block_bytes, weight_cast_bytes  # noqa: E402
from convoy.plan.memory import Layout, memory_per_gpu  # noqa: E402
from convoy.plan.model import from_hf_config  # noqa: E402
from convoy.plan.run import PRECISIONS, RunSpec  # noqa: E402
from planner_models import build, causal_lm_loss  # noqa: E402

TINY = {
    "gpt2": {"model_type": "gpt2", "n_embd": 96, "n_layer": 3, "n_head": 6, "vocab_size": 640, "n_positions": 256,
             "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
    "gpt2-dropout": {"model_type": "gpt2", "n_embd": 96, "n_layer": 3, "n_head": 6, "vocab_size": 640,
                     "n_positions": 256},
    "llama-gqa": {"model_type": "llama", "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6,
                  "num_key_value_heads": 2, "intermediate_size": 272, "vocab_size": 640},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6,
                 "intermediate_size": 384, "vocab_size": 640, "rotary_pct": 0.25},
}
#: "bf16-fsdp" runs bf16 weights under autocast, as FSDP2's MixedPrecisionPolicy gathers them (one process: the
#: fp32 shards, gradients and optimizer of FSDP2 are not emulated)
RECIPES = ("fp32", "bf16-autocast", "bf16", "bf16-fsdp")


def _bf16_weights(recipe: str) -> bool:
    return PRECISIONS[recipe].weight_bytes == 2


def _blocks(model):
    return list(getattr(model, "h", None) or model.layers)


def _from_weights(t: torch.Tensor) -> bool:
    """True for a parameter or a copy/view of one (autocast's weight casts): its autograd chain ends in a leaf."""
    if t.grad_fn is None:
        return t.requires_grad
    fn = t.grad_fn
    for _ in range(4):
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        fn = nxt[0]
        if type(fn).__name__ == "AccumulateGrad":
            return True
    return False


def _setup(case: str, recipe: str, attention: str, recompute: str):
    torch.manual_seed(0)
    config = TINY[case]
    model = build(config, attention="sdpa" if attention == "flash" else "eager", cuda_rules=True)
    if _bf16_weights(recipe):
        model = model.to(torch.bfloat16)
    if recompute != "none":  # as the trainer recomputes: Accelerator(recompute=...)
        from convoy.train.parallel.recompute import apply_recompute

        apply_recompute(model, recompute)
    spec = from_hf_config(config)
    return model, spec


def cpu_only_bytes(case: str, recipe: str, attention: str, seq: int, batch: int) -> int:
    """What these CPU runs save in a block that the planner leaves out, by construction:

    * the rotary ``cos``/``sin`` (one pair per model in transformers, shared by all blocks; counted once per
      block here because the check is per block): 2 x s x rotary dims, in the hidden states' dtype;
    * eager attention's causal mask (s x s bool; transformers builds one per model);
    * GPT-NeoX with SDPA: the CPU flash kernel returns its output in q's layout, and q (rotary + cat) is
      contiguous (b, a, s, d), so the out-projection's reshape copies it; CUDA's flash kernel writes
      (b, s, a, d), and the reshape is a view.
    """
    c = TINY[case]
    heads = c.get("num_attention_heads") or c.get("n_head")
    h = c.get("hidden_size") or c["n_embd"]
    d = h // heads
    act = 2 if _bf16_weights(recipe) else 4
    extra = 0
    if case.startswith("llama"):
        extra += 2 * seq * d * act
    if case == "gpt_neox":
        extra += 2 * seq * int(d * c.get("rotary_pct", 0.25)) * act
        if attention == "flash":
            extra += seq * batch * h * (4 if recipe == "fp32" else 2)
    if attention == "eager":
        extra += seq * seq
    return extra


def saved_per_block(case: str, recipe: str, attention: str, *, seq: int = 48, batch: int = 2) -> dict:
    """Bytes autograd saves in the second block: activations and weight-derived tensors, measured and planned."""
    model, spec = _setup(case, recipe, attention, "none")
    block = _blocks(model)[1]
    seen: dict[int, tuple[int, bool]] = {}
    inside = [False]

    def pack(t):
        if inside[0]:
            st = t.untyped_storage()
            seen[st.data_ptr()] = (st.nbytes(), _from_weights(t))
        return t

    block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    block.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    ids = torch.randint(0, spec.vocab, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISIONS[recipe].autocast):
            model(ids)
    run = RunSpec(seq_len=seq, micro_batch=batch, precision=recipe, attention=attention)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    acts = sum(n for n, w in seen.values() if not w)
    casts = sum(n for ptr, (n, w) in seen.items() if w and ptr not in params)
    return {"activations": acts, "cpu only": cpu_only_bytes(case, recipe, attention, seq, batch),
            "planned": block_bytes(spec, run), "weight casts": casts,
            "planned casts": weight_cast_bytes(spec, run, layers=1, head=False)}


def kept_per_block(case: str, recipe: str, attention: str, *, seq: int = 48, batch: int = 2) -> dict:
    """Bytes the second block keeps under the trainer's ``recompute="selective"``: its input (which the checkpoint
    holds) and the outputs its save list stores (unique storages), measured and planned."""
    from unittest import mock

    from convoy.train.parallel import recompute

    model, spec = _setup(case, recipe, attention, "selective")
    block = _blocks(model)[1]
    seen: dict[int, int] = {}
    inside = [False]
    policy = recompute._policy

    def recording(ctx, func, *args, **kwargs):
        decided = policy(ctx, func, *args, **kwargs)
        if inside[0] and decided.name == "MUST_SAVE":
            for out in (ctx.op_output if isinstance(ctx.op_output, (tuple, list)) else [ctx.op_output]):
                if isinstance(out, torch.Tensor):
                    seen[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
        return decided

    def enter(module, args):
        inside[0] = True
        seen[args[0].untyped_storage().data_ptr()] = args[0].untyped_storage().nbytes()  # the hidden states

    block.register_forward_pre_hook(enter)
    block.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    ids = torch.randint(0, spec.vocab, (batch, seq))
    with mock.patch.object(recompute, "_policy", recording):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISIONS[recipe].autocast):
            model(ids)
    run = RunSpec(seq_len=seq, micro_batch=batch, precision=recipe, attention=attention, recompute="selective")
    return {"kept": sum(seen.values()), "planned": block_bytes(spec, run)}


def step(case: str, recipe: str, attention: str, recompute: str = "none", *, seq: int = 64, batch: int = 4) -> dict:
    """MemTracker's categories at the peak of the second training step, and the planner's; and the activations when
    the backward starts (what the planner's ``activations`` are: with recomputation the peak can come later)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model, spec = _setup(case, recipe, attention, recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, spec.vocab, (batch, seq))
    mt = MemTracker()
    mt.track_external(model, opt, ids)
    with mt:
        for i in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISIONS[recipe].autocast):
                loss = causal_lm_loss(model(ids), ids)
            start = next(iter(mt.get_tracker_snapshot().values()))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i == 0:
                mt.reset_mod_stats()
    peak = next(iter(mt.get_tracker_snapshot("peak").values()))
    got = {str(k).split(".")[-1].lower(): v for k, v in peak.items()}
    run = RunSpec(seq_len=seq, micro_batch=batch, precision=recipe, attention=attention, recompute=recompute)
    est = memory_per_gpu(spec, run, Layout())
    return {"params": (got.get("param", 0), est.params), "optimizer": (got.get("opt", 0), est.optimizer),
            "gradients at the peak": (got.get("grad", 0), est.grads if est.grads_at_peak else 0),
            "activations": (got.get("act", 0), est.activations), "temporaries": (got.get("temp", 0), est.temporary),
            "peak": (got.get("total", 0), est.allocated),
            "activations as the backward starts": (_category(start, "act"), est.activations)}


def _category(snapshot: dict, name: str) -> int:
    return next((v for k, v in snapshot.items() if str(k).split(".")[-1].lower() == name), 0)


def full_size(name: str, seq: int, batch: int) -> dict:
    """One bf16-autocast SDPA step of a benchmark model at full size under FakeTensorMode (no memory is
    allocated) with MemTracker: categories at the peak, and the planner's. Dropout is set to 0: CPU SDPA
    with dropout falls back to the math kernel, which a GPU's flash kernel does not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from planner_models import CONFIGS

    config = {**CONFIGS[name], **({k: 0.0 for k in ("attn_pdrop", "resid_pdrop", "embd_pdrop")}
                                  if CONFIGS[name]["model_type"] == "gpt2" else {})}
    with FakeTensorMode():
        model = build(config, attention="sdpa", cuda_rules=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, config["vocab_size"], (batch, seq))
        mt = MemTracker()
        mt.track_external(model, opt, ids)
        with mt:
            for i in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = causal_lm_loss(model(ids), ids)
                loss.backward()
                opt.step()
                opt.zero_grad()
                if i == 0:
                    mt.reset_mod_stats()
    peak = next(iter(mt.get_tracker_snapshot("peak").values()))
    got = {str(k).split(".")[-1].lower(): v for k, v in peak.items()}
    spec = from_hf_config(config)
    est = memory_per_gpu(spec, RunSpec(seq_len=seq, micro_batch=batch, precision="bf16-autocast"), Layout())
    return {"activations": (got.get("act", 0), est.activations), "temporaries": (got.get("temp", 0), est.temporary),
            "peak": (got.get("total", 0), est.allocated)}


def main() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if "--full-size" in sys.argv:
        print("| model | s x b | activations: MemTracker / planner (GB) | temporaries | peak |")
        print("|---|---|---|---|---|")
        for name, seq, batch in (("gpt2-124m", 1024, 8), ("llama-1.1b-gqa", 2048, 4), ("pythia-410m", 2048, 4),
                                 ("qwen2-0.5b", 4096, 1)):
            r = full_size(name, seq, batch)
            cells = " | ".join(f"{m / 1e9:.3f} / {e / 1e9:.3f} ({e / m:.3f})" for m, e in r.values())
            print(f"| {name} | {seq} x {batch} | {cells} |", flush=True)
        return
    print("## saved for backward, one block (s=48, b=2), bytes\n")
    print("| family | recipe | attention | saved (autograd) | of which CPU-only | planned "
          "| planned / (saved - CPU-only) "
          "| weight casts | planned |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for case in TINY:
        for recipe in RECIPES:
            for attention in ("flash", "eager"):
                if case == "gpt2-dropout" and attention == "flash":
                    continue  # CPU SDPA with dropout falls back to the math kernel (CUDA's flash takes dropout)
                r = saved_per_block(case, recipe, attention)
                ratio = r["planned"] / (r["activations"] - r["cpu only"])
                print(f"| {case} | {recipe} | {attention} | {r['activations']:,} | {r['cpu only']:,} | "
                      f"{r['planned']:,.0f} | {ratio:.4f} | {r['weight casts']:,} | {r['planned casts']:,.0f} |")
    print("\n## one training step (s=64, b=4), MemTracker at the peak vs memory_per_gpu, bytes\n")
    print("| family | recipe | attention | recompute | category | MemTracker | planner | ratio |")
    print("|---|---|---|---|---|---:|---:|---:|")
    for case in ("gpt2", "llama-gqa", "gpt_neox"):
        for recipe in ("fp32", "bf16-autocast", "bf16-fsdp"):
            for attention, recompute in (("flash", "none"), ("eager", "none"), ("flash", "full"),
                                         ("flash", "selective"), ("eager", "selective")):
                r = step(case, recipe, attention, recompute)
                for cat, (m, e) in r.items():
                    ratio = f"{e / m:.3f}" if m else "n/a"
                    print(f"| {case} | {recipe} | {attention} | {recompute} | {cat} | {m:,} | {e:,} | {ratio} |")


if __name__ == "__main__":
    main()
