"""``convoy launch --config_file FILE``: an Accelerate config file's settings in the dry run, each with its key;
flags and torchrun's variables win over the file, the file over CONVOY_*; refusals are one line; Accelerate's
default file is named, never read."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from convoy.cli.main import main
from tests import processes

FILES = Path(__file__).resolve().parents[1] / "config" / "accelerate"
READABLE = ("fsdp1_questionnaire.yaml", "fsdp_template.yaml", "fsdp2_offload.yaml", "fsdp_integer_strategy.yaml",
            "fsdp_no_shard.yaml", "fsdp_hybrid_two_machines.yaml", "fsdp2_parallelism.yaml", "deepspeed_inline.yaml",
            "deepspeed_zero3_file.yaml", "multi_gpu.yaml", "multi_node.yaml", "multi_node_c10d.yaml", "multi_cpu.yaml",
            "default_config.yaml")


@pytest.fixture
def box(inventory_path, monkeypatch, tmp_path):
    """An 8-GPU inventory, and a script to launch."""
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("8xh100_nvswitch")))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return str(script)


def dry_run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["launch", "--dry-run", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def config_lines(out: str) -> list[str]:
    """The plan's ``config:`` block, one value a line."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("config:")), None)
    if start is None:
        return []
    block = [lines[start][12:]]
    block += [line[12:] for line in lines[start + 1:] if line.startswith(" " * 12) and not line.startswith(" " * 13)]
    return block


@pytest.mark.parametrize("name", READABLE)
def test_every_readable_file_plans_a_launch(box, capsys, name):
    code, out, err = dry_run(capsys, "--config_file", str(FILES / name), box)
    assert code == 0, err
    assert all(re.search(rf"\({re.escape(name)}: |\(zero3\.json: ", line) for line in config_lines(out)), out


def test_an_fsdp_file_is_the_plan_with_each_keys_origin(box, capsys):
    code, out, err = dry_run(capsys, "--config-file", str(FILES / "fsdp_hybrid_two_machines.yaml"), box)
    assert code == 0, err
    name = "fsdp_hybrid_two_machines.yaml"
    assert config_lines(out) == [
        f"strategy = zero3 ({name}: fsdp_config.fsdp_sharding_strategy = HYBRID_SHARD)",
        f"parallelism = dp_replicate=2,dp_shard=4 ({name}: fsdp_config.fsdp_sharding_strategy = HYBRID_SHARD)",
        f"nnodes = 2 ({name}: num_machines = 2)", f"node_rank = 1 ({name}: machine_rank = 1)",
        f"rdzv_backend = static ({name}: rdzv_backend = static)",
        f"master_addr = 10.1.2.3 ({name}: main_process_ip = 10.1.2.3)",
        f"master_port = 29501 ({name}: main_process_port = 29501)",
        f"mixed_precision = bf16 ({name}: mixed_precision = bf16)",
        f"nproc_per_node = 4 ({name}: num_processes = 8)"]
    assert "nodes:      2 (this is node 1); 4 processes per node; world size 8" in out
    for line in ("CONVOY_STRATEGY=zero3", "CONVOY_PARALLELISM=dp_replicate=2,dp_shard=4", "CONVOY_MIXED_PRECISION=bf16",
                 "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29501", "RANK=4"):
        assert f"  {line}\n" in out, line
    assert "note: fsdp_hybrid_two_machines.yaml: fsdp_config.fsdp_auto_wrap_policy = TRANSFORMER_BASED_WRAP" in out


def test_a_deepspeed_files_gradient_clipping_reaches_the_ranks(box, capsys, monkeypatch):
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "deepspeed_clipping.yaml"), box)
    assert code == 0, err
    assert "gradient_clipping = 0.05 (deepspeed_clipping.yaml: deepspeed_config.gradient_clipping = 0.05)" in \
        config_lines(out) and "  CONVOY_GRADIENT_CLIPPING=0.05\n" in out
    monkeypatch.setenv("CONVOY_GRADIENT_CLIPPING", "2")  # a standing preference: the file named on the line wins
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "deepspeed_clipping.yaml"), box)
    assert code == 0 and "  CONVOY_GRADIENT_CLIPPING=0.05\n" in out, out
    monkeypatch.setenv("CONVOY_GRADIENT_CLIPPING", "-1")
    code, out, err = dry_run(capsys, box)
    assert code == 2 and err.count("\n") == 1 and "CONVOY_GRADIENT_CLIPPING: '-1' is not valid" in err, err


def test_strategy_options_reach_the_ranks(box, capsys):
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "fsdp2_offload.yaml"), box)
    assert code == 0, err
    assert '  CONVOY_STRATEGY_OPTIONS={"auto_wrap": ["Block"]}\n' in out and "  CONVOY_CPU_OFFLOAD=True\n" in out
    assert "cpu_offload = True (fsdp2_offload.yaml: fsdp_config.fsdp_offload_params = true)" in config_lines(out)
    assert "auto_wrap = Block (fsdp2_offload.yaml: fsdp_config.fsdp_transformer_layer_cls_to_wrap = Block)" in \
        config_lines(out)


def test_flags_and_torchruns_variables_win_over_the_file_and_the_file_over_convoys(box, capsys, monkeypatch):
    monkeypatch.setenv("CONVOY_STRATEGY", "zero1")  # a standing preference: below the file named on the line
    monkeypatch.setenv("CONVOY_NPROC_PER_NODE", "3")
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "fsdp_template.yaml"), box)
    assert code == 0, err
    assert "CONVOY_STRATEGY=zero3" in out and "2 processes per node" in out
    monkeypatch.delenv("CONVOY_NPROC_PER_NODE")  # beside --num_processes it would be a conflict, as without a file
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "fsdp_template.yaml"), "--strategy", "zero2",
                             "--mixed_precision", "no", "--num_processes", "4", box)
    assert code == 0, err
    assert "CONVOY_STRATEGY=zero2" in out and "CONVOY_MIXED_PRECISION=no" in out and "4 processes per node" in out
    assert not any(line.startswith(("strategy", "mixed_precision", "nproc")) for line in config_lines(out))
    monkeypatch.setenv("PET_NNODES", "1")  # torchrun's variable, set for this job as a flag would be
    monkeypatch.setenv("PET_NODE_RANK", "0")
    monkeypatch.setenv("PET_MASTER_ADDR", "127.0.0.1")
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "multi_node.yaml"), box)
    assert code == 0, err
    assert "nodes:      1 (this is node 0); 8 processes per node" in out and "PET_NNODES=1" in out
    assert "MASTER_ADDR=127.0.0.1 MASTER_PORT=9999" in out  # the file's port, torchrun's address


@pytest.mark.parametrize("name, code, words", [
    ("fp8.yaml", 2, "fp8.yaml: fp8_config.backend = TE: Transformer Engine fp8 is not in convoy"),
    ("megatron.yaml", 2, "megatron.yaml: megatron_lm_config = {...}: Megatron-LM is not in convoy"),
    ("tpu.yaml", 2, "tpu.yaml: distributed_type = XLA: TPUs (torch_xla) are not in convoy"),
])
def test_refused_files_exit_with_one_line_naming_the_key(box, capsys, name, code, words):
    got, out, err = dry_run(capsys, "--config_file", str(FILES / name), box)
    assert got == code and err.count("\n") == 1 and words in err and not out, err


def test_a_flag_that_cannot_take_the_files_option_is_one_line(box, capsys):
    code, _, err = dry_run(capsys, "--config_file", str(FILES / "fsdp2_offload.yaml"), "--strategy", "ddp", box)
    assert code == 2 and err.count("\n") == 1, err
    assert "cpu_offload = True (fsdp2_offload.yaml: fsdp_config.fsdp_offload_params = true) offloads FSDP2's " \
           "shards to host memory, and strategy 'ddp' keeps none" in err
    code, _, err = dry_run(capsys, "--config_file", "nowhere.yaml", box)
    assert code == 2 and "--config_file nowhere.yaml: no such file" in err


def test_accelerates_default_file_is_named_once_and_not_read(box, capsys, monkeypatch, tmp_path):
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text((FILES / "multi_node.yaml").read_text())
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, out, err = dry_run(capsys, "--devices", "2", box)
    assert code == 0
    assert err.count(f"Accelerate's default config {default} is not read; --config_file {default} would use it") == 1
    assert "nodes:      1 (this is node 0); 2 processes per node" in out and "config:" not in out
    code, out, err = dry_run(capsys, "--config_file", str(default), box)
    assert code == 0 and "is not read" not in err and "world size 8" in out


def test_the_file_is_read_without_torch_and_help_without_yaml(box, inventory_path):
    code = ("import sys; from convoy.cli.main import main; rc = main(['launch', '--dry-run', '--config_file', "
            f"{str(FILES / 'fsdp2_offload.yaml')!r}, {box!r}]); print('torch' in sys.modules, rc)")
    env = {"CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "PATH": "/usr/bin:/bin",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    done = processes.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip().endswith("False 0"), done.stdout + done.stderr
    code = ("import sys; from convoy.cli.main import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
            "print('yaml' in sys.modules)")
    out = processes.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
    assert out.strip().endswith("False"), out


def test_strategy_options_travel_to_the_ranks_and_back():
    from convoy.errors import ConfigError
    from convoy.launch.rank_env import ConvoyEnv, convoy_env, read_convoy_env

    sent = ConvoyEnv(strategy="zero3", strategy_options={"auto_wrap": ["Block", "Head"]})
    env = convoy_env(sent)
    assert env["CONVOY_STRATEGY_OPTIONS"] == '{"auto_wrap": ["Block", "Head"]}'
    assert read_convoy_env(env).strategy_options == {"auto_wrap": ("Block", "Head")}
    for raw, words in (("{", "is not a JSON object"), ('{"bucket_cap_mb": 1}', "expected an object with keys"),
                       ('{"cpu_offload": true}', "expected an object with keys from auto_wrap"),
                       ('{"auto_wrap": "Block"}', "auto_wrap='Block': give module class names")):
        with pytest.raises(ConfigError, match="environment CONVOY_STRATEGY_OPTIONS") as caught:
            read_convoy_env({"CONVOY_STRATEGY_OPTIONS": raw})
        assert words in str(caught.value), caught.value


def test_a_deepspeed_files_json_is_handed_to_every_rank_whole(box, capsys):
    """Its optimizer / scheduler sections build the script's DummyOptim / DummyScheduler there (as the plugin's)."""
    code, out, err = dry_run(capsys, "--config_file", str(FILES / "deepspeed_optimizer_file.yaml"), box)
    assert code == 0, err
    assert "deepspeed_config = {optimizer, zero_optimization, bf16} (deepspeed_optimizer_file.yaml: deepspeed_config." \
           "deepspeed_config_file = zero2_optimizer.json)" in config_lines(out)
    carried = next(line.strip() for line in out.splitlines() if line.strip().startswith("CONVOY_DEEPSPEED_CONFIG="))
    assert json.loads(carried.split("=", 1)[1]) == json.loads((FILES / "zero2_optimizer.json").read_text())
