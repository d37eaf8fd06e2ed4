"""The planner against a real training step: peak allocated, reserved and step time, per model, with ratios.

    python benchmarks/planner_accuracy.py                     # on a GPU: the cases below, a markdown table
    python benchmarks/planner_accuracy.py --plain             # the plain-PyTorch copies instead of transformers
    python benchmarks/planner_accuracy.py --cases gpt2-124m-sdpa --steps 8 --memtracker
    python benchmarks/planner_accuracy.py --snapshot out/     # also: what is alive at each case's peak
    python benchmarks/planner_accuracy.py --cpu               # tiny models on the CPU (tests this script)

Each case trains a few steps of a decoder built by ``transformers.AutoModelForCausalLM.from_config`` (what users
run; when transformers is not installed, or with ``--plain``, benchmarks/planner_models.py's plain-PyTorch copies
of its GPT-2, Llama (GQA) and GPT-NeoX blocks) under ``torch.autocast(bfloat16)`` with fp32 weights and fp32
AdamW, in a plain loop
(``zero_grad(set_to_none=True)``), planned as ``bf16-autocast``; the ``-fsdp`` cases shard it first with FSDP2 over
one process, each block and the root, with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (what
convoy's zero3 runs under ``mixed_precision="bf16"``), planned as ``bf16-fsdp`` at ZeRO stage 3. Measured:
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
over one step after the first (optimizer state exists), and the median step time of the rest. Full
recomputation is what transformers users turn on (``gradient_checkpointing_enable``, which also turns the KV
cache off). Planned: ``convoy.plan.memory.memory_per_gpu`` (allocated; reserved = allocated x (1 +
fragmentation)) and ``convoy.plan.timing.step_time`` three times: with the GPU's shipped profile (what a plan
made before the GPU is in hand uses), with the shape-aware model alone (what a GPU without a profile gets),
and calibrated on this GPU (``convoy.plan.speed.measure``). Targets: allocated within 10 %, step time within 25 %.
``--snapshot DIR`` records the CUDA allocator's history over each measured step and writes, per case, the live
allocations at the peak with the code that made them (and the raw snapshot for https://pytorch.org/memory_viz).
Without a GPU it refuses with one line unless ``--cpu`` is given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]


@dataclass(frozen=True)
class Case:
    name: str
    config: str
    seq: int
    batch: int
    attention: str = "sdpa"
    recompute: str = "none"
    fsdp: bool = False
    """FSDP2 with bf16 MixedPrecisionPolicy over one process (convoy's zero3 under mixed_precision="bf16")."""


#: at least four models: GPT-2 style, Llama-style GQA above 1B, a 4096 sequence, GPT-NeoX, a 152k vocabulary
CASES = (
    Case("gpt2-124m-sdpa", "gpt2-124m", 1024, 8),
    Case("gpt2-124m-eager", "gpt2-124m", 1024, 4, attention="eager"),
    Case("llama-1.1b-gqa", "llama-1.1b-gqa", 2048, 4),
    Case("llama-1.1b-gqa-4096", "llama-1.1b-gqa", 4096, 2),
    Case("llama-1.1b-gqa-4096-recompute", "llama-1.1b-gqa", 4096, 4, recompute="full"),
    Case("pythia-410m", "pythia-410m", 2048, 4),
    Case("qwen2-0.5b-4096", "qwen2-0.5b", 4096, 1),
    Case("llama-1.1b-gqa-fsdp", "llama-1.1b-gqa", 2048, 4, fsdp=True),
    Case("pythia-410m-fsdp", "pythia-410m", 2048, 4, fsdp=True),
)

CPU_CONFIGS = {
    # no dropout: CPU SDPA with dropout falls back to the math kernel (CUDA's flash kernel takes dropout)
    "gpt2-tiny": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
                  "n_positions": 128, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0},
    "llama-tiny-gqa": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 256},
    "pythia-tiny": {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "intermediate_size": 256, "vocab_size": 256},
}
CPU_CASES = (Case("gpt2-tiny", "gpt2-tiny", 64, 4), Case("llama-tiny-gqa", "llama-tiny-gqa", 64, 4),
             Case("llama-tiny-gqa-eager", "llama-tiny-gqa", 64, 4, attention="eager"),
             Case("pythia-tiny", "pythia-tiny", 64, 4), Case("pythia-tiny-fsdp", "pythia-tiny", 64, 4, fsdp=True))


def _build(case: Case, config: dict, device, hf: bool, cpu: bool):
    import torch

    if hf:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model(**config)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=case.attention).to(device)
        blocks = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))
    else:
        from planner_models import build

        model = build(config, attention=case.attention, cuda_rules=cpu).to(device)
        blocks = getattr(model, "h", None) or model.layers
    if case.recompute == "full" and hf:  # as transformers users do; it also turns the KV cache off
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif case.recompute == "full":
        import functools

        from torch.utils.checkpoint import checkpoint

        for block in blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    if case.fsdp:
        _fully_shard(model, blocks, device)
    return model.train()


def _fully_shard(model, blocks, device) -> None:
    """FSDP2 over a one-process group (started here once: nccl on the GPU, gloo on the CPU), as convoy's zero3
    shards: every block, then the root, with bf16 compute and fp32 gradient reduction."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from convoy.train.precision import precision_for

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    mesh = init_device_mesh(device.type, (1,))
    mp = precision_for("bf16", device_type=device.type).fsdp_policy()  # zero3's own policy
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def _loss(model, ids, hf: bool):
    if hf:
        return model(input_ids=ids, labels=ids).loss
    from planner_models import causal_lm_loss

    return causal_lm_loss(model(ids), ids)


def measure(case: Case, config: dict, *, device: str, steps: int, hf: bool, memtracker: bool,
            snapshot: Path | None = None) -> dict:
    """Peak allocated / reserved (bytes) over the second step, median seconds of steps 3.., MemTracker's
    activations on the second step (``memtracker``; always on the CPU, where it is the only peak we have);
    with ``snapshot``, what is alive at the peak of the measured step (``write_peak``)."""
    import torch

    dev = torch.device(device)
    cpu = dev.type == "cpu"
    torch.manual_seed(0)
    model = _build(case, config, dev, hf, cpu)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, config["vocab_size"], (case.batch, case.seq), device=dev)

    def one_step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = _loss(model, ids, hf)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if not cpu:
            torch.cuda.synchronize(dev)

    one_step()
    sync()
    out: dict = {}
    if memtracker or cpu:
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(model, opt, ids)
        with mt:
            one_step()
        peak = next(iter(mt.get_tracker_snapshot("peak").values()))
        cats = {str(k).split(".")[-1].lower(): v for k, v in peak.items()}
        out["memtracker_activations"], out["memtracker_total"] = cats.get("act", 0), cats.get("total", 0)
    if not cpu:
        torch.cuda.reset_peak_memory_stats(dev)
        if snapshot is not None:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        one_step()
        sync()
        out["allocated"] = torch.cuda.max_memory_allocated(dev)
        out["reserved"] = torch.cuda.max_memory_reserved(dev)
        if snapshot is not None:
            write_peak(torch.cuda.memory._snapshot(), snapshot / f"{case.name}.txt")
            torch.cuda.memory._dump_snapshot(str(snapshot / f"{case.name}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
    else:
        out["allocated"] = out["memtracker_total"]
        out["reserved"] = None
    times = []
    for _ in range(max(1, steps - 2)):
        t0 = time.perf_counter()
        one_step()
        sync()
        times.append(time.perf_counter() - t0)
    out["seconds"] = statistics.median(times)
    model = opt = None  # freed before the next case (one_step is not called again)
    if not cpu:
        torch.cuda.empty_cache()
    return out


def write_peak(snap: dict, path: Path, top: int = 25) -> None:
    """The live allocations at the highest point of the recorded trace, largest first, each with the deepest
    frames of the Python code that made it: replays the allocator's alloc / free events (the snapshot format of
    ``torch.cuda.memory._snapshot``, https://pytorch.org/docs/stable/torch_cuda_memory.html)."""
    live: dict[int, dict] = {}
    total = peak = 0
    at_peak: list[dict] = []
    for event in (e for trace in snap.get("device_traces", []) for e in trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif event["action"] in ("free_completed",) and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
    lines = [f"peak of the recorded step: {peak / 1e9:.2f} GB over what was allocated before it, "
             f"{len(at_peak)} live allocations", ""]
    for event in sorted(at_peak, key=lambda e: -e["size"])[:top]:
        frames = [f for f in event.get("frames", []) if f.get("filename", "").endswith(".py")][:4]
        where = " <- ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames)
        lines.append(f"{event['size'] / 1e9:8.3f} GB  {where}")
    path.write_text("\n".join(lines) + "\n")


def planned(case: Case, config: dict, *, device: str, hardware, calibrate: bool) -> dict:
    from convoy.plan.memory import FRAGMENTATION, Layout, memory_per_gpu
    from convoy.plan.model import from_hf_config
    from convoy.plan.run import RunSpec
    from convoy.plan.speed.measure import calibrate as measure_device
    from convoy.plan.speed.rates import ModeledRates, rates_for
    from convoy.plan.timing import step_time

    spec = from_hf_config(config)
    run = RunSpec(seq_len=case.seq, micro_batch=case.batch, precision="bf16-fsdp" if case.fsdp else "bf16-autocast",
                  attention="flash" if case.attention == "sdpa" else "eager", recompute=case.recompute)
    layout = Layout(zero_stage=3) if case.fsdp else Layout()
    mem = memory_per_gpu(spec, run, layout)
    out = {"params": spec.num_params, "allocated": mem.allocated, "activations": mem.activations,
           "reserved": mem.allocated * (1 + FRAGMENTATION)}
    if hardware is not None:  # before the GPU is in hand: its shipped profile, and the model a GPU without one gets
        out["profile_seconds"] = step_time(spec, run, layout, hardware, global_batch=case.batch,
                                           rates=rates_for(hardware.gpu)).seconds
        out["model_seconds"] = step_time(spec, run, layout, hardware, global_batch=case.batch,
                                         rates=ModeledRates(hardware.gpu)).seconds
    if calibrate:
        record = measure_device(spec, run, device=device, **({"copy_bytes": 1 << 24} if device == "cpu" else {}))
        out["calibrated_seconds"] = step_time(spec, run, layout, hardware, global_batch=case.batch,
                                              calibration=record).seconds
    return out


def _ratio(est, got) -> str:
    return f"{est / got:.2f}x" if est and got else "n/a"


def _ms(est, got=None) -> str:
    if not est:
        return "n/a"
    return f"{est * 1e3:.1f} ms" + (f" ({_ratio(est, got)})" if got else "")


UNIT = [1e9, "GB"]  # MB for the tiny CPU models


def _gb(x) -> str:
    return f"{x / UNIT[0]:.2f}" if x else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="tiny models on the CPU (a test of this script)")
    parser.add_argument("--hf", action="store_true", help="build the models with transformers (the default when "
                                                          "it is installed)")
    parser.add_argument("--plain", action="store_true", help="the plain-PyTorch copies (benchmarks/planner_models.py)")
    parser.add_argument("--snapshot", metavar="DIR", type=Path, help="write what is alive at each case's peak")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--steps", type=int, default=8, help="training steps per case (default 8)")
    parser.add_argument("--memtracker", action="store_true", help="also MemTracker's activations (GPU)")
    parser.add_argument("--no-calibrate", action="store_true", help="the profile and the model only (no measuring)")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("planner_accuracy: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "--cpu runs the tiny CPU variant", file=sys.stderr)
        return 2
    from convoy.plan.hardware import lookup_gpu, parse_hardware
    from planner_models import CONFIGS

    configs = CPU_CONFIGS if args.cpu else CONFIGS
    cases = CPU_CASES if args.cpu else CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = tuple(c for c in cases if c.name in wanted)
        if not cases:
            parser.error(f"--cases: none of {sorted(wanted)} is a case; have {', '.join(c.name for c in CASES)}")
    if args.hf and args.plain:
        parser.error("--hf and --plain: choose one")
    import importlib.util

    args.hf = not args.plain and not args.cpu and (args.hf or importlib.util.find_spec("transformers") is not None)
    if args.snapshot is not None:
        if args.cpu:
            parser.error("--snapshot records the CUDA allocator; it has no CPU variant")
        args.snapshot.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.cpu else "cuda"
    UNIT[:] = [1e6, "MB"] if args.cpu else [1e9, "GB"]
    hardware = None
    if not args.cpu:
        name = torch.cuda.get_device_name(0)
        hardware = parse_hardware(f"1x{lookup_gpu(name).name}")
        print(f"device: {name}, torch {torch.__version__}, models: {'transformers' if args.hf else 'planner_models'}")
    else:  # the CPU as a one-device "hardware": its peak only matters for shapes a calibration lacks
        from convoy.plan.hardware import GpuSpec, Hardware

        cpu = GpuSpec(name="cpu", memory_bytes=2**34, bf16_tflops=0.1, fp16_tflops=0.1, fp32_tflops=0.1,
                      nvlink_gbs=None, pcie_gbs=16, source="the CPU running this script")
        hardware = Hardware(gpu=cpu, gpus_per_node=1, intra="pcie")
        print(f"device: CPU (tiny models; CPU autocast with CUDA's fp32 op list), torch {torch.__version__}")
    calibrate = not args.no_calibrate
    print("| case | params | s x b | peak allocated: measured / planned (ratio) | reserved: measured / planned "
          "| activations: MemTracker / planned | step: measured / profile / shape-aware model / calibrated "
          "(ratios) |")
    print("|---|---:|---|---|---|---|---|")
    worst: dict[str, float] = {}
    try:
        worst = _run_cases(cases, configs, args, device, hardware, calibrate)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():  # the -fsdp cases' one-process group
            dist.destroy_process_group()
    print()
    for what, error in worst.items():
        print(f"worst {what} error: {error:.1%} (target {10 if what == 'peak allocated' else 25} %)")
    return 0


def _run_cases(cases, configs, args, device, hardware, calibrate) -> dict[str, float]:
    """Measure and plan each case, print its row; the worst error of the peak allocated and of each step time."""
    worst: dict[str, float] = {}
    for case in cases:
        cfg = configs[case.config]
        got = measure(case, cfg, device=device, steps=args.steps, hf=args.hf, memtracker=args.memtracker,
                      snapshot=args.snapshot)
        est = planned(case, cfg, device=device, hardware=hardware, calibrate=calibrate)
        step = " / ".join([_ms(got["seconds"])] + [_ms(est.get(k), got["seconds"]) for k in
                                                     ("profile_seconds", "model_seconds", "calibrated_seconds")])
        mt = got.get("memtracker_activations")
        print(f"| {case.name}{' (' + case.attention + ')' if case.attention != 'sdpa' else ''}"
              f"{' recompute' if case.recompute != 'none' else ''} | {est['params'] / 1e6:.1f}M | "
              f"{case.seq} x {case.batch} | {_gb(got['allocated'])} / {_gb(est['allocated'])} {UNIT[1]} "
              f"({_ratio(est['allocated'], got['allocated'])}) | {_gb(got['reserved'])} / {_gb(est['reserved'])} "
              f"{UNIT[1]} | {_gb(mt)} / {_gb(est['activations'])} {UNIT[1]} | {step} |", flush=True)
        errors = {"peak allocated": est["allocated"] / got["allocated"]}
        errors.update({f"step ({k.split('_')[0]})": est[k] / got["seconds"] for k in
                       ("profile_seconds", "model_seconds", "calibrated_seconds") if est.get(k)})
        for what, ratio in errors.items():
            worst[what] = max(worst.get(what, 0.0), abs(ratio - 1))
    return worst


if __name__ == "__main__":
    sys.exit(main())
