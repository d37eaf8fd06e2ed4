"""Accelerate names that stand for something convoy does another way: importable, so a script's imports work,
and one ``NotSupportedYetError`` line naming what to do instead when used.

    from convoy.utils import DummyOptim, DummyScheduler     # the DeepSpeed-config placeholders
    optimizer = DummyOptim(model.parameters(), lr=1e-3)      # made as in Accelerate ...
    accelerator.prepare(model, optimizer)                    # ... built from the DeepSpeed config's section

``prepare`` replaces a ``DummyOptim`` / ``DummyScheduler`` with the torch optimizer and schedule the
``DeepSpeedPlugin(hf_ds_config=...)``'s ``optimizer`` / ``scheduler`` sections describe
(``convoy.train.deepspeed_sections``), or those of a ``convoy launch --config_file``'s ``deepspeed_config_file``.
Accelerate's ``deepspeed_with_config_support.py`` picks ``DummyOptim`` only when
``accelerator.state.deepspeed_plugin.deepspeed_config`` has an ``optimizer`` section: convoy's state holds the
DeepSpeed config in effect there (``convoy.train.deepspeed_view``), None when none was given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from convoy.errors import NotSupportedYetError

__all__ = [
    "DummyOptim", "DummyScheduler", "REFUSED", "MegatronLMPlugin",
    "MegatronLMDummyScheduler", "MegatronLMDummyDataLoader", "GPTTrainStep",
    "avg_losses_across_data_parallel_group", "DeepSpeedSequenceParallelConfig",
    "BnbQuantizationConfig", "load_and_quantize_model", "merge_fsdp_weights", "write_basic_config",
    "PrepareForLaunch", "init_empty_weights", "init_on_device", "cpu_offload", "cpu_offload_with_hook",
    "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch", "infer_auto_device_map",
    "load_checkpoint_in_model", "prepare_pippy", "debug_launcher",
]


class DummyOptim:
    """Accelerate's stand-in for the optimizer a DeepSpeed JSON's ``optimizer`` section describes. Made as in
    Accelerate; ``accelerator.prepare`` builds the section's optimizer (AdamW, Adam) from it."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Accelerate's stand-in for the scheduler a DeepSpeed JSON's ``scheduler`` section describes. Made as in
    Accelerate; ``accelerator.prepare`` builds the section's schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR)."""

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


REFUSED: dict[str, str] = {
    "MegatronLMPlugin": "Megatron-LM is not run by convoy; give Accelerator(parallelism=...) (tp, pp) on PyTorch's "
                        "engines",
    "MegatronLMDummyScheduler": "Megatron-LM is not run by convoy; make a torch.optim.lr_scheduler in the script",
    "MegatronLMDummyDataLoader": "Megatron-LM is not run by convoy; prepare a torch DataLoader",
    "GPTTrainStep": "Megatron-LM is not run by convoy; compute the loss in the script",
    "avg_losses_across_data_parallel_group": "Megatron-LM is not run by convoy; use accelerator.reduce(loss, 'mean')",
    "DeepSpeedSequenceParallelConfig": "DeepSpeed's Ulysses sequence parallelism is not run by convoy; use "
                                       "Accelerator(parallelism=...) without sp",
    "BnbQuantizationConfig": "bitsandbytes quantized loading is not part of convoy; load the model with transformers' "
                             "BitsAndBytesConfig",
    "load_and_quantize_model": "bitsandbytes quantized loading is not part of convoy; load the model with "
                               "transformers' BitsAndBytesConfig",
    "merge_fsdp_weights": "convoy's checkpoints are torch.distributed.checkpoint directories that load at any layout; "
                          "use accelerator.save_model(model, dir) for one safetensors file",
    "write_basic_config": "write convoy's own settings with `convoy config`, or pass flags to `convoy launch`",
    "PrepareForLaunch": "use convoy.launch(function, args, ...) or convoy.notebook_launcher",
    # top-level accelerate names (big-model inference, pippy, the debug launcher)
    "init_empty_weights": "create the model under `with torch.device('meta'):` and load its weights with "
                          "accelerator.load_state or transformers' from_pretrained",
    "init_on_device": "create the model under `with torch.device(device):`",
    "cpu_offload": "big-model inference hooks are not part of convoy; for training, strategy_options={'cpu_offload': "
                   "True} offloads FSDP2's parameters",
    "cpu_offload_with_hook": "big-model inference hooks are not part of convoy; for training, "
                             "strategy_options={'cpu_offload': True} offloads FSDP2's parameters",
    "disk_offload": "big-model inference hooks are not part of convoy; load the model with transformers' device_map",
    "dispatch_model": "big-model inference hooks are not part of convoy; load the model with transformers' device_map",
    "load_checkpoint_and_dispatch": "big-model inference hooks are not part of convoy; load the model with "
                                    "transformers' from_pretrained(device_map=...)",
    "infer_auto_device_map": "big-model inference hooks are not part of convoy; convoy plan estimates a model's "
                             "memory per layout",
    "load_checkpoint_in_model": "use accelerator.load_state(dir) for convoy's checkpoints, or "
                                "model.load_state_dict(safetensors.torch.load_file(path))",
    "prepare_pippy": "give Accelerator(parallelism='pp=N') to train (or run) the model in N pipeline stages",
    "debug_launcher": "use convoy.launch(function, args, devices=0, nproc_per_node=2) for CPU processes",
}
"""Accelerate names with no convoy meaning -> what to do instead (docs/migrating.md lists them)."""


def _refused(name: str) -> Any:
    why = REFUSED[name]

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotSupportedYetError(f"{name} is not supported by convoy: {why}")

    if name[0].isupper():  # a class in Accelerate: a class here, so isinstance() checks in scripts still work
        return type(name, (), {"__init__": refuse, "__doc__": f"Refused when made: {why}.",
                               "__module__": __name__})
    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused when called: {why}."
    return refuse


MegatronLMPlugin = _refused("MegatronLMPlugin")
MegatronLMDummyScheduler = _refused("MegatronLMDummyScheduler")
MegatronLMDummyDataLoader = _refused("MegatronLMDummyDataLoader")
GPTTrainStep = _refused("GPTTrainStep")
avg_losses_across_data_parallel_group = _refused("avg_losses_across_data_parallel_group")
DeepSpeedSequenceParallelConfig = _refused("DeepSpeedSequenceParallelConfig")
BnbQuantizationConfig = _refused("BnbQuantizationConfig")
load_and_quantize_model = _refused("load_and_quantize_model")
merge_fsdp_weights = _refused("merge_fsdp_weights")
write_basic_config = _refused("write_basic_config")
PrepareForLaunch = _refused("PrepareForLaunch")
init_empty_weights = _refused("init_empty_weights")
init_on_device = _refused("init_on_device")
cpu_offload = _refused("cpu_offload")
cpu_offload_with_hook = _refused("cpu_offload_with_hook")
disk_offload = _refused("disk_offload")
dispatch_model = _refused("dispatch_model")
load_checkpoint_and_dispatch = _refused("load_checkpoint_and_dispatch")
infer_auto_device_map = _refused("infer_auto_device_map")
load_checkpoint_in_model = _refused("load_checkpoint_in_model")
prepare_pippy = _refused("prepare_pippy")
debug_launcher = _refused("debug_launcher")
assert sorted(REFUSED) == sorted(__all__[3:])  # one entry per name above
