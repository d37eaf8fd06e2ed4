"""``accelerator.plan_report()`` on one CUDA device, run by tests/gpu/test_plan_report_gpu.py in a fresh process.

    XDG_CACHE_HOME=/tmp/x python tests/gpu/scripts/plan_report_cuda.py zero3     # single | zero3

Trains a GPT-shaped model (8 blocks of 1024, sequence 512 x batch 8, bf16) for 9 optimizer steps and prints ``CHECK
<name> ok`` per check: the report's measured peak is ``torch.cuda.max_memory_allocated()`` read right after the
last measured step (the counter reset after warm-up: at least the weights, gradients and Adam state, 16 bytes
per parameter), the ratios are planned / measured, and a later ``convoy.plan`` of the same case on this GPU
finds the measurement through NVML's uuid (torch's lacks NVML's ``GPU-`` prefix) and takes the measured step time.
Prints ``REPORT <json>`` with the numbers for the GPU notes (docs/gpu.md), and the Accelerator's line (logging at
INFO: ``LOG convoy.train.plan_report: measured ...``).
"""

import dataclasses
import json
import logging
import sys

import torch
from torch import nn

from convoy import Accelerator
from convoy.plan.api import plan
from convoy.plan.hardware import lookup_gpu
from convoy.train.plan_report import MEASURED_STEPS, WARMUP_STEPS

SEQ, BATCH, VOCAB, DIM, HEADS, LAYERS = 512, 8, 8192, 1024, 16, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads = HEADS
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, d // HEADS).transpose(1, 3).unbind(2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def ok(name: str) -> None:
    print(f"CHECK {name} ok", flush=True)


def main(strategy: str) -> None:
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s: %(message)s")
    acc = Accelerator(strategy=strategy, mixed_precision="bf16")
    assert acc.device.type == "cuda", acc.device
    torch.manual_seed(0)
    model = GPT()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = acc.prepare(model, optimizer)
    last = WARMUP_STEPS + MEASURED_STEPS
    torch_peak = None
    for step in range(1, last + 3):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=acc.device)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        acc.backward(loss)
        optimizer.step()  # the report's hook runs at the end of this call
        if step == last:
            torch_peak = torch.cuda.max_memory_allocated(acc.device)
        optimizer.zero_grad()
    report = acc.plan_report()
    print("REPORT", json.dumps({**dataclasses.asdict(report), "time_ratio": report.time_ratio,
                                "memory_ratio": report.memory_ratio, "params": params}), flush=True)
    assert report.missing == "" and report.steps == MEASURED_STEPS, report
    assert report.measured_peak_bytes == torch_peak, (report.measured_peak_bytes, torch_peak)
    ok("measured peak is max_memory_allocated")
    assert report.measured_peak_bytes >= 16 * params, (report.measured_peak_bytes, params)
    ok("peak holds weights, gradients and Adam state")
    assert report.memory_ratio == report.planned_peak_bytes / report.measured_peak_bytes
    assert report.time_ratio == report.planned_seconds / report.measured_seconds and report.measured_seconds > 0
    assert 0.5 < report.memory_ratio < 2, report  # the planner's own accuracy is benchmarks/planner_accuracy.py's
    ok("ratios are planned over measured")
    row = lookup_gpu(torch.cuda.get_device_name(acc.device)).name
    again = plan(GPT(), hardware=f"1x{row}", seq_len=SEQ, micro_batch=BATCH, precision="bf16-autocast",
                 allowed=[report.layout])
    assert report.layout in again.observations, (report.case, again.time_note)
    assert abs(again.row(report.layout).time.seconds - report.measured_seconds) < 1e-9 * report.measured_seconds
    ok("the next plan on this GPU takes the measured step")


if __name__ == "__main__":
    main(sys.argv[1])
