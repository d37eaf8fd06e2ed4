import pytest

from convoy.errors import StrategyError, shown
from convoy.plan.dims import ParallelDims, divisors


def test_parse_infers_dp_from_world_size():
    dims = ParallelDims.parse("tp=2", world_size=8)
    assert (dims.dp, dims.tp, dims.pp, dims.world_size) == (4, 2, 1, 8)
    assert dims.mesh_shape() == (("dp_replicate", 4), ("tp", 2))


def test_shard_dp_puts_dp_on_the_shard_dimension():
    dims = ParallelDims.from_mapping({"dp": 2, "tp": 2}, shard_dp=True)
    assert (dims.dp_replicate, dims.dp_shard) == (1, 2)
    assert dims.mesh_shape() == (("dp_shard", 2), ("tp", 2))


def test_single_process_mesh_is_never_empty():
    assert ParallelDims().mesh_shape() == (("dp_shard", 1),)


@pytest.mark.parametrize("text, world, fragment", [
    ("dp=2,tp=2", 8, "needs 4 processes but the job has 8"),
    ("tp=3", 8, "does not divide the world size 8"),
    ("tp=two", None, "is not KEY=NUMBER"),
    ("xp=2", None, "unknown parallelism key 'xp'"),
    ("tp=0", None, "whole number >= 1"),
])
def test_bad_layouts_name_the_problem(text, world, fragment):
    with pytest.raises(StrategyError, match=fragment):
        ParallelDims.parse(text, world_size=world)


def test_divisibility_checks():
    dims = ParallelDims(tp=4, pp=2)
    dims.check_divides(num_heads=8, num_layers=4)
    with pytest.raises(StrategyError, match="does not divide the model's 6 attention heads"):
        dims.check_divides(num_heads=6)
    with pytest.raises(StrategyError, match="more stages than the model's 1 layers"):
        dims.check_divides(num_layers=1)


@pytest.mark.parametrize("degrees", [{}, {"dp_replicate": 2}, {"dp_shard": 4}, {"dp_replicate": 2, "dp_shard": 2},
                                     {"tp": 2}, {"pp": 2}, {"dp_shard": 2, "tp": 2, "pp": 2}])
def test_each_enabled_property_says_whether_that_axis_is_split(degrees):
    dims = ParallelDims(**degrees)
    enabled = {axis: getattr(dims, f"{axis}_enabled") for axis in ("dp", "dp_replicate", "dp_shard", "tp", "pp")}
    assert enabled == {axis: getattr(dims, axis) > 1 for axis in enabled}
    assert dims.hsdp_enabled == (dims.dp_replicate > 1 and dims.dp_shard > 1)
    assert dims.is_trivial == (not dims.tp_enabled and not dims.pp_enabled)


def test_divisors_are_every_divisor_in_order_for_any_world_size():
    for n in (1, 2, 12, 16, 36, 97, 1000):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(2**20)[-1] == 2**20 and len(divisors(2**20)) == 21


def test_a_value_in_an_error_message_is_one_short_line_whatever_it_is():
    assert shown("x" * 100) == repr("x" * 100)[:37] + "..." and shown(3) == "3"
    assert shown("x" * 100, limit=80) == repr("x" * 100)[:77] + "..." and shown("x" * 78, limit=80) == repr("x" * 78)
    assert shown(10**5000) == "<a int too long to print>"
    assert shown(2**70, huge="<a number too large>") == "<a number too large>" and shown(2**70).startswith("1180")


def test_cp_is_a_degree_between_dp_shard_and_tp():
    """Context parallel: a degree like the others, in the mesh inside dp_shard and outside tp (torchtitan's and
    Accelerate's order), dp inferred from what cp x tp x pp leave."""
    dims = ParallelDims.parse("cp=2,tp=2", world_size=16, shard_dp=True)
    assert (dims.dp, dims.cp, dims.tp, dims.world_size, dims.dp_cp) == (4, 2, 2, 16, 8)
    assert dims.mesh_shape() == (("dp_shard", 4), ("cp", 2), ("tp", 2))
    assert dims.cp_enabled and not dims.is_trivial and dims.describe() == "dp=4,cp=2,tp=2,pp=1"
    assert ParallelDims.parse("cp=4", world_size=4).mesh_shape() == (("cp", 4),)
    assert ParallelDims.parse("dp=2,tp=2").describe() == "dp=2,tp=2,pp=1"  # cp=1 is not named
    with pytest.raises(StrategyError, match="cp=3 x tp=1 x pp=1 does not divide the world size 8"):
        ParallelDims.parse("cp=3", world_size=8)
    with pytest.raises(StrategyError, match="parallelism cp=0: each degree must be a whole number >= 1"):
        ParallelDims.parse("cp=0")
