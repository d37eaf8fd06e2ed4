"""Accelerate's other names (state objects, plugins, kwargs handlers, free operations) in one process; the
same on 2 CPU processes through tests/train/scripts/accelerate_names.py."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
import torch

import convoy
from convoy import (
    Accelerator,
    AcceleratorState,
    AutocastKwargs,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    PartialState,
)
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.train.process_group import stop_process_group
from tests.distributed import cpu_env, run_script
from tests.train.test_scripts import SCRIPTS

pytestmark = pytest.mark.usefixtures("accelerator_in_this_process")


def test_distributed_type_is_accelerates_str_enum():
    accelerator = Accelerator()
    assert accelerator.distributed_type is DistributedType.NO and accelerator.distributed_type == "NO"
    assert accelerator.state.distributed_type == DistributedType.NO
    assert DistributedType("MULTI_CPU") == "MULTI_CPU" and DistributedType.FSDP.value == "FSDP"
    # printed as Accelerate's: str(), format() and a log line show the class name
    assert str(DistributedType.FSDP) == f"{DistributedType.FSDP}" == "DistributedType.FSDP"


def test_states_share_one_view_and_reset_breaks_the_accelerator_as_in_accelerate():
    accelerator = Accelerator(mixed_precision="bf16")
    assert PartialState().num_processes == 1 and AcceleratorState().mixed_precision == "bf16"
    # plain strings, as Accelerate's (a str enum's repr and YAML dumps differ)
    assert type(AcceleratorState().mixed_precision) is str and type(accelerator.mixed_precision) is str
    PartialState().debug = True
    assert accelerator.state.debug is True  # one shared view per process
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match="This happens if `AcceleratorState._reset_state\\(\\)`"):
        accelerator.prepare(torch.nn.Linear(1, 1))


def test_a_later_accelerator_keeps_the_processs_mixed_precision_as_in_accelerate():
    first = Accelerator(mixed_precision="bf16")
    assert Accelerator().mixed_precision == "bf16"  # Accelerate's answer too: the state's, not "no"
    assert Accelerator(mixed_precision="BF16").mixed_precision == "bf16"
    # a different one rewrote the shared state: first.state said fp16 while first computed in bf16
    with pytest.raises(ConfigError, match=re.escape(
            "Accelerator(mixed_precision='fp16'): this process's AcceleratorState is already set up with "
            "mixed_precision='bf16' (by an earlier Accelerator); pass 'bf16' or leave it out, or call "
            "AcceleratorState._reset_state() first")) as err:
        Accelerator(mixed_precision="fp16")
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)  # Accelerate raises a ValueError
    with pytest.raises(ConfigError, match=re.escape("AcceleratorState(mixed_precision='no'): this process's")):
        AcceleratorState(mixed_precision="no")
    assert first.state.mixed_precision == AcceleratorState().mixed_precision == "bf16"
    AcceleratorState._reset_state()
    assert Accelerator(mixed_precision="fp16").state.mixed_precision == "fp16"


def test_accelerate_debug_mode_turns_on_the_shape_checks(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    assert PartialState().debug is True and Accelerator().state.debug is True


def test_gradient_accumulation_plugin_and_setter():
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3))
    assert accelerator.gradient_accumulation_steps == 3 and accelerator.gradient_state.num_steps == 3
    accelerator.gradient_accumulation_steps = 2
    syncs = []
    for _ in range(4):
        with accelerator.accumulate():
            syncs.append(accelerator.sync_gradients)
    assert syncs == [False, True, False, True]
    with pytest.raises(ConfigError, match=">= 1"):
        accelerator.gradient_accumulation_steps = 0
    with pytest.raises(ConfigError, match="not both"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))


def test_gradient_state_follows_nested_dataloaders():
    accelerator = Accelerator()
    outer, inner = accelerator.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=2),
                                       torch.utils.data.DataLoader(list(range(6)), batch_size=2))
    state = accelerator.gradient_state
    assert state.active_dataloader is None
    seen = []
    for i, _ in enumerate(outer):
        if i == 0:
            for _ in inner:
                seen.append((state.active_dataloader is inner, state.end_of_dataloader))
        seen.append((state.active_dataloader is outer, state.end_of_dataloader))
    assert seen == [(True, False), (True, False), (True, True), (True, False), (True, True)]
    assert state.active_dataloader is None


def test_kwargs_handlers_are_applied():
    accelerator = Accelerator(strategy="ddp", kwargs_handlers=[
        DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=5),
        InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=42))])
    assert accelerator.settings.collective_timeout_s == 42.0
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert model.find_unused_parameters is True and model.bucket_bytes_cap == 5 * 1024 * 1024
    stop_process_group()
    PartialState._reset_state()
    fp16 = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    assert fp16.scaler.get_scale() == 1024.0
    AcceleratorState._reset_state()  # the process's mixed precision is set once, as in Accelerate
    bf16 = Accelerator(mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)])
    where = bf16.device.type  # autocast is per device type: cuda on a GPU box, cpu elsewhere
    with bf16.autocast():
        assert not torch.is_autocast_enabled(where)
    with bf16.autocast(AutocastKwargs()):
        assert torch.is_autocast_enabled(where) and torch.get_autocast_dtype(where) == torch.bfloat16


def test_refused_arguments_say_what_to_use():
    with pytest.raises(NotSupportedYetError, match="use parallelism="):
        Accelerator(megatron_lm_plugin=object())
    with pytest.raises(ConfigError, match=r"fsdp_plugin=.*give a convoy.FullyShardedDataParallelPlugin"):
        Accelerator(fsdp_plugin=object())
    with pytest.raises(ConfigError, match="give one of them"):
        Accelerator(dynamo_backend="inductor", dynamo_plugin=convoy.TorchDynamoPlugin(backend="inductor"))
    with pytest.raises(ConfigError, match="init_method"):
        Accelerator(kwargs_handlers=[InitProcessGroupKwargs(init_method="tcp://x:1")])
    with pytest.raises(ConfigError, match="strategy_options"):
        Accelerator(kwargs_handlers=[object()])
    with pytest.raises(ConfigError, match="only pass one"):
        Accelerator(kwargs_handlers=[AutocastKwargs(), AutocastKwargs(enabled=False)])
    with pytest.raises(NotSupportedYetError, match="convoy launch --nnodes"):
        convoy.notebook_launcher(print, num_nodes=2)


@pytest.mark.parametrize("make, why", [
    # a timeout in seconds was an AttributeError inside Accelerator(); a backend name torch lacks, an
    # AssertionError when the process group started
    (lambda: InitProcessGroupKwargs(timeout=30), "InitProcessGroupKwargs(timeout=30): give a datetime.timedelta "
                                                 "longer than zero, e.g. timedelta(seconds=30), or None"),
    (lambda: InitProcessGroupKwargs(timeout=datetime.timedelta(0)), "InitProcessGroupKwargs(timeout=datetime.time"),
    (lambda: InitProcessGroupKwargs(backend="bogus"), "InitProcessGroupKwargs(backend='bogus'): give a "
                                                      "torch.distributed backend (gloo, nccl"),
    (lambda: InitProcessGroupKwargs(backend=5), "InitProcessGroupKwargs(backend=5): give a torch.distributed"),
    # torch.amp.GradScaler checks its factors with asserts, and a negative scale or a 0 interval not at all
    (lambda: GradScalerKwargs(init_scale="big"), "GradScalerKwargs(init_scale='big'): give the first loss scale, "
                                                 "a number > 0"),
    (lambda: GradScalerKwargs(init_scale=-1.0), "GradScalerKwargs(init_scale=-1.0): give the first loss scale"),
    (lambda: GradScalerKwargs(growth_factor=0.5), "GradScalerKwargs(growth_factor=0.5): give a number > 1"),
    (lambda: GradScalerKwargs(backoff_factor=2.0), "GradScalerKwargs(backoff_factor=2.0): give a number between "
                                                   "0 and 1"),
    (lambda: GradScalerKwargs(growth_interval=1.5), "GradScalerKwargs(growth_interval=1.5): give a whole number "
                                                    ">= 1 of steps"),
    (lambda: GradScalerKwargs(growth_interval=0), "GradScalerKwargs(growth_interval=0): give a whole number"),
    (lambda: GradScalerKwargs(enabled="no"), "GradScalerKwargs(enabled='no'): give True or False"),
    # "no" is truthy: find_unused_parameters="no" turned the option on; torch.autocast took no str at all
    (lambda: AutocastKwargs(enabled="no"), "AutocastKwargs(enabled='no'): give True or False"),
    (lambda: AutocastKwargs(cache_enabled="no"), "AutocastKwargs(cache_enabled='no'): give True or False, or None"),
    (lambda: DistributedDataParallelKwargs(find_unused_parameters="no"),
     "DistributedDataParallelKwargs(find_unused_parameters='no'): give True or False"),
    (lambda: DistributedDataParallelKwargs(static_graph=None), "DistributedDataParallelKwargs(static_graph=None): "
                                                               "give True or False"),
    (lambda: DistributedDataParallelKwargs(bucket_cap_mb="25"),
     "DistributedDataParallelKwargs(bucket_cap_mb='25'): give the size of a gradient bucket in MB, a number > 0"),
    (lambda: DistributedDataParallelKwargs(bucket_cap_mb=-1), "DistributedDataParallelKwargs(bucket_cap_mb=-1)"),
    (lambda: DistributedDataParallelKwargs(comm_state_option=5), "DistributedDataParallelKwargs(comm_state_option=5): "
                                                                 "give a dict of PowerSGDState's arguments"),
    (lambda: DistributedDataParallelKwargs(comm_hook="fp8"), "comm_hook='fp8' is not a comm_hook"),
    (lambda: GradientAccumulationPlugin(num_steps=2.5), "GradientAccumulationPlugin(num_steps=2.5): give micro-steps "
                                                        "per optimizer step, a whole number >= 1"),
    (lambda: GradientAccumulationPlugin(num_steps="2"), "GradientAccumulationPlugin(num_steps='2')"),
    (lambda: GradientAccumulationPlugin(num_steps=2, sync_each_batch="no"),
     "GradientAccumulationPlugin(sync_each_batch='no'): give True or False"),
])
def test_kwargs_handlers_refuse_values_of_the_wrong_kind_when_made(make, why):
    with pytest.raises(ConfigError, match=re.escape(why)) as err:
        make()
    assert "\n" not in str(err.value)


def test_kwargs_handlers_take_numpy_values_and_keep_python_ones():
    import numpy as np

    handler = DistributedDataParallelKwargs(find_unused_parameters=np.True_, static_graph=1, bucket_cap_mb=0.5)
    assert handler.to_kwargs() == {"find_unused_parameters": True, "static_graph": True, "bucket_cap_mb": 0.5}
    assert type(handler.find_unused_parameters) is bool  # torch's DDP takes no numpy bool
    scaler = GradScalerKwargs(init_scale=np.float32(1024), growth_interval=np.int64(10))
    assert scaler.to_kwargs() == {"init_scale": 1024.0, "growth_interval": 10}
    assert type(scaler.init_scale) is float and type(scaler.growth_interval) is int
    assert InitProcessGroupKwargs(backend="cpu:gloo,cuda:nccl").backend == "cpu:gloo,cuda:nccl"
    assert AutocastKwargs(enabled=0, cache_enabled=None).to_kwargs() == {"enabled": False}


def test_kwargs_handlers_take_what_accelerate_and_torch_take():
    """Values the first checks refused though torch or Accelerate take them: a vendor's backend registered only
    once its module is imported, a disabled scaler's factors (torch checks none), DDP's None bucket size, a
    whole count computed as a float."""
    assert InitProcessGroupKwargs(backend="hccl").backend == "hccl"  # Ascend's and Habana's
    assert GradScalerKwargs(enabled=False, growth_factor=1.0).to_kwargs() == {"enabled": False, "growth_factor": 1.0}
    assert DistributedDataParallelKwargs(bucket_cap_mb=None).to_kwargs() == {"bucket_cap_mb": None}
    assert GradientAccumulationPlugin(num_steps=4.0).num_steps == 4
    with pytest.raises(ConfigError, match=r"num_steps=4.5\): give micro-steps per optimizer step"):
        GradientAccumulationPlugin(num_steps=4.5)


@pytest.mark.parametrize("kwargs, why", [
    ({"comm_hook": "fp8"}, "comm_hook='fp8' is not a comm_hook; give one of no, fp16, bf16"),
    ({"comm_wrapper": "power_sgd"}, "comm_wrapper='power_sgd' is not a comm_wrapper; give one of no, fp16, bf16"),
    ({"comm_hook": "fp16", "comm_state_option": {"matrix_approximation_rank": 2}}, "PowerSGDState's arguments"),
    ({"comm_hook": "power_sgd", "comm_state_option": {"rank": 2}}, "comm_state_option: "),
])
def test_a_ddp_communication_hook_pytorch_lacks_is_refused_at_construction(kwargs, why):
    with pytest.raises(ConfigError, match=re.escape(why)):
        Accelerator(kwargs_handlers=[convoy.DistributedDataParallelKwargs(**kwargs)])
    hooks = convoy.DDPCommunicationHookType
    assert hooks("power_sgd") is hooks.POWER_SGD and str(hooks.FP16) == f"{hooks.FP16}" == "fp16"  # as Accelerate's
    assert "bf16" in hooks and "fp8" not in hooks and hooks.list()[:3] == ["no", "fp16", "bf16"]
    with pytest.raises(ConfigError, match=re.escape(why)):  # through strategy_options: at construction too
        Accelerator(strategy="ddp", strategy_options=kwargs)


def test_notebook_launcher_checks_accelerates_extra_arguments_before_starting():
    with pytest.raises(ConfigError, match="rdzv_backend='tcp'"):
        convoy.notebook_launcher(print, rdzv_backend="tcp")
    # a rendezvous endpoint on one machine is accepted (and not needed): the next argument is what is refused
    with pytest.raises(ConfigError, match=re.escape("notebook_launcher(max_restarts=-1)")):
        convoy.notebook_launcher(print, rdzv_endpoint="localhost:29400", max_restarts=-1)
    with pytest.raises(NotSupportedYetError, match="log_line_prefix_template"):
        convoy.notebook_launcher(print, log_line_prefix_template="[${rank}]")


def test_free_operations_in_one_process_keep_accelerates_defaults():
    t = torch.tensor([1.0, 4.0])
    assert torch.equal(convoy.reduce(t), t) and torch.equal(convoy.reduce(t, "max", scale=2.0), t * 2)
    with pytest.raises(ConfigError, match="'prod'"):
        convoy.reduce(t, "prod")
    assert convoy.gather_object({"a": 1, "b": 2}) == ["a", "b"] and convoy.gather_object(5) == [5]
    assert convoy.broadcast_object_list([1, 2]) == [1, 2]
    convoy.set_seed(3)
    first = torch.rand(2)
    convoy.set_seed(3)
    assert torch.equal(first, torch.rand(2))
    shard = convoy.prepare_data_loader(torch.utils.data.DataLoader(range(8), batch_size=2), num_processes=2,
                                       process_index=1)
    assert [b.tolist() for b in shard] == [[2, 3], [6, 7]]
    moved = convoy.send_to_device({"x": t, "keep": t, "n": 1}, "cpu", skip_keys="keep")
    assert moved["keep"] is t and moved["n"] == 1


def test_trigger_hooks_save_free_memory_and_unwrap(tmp_path):
    accelerator = Accelerator(project_dir=str(tmp_path))
    assert accelerator.check_trigger() is False
    accelerator.set_trigger()
    assert accelerator.check_trigger() is True and accelerator.check_trigger() is False
    calls = []

    def save_hook(models, weights, output_dir):  # e.g. diffusers: save_pretrained(output_dir / "unet")
        (Path(output_dir) / "unet").mkdir()
        (Path(output_dir) / "unet" / "config.json").write_text("{}")
        calls.append(("save", len(models), len(weights)))

    handle = accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(lambda m, d: calls.append(("load", len(m), d)))
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    where = accelerator.save_state()
    assert (Path(where) / "unet" / "config.json").read_text() == "{}"  # the hook's files are in the checkpoint
    accelerator.load_state()
    handle.remove()
    accelerator.save_state()
    assert calls == [("save", 1, 1), ("load", 1, where)]
    accelerator.save({"w": torch.ones(1)}, tmp_path / "obj.pt")
    assert torch.load(tmp_path / "obj.pt")["w"].item() == 1.0
    compiled = torch.compile(model)
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert accelerator.unwrap_model(compiled) is compiled and compiled._orig_mod is model
    assert accelerator.free_memory(model, compiled) == [None, None] and accelerator._models == []


@pytest.mark.slow
def test_accelerate_names_on_two_cpu_processes():
    result = run_script(SCRIPTS / "accelerate_names.py", nproc=2)
    assert result.returncode == 0, result.output[-4000:]
    assert result.output.count("ACCELERATE NAMES OK") == 2, result.output[-3000:]


@pytest.mark.slow
def test_notebook_launcher_runs_the_function_on_two_cpu_processes():
    import sys

    from tests import processes

    # CPU processes where no accelerator is visible: the notebook's process hides them (on a GPU box too)
    out = processes.run([sys.executable, str(SCRIPTS / "notebook_launch.py")], capture_output=True, text=True,
                        env=cpu_env(), timeout=120)
    assert "RESULT (0, 2, 'DistributedType.MULTI_CPU', 7)" in out.stdout, out.stdout + out.stderr[-3000:]


def test_notebook_launcher_with_more_processes_than_gpus_is_one_error_saying_what_to_do(inventory_path, monkeypatch):
    # a one-GPU box: Accelerate starts both processes and rank 1 dies on cuda:1; convoy starts none
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("1xh100")))
    with pytest.raises(ConfigError) as err:
        convoy.notebook_launcher(print, args=("never printed",), num_processes=2)
    assert str(err.value) == (
        "notebook_launcher(num_processes=2) starts one process per accelerator, but 1 is visible (GPU 0 (NVIDIA H100 "
        "80GB HBM3)); give num_processes=1, or for 2 CPU processes call convoy.launch(function, args, devices=0, "
        "nproc_per_node=2)")
    for bad in (0, "2", 1.5, True):
        with pytest.raises(ConfigError, match=re.escape(f"notebook_launcher(num_processes={bad!r}): give a whole")):
            convoy.notebook_launcher(print, num_processes=bad)
