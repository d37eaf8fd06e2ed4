"""The parallel strategies (``train/strategies/parallel.py``): layout validation, no process group, registration."""

from __future__ import annotations

import pytest

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.plan.dims import ParallelDims
from convoy.train.settings import TrainSettings, resolve_settings
from convoy.train.strategies.base import available_strategies, create_strategy


def _ctx(world: int, dims: ParallelDims | None = None, **options) -> TrainSettings:
    return TrainSettings(world_size=world, local_world_size=world, parallel_dims=dims, options=options)


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


def test_ddp_and_zero1_beside_tp_run_with_engines_that_take_dtensor_weights():
    """DDP and ZeroRedundancyOptimizer take plain tensors only: beside tp, ddp keeps whole replicas with FSDP2's
    replicate (dp stays replicated) and zero1 shards with fully_shard keeping the weights through the step."""
    from convoy.train.strategies.parallel import realisation

    ddp = create_strategy("parallel", _ctx(4, ParallelDims(dp_replicate=2, tp=2), dp_engine="ddp"))
    assert ddp.dims == ParallelDims(dp_replicate=2, tp=2) and ddp.distributed_type == "DDP+TP"
    zero1 = create_strategy("parallel", _ctx(8, ParallelDims(dp_replicate=2, tp=2, pp=2), dp_engine="zero1"))
    assert zero1.dims == ParallelDims(dp_shard=2, tp=2, pp=2) and zero1.distributed_type == "ZERO1+TP+PP"
    assert [realisation(e, 2) for e in ("fsdp", "zero2", "ddp", "zero1")] == ["fsdp", "fsdp", "replicate",
                                                                               "fsdp-kept"]
    assert [realisation(e, 1) for e in ("ddp", "zero1")] == ["ddp", "zero1"]


def test_hsdp_shards_inside_a_machine_and_replicates_across_machines_by_default():
    two_nodes = TrainSettings(world_size=16, local_world_size=8, parallel_dims=None)
    assert create_strategy("hsdp", two_nodes).dims == ParallelDims(dp_replicate=2, dp_shard=8)
    with_tp = TrainSettings(world_size=16, local_world_size=8, parallel_dims=ParallelDims(dp_replicate=8, tp=2))
    assert create_strategy("hsdp", with_tp).dims == ParallelDims(dp_replicate=2, dp_shard=4, tp=2)
    given = _ctx(4, ParallelDims(dp_replicate=2, dp_shard=2))
    assert create_strategy("hsdp", given).distributed_type == "HSDP"
    with pytest.raises(StrategyError, match="strategy='hsdp' shards each replica with FSDP2: dp_engine='ddp'"):
        create_strategy("hsdp", _ctx(4, ParallelDims(dp_replicate=2, dp_shard=2), dp_engine="ddp"))


@pytest.mark.parametrize("dims, options, error, text", [
    (ParallelDims(dp_replicate=2, dp_shard=2), {"dp_engine": "ddp"}, StrategyError, "needs dp_engine='fsdp'"),
    (ParallelDims(tp=4), {"dp_engine": "deepspeed"}, StrategyError, "'deepspeed' is unknown"),
    (ParallelDims(tp=4), {"tp_plna": {}}, StrategyError, "unknown option 'tp_plna'"),
])
def test_layouts_that_cannot_work_are_named(dims, options, error, text):
    with pytest.raises(error, match=text):
        create_strategy("parallel", _ctx(dims.world_size, dims, **options))


def test_fp16_loss_scaling_cannot_reach_a_pipeline_and_is_refused():
    ctx = TrainSettings(world_size=2, local_world_size=2, parallel_dims=ParallelDims(pp=2), mixed_precision="fp16")
    with pytest.raises(NotSupportedYetError, match="fp16.*pp.*bf16"):
        create_strategy("parallel", ctx)
    bf16 = TrainSettings(world_size=2, local_world_size=2, parallel_dims=ParallelDims(pp=2), mixed_precision="bf16")
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


# --- a data-parallel strategy named beside degrees (issue 24, item 7) -------------------------------------------

def _named(strategy: str, parallelism: str, world: int = 4, **options):
    from convoy.train.strategies.build import named_layout

    settings = resolve_settings(explicit={"strategy": strategy, "parallelism": parallelism},
                                env={"WORLD_SIZE": str(world)}, cpu=True, options=options)
    return named_layout(settings)


@pytest.mark.parametrize("strategy, parallelism, engine", [
    ("zero3", "tp=2", "fsdp"), ("fsdp", "tp=2", "fsdp"), ("zero2", "tp=2", "zero2"),  # the guide's case-3 recipe
    ("zero1", "pp=2", "zero1"), ("ddp", "pp=2", "ddp"), ("zero3", "pp=2", "fsdp"),
    ("zero3", "dp_replicate=2,dp_shard=2", "fsdp"),  # HSDP, which plain zero3 would run as FSDP over all ranks
    ("ddp", "tp=2", "ddp"), ("zero1", "tp=2", "zero1"),  # whole replicas / ZeRO-1 of DTensor weights
    ("zero1", "tp=2,pp=2", "zero1"), ("ddp", "tp=2,pp=2", "ddp"),  # dp = 1: nothing for them to do, accepted
])
def test_a_data_parallel_strategy_beside_degrees_builds_them_with_its_engine(strategy, parallelism, engine):
    """It built the named strategy over every rank and dropped the degrees without a word."""
    name, options = _named(strategy, parallelism)
    assert (name, options["dp_engine"]) == ("parallel", engine)
    built = create_strategy(name, TrainSettings(world_size=4, local_world_size=4,
                                                  parallel_dims=ParallelDims.parse(parallelism, world_size=4),
                                                  options=options))
    assert built.dp_engine == engine and built.dims.world_size == 4
    if engine in ("fsdp", "zero2") and built.dims.tp > 1 and built.dims.pp == 1:
        assert built.dims.dp_shard == 2 and built.distributed_type == "FSDP+TP"


def test_degrees_of_data_parallelism_alone_keep_the_named_strategy():
    assert _named("zero3", "dp=4") == ("zero3", {})
    assert _named("auto", "tp=2")[0] == "parallel"
    assert _named("auto", "dp_replicate=2,dp_shard=2")[0] == "parallel"  # auto compared plain dp, dropping HSDP
    assert _named("hsdp", "dp_replicate=2,dp_shard=2") == ("hsdp", {})  # hsdp reads the degrees itself


@pytest.mark.parametrize("strategy, parallelism, error, text", [
    ("ddp", "dp_replicate=2,dp_shard=2", StrategyError, "shards the weights of each replica, which only FSDP2 "
                                                        "does; use strategy 'hsdp'"),
    ("zero1", "dp_replicate=2,dp_shard=2", StrategyError, "strategy='zero1' keeps whole weights in each replica"),
    ("single", "pp=2", StrategyError,
     "runs the whole model in one process, not split by pp=2; use strategy 'parallel'"),
    ("dp", "tp=2", StrategyError, "strategy='dp' runs the whole model in one process"),
])
def test_a_strategy_that_cannot_run_beside_the_degrees_is_one_line(strategy, parallelism, error, text):
    """Refused as the settings are resolved (Accelerator(), PartialState()), as the launcher refuses them."""
    with pytest.raises(error, match=text):
        _named(strategy, parallelism)


def test_the_named_strategys_options_must_be_read_by_the_layout_it_runs_as():
    from convoy.train.strategies.build import named_layout

    assert _named("zero3", "tp=2", cpu_offload=True)[1] == {"cpu_offload": True, "dp_engine": "fsdp"}
    # a pipeline's options with a data-parallel strategy beside pp: strategy "parallel" reads them
    assert _named("zero1", "pp=2", loss_fn=len)[1]["loss_fn"] is len
    with pytest.raises(StrategyError, match="'bucket_cap_mb' is not read when strategy='ddp' runs beside pp=2"):
        _named("ddp", "pp=2", bucket_cap_mb=5)
    settings = TrainSettings(world_size=4, local_world_size=4, strategy="zero1",
                               parallel_dims=ParallelDims(dp_replicate=2, pp=2), options={"dp_engine": "fsdp"})
    with pytest.raises(StrategyError, match="runs with dp_engine='zero1', not 'fsdp'"):
        named_layout(settings)


def test_the_launcher_refuses_what_a_rank_would():
    from convoy.launch.rank_env import ConvoyEnv, check_launch_settings

    check_launch_settings(ConvoyEnv(strategy="zero3", parallelism="tp=2"))
    check_launch_settings(ConvoyEnv(strategy="zero1", parallelism="pp=2"))
    check_launch_settings(ConvoyEnv(strategy="ddp", parallelism="dp=4,tp=2,pp=2"))  # the planner's ddp+tp2+pp2
    check_launch_settings(ConvoyEnv(strategy="hsdp", parallelism="dp_replicate=2,dp_shard=8"))
    with pytest.raises(StrategyError, match="--strategy 'ddp' keeps whole weights in each replica"):
        check_launch_settings(ConvoyEnv(strategy="ddp", parallelism="dp_replicate=2,dp_shard=2"))
    with pytest.raises(StrategyError, match="--strategy 'single' runs the whole model in one process"):
        check_launch_settings(ConvoyEnv(strategy="single", parallelism="pp=2"))
