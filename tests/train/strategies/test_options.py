"""Typed strategy options (``train/strategies/options.py``): the user's dict parsed once per strategy family."""

from __future__ import annotations

import pytest

from convoy.errors import StrategyError
from convoy.plan.dims import ParallelDims
from convoy.train.settings import TrainSettings
from convoy.train.strategies.base import create_strategy, strategy_class
from convoy.train.strategies.options import DDPOptions, ParallelOptions, ShardOptions, StrategyOptions


@pytest.mark.parametrize("names, record", [(("single", "dp"), StrategyOptions), (("ddp", "zero1"), DDPOptions),
                                           (("zero2", "zero3", "fsdp"), ShardOptions),
                                           (("parallel", "tp", "pp", "hsdp"), ParallelOptions)])
def test_each_strategy_accepts_exactly_the_keys_its_record_reads(names, record):
    for name in names:
        assert strategy_class(name).options == record.keys() and strategy_class(name).options_type is record


def test_parse_takes_the_keys_the_record_has_and_leaves_the_others():
    options = ShardOptions.parse({"auto_wrap": ["Block"], "cpu_offload": True, "bucket_cap_mb": 10})
    assert (options.auto_wrap, options.cpu_offload) == (["Block"], True)
    assert ShardOptions.parse(ParallelOptions(cpu_offload=True, loss_fn=print)) == ShardOptions(cpu_offload=True)
    assert ShardOptions.parse(options) is options


def test_ddp_receives_only_the_arguments_given():
    assert DDPOptions.parse({"static_graph": True, "comm_hook": "fp16"}).ddp_kwargs() == {"static_graph": True}
    assert DDPOptions().ddp_kwargs() == {}


def test_parallel_options_read_their_pipeline_and_yes_no_values():
    options = ParallelOptions.parse({"pp_schedule": "gpipe", "pp_split_at": "layers.1, layers.3",
                                     "sequence_parallel": 1, "find_unused_parameters": 0})
    assert options.sequence_parallel is True and options.find_unused_parameters is False
    pipeline = options.pipeline()
    assert (pipeline.schedule, pipeline.split_at, pipeline.microbatches) == ("gpipe", ("layers.1", "layers.3"), None)
    with pytest.raises(StrategyError, match="pipeline schedule 'zigzag' is unknown"):
        ParallelOptions(pp_schedule="zigzag").pipeline()


def test_a_strategy_reads_its_options_as_a_typed_record():
    settings = TrainSettings(world_size=4, local_world_size=4, parallel_dims=ParallelDims(dp_shard=2, tp=2),
                             options={"dp_engine": "zero2", "sequence_parallel": True})
    strategy = create_strategy("parallel", settings)
    assert strategy.config == ParallelOptions(dp_engine="zero2", sequence_parallel=True)
    assert strategy.dp_engine == "zero2" and strategy.context.options == settings.options  # the user's dict kept
