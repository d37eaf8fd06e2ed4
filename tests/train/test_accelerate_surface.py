"""Accelerate's public surface, read from the installed ``accelerate`` package, against convoy's: every name a
script written for Accelerate reads exists under ``convoy`` (the same meaning, or one line saying what to do
instead), unless it is in a documented refusal list below (docs/migrating.md, "Every name").

Accelerate is a test dependency; its ``Accelerator`` is made on one CPU process to list its instance attributes.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import convoy
from convoy import Accelerator, PartialState
from convoy.errors import ConfigError, NotSupportedYetError

accelerate = pytest.importorskip("accelerate")

REFUSED_ACCELERATOR = {
    "flag_tensor": "the tensor behind set_trigger()/check_trigger(), Accelerate's internal; use those two",
    "deepspeed_ulysses_dl_adapter": "DeepSpeed's Ulysses sequence parallelism is not run by convoy",
}
"""Attributes of Accelerate's ``Accelerator`` that convoy refuses, with why (docs/migrating.md)."""

LANDING = {"device_mesh", "parallelism_config"}
"""Names not built yet: ``AcceleratorState.device_mesh`` and ``.parallelism_config`` (the Accelerator's
``torch_device_mesh`` and ``parallelism_config`` hold them)."""

EXAMPLE_UTILS = [
    # what Accelerate's examples (examples/*.py, examples/by_feature/*.py, examples/inference) and its how-to guides
    # import from accelerate.utils
    "set_seed", "find_executable_batch_size", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
    "DummyOptim", "DummyScheduler", "is_npu_available", "is_xpu_available", "is_mps_available", "is_cuda_available",
    "is_schedulefree_available", "is_tensorboard_available", "is_wandb_available", "ProfileKwargs",
    "MegatronLMDummyScheduler", "ParallelismConfig", "FullyShardedDataParallelPlugin", "DeepSpeedPlugin",
    "TorchDynamoPlugin", "gather_object", "tqdm", "PrepareForLaunch", "patch_environment", "release_memory",
    "write_basic_config", "merge_fsdp_weights", "LoggerType", "GradientAccumulationPlugin", "ProjectConfiguration",
    "InitProcessGroupKwargs", "GradScalerKwargs", "AutocastKwargs", "DataLoaderConfiguration", "broadcast",
    "broadcast_object_list", "gather", "reduce", "pad_across_processes", "send_to_device", "DistributedType",
    "BnbQuantizationConfig", "load_and_quantize_model", "MegatronLMDummyDataLoader", "GPTTrainStep",
    "avg_losses_across_data_parallel_group", "DeepSpeedSequenceParallelConfig", "synchronize_rng_states",
]
LANDING_UTILS = {"AORecipeKwargs", "TERecipeKwargs", "FP8RecipeKwargs", "TorchContextParallelConfig"}
"""accelerate.utils names the examples import that the float8 and context-parallel issues (37/39) add."""

MODULES = {  # Accelerate's module -> the names scripts import from it
    "logging": ["get_logger", "MultiProcessAdapter"],
    "local_sgd": ["LocalSGD"],
    "state": ["AcceleratorState", "PartialState", "GradientState"],
    "data_loader": ["skip_first_batches", "prepare_data_loader", "SeedableRandomSampler", "IterableDatasetShard"],
}


def _public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


@pytest.fixture(scope="module")
def accelerate_surface():
    """Accelerate's Accelerator, AcceleratorState and PartialState names, from one instance on this process."""
    made = accelerate.Accelerator(cpu=True)
    surface = {"Accelerator": _public(made), "AcceleratorState": _public(made.state),
               "PartialState": _public(accelerate.PartialState()), "GradientState": _public(made.gradient_state)}
    accelerate.state.AcceleratorState._reset_state(True)
    return surface


@pytest.fixture
def ours(accelerator_in_this_process):
    return Accelerator()


def _lacking(theirs: set[str], ours: object, *allowed: object) -> list[str]:
    known = set().union(*allowed)
    return sorted(n for n in theirs - _public(ours) if n not in known)


def test_every_accelerator_attribute_exists_or_is_a_documented_refusal(accelerate_surface, ours):
    assert _lacking(accelerate_surface["Accelerator"], ours, REFUSED_ACCELERATOR, LANDING) == []


def test_every_state_attribute_exists_or_is_a_documented_refusal(accelerate_surface, ours):
    assert _lacking(accelerate_surface["AcceleratorState"], ours.state, LANDING) == []
    assert _lacking(accelerate_surface["PartialState"], PartialState(), LANDING) == []
    assert _lacking(accelerate_surface["GradientState"], ours.gradient_state) == []


def test_every_top_level_name_exists():
    assert sorted(set(accelerate.__all__ if hasattr(accelerate, "__all__") else _public(accelerate))
                  - {"__version__", "utils", "rich", "accelerator", "big_modeling", "data_loader", "hooks",
                     "inference", "launchers", "logging", "optimizer", "scheduler", "state", "tracking",
                     "checkpointing", "local_sgd", "memory_utils", "parallelism_config", "commands", "test_utils"}
                  - set(convoy.__all__)) == []


def test_every_utils_name_the_examples_import_exists():
    import convoy.utils

    # the list names real names (DummyOptim/DummyScheduler reach accelerate.utils only with deepspeed installed)
    homes = [accelerate.utils, importlib.import_module("accelerate.utils.deepspeed")]
    assert [n for n in EXAMPLE_UTILS if not any(hasattr(home, n) for home in homes)] == []
    assert [n for n in EXAMPLE_UTILS if n not in convoy.utils.__all__ or not hasattr(convoy.utils, n)] == []
    assert LANDING_UTILS <= set(dir(accelerate.utils))


@pytest.mark.parametrize("module, names", sorted(MODULES.items()))
def test_accelerates_modules_exist_under_convoy(module, names):
    theirs = importlib.import_module(f"accelerate.{module}")
    ours = importlib.import_module(f"convoy.{module}")
    assert [n for n in names if not hasattr(theirs, n)] == []
    assert [n for n in names if not hasattr(ours, n)] == []


def test_refused_names_are_importable_and_say_what_to_do_in_one_line():
    import convoy.utils
    from convoy.train.placeholders import REFUSED

    for name, why in REFUSED.items():
        where = convoy.utils if hasattr(convoy.utils, name) else convoy
        with pytest.raises(NotSupportedYetError) as err:
            getattr(where, name)()
        assert str(err.value) == f"{name} is not supported by convoy: {why}" and "\n" not in str(err.value)


def test_placeholders_are_made_as_in_accelerate_and_need_a_deepspeed_section(ours):
    from convoy.utils import DummyOptim, DummyScheduler

    model = torch.nn.Linear(2, 2)
    optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    scheduler = DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    assert (optimizer.lr, optimizer.weight_decay, optimizer.kwargs) == (3e-4, 0.1, {"betas": (0.9, 0.95)})
    assert (scheduler.total_num_steps, scheduler.warmup_num_steps) == (10, 2)
    assert ours.state.deepspeed_plugin is None and ours.deepspeed_plugin is None  # the script's torch branch
    # built from a DeepSpeedPlugin's sections (tests/train/test_deepspeed_sections.py); without one, one line
    with pytest.raises(ConfigError, match=r"prepare\(DummyOptim\): the DeepSpeed config has no 'optimizer' section"):
        ours.prepare(model, optimizer)
    with pytest.raises(ConfigError, match=r"prepare\(DummyScheduler\): give its DummyOptim"):
        ours.prepare(scheduler)


def test_printouts_match_accelerates_on_one_process(ours):
    """What a script logs or compares: str() of the distributed type, the device, the state."""
    theirs = accelerate.Accelerator(cpu=True)
    try:
        assert str(ours.distributed_type) == str(theirs.distributed_type) == "DistributedType.NO"
        assert f"{ours.distributed_type}" == f"{theirs.distributed_type}"
        assert str(ours.device) == str(theirs.device) and str(ours.state) == str(theirs.state)
        assert ours.rng_types == theirs.rng_types and ours.log_with == theirs.log_with
        for name in ("native_amp", "multi_device", "is_fsdp2", "dispatch_batches", "non_blocking",
                     "use_seedable_sampler", "use_stateful_dataloader", "deepspeed_plugin", "ddp_handler",
                     "init_handler", "scaler_handler", "autocast_handler", "profile_handler", "has_lomo_optimizer"):
            assert getattr(ours, name) == getattr(theirs, name), name
    finally:
        accelerate.state.AcceleratorState._reset_state(True)
