"""Accelerate's ``accelerate.utils`` import path, so that ``from accelerate.utils import ...`` needs only its package
name changed. The objects live in convoy's own modules (``convoy.train.*``); this module holds nothing of its own.
docs/migrating.md lists every name: the same, different (how), or refused (why).

    from convoy.utils import set_seed, find_executable_batch_size, ProfileKwargs, gather_object, tqdm
"""

from convoy.errors import DistributedOperationError as DistributedOperationException
from convoy.train.accelerator import ProjectConfiguration
from convoy.train.availability import (
    is_aim_available,
    is_bf16_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_hpu_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_rich_available,
    is_safetensors_available,
    is_schedulefree_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_xla_available,
    is_torchao_available,
    is_tqdm_available,
    is_trackio_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)
from convoy.train.data import DataLoaderConfiguration
from convoy.train.environment import clear_environment, patch_environment
from convoy.train.kwargs_handlers import (
    AORecipeKwargs,
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)
from convoy.train.memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size
from convoy.train.operations import (
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
    set_seed,
    synchronize_rng_states,
)
from convoy.train.placeholders import (
    BnbQuantizationConfig,
    DeepSpeedSequenceParallelConfig,
    DummyOptim,
    DummyScheduler,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMPlugin,
    PrepareForLaunch,
    avg_losses_across_data_parallel_group,
    load_and_quantize_model,
    merge_fsdp_weights,
    write_basic_config,
)
from convoy.train.plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchDynamoPlugin,
)
from convoy.train.process_view import DistributedType
from convoy.train.profiling import ProfileKwargs
from convoy.train.progress import tqdm
from convoy.train.tracking import LoggerType

__all__ = [
    # plugins and kwargs handlers (convoy.train.plugins, convoy.train.kwargs_handlers, convoy.train.profiling)
    "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ParallelismConfig", "TorchContextParallelConfig",
    "TorchDynamoPlugin", "AORecipeKwargs", "GradientAccumulationPlugin",
    "KwargsHandler", "DistributedDataParallelKwargs", "DDPCommunicationHookType", "InitProcessGroupKwargs",
    "GradScalerKwargs", "AutocastKwargs", "ProfileKwargs", "ProjectConfiguration", "DataLoaderConfiguration",
    "DistributedType", "LoggerType",
    # operations (convoy.train.operations)
    "set_seed", "synchronize_rng_states", "gather", "gather_object", "broadcast", "broadcast_object_list", "reduce",
    "pad_across_processes", "send_to_device", "copy_tensor_to_devices", "DistributedOperationException",
    # memory (convoy.train.memory), progress, environment
    "find_executable_batch_size", "should_reduce_batch_size", "release_memory", "clear_device_cache", "tqdm",
    "patch_environment", "clear_environment",
    # what is installed and usable (convoy.train.availability)
    "is_aim_available", "is_bf16_available", "is_bnb_available", "is_clearml_available", "is_comet_ml_available",
    "is_cuda_available", "is_datasets_available", "is_deepspeed_available", "is_dvclive_available",
    "is_hpu_available", "is_matplotlib_available", "is_mlflow_available", "is_mlu_available", "is_mps_available",
    "is_musa_available", "is_npu_available", "is_pandas_available", "is_peft_available", "is_rich_available",
    "is_safetensors_available", "is_schedulefree_available", "is_swanlab_available", "is_tensorboard_available",
    "is_timm_available", "is_torch_xla_available", "is_torchao_available", "is_tqdm_available",
    "is_trackio_available", "is_transformers_available", "is_wandb_available", "is_xpu_available",
    # placeholders and refused names (convoy.train.placeholders): importable, one line when used
    "DummyOptim", "DummyScheduler", "MegatronLMPlugin", "MegatronLMDummyScheduler", "MegatronLMDummyDataLoader",
    "GPTTrainStep", "avg_losses_across_data_parallel_group", "DeepSpeedSequenceParallelConfig",
    "BnbQuantizationConfig", "load_and_quantize_model", "merge_fsdp_weights", "write_basic_config",
    "PrepareForLaunch",
]
