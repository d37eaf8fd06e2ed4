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
