"""Launch overhead: time from command start until every rank has passed init_process_group and a barrier, and
until the launcher has exited.

    .venv/bin/python benchmarks/launch_overhead.py --runs 5 --nproc 2

Compares, on the same trivial script and interleaved run by run (so load changes hit every launcher alike):
``convoy launch`` (direct engine), ``convoy launch --engine elastic`` (torch's agent), ``torchrun
--standalone``, ``accelerate launch --multi_gpu`` (when installed; on CPU it runs torchrun's agent), and the
floor: one bare process that imports torch.distributed. Prints medians and ratios: "ready s" until the last
rank passed its barrier, "exit s" until the command has exited (the ranks' interpreter shutdowns and the
launcher's clean-up included), "cpu s" the CPU time of the command and everything it waited for.
The last lines give the two ratios convoy is held to, on "exit s": the direct engine against the bare
launcher (goal 1.05x) and the elastic engine against torchrun (goal 0.9x), as the ratio of the medians and
as the median of the per-round ratios (each round runs every launcher once, so a load change hits both).

Two more rows split the gap between a launcher and the floor into what no launcher can avoid and what the
launcher adds: "bare" starts the ranks from a ten-line Python script with torchrun's variables (rank 0's
process group hosts the store, as under the direct engine), and "N processes import torch.distributed"
starts N ranks that only import (no rendezvous). The "init s" column is the median, over runs, of the
slowest rank's ``init_process_group`` + barrier: a rank whose store client arrives before rank 0 listens is
refused and retried by torch after a backoff, which shows up there. ``--baseline OTHER/src`` adds the convoy
rows run from another checkout's ``src/`` (``PYTHONPATH``), for a before/after in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
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
began = time.time()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(f"{time.time()!r} {time.time() - began!r}")
dist.destroy_process_group()
"""
FLOOR_SCRIPT = """
import os, sys, time
import torch.distributed
open(os.path.join(sys.argv[1], "rank" + os.environ.get("RANK", "0")), "w").write(repr(time.time()))
"""
BARE_LAUNCHER = """
import os, socket, subprocess, sys
nproc, script, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
procs = [subprocess.Popen([sys.executable, "-u", script, out], env={
    **os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(nproc)]
sys.exit(max(p.wait() for p in procs))
"""
FLOOR = "floor (1 process, import torch.distributed)"
BARE = "bare: {nproc} processes, torchrun's variables"


def launchers(nproc: int, script: str, floor: str, bare: str, baseline: str | None) -> dict[str, list[str]]:
    py = sys.executable
    table = {
        "convoy launch": [py, "-m", "convoy", "launch", f"--nproc-per-node={nproc}", script],
        "convoy launch --engine elastic": [py, "-m", "convoy", "launch", "--engine", "elastic",
                                           f"--nproc-per-node={nproc}", script],
    }
    if baseline:  # the same commands on another checkout's src/ (before/after a change, in the same run)
        table.update({f"{name} (baseline)": [f"PYTHONPATH={baseline}", *argv] for name, argv in table.items()})
    table |= {
        "torchrun --standalone": [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                                  script],
    }
    accelerate = shutil.which("accelerate", path=str(Path(py).parent)) or shutil.which("accelerate")
    if accelerate:
        table["accelerate launch"] = [accelerate, "launch", "--multi_gpu", "--num_processes", str(nproc),
                                      "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                                      script]
    table[BARE.format(nproc=nproc)] = [py, bare, str(nproc), script]
    table[f"{nproc} processes import torch.distributed"] = [py, bare, str(nproc), floor]
    table[FLOOR] = [py, floor]
    return table


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(argv: list[str], expect: int) -> tuple[float, float | None, float, float] | None:
    """(seconds until the last rank was ready, the slowest rank's init + barrier seconds, seconds until the
    command exited, its CPU seconds) or None."""
    out = Path(tempfile.mkdtemp(prefix="convoy-bench-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while "=" in argv[0]:  # leading NAME=value items are environment variables, as in a shell
        name, value = argv[0].split("=", 1)
        env[name], argv = value, argv[1:]
    cpu = _children_cpu()
    start = time.time()
    proc = subprocess.run([*argv, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=300)
    ended, cpu = time.time(), _children_cpu() - cpu
    stamps = [[float(field) for field in p.read_text().split()] for p in out.iterdir()]
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0 or len(stamps) != expect:
        print(f"  failed: {' '.join(argv[:4])}...: rc={proc.returncode} {proc.stderr.strip()[-300:]}",
              file=sys.stderr)
        return None
    inits = [fields[1] for fields in stamps if len(fields) > 1]
    return max(fields[0] for fields in stamps) - start, max(inits) if inits else None, ended - start, cpu


GOALS = (("convoy launch", BARE, 1.05), ("convoy launch --engine elastic", "torchrun --standalone", 0.9))


def _ratio_lines(columns: dict[str, dict[str, list[float]]], nproc: int) -> list[str]:
    """The goal ratios on "exit s": ratio of the medians, and the median of the per-round ratios."""
    exits, lines = columns["exit"], []
    names = [(ours, peer.format(nproc=nproc), goal) for ours, peer, goal in GOALS]
    names += [(f"{ours} (baseline)", peer, goal) for ours, peer, goal in names if f"{ours} (baseline)" in exits]
    for ours, peer, goal in names:
        if ours not in exits or peer not in exits:
            continue
        rounds = [a / b for a, b in zip(exits[ours], exits[peer]) if a is not None and b is not None]
        mine, theirs = [v for v in exits[ours] if v is not None], [v for v in exits[peer] if v is not None]
        if not rounds:
            continue
        cpu = statistics.median(v for v in columns["cpu"][ours] if v is not None) / statistics.median(
            v for v in columns["cpu"][peer] if v is not None)
        lines.append(f"{ours} / {peer}, exit: {statistics.median(mine) / statistics.median(theirs):.2f}x "
                     f"(median of {len(rounds)} rounds' ratios {statistics.median(rounds):.2f}x; "
                     f"cpu {cpu:.2f}x; goal {goal}x)")
    for ours, _, _ in GOALS:  # this checkout against the baseline, round by round
        before = exits.get(f"{ours} (baseline)")
        if before and ours in exits:
            rounds = [a / b for a, b in zip(exits[ours], before) if a is not None and b is not None]
            if rounds:
                lines.append(f"{ours} / its baseline, exit: median of {len(rounds)} rounds' ratios "
                             f"{statistics.median(rounds):.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--baseline", metavar="SRC", help="also time convoy from this src/ directory (PYTHONPATH)")
    parser.add_argument("--rows", metavar="WORDS", help="only the launchers whose name contains one of these "
                        "comma-separated words (more rounds in the same time), e.g. 'convoy,torchrun,bare'")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convoy-bench-scripts-"))
    script, floor, bare = work / "ready.py", work / "floor.py", work / "bare.py"
    script.write_text(RANK_SCRIPT)
    floor.write_text(FLOOR_SCRIPT)
    bare.write_text(BARE_LAUNCHER)
    table = launchers(args.nproc, str(script), str(floor), str(bare), args.baseline)
    if args.rows:
        words = [word.strip() for word in args.rows.split(",") if word.strip()]
        table = {name: argv for name, argv in table.items() if any(word in name for word in words)}
    # one entry per round and launcher (None: that run failed), so that rounds pair up for the ratios
    columns: dict[str, dict[str, list[float | None]]] = {
        key: {name: [] for name in table} for key in ("ready", "init", "exit", "cpu")}
    for run in range(args.runs):  # interleaved: every launcher once per round
        for name, argv in table.items():
            value = measure(argv, 1 if name == FLOOR else args.nproc)
            for key, item in zip(columns, value or (None,) * 4):
                columns[key][name].append(item)
        print(f"round {run + 1}/{args.runs} done", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)

    def median(key: str, name: str) -> float | None:
        values = [v for v in columns[key].get(name, []) if v is not None]
        return statistics.median(values) if values else None

    torchrun, floor_s = median("ready", "torchrun --standalone"), median("ready", FLOOR)
    print(f"\n{args.nproc} ranks, {args.runs} interleaved runs, medians: seconds until every rank passed a barrier "
          "(ready), until the command exited (exit), CPU seconds")
    print(f"{'launcher':<50} {'ready s':>8} {'min s':>6} {'max s':>6} {'/ torchrun':>10} {'/ floor':>8} "
          f"{'init s':>7} {'exit s':>7} {'cpu s':>6}")
    for name in table:
        ready = [v for v in columns["ready"][name] if v is not None]
        if not ready:
            continue
        med = statistics.median(ready)
        ratio_t = f"{med / torchrun:.2f}" if torchrun else "-"
        ratio_f = f"{med / floor_s:.2f}" if floor_s else "-"
        init, ended, cpu = (median(key, name) for key in ("init", "exit", "cpu"))
        init_text = f"{init:.2f}" if init is not None else "-"
        print(f"{name:<50} {med:>8.2f} {min(ready):>6.2f} {max(ready):>6.2f} {ratio_t:>10} {ratio_f:>8} "
              f"{init_text:>7} {ended:>7.2f} {cpu:>6.2f}")
    print()
    for line in _ratio_lines(columns, args.nproc):
        print(line)


if __name__ == "__main__":
    main()
