"""The settings files reach ``convoy launch`` and the ``Accelerator`` (below flags and CONVOY_* variables)."""

from __future__ import annotations

import importlib

import pytest

from convoy.errors import ConfigError


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("CONFIG", "STRATEGY", "MIXED_PRECISION", "COLLECTIVE_TIMEOUT", "NNODES"):
        monkeypatch.delenv(f"CONVOY_{name}", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _launch_request(argv):
    from convoy.cli.main import _command_parser

    module = importlib.import_module("convoy.cli.launch")
    parser = _command_parser("launch", module)
    parse = getattr(module, "parse_args", None)
    args = parse(parser, argv) if parse else parser.parse_args(argv)
    return module.build_request(args)[0]


def test_launch_takes_unset_flags_from_the_project_file(project):
    (project / "convoy.toml").write_text('mixed_precision = "bf16"\nstrategy = "zero1"\nnnodes = "1"\n')
    request = _launch_request(["--strategy", "ddp", "train.py"])
    assert request.settings.mixed_precision == "bf16"  # from the file
    assert request.settings.strategy == "ddp"  # the flag wins


def test_launch_stops_on_a_malformed_file(project):
    (project / "convoy.toml").write_text('mixed_precison = "bf16"\n')
    with pytest.raises(ConfigError, match=r"convoy.toml, line 1, key 'mixed_precison': unknown key"):
        _launch_request(["train.py"])


def test_accelerator_settings_read_the_files_below_the_environment(project):
    from convoy.train.settings import resolve_settings

    (project / "convoy.toml").write_text('strategy = "zero2"\ncollective_timeout = 42\n')
    settings = resolve_settings(env={"XDG_CONFIG_HOME": str(project / "xdg"), "CONVOY_STRATEGY": "ddp"}, cpu=True)
    assert settings.strategy == "ddp" and settings.collective_timeout_s == 42.0
    assert resolve_settings(explicit={"strategy": "fsdp"}, env={}, cpu=True).strategy == "fsdp"


def test_accelerate_launchers_variable_beats_a_settings_file(project):
    # the environment (CONVOY_* or Accelerate's alias) is above the files, whichever variable says it
    from convoy.train.settings import resolve_settings

    (project / "convoy.toml").write_text('mixed_precision = "fp16"\nstrategy = "mine"\n')
    env = {"XDG_CONFIG_HOME": str(project / "xdg")}
    assert resolve_settings(env={**env, "ACCELERATE_MIXED_PRECISION": "bf16"}, cpu=True).mixed_precision == "bf16"
    assert resolve_settings(env=env, cpu=True).mixed_precision == "fp16"
    # a strategy the script registers may be named in a file or CONVOY_STRATEGY: only the launcher keeps to
    # convoy's own names
    assert resolve_settings(env=env, cpu=True).strategy == "mine"
    assert resolve_settings(env={"CONVOY_STRATEGY": "mine"}, cpu=True).strategy == "mine"


@pytest.mark.parametrize("text, argv, inventory, said", [
    ('strategy = "mine"\n', [], "8xh100_nvswitch", "strategy = 'mine' ({file}, line 1) is not one of convoy's"),
    ('\nnproc_per_node = "gpu"\n', [], None, "nproc_per_node = gpu ({file}, line 2) asks for one process per "),
    ('nproc_per_node = 9\n', [], "8xh100_nvswitch", "nproc_per_node = 9 ({file}, line 1) needs 9 devices"),
    ('devices = "0-9"\n', [], "8xh100_nvswitch", "devices = 0-9 ({file}, line 1): devices='0-9': range '0-9' reaches"),
    ('devices = "0,1"\nnproc_per_node = 3\n', [], "8xh100_nvswitch",
     "devices = 0,1 ({file}, line 1) selects 2 device(s) but nproc_per_node = 3 ({file}, line 2) asks for 3"),
    ('nnodes = "2"\n', ["--node-rank", "3"], "8xh100_nvswitch", "--node-rank 3 is outside nnodes = 2 ({file}, line 1)"),
    ('nnodes = "2"\nrdzv_backend = "c10d"\n', [], "8xh100_nvswitch",
     "rdzv_backend = c10d ({file}, line 2) needs --rdzv-endpoint"),
    ('nnodes = "2"\n', ["--num_processes", "3"], "8xh100_nvswitch", "not divisible by nnodes = 2 ({file}, line 1)"),
])
def test_a_checked_value_from_a_file_is_named_by_its_file_line_and_key(project, text, argv, inventory, said):
    """Issue: a value from convoy.toml refused after the flags were filled was named as the flag
    ('--nproc-per-node gpu asks for ...'), which the user never typed."""
    from convoy.errors import ConvoyError
    from convoy.launch.job import plan_job
    from tests.conftest import INVENTORIES

    (project / "convoy.toml").write_text(text)
    cpu = project / "cpu.json"
    cpu.write_text('{"devices": []}')
    env = {"XDG_CONFIG_HOME": str(project / "xdg"),
           "CONVOY_INVENTORY": str(INVENTORIES / f"{inventory}.json") if inventory else str(cpu)}
    with pytest.raises(ConvoyError) as info:
        plan_job(_launch_request([*argv, "train.py"]), env=env)
    message = str(info.value)
    assert said.format(file=project / "convoy.toml") in message, message
    assert not any(flag in message for flag in ("--nproc-per-node", "--strategy", "--nnodes", "--rdzv-backend",
                                                "--devices 0,1", "--devices 0-9")), message
