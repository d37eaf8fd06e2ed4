"""Launch overhead: time from command start until every rank has finished init_process_group and a barrier.

    .venv/bin/python benchmarks/launch_overhead.py --runs 5 --nproc 2

Compares, on the same trivial script and interleaved run by run (so load changes hit every launcher alike):
``convoy launch`` (direct engine), ``convoy launch --engine elastic`` (torch's agent), ``torchrun
--standalone``, ``accelerate launch --multi_gpu`` (when installed; on CPU it runs torchrun's agent), and the
floor: one bare process that imports torch.distributed. Prints medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_SCRIPT = """
import datetime, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(repr(time.time()))
dist.destroy_process_group()
"""
FLOOR_SCRIPT = """
import os, sys, time
import torch.distributed
open(os.path.join(sys.argv[1], "rank0"), "w").write(repr(time.time()))
"""


def launchers(nproc: int, script: str, floor: str) -> dict[str, list[str]]:
    py = sys.executable
    table = {
        "convoy launch": [py, "-m", "convoy", "launch", f"--nproc-per-node={nproc}", script],
        "convoy launch --engine elastic": [py, "-m", "convoy", "launch", "--engine", "elastic",
                                           f"--nproc-per-node={nproc}", script],
        "torchrun --standalone": [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                                  script],
    }
    accelerate = shutil.which("accelerate", path=str(Path(py).parent)) or shutil.which("accelerate")
    if accelerate:
        table["accelerate launch"] = [accelerate, "launch", "--multi_gpu", "--num_processes", str(nproc),
                                      "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                                      script]
    table["floor (1 process, import torch.distributed)"] = [py, floor]
    return table


def measure(argv: list[str], expect: int) -> float | None:
    out = Path(tempfile.mkdtemp(prefix="convoy-bench-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run([*argv, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=300)
    stamps = [float(p.read_text()) for p in out.iterdir()]
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0 or len(stamps) != expect:
        print(f"  failed: {' '.join(argv[:4])}...: rc={proc.returncode} {proc.stderr.strip()[-300:]}",
              file=sys.stderr)
        return None
    return max(stamps) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convoy-bench-scripts-"))
    script, floor = work / "ready.py", work / "floor.py"
    script.write_text(RANK_SCRIPT)
    floor.write_text(FLOOR_SCRIPT)
    table = launchers(args.nproc, str(script), str(floor))
    times: dict[str, list[float]] = {name: [] for name in table}
    for run in range(args.runs):  # interleaved: every launcher once per round
        for name, argv in table.items():
            value = measure(argv, 1 if name.startswith("floor") else args.nproc)
            if value is not None:
                times[name].append(value)
        print(f"round {run + 1}/{args.runs} done", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in times.items() if v}
    torchrun = medians.get("torchrun --standalone")
    floor_s = medians.get("floor (1 process, import torch.distributed)")
    print(f"\n{args.nproc} ranks, {args.runs} interleaved runs, median seconds until every rank passed a barrier")
    print(f"{'launcher':<46} {'median s':>9} {'min s':>7} {'/ torchrun':>11} {'/ floor':>8}")
    for name, med in medians.items():
        ratio_t = f"{med / torchrun:.2f}" if torchrun else "-"
        ratio_f = f"{med / floor_s:.2f}" if floor_s else "-"
        print(f"{name:<46} {med:>9.2f} {min(times[name]):>7.2f} {ratio_t:>11} {ratio_f:>8}")


if __name__ == "__main__":
    main()
