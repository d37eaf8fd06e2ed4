"""Start-up latency of the device commands, next to bare Python and ``import torch``.

    python benchmarks/cli_latency.py              # median of 11 runs each (3 for import torch)
    python benchmarks/cli_latency.py --runs 15

Each row is the median wall time of a fresh process (``time.perf_counter`` around it) and its median
CPU time (user + system, from ``os.wait4``), which a busy machine distorts less. The commands run in rounds (each
once per round), so that a load that comes and goes stretches every row alike, bare Python's too. The targets: a
70B plan (``convoy plan --params 70e9 --hardware 8xH100-80GB``) under 100 ms in all (issue 38), and (issue 32)
``convoy select 2 --free`` within 30 ms of bare Python start-up (issue 2's was 150 ms, which holds only as long as
the device layer never imports torch). Run it with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` unset, as a
user's install has it): without ``.pyc`` files every module is compiled again on each start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "tests" / "inventories" / "8xh100_nvswitch.json"
TARGET_S = 0.030  # convoy select 2 --free above bare Python (issue 32)
PLAN_LABEL = "convoy plan --params 70e9 --hardware 8xH100-80GB"
PLAN_TARGET_S = 0.100  # the whole command, start-up included (issue 38)


def _cases(python: str, convoy: list[str]) -> list[tuple[str, list[str], dict[str, str]]]:
    inv = {"CONVOY_INVENTORY": str(INVENTORY)}
    return [
        ("python -c pass", [python, "-c", "pass"], {}),
        ("convoy --help", [*convoy, "--help"], {}),
        ("convoy devices (this machine)", [*convoy, "devices"], {}),
        ("convoy devices (8xH100 inventory)", [*convoy, "devices"], inv),
        ("convoy select 2 --free --format env", [*convoy, "select", "2", "--free", "--format", "env"], inv),
        ("convoy run --devices 1 --free -- true", [*convoy, "run", "--devices", "1", "--free", "--", "true"], inv),
        (PLAN_LABEL, [*convoy, "plan", "--params", "70e9", "--hardware", "8xH100-80GB"], {}),
        ('python -c "import torch"', [python, "-c", "import torch"], {}),
    ]


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, from wait4) of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} exited {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="runs per command (import torch: a third)")
    args = parser.parse_args(argv)
    python = sys.executable
    script = Path(python).with_name("convoy")
    convoy = [str(script)] if script.exists() else [python, "-m", "convoy"]
    cases = _cases(python, convoy)
    runs = {label: max(3, args.runs // 3) if "import torch" in label else args.runs for label, _, _ in cases}
    times: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in cases}
    load = os.getloadavg()[0]
    for _, cmd, env in cases:
        _once(cmd, env)  # warm the page cache (and write the .pyc files)
    for i in range(args.runs):  # round after round of every command: a load that comes and goes hits them alike
        for label, cmd, env in cases:
            if i < runs[label]:
                times[label].append(_once(cmd, env))
    rows = [(label, statistics.median(w for w, _ in times[label]), statistics.median(c for _, c in times[label]),
             runs[label]) for label, _, _ in cases]
    base, base_cpu = rows[0][1], rows[0][2]
    print(f"load average: {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores (wall time "
          f"includes waiting for a core; CPU time does not)")
    print(f"{'command':<50} {'wall s':>7} {'x python':>9} {'+ms':>6} {'cpu s':>7} {'x python':>9} {'+ms':>6} "
          f"{'runs':>5}")
    for label, wall, cpu, runs in rows:
        print(f"{label:<50} {wall:>7.3f} {wall / base:>9.1f} {1000 * (wall - base):>6.0f} {cpu:>7.3f} "
              f"{cpu / base_cpu:>9.1f} {1000 * (cpu - base_cpu):>6.0f} {runs:>5}")
    select_wall, select_cpu = next((w, c) for label, w, c, _ in rows if label.startswith("convoy select"))
    verdict = "meets" if select_wall - base <= TARGET_S else "misses"
    print(f"\nconvoy select: +{1000 * (select_wall - base):.0f} ms wall, +{1000 * (select_cpu - base_cpu):.0f} ms "
          f"CPU above bare Python: {verdict} the {1000 * TARGET_S:.0f} ms target")
    plan_wall, plan_cpu = next((w, c) for label, w, c, _ in rows if label == PLAN_LABEL)
    verdict = "meets" if plan_wall <= PLAN_TARGET_S else "misses"
    print(f"convoy plan (70B, 8 H100s): {1000 * plan_wall:.0f} ms wall, {1000 * plan_cpu:.0f} ms CPU: {verdict} the "
          f"{1000 * PLAN_TARGET_S:.0f} ms target (on a quiet machine; a loaded one stretches both)")
    if sys.flags.dont_write_bytecode:
        print("note: PYTHONDONTWRITEBYTECODE is set: modules without a .pyc were compiled on every start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
