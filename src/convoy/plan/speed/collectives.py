"""Seconds of one collective as NCCL's own cost model prices it: ring, tree or PAT, LL / LL128 / Simple, latency that
grows with the ranks and the nodes a group spans.

    from convoy.plan.speed.collectives import Group, collective_seconds
    group = Group(ranks=1536, nodes=192, bus_bytes_per_s=200e9, link="nvlink")
    collective_seconds("all_gather", 24_576, group)        # a LayerNorm's weights over 1,536 ranks: latency-bound
    collective_seconds("all_reduce", 2 * 7e9, Group(ranks=8, nodes=1, bus_bytes_per_s=450e9, link="nvlink"))

NCCL picks, per collective and message size, the algorithm and protocol its tuning model predicts fastest (time =
latency + bytes / algorithm bandwidth: ``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``);
this module is that model with NCCL 2.27's constants (what PyTorch's CUDA 12 wheels ship; unchanged through 2.29):
with one rank per node (a data-parallel group of a TP 8 layout, rail-optimized) each network step pays the tree's
network latency, all-gathers and reduce-scatters may run PAT (log-depth, NCCL >= 2.23), a multi-node Simple ring
all-reduce pays its latency x 1.4 (the ring's plateau on Ampere and later), and trees at medium sizes run at NCCL's own
correction of their bandwidth. Not modeled: NVLS / NVLS-tree (NVSwitch multicast) and CollNet (SHARP), which need
switch support a plan does not know of, and the per-channel caps of the tree's bandwidth. A group's bus bandwidth is
the caller's (``convoy.plan.timing``: its link inside a node, its share of the node's NICs across nodes); gloo
between CPU processes is a ring at ``CPU_LATENCY_S`` per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Group", "collective_seconds", "choice", "CPU_LATENCY_S", "NET_OVERHEAD_S", "RING_PLATEAU"]

#: latency (us) per algorithm and protocol (LL, LL128, Simple), and per hop by link (NCCL 2.27, tuning.cc ``baseLat``,
#: ``hwLat``; PAT runs Simple only)
_BASE = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (0.0, 0.0, 8.0)}
_HOP = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
#: NCCL's correction of a tree all-reduce's bandwidth at medium sizes, by protocol, for messages of 64 B x 2^i
#: (``treeCorrectionFactor``)
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
#: a multi-node Simple ring all-reduce's latency x this on Ampere and later (NCCL's "plateau effect of ring")
RING_PLATEAU = 1.4
#: channels NCCL runs a ring on (a stated assumption: 2 per NIC on an 8-GPU, 8-NIC node, NCCL's usual 16); only
#: decides from what size on ``RING_PLATEAU`` applies (64 B per channel and rank)
_CHANNELS = 16
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
    that cross nodes (nodes - 1, or 2(nodes - 1)) pay the network's hop and the rest the node's link (never less than
    posting a network operation on a multi-node ring); a tree all-reduce takes 2((n/nodes - 1) intra + log2(nodes)
    inter); PAT 8 us + log2(nodes) x inter / 3.5 + 2.8 us per rank. With one rank per node every network hop pays
    the tree's network latency (NCCL: "with ppn=1 latencies are fully exposed"). So a ring's latency grows with its
    length: 1,536 ranks on 192 nodes cost about 1.9 ms per all-gather with LL, where 8 ranks cost 11 us."""
    n, nodes = group.ranks, max(1, group.nodes)
    intra = _HOP["pcie" if group.link == "pcie" else "nvlink"][algo if algo != "pat" else "tree"][proto]
    inter = _HOP["net"]["tree" if n == nodes or algo == "pat" else algo][proto]
    if algo == "pat":
        return (_BASE[algo][proto] + math.floor(math.log2(nodes)) * inter / 3.5 + n * 2.8) * 1e-6
    if algo == "tree":
        per_node = max(1, n // nodes)
        hops = 2 * ((per_node - 1) * intra + math.floor(math.log2(nodes)) * inter) if nodes > 1 else \
            2 * (n - 1) * intra
        return (_BASE[algo][proto] + hops) * 1e-6
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter_steps = (2 * (nodes - 1) if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD_S * 1e6 * (3 if _PROTOCOLS[proto] == "Simple" else 1))
    return (_BASE[algo][proto] + (steps - inter_steps) * intra + inter_steps * inter) * 1e-6


def _algorithm_bandwidth(op: str, algo: str, proto: int, group: Group) -> float:
    """The bus bandwidth x the protocol's efficiency (ring: LL 1/2, LL128 0.92, NVLink only; tree: 0.92, LL 1/3.8 of
    that, LL128 x 120/128 across nodes or 7/9 inside one; PAT: 0.75), turned into algorithm bandwidth (ring:
    x n / steps; tree: x 1/2; PAT as it is)."""
    n, bus = group.ranks, group.bus_bytes_per_s
    name = _PROTOCOLS[proto]
    if name == "LL128" and group.link != "nvlink":
        return 0.0  # NCCL enables LL128 only over NVLink
    if algo == "pat":
        return bus * 0.75 if name == "Simple" else 0.0
    if algo == "ring":
        if name == "LL":
            bus *= 0.5
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


def _seconds(op: str, algo: str, proto: int, nbytes: float, group: Group) -> float:
    """``ncclTopoGetAlgoTime``: latency + bytes / algorithm bandwidth, a tree all-reduce's bandwidth at NCCL's
    correction for its size, a multi-node Simple ring all-reduce's latency x ``RING_PLATEAU``."""
    bandwidth = _algorithm_bandwidth(op, algo, proto, group)
    if bandwidth <= 0:
        return math.inf
    latency = _latency(op, algo, proto, group)
    log_size = int(math.log2(nbytes / 64)) if nbytes >= 64 else -1
    if algo == "tree" and 0 <= log_size < 23:
        bandwidth *= _TREE_CORRECTION[proto][log_size]
    if (algo == "ring" and _PROTOCOLS[proto] == "Simple" and group.nodes > 1 and op == "all_reduce"
            and nbytes / (_CHANNELS * group.ranks) >= 64):
        latency *= RING_PLATEAU
    return latency + nbytes / bandwidth


def choice(op: str, nbytes: float, group: Group) -> tuple[str, str, float]:
    """(algorithm, protocol, seconds) NCCL's model picks for ``op`` of ``nbytes`` (the whole buffer: the gathered
    output of an all-gather, the input of a reduce-scatter) over ``group``: ``"ring"``, ``"tree"`` (all-reduce) or
    ``"pat"`` (all-gather and reduce-scatter with one rank per node)."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        raise ValueError(f"unknown collective {op!r}")
    if group.ranks <= 1:
        return "none", "none", 0.0
    if group.link == "cpu":
        steps = 2 * (group.ranks - 1) if op == "all_reduce" else group.ranks - 1
        return "ring", "gloo", steps * CPU_LATENCY_S + nbytes * steps / group.ranks / group.bus_bytes_per_s
    best = ("ring", "Simple", math.inf)
    if op == "all_reduce":
        algorithms: tuple[str, ...] = ("ring", "tree")
    elif op in ("all_gather", "reduce_scatter") and group.nodes > 1 and group.ranks == group.nodes:
        algorithms = ("ring", "pat")  # PAT: one rank per node only (NCCL >= 2.23)
    else:
        algorithms = ("ring",)
    for algo in algorithms:
        for proto, name in enumerate(_PROTOCOLS):
            seconds = _seconds(op, algo, proto, nbytes, group)
            if seconds < best[2]:
                best = (algo, name, seconds)
    return best


def collective_seconds(op: str, nbytes: float, group: Group) -> float:
    """Seconds of one ``op`` (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``) of
    ``nbytes`` over ``group``, as NCCL's model prices its fastest algorithm and protocol (0 for one rank)."""
    return choice(op, nbytes, group)[2]
