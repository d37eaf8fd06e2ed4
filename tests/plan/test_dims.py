import pytest

from convoy.errors import StrategyError
from convoy.plan.dims import ParallelDims


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
