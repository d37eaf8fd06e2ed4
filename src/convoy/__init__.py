"""convoy: from "which accelerators should this job use?" to "it is training on them".

    import convoy
    convoy.parse_devices("1,3", 4)            # -> [1, 3]
    sel = convoy.select_devices(2, free=True)  # the devices, their environment, and why
    accelerator = convoy.Accelerator()         # Accelerate's quick-tour API on PyTorch's engines

``import convoy`` is cheap: names are resolved on first use (PEP 562), so the device layer never pulls in
torch, and torch loads only when a torch-facing name (``Accelerator``, ``launch``, ...) is first touched.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it. The one list of convoy's top-level API.
_LAZY: dict[str, str] = {
    # errors
    "ConvoyError": "convoy.errors",
    "DeviceSpecError": "convoy.errors",
    "InventoryError": "convoy.errors",
    "SelectionError": "convoy.errors",
    "LeaseError": "convoy.errors",
    "VisibilityError": "convoy.errors",
    "ConfigError": "convoy.errors",
    "LaunchError": "convoy.errors",
    "RankFailedError": "convoy.errors",
    "StrategyError": "convoy.errors",
    "CheckpointError": "convoy.errors",
    "PlanError": "convoy.errors",
    "CollectiveTimeoutError": "convoy.errors",
    "NotSupportedYetError": "convoy.errors",
    "DistributedOperationError": "convoy.errors",
    # devices (torch-free)
    "parse_devices": "convoy.devices.spec",
    "Device": "convoy.devices.inventory",
    "Inventory": "convoy.devices.inventory",
    "discover": "convoy.devices.discovery",
    "select_devices": "convoy.devices.selection",
    "Selection": "convoy.devices.selection",
    "visibility_env": "convoy.devices.visibility",
    "lease_devices": "convoy.devices.lease",
    # launch
    "launch": "convoy.launch.function",
    "notebook_launcher": "convoy.launch.notebook",
    # train: the Accelerator and Accelerate's other names (docs/migrating.md lists them)
    "Accelerator": "convoy.train.accelerator",
    "DataLoaderConfiguration": "convoy.train.data",
    "ProjectConfiguration": "convoy.train.accelerator",
    "PartialState": "convoy.train.process_view",
    "AcceleratorState": "convoy.train.process_view",
    "GradientState": "convoy.train.process_view",
    "DistributedType": "convoy.train.process_view",
    "GradientAccumulationPlugin": "convoy.train.kwargs_handlers",
    "DistributedDataParallelKwargs": "convoy.train.kwargs_handlers",
    "DDPCommunicationHookType": "convoy.train.kwargs_handlers",
    "InitProcessGroupKwargs": "convoy.train.kwargs_handlers",
    "GradScalerKwargs": "convoy.train.kwargs_handlers",
    "AutocastKwargs": "convoy.train.kwargs_handlers",
    "AORecipeKwargs": "convoy.train.kwargs_handlers",
    "FullyShardedDataParallelPlugin": "convoy.train.plugins",
    "DeepSpeedPlugin": "convoy.train.plugins",
    "ParallelismConfig": "convoy.train.plugins",
    "TorchDynamoPlugin": "convoy.train.plugins",
    "set_seed": "convoy.train.operations",
    "synchronize_rng_states": "convoy.train.operations",
    "gather": "convoy.train.operations",
    "gather_object": "convoy.train.operations",
    "broadcast": "convoy.train.operations",
    "broadcast_object_list": "convoy.train.operations",
    "reduce": "convoy.train.operations",
    "pad_across_processes": "convoy.train.operations",
    "send_to_device": "convoy.train.operations",
    "copy_tensor_to_devices": "convoy.train.operations",
    "DistributedOperationException": "convoy.train.operations",
    "prepare_data_loader": "convoy.train.data",
    "skip_first_batches": "convoy.train.data",
    "SeedableRandomSampler": "convoy.train.data",
    "ProfileKwargs": "convoy.train.profiling",
    "find_executable_batch_size": "convoy.train.memory",
    "is_rich_available": "convoy.train.availability",
    # Accelerate's top-level names with no convoy meaning: importable, one line saying what to use when used
    "init_empty_weights": "convoy.train.placeholders",
    "init_on_device": "convoy.train.placeholders",
    "cpu_offload": "convoy.train.placeholders",
    "cpu_offload_with_hook": "convoy.train.placeholders",
    "disk_offload": "convoy.train.placeholders",
    "dispatch_model": "convoy.train.placeholders",
    "load_checkpoint_and_dispatch": "convoy.train.placeholders",
    "infer_auto_device_map": "convoy.train.placeholders",
    "load_checkpoint_in_model": "convoy.train.placeholders",
    "prepare_pippy": "convoy.train.placeholders",
    "debug_launcher": "convoy.train.placeholders",
    # plan
    "plan": "convoy.plan.api",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'convoy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
