"""What a Slurm allocation says about a multi-node job: node count, this node's rank, the main address.

    from convoy.launch.slurm import slurm_allocation, expand_hostlist
    alloc = slurm_allocation(os.environ)     # None outside Slurm
    alloc.nnodes, alloc.node_rank, alloc.master_addr, alloc.master_port
    expand_hostlist("gpu[01-03,07],login")   # ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login']

Run ``srun --ntasks-per-node=1 convoy launch train.py`` inside ``sbatch``: each node's ``convoy launch`` reads
its place from ``SLURM_*``. The allocation's GPU mask (``CUDA_VISIBLE_DEVICES`` set by Slurm) is respected
by the device layer, which composes with a mask already present. Pure functions of an environment mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from convoy.errors import LaunchError, shown

__all__ = ["SlurmAllocation", "slurm_allocation", "expand_hostlist", "slurm_port"]


@dataclass(frozen=True, kw_only=True)
class SlurmAllocation:
    """This node's place in a Slurm job."""

    job_id: str
    """``SLURM_JOB_ID``; also the rendezvous id, so every node of the job agrees on it."""
    nnodes: int
    """Nodes in the allocation (``SLURM_NNODES``)."""
    node_rank: int
    """This node's index (``SLURM_NODEID``)."""
    hosts: tuple[str, ...]
    """Expanded ``SLURM_JOB_NODELIST``; the first is the main node."""
    tasks_per_node: int | None = None
    """Tasks ``srun`` started on this node (``SLURM_NTASKS_PER_NODE``/``SLURM_STEP_TASKS_PER_NODE``)."""

    @property
    def master_addr(self) -> str:
        return self.hosts[0]

    @property
    def master_port(self) -> int:
        return slurm_port(self.job_id)


def slurm_port(job_id: str) -> int:
    """A port every node of the job derives alike from its id (15000-34999), so no node has to tell the others."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 15000 + int(digits[-6:]) % 20000


def expand_hostlist(text: str) -> list[str]:
    """Expand Slurm's compressed host list (``a[1-3,5],b``); ``LaunchError`` when it is malformed."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        hosts.extend(_expand_one(item.strip(), text))
    if not hosts:
        raise LaunchError(f"SLURM_JOB_NODELIST={text!r} names no host")
    return hosts


#: more hosts than any allocation has; a range past it is refused before it is expanded.
_MAX_HOSTS = 2**15


def _expand_one(item: str, whole: str) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
    if not match:
        return [item] if item else []
    prefix, ranges, rest = match.groups()
    tails = _expand_one(rest, whole) or [""]
    parts: list[tuple[int, int, int]] = []
    count = 0
    for part in ranges.split(","):
        low, sep, high = part.partition("-")
        if not re.fullmatch(r"[0-9]{1,9}", low) or (sep and not re.fullmatch(r"[0-9]{1,9}", high)):
            raise LaunchError(f"SLURM_JOB_NODELIST={shown(whole, limit=60)}: cannot read the range {shown(part)}")
        parts.append((int(low), int(high if sep else low), len(low)))
        count += max(0, parts[-1][1] - parts[-1][0] + 1)
        if count * len(tails) > _MAX_HOSTS:  # counted before anything is expanded
            raise LaunchError(f"SLURM_JOB_NODELIST={shown(whole, limit=60)} names more than {_MAX_HOSTS} hosts")
    return [f"{prefix}{number:0{width}d}{tail}" for low, high, width in parts for number in range(low, high + 1)
            for tail in tails]


def slurm_allocation(env: Mapping[str, str]) -> SlurmAllocation | None:
    """This node's place in the Slurm job described by ``env``; ``None`` when not inside an allocation."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    hosts = tuple(expand_hostlist(nodelist))
    nnodes = _int(env, "SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES") or str(len(hosts)))
    node_rank = _int(env, "SLURM_NODEID", "0")
    if not 0 <= node_rank < nnodes:
        raise LaunchError(f"SLURM_NODEID={node_rank} is outside the allocation's {nnodes} nodes")
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    head = tasks.split("(")[0] if tasks else ""
    per_node = int(head) if re.fullmatch(r"[0-9]{1,9}", head) else None
    return SlurmAllocation(job_id=job_id, nnodes=nnodes, node_rank=node_rank, hosts=hosts, tasks_per_node=per_node)


def _int(env: Mapping[str, str], key: str, default: str) -> int:
    raw = env.get(key, default)
    if not re.fullmatch(r"\s*[0-9]{1,9}\s*", raw):  # ASCII: int() would read '٣'
        raise LaunchError(f"{key}={shown(raw)} is not a whole number; is this a Slurm allocation?")
    return int(raw)
