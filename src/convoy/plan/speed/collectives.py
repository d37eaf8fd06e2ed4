"""Seconds of one collective as NCCL's own cost model prices it: ring or tree, LL / LL128 / Simple, latency that grows
with the ranks and the nodes a group spans.

    from convoy.plan.speed.collectives import Group, collective_seconds
    group = Group(ranks=1536, nodes=192, bus_bytes_per_s=200e9, link="nvlink")
    collective_seconds("all_gather", 24_576, group)        # a LayerNorm's weights over 1,536 ranks: latency-bound
    collective_seconds("all_reduce", 2 * 7e9, Group(ranks=8, nodes=1, bus_bytes_per_s=450e9, link="nvlink"))

NCCL picks, per collective and message size, the algorithm and protocol its tuning model predicts fastest (time =
latency + bytes / algorithm bandwidth: ``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``);
this module is that model with NCCL 2.19's published constants. A group's bus bandwidth is the caller's
(``convoy.plan.timing``: its link inside a node, its share of the node's NICs across nodes); gloo between CPU
processes is a ring at ``CPU_LATENCY_S`` per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Group", "collective_seconds", "choice", "CPU_LATENCY_S", "NET_OVERHEAD_S"]

#: latency (us) per algorithm and protocol (LL, LL128, Simple), and per hop by link (NCCL 2.19, tuning.cc)
_BASE = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
_HOP = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}
_PROTOCOLS = ("LL", "LL128", "Simple")
#: posting one network operation (NCCL's getNetOverhead on an x86 host), x3 for Simple
NET_OVERHEAD_S = 1.0e-6
#: one step of gloo's ring between CPU processes over TCP loopback (a stated assumption)
CPU_LATENCY_S = 100e-6


@dataclass(frozen=True, kw_only=True)
class Group:
    """The ranks of one collective: how many, over how many nodes, and the bandwidth each rank's ring link gets."""

    ranks: int
    nodes: int = 1
    bus_bytes_per_s: float
    """Bus bandwidth per rank (NCCL's ``busBw``): the intra-node link, or the rank's share of its node's NICs."""
    link: str = "nvlink"
    """The link inside a node: ``"nvlink"`` (LL128 allowed), ``"pcie"``, or ``"cpu"`` (gloo)."""


def _latency(op: str, algo: str, proto: int, group: Group) -> float:
    """A ring takes n - 1 steps for an all-gather or reduce-scatter and 2(n - 1) for an all-reduce, of which those
    that cross nodes (nodes - 1, or 2 nodes) pay the network's hop and the rest the node's link (never less than
    posting a network operation on a multi-node ring); a tree all-reduce takes 2((n/nodes - 1) intra + log2(nodes)
    inter). So a ring's latency grows with its length: 1,536 ranks on 192 nodes cost about 1.3 ms per all-gather
    with LL and 6 ms with Simple, where 8 ranks cost 11 us."""
    n, nodes = group.ranks, max(1, group.nodes)
    intra = _HOP["pcie" if group.link == "pcie" else "nvlink"][algo][proto]
    inter = _HOP["net"][algo][proto]
    if algo == "tree":
        per_node = max(1, n // nodes)
        hops = 2 * ((per_node - 1) * intra + math.log2(nodes) * inter) if nodes > 1 else 2 * (n - 1) * intra
        return (_BASE[algo][proto] + hops) * 1e-6
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter_steps = (2 * nodes if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD_S * 1e6 * (3 if _PROTOCOLS[proto] == "Simple" else 1))
    return (_BASE[algo][proto] + (steps - inter_steps) * intra + inter_steps * inter) * 1e-6


def _algorithm_bandwidth(op: str, algo: str, proto: int, group: Group) -> float:
    """The bus bandwidth x the protocol's efficiency (LL: 1/4 across nodes or for an all-reduce, else 1/3; LL128:
    0.92, NVLink only; tree: 0.92, LL 1/3.8 of that, LL128 x 120/128 across nodes or 7/9 inside one), turned into
    algorithm bandwidth (ring: x n / steps; tree: x 1/2)."""
    n, bus = group.ranks, group.bus_bytes_per_s
    name = _PROTOCOLS[proto]
    if name == "LL128" and group.link != "nvlink":
        return 0.0  # NCCL enables LL128 only over NVLink
    if algo == "ring":
        if name == "LL":
            bus /= 4 if (group.nodes > 1 or op == "all_reduce") else 3
        elif name == "LL128":
            bus *= 0.92
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        return bus * n / steps
    bus *= 0.92
    if name == "LL":
        bus /= 3.8
    elif name == "LL128":
        bus *= 120 / 128 if group.nodes > 1 else 7 / 9
    return bus / 2


def choice(op: str, nbytes: float, group: Group) -> tuple[str, str, float]:
    """(algorithm, protocol, seconds) NCCL's model picks for ``op`` of ``nbytes`` (the whole buffer: the gathered
    output of an all-gather, the input of a reduce-scatter) over ``group``."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        raise ValueError(f"unknown collective {op!r}")
    if group.ranks <= 1:
        return "none", "none", 0.0
    if group.link == "cpu":
        steps = 2 * (group.ranks - 1) if op == "all_reduce" else group.ranks - 1
        return "ring", "gloo", steps * CPU_LATENCY_S + nbytes * steps / group.ranks / group.bus_bytes_per_s
    best = ("ring", "Simple", math.inf)
    algorithms = ("ring", "tree") if op == "all_reduce" else ("ring",)
    for algo in algorithms:
        for proto, name in enumerate(_PROTOCOLS):
            bandwidth = _algorithm_bandwidth(op, algo, proto, group)
            if bandwidth <= 0:
                continue
            seconds = _latency(op, algo, proto, group) + nbytes / bandwidth
            if seconds < best[2]:
                best = (algo, name, seconds)
    return best


def collective_seconds(op: str, nbytes: float, group: Group) -> float:
    """Seconds of one ``op`` (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``) of
    ``nbytes`` over ``group``, as NCCL's model prices its fastest algorithm and protocol (0 for one rank)."""
    return choice(op, nbytes, group)[2]
