"""Training throughput at the state of the art: convoy's Accelerator against a raw torchtitan-style script.

    python benchmarks/step_throughput.py                          # one GPU: Llama-3-8B-shaped, 4 layers, seq 8192
    convoy launch --nproc-per-node 8 benchmarks/step_throughput.py --layers 8
    python benchmarks/step_throughput.py --size tiny --steps 3    # CPU smoke test (the suite runs it)

The same model (a Llama 3 8B block: RMSNorm, grouped-query causal attention through SDPA, SwiGLU; cut to a few
layers so that it fits one 80 GB GPU), the same data and AdamW, trained as

  (a) raw: torchtitan's recipe written out in plain PyTorch, no convoy: torchao float8 conversion
      (``convert_to_float8_training``, the output head kept in high precision), per-op selective activation
      checkpointing (``checkpoint_wrapper`` with ``create_selective_checkpoint_contexts``: every second matmul and
      the attention saved), per-block ``torch.compile(fullgraph=True)``, then FSDP2 (``fully_shard``, bf16
      parameters, fp32 reduction; float8 all-gather and precomputed scales for tensorwise);
  (b) convoy: ``Accelerator(strategy="zero3", mixed_precision=..., fp8_recipe=..., compile=..., recompute="selective")``

for each row: eager, compile, compile + float8 tensorwise, compile + float8 rowwise. Rows and sides are
interleaved in one process, so drift hits them alike. Each cell is tokens/s per GPU over the timed steps (the
first ``--warmup`` steps, compilation included, are not timed), MFU (model FLOPs 6N + 12 L h s per token over the
board's dense bf16 peak from convoy's GPU table), and peak memory; each row prints b / a and the planner's
prediction (``convoy.plan`` of the same model, layout and options on this board). float8 rows run on boards with
float8 tensor cores (H100, H200, L40S, ...); on a CPU they run in torchao's emulation (``--size tiny`` only).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# Llama 3 8B's block (hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocabulary 128256); tiny: for a CPU
SIZES = {
    "8b": {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256, "seq": 8192, "batch": 1},
    "tiny": {"hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256, "seq": 64, "batch": 2},
}
ROWS = {"eager": ("none", None), "compile": ("blocks", None), "compile+fp8-tensorwise": ("blocks", "tensorwise"),
        "compile+fp8-rowwise": ("blocks", "rowwise")}


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attention_norm, self.ffn_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.wq = nn.Linear(hidden, hidden, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.wo(attended)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, *, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.output = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def make_model(shape: dict, layers: int, device: torch.device) -> Llama:
    torch.manual_seed(0)
    with device:
        return Llama(hidden=shape["hidden"], heads=shape["heads"], kv_heads=shape["kv_heads"], ffn=shape["ffn"],
                     vocab=shape["vocab"], layers=layers)


def model_config(shape: dict, layers: int) -> dict:
    """The model as a Hugging Face Llama config, for the planner."""
    return {"model_type": "llama", "hidden_size": shape["hidden"], "num_hidden_layers": layers,
            "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
            "intermediate_size": shape["ffn"], "vocab_size": shape["vocab"], "max_position_embeddings": shape["seq"],
            "tie_word_embeddings": False}


# --- (a) the raw, torchtitan-style recipe -------------------------------------------------------------------

def _float8_config(recipe: str, emulate: bool):
    from torchao.float8 import Float8LinearConfig

    if recipe == "tensorwise":
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, emulate=emulate)


def _selective_context():
    """torchtitan's per-op policy: save attention and every second matmul, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.max.default}
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def raw_step(shape: dict, layers: int, device: torch.device, compile_: str, fp8: str | None,
             emulate: bool) -> Callable[[torch.Tensor], float]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = make_model(shape, layers, device)
    if fp8 is not None:  # 1. float8 (the output head stays in high precision)
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, config=_float8_config(fp8, emulate),
                                   module_filter_fn=lambda module, fqn: fqn != "output"
                                   and module.in_features % 16 == 0 and module.out_features % 16 == 0)
    for index, block in enumerate(model.layers):  # 2. recompute, 3. compile, per block
        block = checkpoint_wrapper(block, context_fn=_selective_context, preserve_rng_state=False)
        if compile_ == "blocks":
            block = torch.compile(block, fullgraph=True)
        model.layers[index] = block
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:  # 4. FSDP2
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    precompute = fp8 == "tensorwise"

    def step(tokens: torch.Tensor) -> float:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if precompute:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)
        return float(loss.detach())

    return step


# --- (b) the same through convoy ----------------------------------------------------------------------------

def convoy_step(shape: dict, layers: int, device: torch.device, compile_: str, fp8: str | None,
                emulate: bool) -> Callable[[torch.Tensor], float]:
    from convoy import Accelerator, AcceleratorState

    AcceleratorState._reset_state()  # each cell's precision is its own (the process group stays up)
    options = {"mixed_precision": "fp8", "fp8_recipe": fp8, **({"fp8_emulate": True} if emulate else {})} \
        if fp8 is not None else {"mixed_precision": "bf16"}
    accelerator = Accelerator(strategy="zero3", compile=compile_, recompute="selective", **options)
    model = make_model(shape, layers, device)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))

    def step(tokens: torch.Tensor) -> float:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.detach())

    return step


# --- measuring ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Cell:
    tokens_per_s: float
    peak_gib: float
    losses: list[float]


def measure(make: Callable[[], Callable[[torch.Tensor], float]], data: list[torch.Tensor], warmup: int,
            device: torch.device) -> Cell:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step = make()
    losses = [step(tokens) for tokens in data[:warmup]]
    _sync(device)
    began = time.perf_counter()
    losses += [step(tokens) for tokens in data[warmup:]]
    _sync(device)
    seconds = time.perf_counter() - began
    timed = data[warmup:]
    tokens = sum(t[:, :-1].numel() for t in timed)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return Cell(tokens / seconds, peak, losses)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def flops_per_token(shape: dict, layers: int) -> float:
    """6N + 12 L h s: the model FLOPs per trained token (PaLM's appendix B, as torchtitan counts MFU)."""
    h, f, kv = shape["hidden"], shape["ffn"], shape["kv_heads"] * shape["hidden"] // shape["heads"]
    block = 2 * h * h + 2 * h * kv + 3 * h * f
    params = layers * block + 2 * shape["vocab"] * h
    return 6 * params + 12 * layers * h * shape["seq"]


def board(device: torch.device) -> tuple[str | None, float | None, bool]:
    """(convoy's hardware name for this GPU, its dense bf16 TFLOP/s, whether it has float8 tensor cores)."""
    if device.type != "cuda":
        return None, None, False
    from convoy.errors import PlanError
    from convoy.plan.hardware import lookup_gpu

    try:
        gpu = lookup_gpu(torch.cuda.get_device_name(device))
    except PlanError:
        return None, None, torch.cuda.get_device_capability(device) >= (8, 9)
    return gpu.name, gpu.bf16_tflops, bool(gpu.fp8_tflops)


def predicted(shape: dict, layers: int, hardware: str | None, world: int, compile_: str, fp8: str | None) -> str:
    """The planner's tokens/s per GPU for this row's layout on this board, or why there is none."""
    if hardware is None:
        return "n/a"
    import convoy

    try:
        plan = convoy.plan(model_config(shape, layers), hardware=f"{world}x{hardware}", seq_len=shape["seq"],
                           micro_batch=shape["batch"], recompute="selective", allowed={"zero3"},
                           compile=compile_, fp8=fp8 or "none")
    except Exception as err:  # a plan that cannot be made is a row's note, not the benchmark's end
        return f"n/a ({type(err).__name__})"
    row = plan.recommendation.row
    if row is None:
        return "does not fit"
    return f"{shape['batch'] * shape['seq'] / row.time.seconds:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="8b on a GPU (default), tiny on a CPU")
    parser.add_argument("--layers", type=int, default=None, help="blocks (default 4 for 8b, 2 for tiny)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps, compilation included")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated among {', '.join(ROWS)}")
    parser.add_argument("--sides", default="raw,convoy", help="raw, convoy or both (default)")
    args = parser.parse_args()

    if not dist.is_initialized():
        if "RANK" not in os.environ:  # one process without a launcher: a group of one, as FSDP2 needs
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=os.environ.get("MASTER_PORT", "29512"))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    size = args.size or ("8b" if device.type == "cuda" else "tiny")
    shape, layers = SIZES[size], args.layers or (4 if size == "8b" else 2)
    hardware, peak, has_fp8 = board(device)
    emulate = device.type != "cuda"
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose among {', '.join(ROWS)}")
    sides = {"raw": raw_step, "convoy": convoy_step}
    chosen = [s for s in args.sides.split(",") if s]

    generator = torch.Generator().manual_seed(1)
    # seq + 1 tokens a row: the model reads seq of them (float8's matmuls need a multiple of 16), predicts the next
    data = [torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"] + 1), generator=generator).to(device)
            for _ in range(args.warmup + args.steps)]
    results: dict[tuple[str, str], Cell | str] = {}
    for row in rows:
        compile_, fp8 = ROWS[row]
        if fp8 is not None and device.type == "cuda" and not has_fp8:
            for side in chosen:
                results[row, side] = "no float8 tensor cores"
            continue
        for side in chosen:
            torch._dynamo.reset()
            make = (lambda side=side, compile_=compile_, fp8=fp8:  # noqa: E731
                    sides[side](shape, layers, device, compile_, fp8, emulate))
            try:
                results[row, side] = measure(make, data, args.warmup, device)
            except Exception as err:  # one failing cell is reported (its traceback on stderr), the others still run
                results[row, side] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}"
                traceback.print_exc(file=sys.stderr)
            if rank == 0:  # a progress line per cell, so that a run stopped by a time limit still says something
                cell = results[row, side]
                said = cell if isinstance(cell, str) else f"{cell.tokens_per_s:,.0f} tokens/s, {cell.peak_gib:.1f} GiB"
                print(f"[{time.strftime('%H:%M:%S')}] {row} {side}: {said}", file=sys.stderr, flush=True)
    if rank != 0:
        return
    per_token = flops_per_token(shape, layers)
    print(f"{size} model, {layers} layers, sequence {shape['seq']}, micro-batch {shape['batch']}, {world} "
          f"process(es) on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}; "
          f"{args.steps} timed steps after {args.warmup}")
    header = f"{'row':24} {'side':7} {'tokens/s/GPU':>13} {'MFU':>6} {'peak GiB':>9} {'b / a':>6} {'planned':>10}"
    print(header)
    for row in rows:
        compile_, fp8 = ROWS[row]
        plan = predicted(shape, layers, hardware, world, compile_, fp8)
        raw = results.get((row, "raw"))
        for side in chosen:
            cell = results[row, side]
            if isinstance(cell, str):
                print(f"{row:24} {side:7} {cell}")
                continue
            mfu = f"{cell.tokens_per_s * per_token / (peak * 1e12):6.1%}" if peak else "   n/a"
            ratio = f"{cell.tokens_per_s / raw.tokens_per_s:6.2f}" if side == "convoy" and isinstance(raw, Cell) \
                else "     -"
            print(f"{row:24} {side:7} {cell.tokens_per_s:13,.0f} {mfu} {cell.peak_gib:9.1f} {ratio} {plan:>10}")
    print("losses per step (the same recipe trains the same model):")
    for (row, side), cell in results.items():
        if isinstance(cell, Cell):
            print(f"  {row:24} {side:7} {' '.join(f'{x:.5f}' for x in cell.losses)}")


if __name__ == "__main__":
    main()
    if dist.is_initialized():
        dist.destroy_process_group()
