"""The parallel strategies (``train/strategies/parallel.py``): layout validation, no process group, registration."""

from __future__ import annotations

import pytest

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.plan.dims import ParallelDims
from convoy.train.strategies.base import StrategyContext, available_strategies, create_strategy
from convoy.train.settings import resolve_settings


def _ctx(world: int, dims: ParallelDims | None = None, **options) -> StrategyContext:
    return StrategyContext(world_size=world, local_world_size=world, parallel_dims=dims, options=options)


def test_registered_names():
    assert {"parallel", "tp", "pp"} <= set(available_strategies())


def test_default_layouts_per_name():
    assert create_strategy("tp", _ctx(4)).dims == ParallelDims(tp=4)
    assert create_strategy("pp", _ctx(2)).dims == ParallelDims(pp=2)
    two_d = create_strategy("parallel", _ctx(4, ParallelDims(dp_replicate=2, tp=2)))
    assert two_d.dims == ParallelDims(dp_shard=2, tp=2) and two_d.dp_engine == "fsdp"
    dp_pp = create_strategy("parallel", _ctx(4, ParallelDims(dp_replicate=2, pp=2)))
    assert dp_pp.dims == ParallelDims(dp_replicate=2, pp=2) and dp_pp.dp_engine == "zero1"
    tp_pp = create_strategy("parallel", _ctx(4, ParallelDims(tp=2, pp=2)))
    assert tp_pp.dims == ParallelDims(tp=2, pp=2) and tp_pp.distributed_type == "TP+PP"
    # 3D: tp splits the weights into DTensors, which only FSDP2 takes, so dp is sharded
    three_d = create_strategy("parallel", _ctx(8, ParallelDims(dp_replicate=2, tp=2, pp=2)))
    assert three_d.dims == ParallelDims(dp_shard=2, tp=2, pp=2) and three_d.distributed_type == "FSDP+TP+PP"
    dp_pp_fsdp = create_strategy("parallel", _ctx(4, ParallelDims(dp_replicate=2, pp=2), dp_engine="fsdp"))
    assert dp_pp_fsdp.dims == ParallelDims(dp_shard=2, pp=2) and dp_pp_fsdp.distributed_type == "FSDP+PP"


def test_degrees_must_multiply_to_the_world_size():
    with pytest.raises(StrategyError, match="needs 4 processes but the job has 2"):
        create_strategy("parallel", _ctx(2, ParallelDims(dp_replicate=2, tp=2)))


@pytest.mark.parametrize("dims, options, error, text", [
    (ParallelDims(dp_replicate=2, tp=2), {"dp_engine": "ddp"}, NotSupportedYetError, "dp_engine='fsdp'"),
    (ParallelDims(dp_replicate=2, tp=2, pp=2), {"dp_engine": "zero1"}, NotSupportedYetError, "dp_engine='fsdp'"),
    (ParallelDims(tp=4), {"dp_engine": "deepspeed"}, StrategyError, "'deepspeed' is unknown"),
    (ParallelDims(tp=4), {"tp_plna": {}}, StrategyError, "unknown option 'tp_plna'"),
])
def test_layouts_that_cannot_work_are_named(dims, options, error, text):
    with pytest.raises(error, match=text):
        create_strategy("parallel", _ctx(dims.world_size, dims, **options))


def test_fp16_loss_scaling_cannot_reach_a_pipeline_and_is_refused():
    ctx = StrategyContext(world_size=2, local_world_size=2, parallel_dims=ParallelDims(pp=2), mixed_precision="fp16")
    with pytest.raises(NotSupportedYetError, match="fp16.*pp.*bf16"):
        create_strategy("parallel", ctx)
    bf16 = StrategyContext(world_size=2, local_world_size=2, parallel_dims=ParallelDims(pp=2), mixed_precision="bf16")
    assert create_strategy("parallel", bf16).dims.pp == 2


def test_accelerator_settings_take_a_mapping_or_the_launcher_string():
    by_map = resolve_settings(explicit={"parallelism": {"dp": 2, "tp": 2}}, env={"WORLD_SIZE": "4"}, cpu=True)
    by_env = resolve_settings(env={"WORLD_SIZE": "4", "CONVOY_PARALLELISM": "dp=2,tp=2"}, cpu=True)
    assert by_map.parallel_dims == by_env.parallel_dims == ParallelDims(dp_replicate=2, tp=2)
    with pytest.raises(StrategyError, match="needs 8 processes"):
        resolve_settings(explicit={"parallelism": {"dp": 4, "tp": 2}}, env={"WORLD_SIZE": "4"}, cpu=True)


def test_sequence_parallel_pipelines_start_stages_only_between_blocks():
    from convoy.train.parallel.pipeline import PipelineConfig
    from convoy.train.strategies.parallel import _check_block_boundaries
    from tests.train.parallel.tiny_gpt import TinyGPT

    model = TinyGPT()
    _check_block_boundaries(model, PipelineConfig(split_at=("layers.2",)))  # between blocks: fine
    _check_block_boundaries(model, PipelineConfig())  # the default even cut of the layer list: fine
    with pytest.raises(StrategyError, match="pp_split_at 'lm_head' with sequence_parallel: .*'layers.1'"):
        _check_block_boundaries(model, PipelineConfig(split_at=("lm_head",)))
