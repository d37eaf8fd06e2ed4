"""The Accelerator in one process: settings, API surface, accumulation, precision, saving."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator, AcceleratorState
from convoy.errors import CheckpointError, ConfigError, StrategyError
from convoy.train import ProjectConfiguration
from convoy.train.settings import resolve_settings
from convoy.train.strategies import Strategy, available_strategies, register_strategy, strategy_class

PUBLIC = [
    "accumulate", "autocast", "backward", "broadcast", "check_trigger", "clear", "clip_grad_norm_",
    "clip_grad_value_", "context_parallel_rank", "data_parallel_rank", "data_parallel_shard_rank", "device",
    "distributed_type", "end_training", "even_batches", "fp8_backend", "fp8_recipe_handler", "free_memory", "gather",
    "gather_for_metrics", "get_state_dict", "get_tracker", "gradient_accumulation_steps", "gradient_state",
    "init_trackers", "is_last_process", "is_local_main_process", "is_main_process", "join_uneven_inputs",
    "load_state", "local_main_process_first", "local_process_index", "log", "logging_dir", "main_process_first",
    "maybe_context_parallel", "mixed_precision", "no_sync", "non_data_parallel_size", "num_processes",
    "on_last_process", "on_local_main_process", "on_local_process",
    "on_main_process", "on_process", "optimizer_step_was_skipped", "pad_across_processes",
    "parallelism_config", "pipeline_parallel_rank",
    "plan_report",  # convoy's own, not an Accelerate name: the plan beside what the first steps measured
    "prepare",
    "prepare_data_loader", "prepare_model", "prepare_optimizer", "prepare_scheduler", "print", "process_index",
    "project_dir", "reduce", "register_for_checkpointing", "register_load_state_pre_hook",
    "register_save_state_pre_hook", "save", "save_model", "save_state", "set_trigger", "skip_first_batches",
    "split_batches", "split_between_processes", "strategy", "sync_gradients", "tensor_parallel_rank",
    "torch_device_mesh", "trackers", "trigger_sync_in_backward", "unscale_gradients", "unwrap_model",
    "use_distributed", "wait_for_everyone",
    # issue 40: the rest of Accelerate's attributes (tests/train/test_accelerate_surface.py)
    "deepspeed_plugin", "dispatch_batches", "has_lomo_optimizer", "is_fsdp2", "lomo_backward", "multi_device",
    "native_amp", "non_blocking", "profile", "use_seedable_sampler", "use_stateful_dataloader", "verify_device_map",
    # Accelerate's fp8 and composable-parallelism attributes (tests/train/test_accelerate_surface.py)
    "ao_recipe_handler", "te_recipe_handler", "msamp_recipe_handler", "delayed_fp8_autocast", "has_fp8_handler",
    "fp8_enabled", "is_composable_parallelism_enabled", "should_save_model",
]


def test_public_surface_snapshot():
    assert sorted(n for n in dir(Accelerator) if not n.startswith("_")) == sorted(PUBLIC)


def test_explicit_argument_beats_environment():
    env = {"CONVOY_MIXED_PRECISION": "bf16", "CONVOY_STRATEGY": "ddp", "CONVOY_GRADIENT_ACCUMULATION_STEPS": "4",
           "CONVOY_COLLECTIVE_TIMEOUT": "12"}
    s = resolve_settings(explicit={"mixed_precision": "no"}, env=env, cpu=True)
    assert (s.mixed_precision, s.strategy, s.gradient_accumulation_steps, s.collective_timeout_s) == \
        ("no", "ddp", 4, 12.0)
    assert resolve_settings(env={"RANK": "1", "WORLD_SIZE": "2"}, cpu=True).world_size == 2


def test_bad_settings_are_one_clear_error():
    with pytest.raises(ConfigError, match="mixed_precision='fp4'"):
        Accelerator(mixed_precision="fp4")
    with pytest.raises(StrategyError, match="choose one of"):
        Accelerator(strategy="zero4")


@pytest.mark.parametrize("kwargs, why", [
    ({"device_placement": "no"}, "device_placement='no'): give True or False"),  # "no" would read as True
    ({"cpu": "false"}, "cpu='false'): give True or False"),
    ({"split_batches": 2}, "split_batches=2): give True or False"),
    ({"step_scheduler_with_optimizer": None}, "step_scheduler_with_optimizer=None): give True or False"),
    ({"project_dir": 5}, "project_dir=5): give a directory path"),
    ({"rng_types": ["torch", "bogus"]}, "'bogus' is not a random number generator"),
    ({"rng_types": 3}, "3 is not a random number generator"),
])
def test_plain_arguments_of_the_wrong_kind_are_one_line(kwargs, why):
    with pytest.raises(ConfigError, match=re.escape(why)) as err:
        Accelerator(cpu=True, **kwargs) if "cpu" not in kwargs else Accelerator(**kwargs)
    assert "\n" not in str(err.value)


def test_plain_arguments_of_the_right_kind_are_taken():
    import numpy as np

    acc = Accelerator(cpu=np.True_, device_placement=False, split_batches=None, even_batches=False,
                      project_dir=Path("out"), rng_types=["torch", "generator"])
    assert acc.device_placement is False and acc.dataloader_config.even_batches is False
    assert acc.project_configuration.project_dir == "out"


@pytest.mark.parametrize("kwargs, why", [
    ({"total_limit": 0}, "total_limit=0): give how many of the newest checkpoints to keep, a whole number >= 1, "
                         "or None to keep them all"),
    ({"total_limit": -1}, "total_limit=-1): give how many"),
    ({"total_limit": "3"}, "total_limit='3'): give how many"),
    ({"total_limit": True}, "total_limit=True): give how many"),
    ({"iteration": -1}, "iteration=-1): give the number of the next automatic checkpoint, a whole number >= 0"),
    ({"iteration": 1.0}, "iteration=1.0): give the number"),
    ({"project_dir": 5}, "project_dir=5): give a directory path (a str or Path), or None"),
    ({"logging_dir": ["logs"]}, "logging_dir=['logs']): give a directory path"),
    ({"automatic_checkpoint_naming": "yes"}, "automatic_checkpoint_naming='yes'): give True or False"),
])
def test_project_configuration_refuses_values_of_the_wrong_kind(kwargs, why):
    with pytest.raises(ConfigError, match=re.escape("ProjectConfiguration(" + why)) as err:
        ProjectConfiguration(**kwargs)
    assert "\n" not in str(err.value)


def test_project_configuration_takes_paths_and_numpy_numbers(tmp_path):
    import numpy as np

    config = ProjectConfiguration(project_dir=tmp_path, logging_dir=tmp_path / "logs", total_limit=np.int64(2),
                                  iteration=np.int64(3), automatic_checkpoint_naming=np.True_)
    assert type(config.total_limit) is int and config.total_limit == 2 and config.iteration == 3
    assert Accelerator(project_config=config).project_configuration.project_dir == tmp_path


def test_registry_takes_new_strategies_without_touching_the_facade():
    @register_strategy("test-identity", replace=True)
    class Identity(Strategy):
        def setup_module(self, module):
            module.marked = True
            return module

    assert "test-identity" in available_strategies() and strategy_class("ddp").name == "ddp"
    model = Accelerator(strategy="test-identity").prepare(torch.nn.Linear(2, 2))
    assert model.marked


def _setup(acc, n=12, batch=2):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(n, 3), torch.randn(n, 1))
    return acc.prepare(model, opt, DataLoader(data, batch_size=batch))


def test_accumulate_steps_only_on_sync_micro_steps_and_at_the_end():
    acc = Accelerator(gradient_accumulation_steps=4)
    model, opt, loader = _setup(acc, n=12, batch=2)  # 6 micro-steps: sync at 4 and at the end (6)
    syncs = []
    for x, y in loader:
        with acc.accumulate(model):
            before = model.weight.detach().clone()
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            syncs.append((acc.sync_gradients, not torch.equal(before, model.weight)))
    assert syncs == [(False, False)] * 3 + [(True, True), (False, False), (True, True)]


def test_fp16_skips_a_step_with_inf_gradients_and_bf16_autocasts():
    acc = Accelerator(mixed_precision="fp16")
    model, opt, _ = _setup(acc)
    loss = model(torch.randn(2, 3, device=acc.device)).sum() * float("inf")  # cpu or cuda: this machine's
    acc.backward(loss)
    before = model.weight.detach().clone()
    opt.step()
    assert acc.optimizer_step_was_skipped and torch.equal(before, model.weight)
    AcceleratorState._reset_state()  # the process's mixed precision is set once, as in Accelerate
    acc = Accelerator(mixed_precision="bf16")
    model, _, _ = _setup(acc)
    with acc.autocast():
        assert (torch.randn(2, 2, device=acc.device) @ torch.randn(2, 2, device=acc.device)).dtype == torch.bfloat16
    assert model(torch.randn(2, 3, device=acc.device)).dtype == torch.float32  # outputs handed back in fp32


def test_helpers_in_one_process():
    acc = Accelerator()
    with acc.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    assert acc.gather(torch.tensor(5.0)).tolist() == [5.0]
    assert acc.reduce(torch.tensor([2.0]), "mean").tolist() == [2.0]
    assert acc.on_main_process(lambda: 7)() == 7
    loader = DataLoader(list(range(10)), batch_size=2)
    assert [b.tolist() for b in acc.skip_first_batches(loader, 3)] == [[6, 7], [8, 9]]


def test_split_between_processes_shares_and_pads():
    from convoy.train.collectives import split

    assert [split([1, 2, 3, 4, 5], 2, i, False) for i in range(2)] == [[1, 2, 3], [4, 5]]
    assert [split([1, 2, 3, 4, 5], 2, i, True) for i in range(2)] == [[1, 2, 3], [4, 5, 5]]
    assert split({"a": [1, 2, 3], "b": (4, 5, 6)}, 3, 2, False) == {"a": [3], "b": (6,)}
    assert split(torch.arange(3), 2, 1, True).tolist() == [2, 2]


def test_save_and_load_state_without_a_directory_say_what_is_missing(tmp_path):
    with pytest.raises(CheckpointError, match=r"needs Accelerator\(project_dir=...\); or pass a directory"):
        Accelerator().save_state()
    with pytest.raises(CheckpointError, match="no complete checkpoint under .*checkpoints; save_state"):
        Accelerator(project_dir=tmp_path).load_state()


def test_save_state_names_limits_and_restores(tmp_path):
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path), total_limit=2))
    model, opt, loader = _setup(acc)

    class Counter:
        n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, s):
            self.n = s["n"]

    counter = Counter()
    acc.register_for_checkpointing(counter)
    for n in range(3):
        counter.n = n
        acc.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_1", "checkpoint_2"]
    counter.n = -1
    assert acc.load_state().endswith("checkpoint_2") and counter.n == 2
    with pytest.raises(CheckpointError):
        Accelerator().save_state()


def test_save_model_writes_safetensors_shards(tmp_path):
    from safetensors.torch import load_file

    acc = Accelerator()
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)))
    acc.save_model(model, tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    loaded = {}
    for f in set(index["weight_map"].values()):
        loaded.update(load_file(tmp_path / f))
    assert loaded.keys() == model.state_dict().keys()
    assert all(torch.equal(loaded[k], v.cpu()) for k, v in model.state_dict().items())  # files hold CPU tensors
    # saved again as one file: the earlier shards and their index are gone (a loader read the stale index), and
    # files of another format or name stay
    (tmp_path / "pytorch_model.bin").write_bytes(b"the user's")
    (tmp_path / "notes.txt").write_text("mine")
    acc.save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "notes.txt", "pytorch_model.bin"]
    acc.save_model(model, tmp_path, max_shard_size="20KB")  # and the other way round
    assert "model.safetensors" not in {p.name for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="max_shard_size='0GB' is not a size above zero"):
        acc.save_model(model, tmp_path, max_shard_size="0GB")


def test_parameter_origins_repoint_an_optimizer_at_replaced_parameters():
    import torch

    from convoy.train.strategies.base import ParameterOrigins

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    old_weight = model.weight
    origins = ParameterOrigins()
    origins.record(model, {id(p): n for n, p in model.named_parameters()})
    model.weight = torch.nn.Parameter(old_weight.detach().clone())  # what a sharding engine does
    assert origins.knows(old_weight) and not origins.knows(model.weight)
    origins.repoint(optimizer)
    assert optimizer.param_groups[0]["params"][0] is model.weight
    assert origins.current(torch.nn.Parameter(torch.zeros(1))) is not model.weight  # unknown: itself
