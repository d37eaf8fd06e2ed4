"""``convoy test``: a short self-check of the selected devices and the links between them.

    from convoy.launch.selfcheck import run_selfcheck, format_selfcheck
    report = run_selfcheck(devices="0,1")            # launches one process per device (2 on a CPU box)
    print(format_selfcheck(report)); report.ok

    $ convoy test                  # every visible device (2 CPU processes without accelerators)
    $ convoy test --devices 0,1 --size-mib 256

Checks, in order, each with a PASS/FAIL line and what to do on a failure: every rank joins the rendezvous
(the ones that do not are named), each collective the strategies use (all_reduce, broadcast, all_gather,
reduce_scatter, all_to_all, send/recv) with its result verified, a few DDP steps that must match a
one-process reference, and the measured all-reduce bus bandwidth. The parent launches the workers with
``convoy.launch.job.launch_job`` (as ``convoy launch`` does) and imports no torch; each worker is this module
run as ``python -m convoy.launch.selfcheck --worker`` and writes its results to a JSON file as it goes, so
a job that dies part-way still reports the checks it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convoy.devices.vendors import process_group_backend
from convoy.launch.rank_env import read_rank_env

__all__ = ["Check", "SelfCheckReport", "run_selfcheck", "format_selfcheck", "CHECKS"]

#: every check, in the order it runs.
CHECKS = ("rendezvous", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
          "ddp_steps", "bus_bandwidth")

_HINTS = {
    "rendezvous": "every node must reach MASTER_ADDR:MASTER_PORT: open that port in the firewall (or choose another "
                  "with --master-port), make the nodes use the interface that reaches it (GLOO_SOCKET_IFNAME=eth0 / "
                  "NCCL_SOCKET_IFNAME=eth0), and run the same command on every node",
    "collective_gloo": "set GLOO_SOCKET_IFNAME to the interface that reaches the other nodes; rerun with "
                       "TORCH_DISTRIBUTED_DEBUG=DETAIL to see the failing call",
    "collective_nccl": "rerun with NCCL_DEBUG=INFO; between GPUs of one machine try NCCL_P2P_DISABLE=1 (broken "
                       "peer-to-peer, IOMMU/ACS on); across machines set NCCL_SOCKET_IFNAME, or NCCL_IB_DISABLE=1 "
                       "without working InfiniBand",
    "ddp_steps": "the collectives work but DDP training disagrees with one process: report it with 'convoy env "
                 "--json' attached",
    "bus_bandwidth": "compare with 'nvidia-smi topo -m': GPUs on PCIe without NVLink are slower; make sure "
                     "NCCL_P2P_DISABLE is not set when the GPUs support peer-to-peer",
}


@dataclass(frozen=True)
class Check:
    """One line of the self-check: ``status`` is ``"pass"``, ``"fail"`` or ``"skip"``."""

    name: str
    status: str
    detail: str
    hint: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass(frozen=True)
class SelfCheckReport:
    """What ``convoy test`` found: the checks that ran, and the launch failure if the job died."""

    world_size: int
    backend: str
    checks: tuple[Check, ...]
    launch_error: str = ""
    bus_bandwidth_gbps: float | None = None

    @property
    def ok(self) -> bool:
        names = {c.name for c in self.checks}
        return not self.launch_error and all(c.ok for c in self.checks) and set(CHECKS) <= names


def format_selfcheck(report: SelfCheckReport) -> str:
    """One PASS/FAIL/SKIP line per check, the advice under each failure, and a summary line."""
    lines = [f"convoy test: {report.world_size} processes, backend {report.backend}"]
    for check in report.checks:
        lines.append(f"  {check.status.upper():<4}  {check.name:<15} {check.detail}")
        if check.status == "fail" and check.hint:
            lines.append(f"        what to do: {check.hint}")
    ran = {c.name for c in report.checks}
    lines += [f"  ----  {name:<15} not run" for name in CHECKS if name not in ran]
    if report.launch_error:
        lines.append(f"  the job ended early: {report.launch_error}")
    failed = sum(not c.ok for c in report.checks)
    passed = sum(c.status == "pass" for c in report.checks)
    verdict = "all checks passed" if report.ok else f"{failed or 'some'} check(s) failed or did not run"
    lines.append(f"result: {verdict} ({passed} passed)")
    return "\n".join(lines)


def run_selfcheck(*, devices: str | None = None, nproc_per_node: str | None = None, timeout: float = 30.0,
                  size_mib: float | None = None, steps: int = 3, env: Mapping[str, str] | None = None,
                  absent_ranks: tuple[int, ...] = (), echo: Callable[[str], None] | None = None) -> SelfCheckReport:
    """Launch the self-check on the selected devices and return its report (never raises for a failed check).

    ``timeout`` bounds the rendezvous and each collective. ``absent_ranks`` is fault injection for tests:
    those ranks start but never join, the way a rank behind a firewall behaves.
    """
    from convoy.errors import ConfigError, LaunchError
    from convoy.launch.job import launch_job
    from convoy.launch.resolve import LaunchRequest

    if timeout <= 0:
        raise ConfigError(f"--timeout {timeout:g}: give a number of seconds > 0")
    if size_mib is not None and size_mib <= 0:
        raise ConfigError(f"--size-mib {size_mib:g}: give a size in MiB > 0")
    if steps < 1:
        raise ConfigError(f"--steps {steps}: give 1 or more")
    with tempfile.TemporaryDirectory(prefix="convoy-test-") as tmp:
        out = Path(tmp) / "results.json"
        program = ["convoy.launch.selfcheck", "--worker", "--out", str(out), "--timeout", str(timeout),
                   "--steps", str(steps)]
        if size_mib is not None:
            program += ["--size-mib", str(size_mib)]
        for rank in absent_ranks:
            program += ["--absent-rank", str(rank)]
        request = LaunchRequest(program=tuple(program), module=True, devices=devices, nproc_per_node=nproc_per_node)
        base = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"}
        launch_error = ""
        try:
            launch_job(request, env=base, echo=echo)
        except LaunchError as err:
            launch_error = str(err)
        return _read_results(out, launch_error)


def _read_results(path: Path, launch_error: str) -> SelfCheckReport:
    found = [path] if path.exists() else sorted(path.parent.glob(f"{path.name}.rank*[0-9]"))
    data: dict[str, Any] = json.loads(found[0].read_text()) if found else {}
    checks = tuple(Check(**c) for c in data.get("checks", []))
    if not checks and launch_error:
        checks = (Check("rendezvous", "fail", "the processes ended before any check finished", _HINTS["rendezvous"]),)
    return SelfCheckReport(world_size=data.get("world_size", 0), backend=data.get("backend", "?"), checks=checks,
                           launch_error=launch_error, bus_bandwidth_gbps=data.get("bus_bandwidth_gbps"))


# ----------------------------------------------------------------------------------------------------------
# The worker: runs in every launched process; imports torch.


class _Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.torch = torch
        ranks = read_rank_env(os.environ)
        self.rank, self.world, self.local_rank = ranks.rank, ranks.world_size, ranks.local_rank
        self.restart_count = ranks.restart_count
        self.master = (ranks.master_addr or "127.0.0.1", ranks.master_port or 29500)
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        self.backend = process_group_backend(self.device.type)
        if cuda:
            torch.cuda.set_device(self.device)
        self.checks: list[dict[str, Any]] = []
        self.bandwidth: float | None = None

    def record(self, name: str, status: str, detail: str, hint: str = "", seconds: float = 0.0) -> None:
        self.checks.append({"name": name, "status": status, "detail": detail, "hint": hint,
                            "seconds": round(seconds, 4)})
        # rank 0 speaks for the job; another rank writes its own file only when it could not join (then
        # rank 0 may never hear from it).
        if self.rank == 0 or (name == "rendezvous" and status == "fail"):
            data = {"world_size": self.world, "backend": self.backend, "checks": self.checks,
                    "bus_bandwidth_gbps": self.bandwidth}
            target = Path(self.args.out if self.rank == 0 else f"{self.args.out}.rank{self.rank}")
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, target)

    def join(self) -> bool:
        """Rendezvous on MASTER_ADDR:MASTER_PORT; rank 0 names the ranks that did not join in time."""
        import datetime

        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.args.timeout)
        if self.rank in self.args.absent_rank:  # fault injection: start, never join
            time.sleep(self.args.timeout + 30)
            return False
        started = time.monotonic()
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
        addr, port = self.master
        try:
            # multi_tenant: rank 0 reuses the server convoy started on loopback (convoy.launch.loopback)
            store = dist.TCPStore(addr, port, self.world, is_master=self.rank == 0 and not agent_store,
                                  timeout=timeout, wait_for_workers=False, multi_tenant=True)
            prefixed = dist.PrefixStore(f"convoy-test/{self.restart_count}", store)
            prefixed.set(f"joined/{self.rank}", "1")
            keys = [f"joined/{r}" for r in range(self.world)]
            try:
                prefixed.wait(keys, timeout)
            except RuntimeError:
                missing = [r for r, k in enumerate(keys) if not prefixed.check([k])]
                self.record("rendezvous", "fail", f"rank(s) {', '.join(map(str, missing))} of {self.world} did not "
                            f"join {addr}:{port} within {self.args.timeout:g} s", _HINTS["rendezvous"],
                            time.monotonic() - started)
                return False
            dist.init_process_group(self.backend, store=dist.PrefixStore("pg", store), rank=self.rank,
                                    world_size=self.world, timeout=timeout)
        except Exception as err:  # noqa: BLE001 - reported as the check's failure
            self.record("rendezvous", "fail", f"rank {self.rank} could not join {addr}:{port}: {_short(err)}",
                        _HINTS["rendezvous"], time.monotonic() - started)
            return False
        self.record("rendezvous", "pass", f"{self.world} of {self.world} ranks joined {addr}:{port} "
                    f"({self.backend})", seconds=time.monotonic() - started)
        return True

    def run_check(self, name: str, body: Callable[[], str], hint: str) -> bool:
        started = time.monotonic()
        try:
            detail, ok = body(), True
        except Exception as err:  # noqa: BLE001 - reported as the check's failure
            detail, ok = _short(err), False
        seconds = time.monotonic() - started
        verdicts = self._gather((ok, detail))
        bad = [r for r, (good, _) in enumerate(verdicts) if not good]
        if bad:
            first = verdicts[bad[0]][1]
            self.record(name, "fail", f"rank(s) {', '.join(map(str, bad))}: {first}", hint, seconds)
            return False
        self.record(name, "pass", detail, seconds=seconds)
        return True

    def _gather(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def main(self) -> int:
        if not self.join():
            return 1
        from convoy.launch import selfcheck_ops as ops

        hint = _HINTS[f"collective_{self.backend}"] if self.backend in ("gloo", "nccl") else ""
        try:
            for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
                def check(n: str = name) -> str:  # the default binds this iteration's name
                    return ops.COLLECTIVES[n](self.rank, self.world, self.device)

                if not self.run_check(name, check, hint):
                    return 1
            if not self.run_check("ddp_steps", lambda: ops.ddp_steps(self.rank, self.world, self.device,
                                                                       self.args.steps), _HINTS["ddp_steps"]):
                return 1
            self.bandwidth_check()
        finally:
            import torch.distributed as dist

            dist.destroy_process_group()
        return 0 if all(c["status"] != "fail" for c in self.checks) else 1

    def bandwidth_check(self) -> None:
        from convoy.launch import selfcheck_ops as ops

        if self.world == 1:
            self.record("bus_bandwidth", "skip", "one process: no link to measure")
            return
        size = self.args.size_mib or (256.0 if self.device.type == "cuda" else 16.0)

        def body() -> str:
            result = ops.bus_bandwidth(self.world, self.device, size_mib=size)
            self.bandwidth = result["bus_gbps"]
            return (f"all_reduce of {size:g} MiB: {result['bus_gbps']:.2f} GB/s bus bandwidth "
                    f"({result['alg_gbps']:.2f} GB/s algorithm), median of {result['runs']} runs")

        self.run_check("bus_bandwidth", body, _HINTS["bus_bandwidth"])


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m convoy.launch.selfcheck")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--size-mib", type=float, default=None)
    parser.add_argument("--absent-rank", type=int, action="append", default=[])
    return _Worker(parser.parse_args(argv)).main()


if __name__ == "__main__":
    code = _worker_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # The results are on disk; skip interpreter teardown, where gloo rarely aborts with "terminate called
    # without an active exception" (docs: torch-cpu-distributed notes, "Flaky abort at exit").
    os._exit(code)
