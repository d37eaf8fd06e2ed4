"""Accelerate's plugin objects in convoy: ``FullyShardedDataParallelPlugin``, ``DeepSpeedPlugin`` and
``ParallelismConfig`` with Accelerate's constructor arguments, read by the ``Accelerator`` as the strategy, degrees
and options they stand for (the 2-process runs: tests/train/test_accelerate_config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from convoy import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig, PartialState
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.train.plugins import plugin_arguments
from convoy.train.process_group import stop_process_group
from convoy.utils import TorchContextParallelConfig

ZERO3_JSON = Path(__file__).resolve().parents[1] / "config" / "accelerate" / "zero3.json"


pytestmark = pytest.mark.usefixtures("accelerator_in_this_process")


def test_importable_where_accelerate_puts_them():
    from convoy.parallelism_config import ParallelismConfig as from_module
    from convoy.utils import DeepSpeedPlugin as ds
    from convoy.utils import FullyShardedDataParallelPlugin as fsdp
    from convoy.utils import ParallelismConfig as pc

    assert (fsdp, ds, pc, from_module) == (FullyShardedDataParallelPlugin, DeepSpeedPlugin, ParallelismConfig,
                                           ParallelismConfig)


@pytest.mark.parametrize("ours, name", [(FullyShardedDataParallelPlugin, "FullyShardedDataParallelPlugin"),
                                        (DeepSpeedPlugin, "DeepSpeedPlugin"), (ParallelismConfig, "ParallelismConfig"),
                                        (TorchContextParallelConfig, "TorchContextParallelConfig")])
def test_constructor_arguments_are_accelerates(ours, name):
    accelerate = pytest.importorskip("accelerate")
    theirs = getattr(accelerate.utils, name)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs) if f.init]


@pytest.mark.parametrize("plugin, strategy, options", [
    (FullyShardedDataParallelPlugin(), "zero3", {}),
    (FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False, cpu_offload=True), "zero2",
     {"cpu_offload": True}),
    (FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP"), "zero2", {}),
    (FullyShardedDataParallelPlugin(sharding_strategy=3), "ddp", {}),
    (FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]),
     "zero3", {"auto_wrap": ("Block",)}),
])
def test_an_fsdp_plugin_is_the_strategy_it_stands_for(plugin, strategy, options):
    accelerator = Accelerator(fsdp_plugin=plugin)
    assert accelerator.settings.strategy == strategy
    assert {k: v for k, v in accelerator.settings.options.items() if k in ("cpu_offload", "auto_wrap")} == options


def test_torchs_own_enums_and_policies_are_read(monkeypatch):
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    plugin = FullyShardedDataParallelPlugin(sharding_strategy=fsdp.ShardingStrategy.SHARD_GRAD_OP,
                                            cpu_offload=fsdp.CPUOffload(offload_params=True))
    assert (plugin.translate(nodes=1, processes=2).value("strategy"),
            plugin.translate(nodes=1, processes=2).value("cpu_offload")) == ("zero2", True)
    policy = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=fsdp.CPUOffloadPolicy())
    assert policy.translate(nodes=1, processes=2).value("cpu_offload") is True
    import torch

    mixed = FullyShardedDataParallelPlugin(mixed_precision_policy=fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                                           reduce_dtype=torch.float32))
    assert mixed.translate(nodes=1, processes=1).value("mixed_precision") == "bf16"
    with pytest.raises(NotSupportedYetError, match="reduces gradients in fp32"):
        FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.bfloat16,
                                                               "reduce_dtype": torch.bfloat16})


def test_a_plugin_left_bare_keeps_the_launchers_strategy_of_its_family(monkeypatch):
    monkeypatch.setenv("CONVOY_STRATEGY", "zero2")  # convoy launch --config_file with SHARD_GRAD_OP
    assert Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()).settings.strategy == "zero2"
    PartialState._reset_state()
    monkeypatch.setenv("CONVOY_STRATEGY", "ddp")  # a plain multi-GPU launch: the plugin asks for FSDP
    assert Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()).settings.strategy == "zero3"
    PartialState._reset_state()
    monkeypatch.setenv("CONVOY_STRATEGY", "zero3")
    assert Accelerator(deepspeed_plugin=DeepSpeedPlugin()).settings.strategy == "zero3"
    PartialState._reset_state()
    monkeypatch.delenv("CONVOY_STRATEGY")
    assert Accelerator(deepspeed_plugin=DeepSpeedPlugin()).settings.strategy == "zero2"  # Accelerate's stage 2


def test_a_deepspeed_plugin_reads_its_json_as_the_config_file_does(monkeypatch, tmp_path):
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=str(ZERO3_JSON)))
    assert (accelerator.settings.strategy, accelerator.gradient_accumulation_steps) == ("zero3", 2)
    PartialState._reset_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu",
                                                               gradient_accumulation_steps=4))
    assert (accelerator.settings.strategy, accelerator.settings.options.get("cpu_offload"),
            accelerator.gradient_accumulation_steps) == ("zero2", True, 4)
    with pytest.raises(NotSupportedYetError, match=r"DeepSpeedPlugin\(hf_ds_config\)\['optimizer.type'\].*DummyOptim"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}})
    with pytest.raises(NotSupportedYetError, match=r"\(offload_param_device='nvme'\): offloading to NVMe"):
        DeepSpeedPlugin(zero_stage=3, offload_param_device="nvme")
    with pytest.raises(NotSupportedYetError, match="MS-AMP"):
        DeepSpeedPlugin(enable_msamp=True)


@pytest.mark.parametrize("make, words", [
    (lambda: Accelerator(strategy="ddp", fsdp_plugin=FullyShardedDataParallelPlugin()),
     "Accelerator(strategy='ddp') and FullyShardedDataParallelPlugin"),
    (lambda: Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), deepspeed_plugin=DeepSpeedPlugin()),
     "give one of them"),
    (lambda: Accelerator(deepspeed_plugin={"a": DeepSpeedPlugin(), "b": DeepSpeedPlugin()}), "one plugin"),
    (lambda: Accelerator(mixed_precision="fp16", deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})), "Accelerator(mixed_precision='fp16') and"),
    (lambda: Accelerator(strategy_options={"cpu_offload": False},
                         fsdp_plugin=FullyShardedDataParallelPlugin(cpu_offload=True)),
     "strategy_options cpu_offload=False and FullyShardedDataParallelPlugin(cpu_offload=True)"),
    (lambda: FullyShardedDataParallelPlugin(fsdp_version=3), "Plugin(fsdp_version=3): give 1 or 2"),
    (lambda: FullyShardedDataParallelPlugin(ignored_modules=["head"]), "ignored_modules=['head']): not supported yet"),
    (lambda: ParallelismConfig(sp_size=2), "ParallelismConfig(sp_size=2): sequence parallelism (Ulysses) is not in "
                                           "convoy yet"),
    (lambda: TorchContextParallelConfig(cp_comm_strategy="ring"), "TorchContextParallelConfig(cp_comm_strategy='ring')"
                                                                  ": choose 'allgather' or 'alltoall'"),
])
def test_conflicts_and_what_convoy_does_not_run_are_one_line(make, words):
    with pytest.raises((ConfigError, NotSupportedYetError)) as caught:
        make()
    assert words in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_hybrid_shard_splits_over_the_machines_and_parallelism_config_gives_degrees():
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "LOCAL_RANK": "1"}
    hybrid = plugin_arguments(fsdp_plugin=FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD"),
                              deepspeed_plugin=None, parallelism_config=None, explicit={}, strategy_options=None,
                              env=env)
    assert (hybrid.explicit["strategy"], hybrid.explicit["parallelism"]) == ("zero3", "dp_replicate=2,dp_shard=4")
    both = plugin_arguments(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
                            deepspeed_plugin=None, parallelism_config=ParallelismConfig(dp_shard_size=4, tp_size=2),
                            explicit={}, strategy_options=None, env=env)
    assert both.explicit["parallelism"] == "dp_replicate=1,dp_shard=4,tp=2" and both.family
    with pytest.raises(ConfigError, match=r"Accelerator\(parallelism=\{'tp': 2\}\) and ParallelismConfig"):
        plugin_arguments(fsdp_plugin=None, deepspeed_plugin=None, parallelism_config=ParallelismConfig(tp_size=2),
                         explicit={"parallelism": {"tp": 2}}, strategy_options=None, env=env)
    assert ParallelismConfig(dp_shard_size=4, tp_size=2).total_size == 8


def test_parallelism_config_cp_size_is_the_cp_degree_and_its_comm_strategy_an_option():
    """Accelerate's nd_parallel.py spelling: cp_size with cp_handler=TorchContextParallelConfig(cp_comm_strategy=...);
    its dimension names as Accelerate gives them."""
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "RANK": "0", "LOCAL_RANK": "0"}
    config = ParallelismConfig(dp_shard_size=2, cp_size=4,
                               cp_handler=TorchContextParallelConfig(cp_comm_strategy="alltoall"))
    got = plugin_arguments(fsdp_plugin=None, deepspeed_plugin=None, parallelism_config=config, explicit={},
                           strategy_options=None, env=env)
    assert got.explicit["parallelism"] == "dp_replicate=1,dp_shard=2,cp=4,tp=1"
    assert got.options == {"cp_comm_strategy": "alltoall"}
    assert (config.cp_enabled, config.total_size, config.non_data_parallel_size) == (True, 8, 4)
    assert config.dp_cp_dim_names == ["dp_shard", "cp"] and config.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_shard_cp"] and config.non_dp_dim_names == ["cp"]
    plain = plugin_arguments(fsdp_plugin=None, deepspeed_plugin=None, parallelism_config=ParallelismConfig(cp_size=2),
                             explicit={}, strategy_options=None, env=env)
    assert plain.explicit["parallelism"] == "dp_replicate=1,dp_shard=1,cp=2,tp=1" and plain.options is None


def test_auto_wrap_takes_class_names_as_accelerates_transformer_cls_names_to_wrap():
    from torch import nn

    from convoy.errors import StrategyError
    from convoy.train.strategies.fsdp import shard_units

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

    model = nn.Sequential(nn.Linear(2, 2), Block(), Block())
    assert [type(m).__name__ for m in shard_units(model, ("Block",))] == ["Block", "Block"]
    with pytest.raises(StrategyError, match="auto_wrap: the model has no module of class 'LlamaDecoderLayer'"):
        shard_units(model, ("LlamaDecoderLayer",))


def _three_steps(accelerator, clip=None):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    norms = []
    for step in range(3):
        x = torch.full((8, 4), float(step + 1))
        accelerator.backward(model(x).pow(2).mean() * 100)
        if clip is not None:
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()], norms


@pytest.mark.parametrize("how", [{"gradient_clipping": 0.05}, {"hf_ds_config": {"gradient_clipping": 0.05}}])
def test_deepspeed_gradient_clipping_clips_at_each_optimizer_step(how):
    """As DeepSpeed's engine: the global gradient norm is clipped before each step, with no call in the script."""
    import torch

    clipped, _ = _three_steps(Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=0, **how)))
    stop_process_group()
    PartialState._reset_state()
    by_hand, norms = _three_steps(Accelerator(), clip=0.05)
    assert min(norms) > 0.05  # the clipping changed every step
    assert all(torch.equal(a, b) for a, b in zip(clipped, by_hand))
    with pytest.raises(ConfigError, match=r"\['gradient_clipping'\] = -1: give the largest gradient norm, a number"):
        Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={"gradient_clipping": -1}))
