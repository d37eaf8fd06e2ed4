"""The command table itself: help, version, typos, and the one place errors become exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import convoy
from convoy.cli.main import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"convoy {convoy.__version__}"


def test_typo_suggests_the_command(capsys):
    assert main(["lanch"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "convoy: unknown command 'lanch' (did you mean 'launch'?)"


def test_unknown_command_without_a_near_match_lists_commands(capsys):
    assert main(["zzz"]) == 2
    assert "commands: devices, select" in capsys.readouterr().err


def test_unknown_top_level_option_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "convoy", "--frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unrecognized arguments: --frobnicate" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_public_surface_snapshot():
    # Changing this list is a change of convoy's public API: say so in the release notes.
    assert sorted(convoy.__all__) == sorted([
        "__version__", "ConvoyError", "DeviceSpecError", "InventoryError", "SelectionError", "LeaseError",
        "VisibilityError", "ConfigError", "LaunchError", "RankFailedError", "StrategyError", "CheckpointError",
        "PlanError", "CollectiveTimeoutError", "NotSupportedYetError", "parse_devices", "Device", "Inventory",
        "discover", "select_devices", "Selection", "visibility_env", "lease_devices", "launch", "Accelerator",
        "plan",
        # Accelerate's names (issue 13; docs/migrating.md): state, plugins, kwargs handlers, free operations
        "DistributedOperationError", "notebook_launcher", "DataLoaderConfiguration", "ProjectConfiguration",
        "PartialState", "AcceleratorState", "GradientState", "DistributedType", "GradientAccumulationPlugin",
        "DistributedDataParallelKwargs", "DDPCommunicationHookType", "InitProcessGroupKwargs", "GradScalerKwargs",
        "AutocastKwargs", "AORecipeKwargs", "FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "ParallelismConfig",
        "TorchDynamoPlugin",
        "set_seed", "synchronize_rng_states", "gather", "gather_object", "broadcast", "broadcast_object_list",
        "reduce", "pad_across_processes", "send_to_device", "copy_tensor_to_devices",
        "DistributedOperationException", "prepare_data_loader", "skip_first_batches", "SeedableRandomSampler",
        # issue 40: the rest of Accelerate's top level; the big-model and pippy names are refused when used
        "ProfileKwargs", "find_executable_batch_size", "is_rich_available", "init_empty_weights", "init_on_device",
        "cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch",
        "infer_auto_device_map", "load_checkpoint_in_model", "prepare_pippy", "debug_launcher",
    ])


def test_error_types_refine_the_builtins():
    assert issubclass(convoy.DeviceSpecError, ValueError)
    assert issubclass(convoy.ConfigError, ValueError)
    assert issubclass(convoy.LaunchError, RuntimeError)
    assert issubclass(convoy.NotSupportedYetError, NotImplementedError)
    assert all(issubclass(getattr(convoy, n), convoy.ConvoyError) for n in convoy.__all__ if n.endswith("Error"))


@pytest.mark.parametrize("argv", [["launch", "--dry-run", "--num_processes=--", "x.py"],
                                  ["launch", "--dry-run", "--exclude=--", "x.py"], ["select", "--exclude=--", "1"],
                                  ["plan", "--params=--"]])
def test_a_flag_given_double_dash_as_its_value_is_one_line(argv, capsys):
    """Python 3.11's argparse turns --flag=-- into an empty list, which crashed launch with a traceback."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "expected one argument" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, env, code", [
    # 2: wrong here, and wrong however often it is retried
    (["select", "2", "--order", "memory"], {}, 2),                                   # a value argparse refuses
    (["launch", "--dry-run", "--devices", "0", "--virtual-local-rank", "x.py"], {}, 2),  # not supported yet
    (["select", "9"], {"CONVOY_INVENTORY": "4_mixed_pcie"}, 2),                      # devices it does not have
    (["plan", "--params", "1e9", "--hardware", "1xH100-80GB", "--plot", "p.png"], {"NO_MATPLOTLIB": "1"}, 2),
    # 1: could run, did not this time
    (["select", "1", "--free"], {"CONVOY_INVENTORY": "2_busy_exclusive"}, 1),  # none free now
])
def test_one_exit_code_rule(argv, env, code, monkeypatch, tmp_path, capsys):
    """Usage errors were 2 in docs/launching.md but 1 for `--plot` without matplotlib and for an unsupported
    combination: one rule now (docs/launching.md, "Exit codes")."""
    import importlib.util

    from tests.conftest import INVENTORIES

    monkeypatch.chdir(tmp_path)
    if "CONVOY_INVENTORY" in env:
        monkeypatch.setenv("CONVOY_INVENTORY", str(INVENTORIES / f"{env['CONVOY_INVENTORY']}.json"))
    if "NO_MATPLOTLIB" in env:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else
                            real(name, *a))
    try:
        got = main(argv)
    except SystemExit as exc:
        got = exc.code
    err = capsys.readouterr().err
    assert got == code and err.startswith("convoy:") and err.count("\n") == 1, err
