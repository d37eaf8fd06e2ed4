"""``convoy plan``: memory and time per parallelism layout, and which to use.

    convoy plan config.json --hardware 8xH100-80GB --seq-len 4096
    convoy plan --params 7.5e9 --hardware 8xA100-80GB --nodes 8 --json
    convoy plan mypkg.models:build --hardware 2xL40S --plot plan.png
    convoy plan config.json --inventory box.json            # a machine described by `convoy devices --json`

The same as ``convoy.plan(...)``; this module only parses and prints. torch is imported only when MODEL is
a ``module:function`` factory (built on the meta device).
"""

from __future__ import annotations

import argparse
import re

from convoy.errors import shown
from convoy.plan.run import COMPILE, FP8_RECIPES, PRECISIONS

DESCRIPTION = "Estimate per-GPU memory and step time of every parallelism layout, and recommend one."
EPILOG = """examples:
  convoy plan Llama-2-7b/config.json --hardware 8xH100-80GB --seq-len 4096
  convoy plan --params 7.5e9 --hardware 8xA100-80GB --nodes 8 --json
  convoy plan config.json --hardware 8xH100-80GB --nodes 4 --inter-gbps 3200 --recompute full
  convoy plan mypkg.models:build --inventory box.json --plot plan.png
  convoy plan config.json --hardware 8xH100-80GB --compile blocks --fp8 tensorwise

MODEL is a Hugging Face config.json (or its directory), or MODULE:FUNCTION returning an nn.Module.
Hardware: --hardware, else --inventory, else this machine's accelerators (CONVOY_INVENTORY is honoured).
Numbers and their sources: docs/planner.md."""


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"\s*-?[0-9]{1,10}\s*", text):  # ASCII digits: int() would read '٣'
        too_long = re.fullmatch(r"\s*-?[0-9]+\s*", text)
        raise argparse.ArgumentTypeError(f"{shown(text)} is " + ("too large (at most 10 digits)" if too_long
                                                                  else "not a whole number"))
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _positive_float(text: str) -> float:
    try:
        if not text.isascii():
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 7.5e9)") from None
    if not 0 < value < float("inf"):  # also refuses nan, inf and 400 nines (a float's inf)
        raise argparse.ArgumentTypeError(f"{shown(text)} must be > 0 and finite")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="MODEL", help="config.json path, or MODULE:FUNCTION")
    m = parser.add_argument_group("model by numbers (also override MODEL's values)")
    m.add_argument("--params", type=_positive_float, help="parameter count, e.g. 7.5e9")
    m.add_argument("--layers", type=_positive_int, help="transformer blocks")
    m.add_argument("--hidden", type=_positive_int, help="hidden size")
    m.add_argument("--heads", type=_positive_int, help="attention heads")
    m.add_argument("--kv-heads", type=_positive_int, help="key/value heads (grouped-query attention)")
    m.add_argument("--ffn", type=_positive_int, help="MLP inner size (default 4 x hidden)")
    m.add_argument("--vocab", type=_positive_int, help="vocabulary size")
    h = parser.add_argument_group("hardware")
    h.add_argument("--hardware", metavar="NxGPU", help="e.g. 8xH100-80GB (GPUs per node, at most 16, x table name)")
    h.add_argument("--inventory", metavar="FILE", help="plan for the machine in this inventory file")
    h.add_argument("--nodes", type=_positive_int, default=1, help="number of nodes (default 1)")
    h.add_argument("--intra", choices=("nvlink", "pcie"), help="link inside a node (default: NVLink if the GPU has it)")
    h.add_argument("--intra-gbs", type=_positive_float, help="override intra-node GB/s per GPU, one direction")
    h.add_argument("--inter-gbps", type=_positive_float, default=400.0,
                   help="network Gbit/s per node, all NICs (default 400; a DGX H100 has 3200); printed with "
                        "multi-node plans, and it often decides them")
    h.add_argument("--gpu-memory-gib", type=_positive_float, help="override the GPU's memory")
    h.add_argument("--peak-tflops", type=_positive_float, help="override the GPU's peak TFLOPs")
    r = parser.add_argument_group("run")
    r.add_argument("--seq-len", type=_positive_int, default=2048, help="tokens per sequence (default 2048)")
    r.add_argument("--micro-batch", type=_positive_int, default=1, help="sequences per GPU per forward (default 1)")
    r.add_argument("--global-batch", type=_positive_int, help="sequences per step (default micro-batch x GPUs)")
    r.add_argument("--precision", choices=(*PRECISIONS, "fp8"), default="bf16",
                   help="precision recipe (default bf16; each is described in docs/planner.md); fp8: bf16 with "
                        "torchao float8 tensorwise (see --fp8)")
    r.add_argument("--compile", choices=COMPILE, default=None,
                   help="torch.compile: none, blocks (each block, as torchtitan) or model (default: the plan shows "
                        "eager, compile and compile+fp8 and recommends the fastest)")
    r.add_argument("--fp8", choices=FP8_RECIPES, default=None,
                   help="torchao float8 recipe (default: chosen where the board has float8 tensor cores and it is "
                        "faster; none keeps 16-bit GEMMs)")
    r.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd-momentum", "none"), default="adamw",
                   help="optimizer; 'none' plans inference (default adamw)")
    r.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation checkpointing (default none)")
    r.add_argument("--attention", choices=("flash", "eager"), default="flash",
                   help="flash: fused SDPA keeps no s x s scores; eager: it does (default flash)")
    r.add_argument("--dropout", action="store_true", help="the model uses dropout (masks cost memory)")
    r.add_argument("--efficiency", type=_positive_float, default=None,
                   help="time every GEMM and the attention at this fraction of peak FLOPs (the flat datasheet model); "
                        "default: the GPU's measured profile, else the shape-aware model")
    r.add_argument("--no-offload", action="store_true", help="leave out CPU-offload candidates")
    r.add_argument("--calibrate", action="store_true",
                   help="measure the planned GPU on this machine (cached) and time with the measured rates")
    r.add_argument("--strategies", metavar="LIST",
                   help="only these, comma-separated: single,ddp,zero1,zero2,zero3,hsdp,tp,pp,cp,offload (cp: layouts "
                        "that split each sequence, for a loop with maybe_context_parallel)")
    o = parser.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the plan as JSON")
    o.add_argument("--plot", metavar="OUT.png", help="draw each candidate's per-GPU memory beside its step time, what "
                   "fits marked (needs matplotlib: pip install 'convoy[plot]')")


def run(args: argparse.Namespace) -> int:
    from convoy.errors import PlanError
    from convoy.plan.api import format_plan, plan

    if args.model is None and args.params is None:
        raise PlanError("no model given; pass a config.json path, a MODULE:FUNCTION factory, or --params 7.5e9")
    allowed = None
    if args.strategies:
        allowed = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
        known = {"single", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "parallel", "tp", "pp", "cp", "offload"}
        bad = [s for s in allowed if s not in known]
        if bad:
            raise PlanError(f"--strategies: unknown {bad[0]!r}; use some of {', '.join(sorted(known))}")
    if args.efficiency is not None and args.efficiency > 1:
        raise PlanError(f"--efficiency {args.efficiency} is a fraction of peak; give a number in (0, 1], e.g. 0.45")
    out = None
    if args.plot:  # checked before planning: a plan of minutes is not lost to a typo in the file name
        from convoy.plan.plot import plot_path

        out = plot_path(args.plot)
    result = plan(args.model, hardware=args.hardware, inventory=args.inventory, nodes=args.nodes, intra=args.intra,
                  intra_gbs=args.intra_gbs, inter_gbps=args.inter_gbps, gpu_memory_gib=args.gpu_memory_gib,
                  peak_tflops=args.peak_tflops, seq_len=args.seq_len, micro_batch=args.micro_batch,
                  global_batch=args.global_batch, precision=args.precision, optimizer=args.optimizer,
                  recompute=args.recompute, attention=args.attention, dropout=args.dropout,
                  efficiency=args.efficiency, offload=not args.no_offload, allowed=allowed,
                  params=args.params, layers=args.layers, hidden=args.hidden, heads=args.heads,
                  kv_heads=args.kv_heads, ffn=args.ffn, vocab=args.vocab, calibrate=args.calibrate,
                  compile=args.compile, fp8=args.fp8)
    if out is not None:
        from convoy.plan.plot import plot_plan

        plot_plan(result, out)
    print(result.to_json() if args.json else format_plan(result))
    if out is not None and not args.json:
        print(f"plot of memory and step time written to {out}")
    return 0
