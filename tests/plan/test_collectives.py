"""Collective costs as NCCL's tuning model prices them: latency that grows with a ring's length and a tree's depth,
the protocol a message size picks, and the bandwidth each protocol keeps."""

from __future__ import annotations

import pytest

from convoy.plan.speed.collectives import Group, choice, collective_seconds

NODE = Group(ranks=8, nodes=1, bus_bytes_per_s=360e9, link="nvlink")


def test_a_small_all_reduce_in_a_node_costs_nccls_base_and_hop_latency():
    algorithm, protocol, seconds = choice("all_reduce", 8, NODE)
    # ring LL: 6.6 us base + 2 x 7 steps x 0.6 us over NVLink (tree LL: 6.8 + 2 x 7 x 0.6 = 15.2 us)
    assert (algorithm, protocol) == ("ring", "LL") and seconds == pytest.approx(15.0e-6, rel=0.01)


def test_a_large_message_runs_at_the_bus_bandwidth_with_simple():
    nbytes = 4e9
    algorithm, protocol, seconds = choice("all_reduce", nbytes, NODE)
    assert protocol in ("Simple", "LL128")
    assert seconds == pytest.approx(2 * 7 / 8 * nbytes / 360e9, rel=0.1)  # the ring's 2(n-1)/n of the bytes
    gather = collective_seconds("all_gather", nbytes, NODE)
    assert gather == pytest.approx(7 / 8 * nbytes / 360e9, rel=0.1)


def test_ll128_runs_only_over_nvlink():
    pcie = Group(ranks=8, nodes=1, bus_bytes_per_s=12e9, link="pcie")
    assert {choice("all_reduce", size, pcie)[1] for size in (1e3, 1e5, 1e7, 1e9)} <= {"LL", "Simple"}
    assert "LL128" in {choice("all_gather", size, NODE)[1] for size in (1e5, 1e6, 1e7)}


def test_a_ring_latency_grows_with_its_length():
    """A LayerNorm's weights gathered over 1,536 ranks on 192 nodes cost about a millisecond; over 8 ranks, 11 us."""
    big = Group(ranks=1536, nodes=192, bus_bytes_per_s=192e9, link="nvlink")
    small = collective_seconds("all_gather", 24_576, NODE)
    large = collective_seconds("all_gather", 24_576, big)
    assert small < 15e-6 and large > 1e-3
    # LL over 1,536 ranks: 6.6 + (1535 - 191) steps at the 1 us of posting a network operation + 191 x 2.7 us
    assert large == pytest.approx((6.6 + 1344 * 1.0 + 191 * 2.7) * 1e-6, rel=0.01)


def test_a_tree_all_reduce_grows_with_the_log_of_the_nodes():
    """Across many nodes NCCL's tree wins for small all-reduces: its latency grows with log2(nodes), the ring's with
    the ranks."""
    many = Group(ranks=1024, nodes=128, bus_bytes_per_s=192e9, link="nvlink")
    algorithm, _, seconds = choice("all_reduce", 4096, many)
    assert algorithm == "tree" and seconds < 200e-6
    double = Group(ranks=2048, nodes=256, bus_bytes_per_s=192e9, link="nvlink")
    assert collective_seconds("all_reduce", 4096, double) - seconds == pytest.approx(2 * 5.0e-6, rel=0.01)


def test_one_rank_costs_nothing_and_an_unknown_collective_is_refused():
    assert collective_seconds("all_reduce", 1e9, Group(ranks=1, bus_bytes_per_s=1e9)) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        collective_seconds("all_to_all", 1e6, NODE)


# At 10^3-10^4 GPUs: what NCCL 2.27's tuning model (src/graph/tuning.cc) does there, and published points.
RAIL = 50e9 * 0.96  # one 400 Gbit/s NIC per GPU (rail-optimized): a group of one rank per node runs at its rate


def test_a_small_all_reduce_over_24576_gpus_takes_the_tree_at_a_hundredth_of_the_rings_latency():
    """NCCL 2.4's blog ("Massively Scale Your Deep Learning Training with NCCL 2.4", 2019): on Summit, 24,576 GPUs
    (4,096 nodes of 6), double binary trees cut a small all-reduce's latency by up to 180x against the ring. The
    model's tree is log2(nodes) network hops deep; its ring 2(n - 1) steps long: at least 100x apart (the model's
    ring is the slower, about 475x: the tolerance is the published factor within a factor of 3)."""
    summit = Group(ranks=24_576, nodes=4_096, bus_bytes_per_s=12.5e9, link="nvlink")
    algorithm, _, tree = choice("all_reduce", 8, summit)
    assert algorithm == "tree" and tree < 200e-6
    from convoy.plan.speed.collectives import _seconds  # the ring's own price, which the choice passed over
    ring = min(_seconds("all_reduce", "ring", p, 8, summit) for p in range(3))
    assert 180 / 3 <= ring / tree <= 180 * 3


def test_tree_for_all_reduces_at_thousands_of_nodes_ring_for_large_ones_at_few():
    """Over 16 nodes of one rank each the ring carries a gradient bucket of 1 GB at the full NIC rate (its
    n/(2(n-1)) of the bus against the tree's 0.92/2); over 1,024 the ring's 2(n - 1) network steps cost 40 ms
    (14 us each, x 1.4 for its plateau), and NCCL's model takes the tree at every size, at 0.46 of the NIC rate."""
    few = Group(ranks=16, nodes=16, bus_bytes_per_s=RAIL)
    algorithm, protocol, seconds = choice("all_reduce", 1e9, few)
    assert (algorithm, protocol) == ("ring", "Simple")
    assert seconds == pytest.approx(2 * 15 / 16 * 1e9 / RAIL, rel=0.02)  # + 0.6 ms of latency
    many = Group(ranks=1_024, nodes=1_024, bus_bytes_per_s=RAIL)
    assert {choice("all_reduce", size, many)[0] for size in (1e3, 1e6, 1e8, 1e9)} == {"tree"}
    assert collective_seconds("all_reduce", 1e9, many) == pytest.approx(1e9 / (RAIL * 0.92 / 2), rel=0.01)


def test_pat_gathers_at_one_rank_per_node_with_log_depth():
    """NCCL >= 2.23 runs all-gather and reduce-scatter with PAT when each node has one rank: 8 us + log2(nodes) x
    14/3.5 us + 2.8 us per rank, where the ring pays 14 us per node (the tree's network latency, ppn = 1)."""
    group = Group(ranks=128, nodes=128, bus_bytes_per_s=RAIL)
    algorithm, protocol, seconds = choice("all_gather", 1e5, group)
    assert (algorithm, protocol) == ("pat", "Simple")
    assert seconds == pytest.approx((8 + 7 * 14 / 3.5 + 128 * 2.8) * 1e-6 + 1e5 / (0.75 * RAIL), rel=1e-6)
    assert choice("all_gather", 1e9, group)[0] == "ring"  # PAT keeps 0.75 of the bus: large buffers ring
    packed = Group(ranks=1024, nodes=128, bus_bytes_per_s=RAIL)  # 8 ranks per node: no PAT
    assert choice("all_gather", 1e5, packed)[0] == "ring"


def test_a_ring_with_one_rank_per_node_crosses_the_network_at_every_step():
    """2(n - 1) network steps for an all-reduce of n nodes (NCCL 2.19 counted 2n, more steps than the ring has),
    each at the tree's network latency when a node has one rank."""
    group = Group(ranks=64, nodes=64, bus_bytes_per_s=RAIL)
    from convoy.plan.speed.collectives import _latency

    assert _latency("all_reduce", "ring", 0, group) == pytest.approx((6.6 + 2 * 63 * 5.0) * 1e-6)
    assert _latency("all_gather", "ring", 2, group) == pytest.approx((8.4 + 63 * 14.0) * 1e-6)
