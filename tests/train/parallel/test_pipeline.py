"""Pipeline stage cuts and configuration, without processes."""

from __future__ import annotations

import pytest
from torch import nn

from convoy.errors import StrategyError
from convoy.train.parallel.pipeline import SCHEDULES, PipelineConfig, find_layers, stage_boundaries
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT


@pytest.mark.parametrize("layers, stages, expected", [
    (4, 2, ("layers.2",)), (4, 4, ("layers.1", "layers.2", "layers.3")), (5, 2, ("layers.2",)),
    (6, 3, ("layers.2", "layers.4")), (4, 1, ()),
])
def test_even_cuts_by_layer_count(layers, stages, expected):
    assert stage_boundaries(TinyGPT(TinyConfig(layers=layers)), stages) == expected


def test_more_stages_than_layers_is_refused():
    with pytest.raises(StrategyError, match="3 pipeline stages are more than the 2 layers of 'layers'"):
        stage_boundaries(TinyGPT(TinyConfig(layers=2)), 3)


def test_named_split_points_are_checked():
    model = TinyGPT(TinyConfig(layers=4))
    assert stage_boundaries(model, 2, split_at=["layers.3"]) == ("layers.3",)
    with pytest.raises(StrategyError, match="'layers.9' is not a module"):
        stage_boundaries(model, 2, split_at=["layers.9"])
    with pytest.raises(StrategyError, match="3 stages need 2 split points, got 1"):
        stage_boundaries(model, 3, split_at=["layers.1"])
    with pytest.raises(StrategyError, match="in the model's order"):
        stage_boundaries(model, 3, split_at=["layers.3", "layers.1"])


def test_layers_list_is_found_or_named():
    model = TinyGPT(TinyConfig(layers=3))
    model.extra = nn.ModuleList([nn.Linear(2, 2)])
    assert find_layers(model) == ("layers", 3)
    assert find_layers(model, "extra") == ("extra", 1)
    with pytest.raises(StrategyError, match="'blocks' is not a non-empty nn.ModuleList"):
        find_layers(model, "blocks")
    with pytest.raises(StrategyError, match="no nn.ModuleList"):
        stage_boundaries(nn.Sequential(nn.Linear(2, 2)), 2)


def test_config_validation_and_stages_per_rank():
    assert PipelineConfig().local_stages() == 1
    assert PipelineConfig(schedule="interleaved_1f1b").local_stages() == 2
    assert PipelineConfig(schedule="looped_bfs", stages_per_rank=3).local_stages() == 3
    with pytest.raises(StrategyError, match="'zigzag' is unknown"):
        PipelineConfig(schedule="zigzag")
    with pytest.raises(StrategyError, match="runs one stage per process"):
        PipelineConfig(schedule="gpipe", stages_per_rank=2)
    with pytest.raises(StrategyError, match="microbatches=0"):
        PipelineConfig(microbatches=0)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs"}


def test_config_from_strategy_options():
    cfg = PipelineConfig.from_options({"pp_schedule": "gpipe", "pp_microbatches": 8,
                                       "pp_split_at": "layers.1, layers.3",
                                       "other": 1})
    assert (cfg.schedule, cfg.microbatches, cfg.split_at) == ("gpipe", 8, ("layers.1", "layers.3"))


def test_convoy_errors_raised_while_tracing_reach_the_user_as_themselves():
    from convoy.train.parallel.pipeline import _convoy_cause

    mine = StrategyError("make the sequence length a multiple of 2")
    try:
        try:
            raise mine
        except StrategyError as inner:
            raise RuntimeError("torch.export: cannot capture your model as a full graph") from inner
    except RuntimeError as wrapped:
        assert _convoy_cause(wrapped) is mine
    assert _convoy_cause(RuntimeError("unrelated")) is None
