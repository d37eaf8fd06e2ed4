"""Issue 14's table of bad command lines: each exits 2 (bad input) or 1 (a runtime failure), with exactly one
stderr line starting ``convoy:`` and no traceback, and none starts a rank or a child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from convoy.cli.main import main
from tests.conftest import INVENTORIES, REPO

H100 = str(INVENTORIES / "8xh100_nvswitch.json")
NINES = "9" * 400


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad files of every kind the commands read, in one folder."""
    d = tmp_path_factory.mktemp("bad")
    (d / "bad_utf8.json").write_bytes(b'{"devices": [\xff\xfe]}')
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "cpu.json").write_text('{"devices": []}')
    device = {"index": 0, "uuid": "GPU-a", "name": "x"}
    for name, patch in {"neg_index": {"index": -1}, "neg_memory": {"memory_total_mib": -5},
                        "bogus_peer": {"nvlink_peers": [7]}, "typo_vendor": {"vendor": "nvidai"}}.items():
        (d / f"{name}.json").write_text(json.dumps({"devices": [{**device, **patch}]}))
    llama = json.loads((REPO / "tests/plan/configs/llama2_7b.json").read_text())
    for name, patch in {"heads0": {"num_attention_heads": 0}, "hidden_str": {"hidden_size": "4096"},
                        "hidden_null": {"hidden_size": None}, "hidden_frac": {"hidden_size": 4096.5},
                        "kv_above_heads": {"num_key_value_heads": 64}, "llama2_7b": {}}.items():
        (d / f"{name}.json").write_text(json.dumps({**llama, **patch}))
    gpt2 = json.loads((REPO / "tests/plan/configs/gpt2.json").read_text())
    (d / "n_positions_null.json").write_text(json.dumps({**gpt2, "n_positions": None}))
    (d / "config_latin1.json").write_bytes(b'{"model_type": "llama", "name": "caf\xe9"}')
    (d / "raising_factory.py").write_text("def build():\n    raise RuntimeError('boom')\n")
    (d / "no_shebang.sh").write_text("echo hi\n")
    (d / "no_shebang.sh").chmod(0o755)
    (d / "train.py").write_text("raise SystemExit('a rank started')\n")
    _input_file_holes(d)
    return d


#: a YAML "billion laughs": 370 bytes whose aliases expand to 9**9 strings
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{','.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


def _input_file_holes(d):
    """Issue 41's files that hung or crashed a reader: a FIFO, a huge file (sparse), deep nesting, aliases, values
    of the wrong type."""
    os.mkfifo(d / "fifo")
    (d / "folder").mkdir()
    with open(d / "huge", "wb") as f:  # 70 MiB of nothing on disk: larger than any kind's limit
        f.truncate(70 * 2**20)
    (d / "huge.yaml").symlink_to(d / "huge")
    (d / "laughs.yaml").write_text(LAUGHS)
    (d / "deep.yaml").write_text("distributed_type: " + "[" * 1000 + "]" * 1000 + "\n")
    (d / "deep_block.yaml").write_text("".join("  " * i + f"k{i}:\n" for i in range(1000)))
    (d / "deep_config.json").write_text('{"distributed_type": ' + "[" * 1000 + "]" * 1000 + "}")
    (d / "deep.toml").write_text("strategy = " + "[" * 1000 + "]" * 1000 + "\n")
    (d / "nul.yaml").write_bytes(b"distributed_type: NO\x00\n")  # PyYAML's reader refuses it in its constructor
    (d / "use_cpu_maybe.yaml").write_text("distributed_type: MULTI_CPU\nuse_cpu: maybe\n")
    (d / "wrap_nested.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: "
                                        "TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: [[a], {b: c}]\n")
    for name, target in (("fifo", d / "fifo"), ("zero", "/dev/zero"), ("deep", d / "deep.json"),
                         ("huge", d / "huge")):
        (d / f"ds_{name}.yaml").write_text(f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  "
                                           f"deepspeed_config_file: {target}\n")


# (environment, argv with {d} for the files folder, exit code, a word the one line must hold)
CASES = [
    ({}, "select 0-99999999999", 2, "out of range"),
    ({}, "select 0-300000000", 2, "out of range"),
    ({}, "select " + "9" * 5000, 2, "too large"),
    ({}, "select ²", 2, "cannot parse"),
    ({}, "select ٣", 2, "cannot parse"),
    ({}, "select 1 --exclude ²", 2, "exclude"),
    ({}, "select 1 --exclude=--1", 2, "exclude"),
    ({}, "select 1 --exclude a", 2, "exclude"),
    ({"CUDA_VISIBLE_DEVICES": "²"}, "select 1", 2, "non-ASCII"),
    ({"CUDA_VISIBLE_DEVICES": "٣"}, "select 1", 2, "non-ASCII"),
    ({"CUDA_VISIBLE_DEVICES": "--1"}, "select 1", 2, "not a whole number"),
    ({"CUDA_VISIBLE_DEVICES": "0,0,1"}, "select all", 2, "twice"),
    ({}, f"select 1 --min-free-memory {NINES}", 2, "not a finite number"),
    ({}, f"launch --max-restarts {NINES} --dry-run train.py", 2, f"'{NINES[:36]}... is too large"),  # cut, and says so
    ({"CONVOY_INVENTORY": "{d}/bad_utf8.json"}, "select 1", 2, "not UTF-8"),
    ({"CONVOY_INVENTORY": "{d}/deep.json"}, "select 1", 2, "too deeply"),
    ({"CONVOY_INVENTORY": "{d}/neg_index.json"}, "select all", 2, "index must be an integer >= 0"),
    ({"CONVOY_INVENTORY": "{d}/neg_memory.json"}, "select all", 2, "memory_total_mib"),
    ({"CONVOY_INVENTORY": "{d}/bogus_peer.json"}, "select all", 2, "nvlink peer 7"),
    ({"CONVOY_INVENTORY": "{d}/typo_vendor.json"}, "select all", 2, "did you mean 'nvidia'"),  # failed later
    ({"CONVOY_INVENTORY": "{d}/typo_vendor.json"}, "devices", 2, "typo_vendor.json"),  # printed 'device:0', exit 0
    ({}, "devices --inventory=", 2, "names no file"),  # was ignored: printed the hardware's (or CONVOY_INVENTORY's)
    ({}, "select 1 --inventory=", 2, "names no file"),
    ({}, "run --inventory= -- {d}/train.py", 2, "names no file"),
    ({"CONVOY_NPROC_PER_NODE": "²"}, "config show", 2, "CONVOY_NPROC_PER_NODE"),
    ({}, "config --path {d}/c.toml --nproc-per-node ²", 2, "nproc_per_node"),
    ({}, "config --path /proc/c.toml --strategy ddp", 2, "cannot write"),
    ({}, "config --path {d}/c.toml --devices 0,0", 2, "index 0 appears twice"),  # written; every launch refused it
    ({}, "config --path {d}/c.toml --devices all,1", 2, "cannot parse 'all'"),
    ({}, "config --path {d}/c.toml --rdzv-id job\udcff", 2, "not UTF-8"),  # written; the file no longer read
    ({}, "plan {d}/heads0.json --hardware 8xH100-80GB", 2, "num_attention_heads"),
    ({}, "plan {d}/hidden_str.json --hardware 8xH100-80GB", 2, "hidden_size"),
    ({}, "plan {d}/hidden_null.json --hardware 8xH100-80GB", 2, "hidden_size"),
    ({}, "plan {d}/hidden_frac.json --hardware 8xH100-80GB", 2, "4096.5"),
    ({}, "plan {d}/kv_above_heads.json --hardware 8xH100-80GB", 2, "num_key_value_heads"),
    ({}, "plan {d}/n_positions_null.json --hardware 8xH100-80GB", 2, "n_positions"),
    ({}, "plan {d}/config_latin1.json --hardware 8xH100-80GB", 2, "not UTF-8"),
    ({}, "plan --params inf --hardware 8xH100-80GB", 2, "finite"),
    ({}, "plan --params 7e9 --hardware 8xH100-80GB --gpu-memory-gib inf", 2, "finite"),
    ({}, "plan {d}/raising_factory.py:build --hardware 8xH100-80GB", 2, "RuntimeError: boom"),
    ({}, "plan --params 7e9 --hardware 99999999999999xH100-80GB", 2, "GPU count"),
    ({}, "plan --params 7e9 --hardware 8xH100-80GB --global-batch 3 --strategies ddp,zero3", 2,
     "cannot be split evenly"),
    ({}, "plan --params 7e9 --hardware 8xH100-80GB --seq-len 99999999999", 2, "too large (at most 10 digits)"),
    ({}, "plan --params 70e9 --layers 2 --hidden 64 --heads 1 --vocab 100 --hardware 8xH100-80GB", 2,
     "cannot describe one model"),  # printed 279 % MFU
    ({}, "plan --params 1e6 --layers 80 --hidden 8192 --vocab 128000 --hardware 8xH100-80GB", 2, "--params 1e+06"),
    ({}, "plan {d}/llama2_7b.json --params 70e12 --hardware 8xH100-80GB", 2, "cannot describe one model"),
    ({}, "plan {d}/llama2_7b.json --hidden 64 --hardware 8xH100-80GB", 2, "leave --hidden out"),
    ({}, "launch --max-restarts 9999999999 {d}/train.py", 2, "too large (at most 9 digits)"),
    ({}, "run -- {d}/no_shebang.sh", 126, "add a #! line"),
    ({}, "run --no-lease --wait 5m -- {d}/train.py", 2, "--no-lease takes no lease"),  # --wait was ignored
    ({}, "launch --no-lease --wait 5m {d}/train.py", 2, "--no-lease takes no lease"),
    ({}, "launch --exclude a {d}/train.py", 2, "exclude"),
    ({}, "launch --log-dir /etc/hostname {d}/train.py", 2, "not a directory"),
    ({}, "launch --log-dir /proc/nope {d}/train.py", 2, "cannot create"),
    ({}, "launch --master-port -1 {d}/train.py", 2, "--master-port"),
    ({}, "launch --master-port 70000 {d}/train.py", 2, "--master-port"),
    ({}, "launch --strategy bogus {d}/train.py", 2, "bogus"),
    # a strategy the ranks would build without the degrees (or cannot run beside them): refused in the parent
    ({}, "launch --nproc-per-node 4 --strategy ddp --dp-replicate 2 --dp-shard 2 {d}/train.py", 2,
     "--strategy 'ddp' keeps whole weights in each replica"),
    ({"CONVOY_STRATEGY": "single"}, "launch --nproc-per-node 2 --pp 2 {d}/train.py", 2,
     "CONVOY_STRATEGY='single' runs"),
    ({}, "launch --collective-timeout inf {d}/train.py", 2, "seconds > 0"),
    ({}, "launch --mixed-precision fp4 {d}/train.py", 2, "fp4"),
    ({"CONVOY_MIXED_PRECISION": "fp4"}, "launch {d}/train.py", 2, "fp4"),
    ({}, "launch --fp8-recipe blockwise {d}/train.py", 2, "blockwise"),
    ({"CONVOY_FP8_RECIPE": "blockwise"}, "launch {d}/train.py", 2, "CONVOY_FP8_RECIPE"),
    ({}, "launch --mixed-precision bf16 --fp8-recipe rowwise {d}/train.py", 2,
     "--fp8-recipe rowwise configures fp8, but --mixed-precision bf16 is asked for"),
    ({}, "launch --gradient-accumulation-steps ٣ {d}/train.py", 2, "whole number"),
    ({}, "launch --nproc-per-node ² {d}/train.py", 2, "--nproc-per-node"),
    ({"CONVOY_NPROC_PER_NODE": "999999"}, "launch {d}/train.py", 2, "CONVOY_NPROC_PER_NODE=999999 would be 999999 CPU"),
    # a value from a variable is named as that variable, not as the flag that was not given
    ({"CONVOY_NPROC_PER_NODE": "gpu"}, "launch {d}/train.py", 2, "CONVOY_NPROC_PER_NODE=gpu asks for one process"),
    ({"CONVOY_STRATEGY": "mine"}, "launch {d}/train.py", 2, "CONVOY_STRATEGY='mine' is not one of convoy's"),
    ({"CONVOY_DEVICES": "0-3"}, "launch {d}/train.py", 2, "CONVOY_DEVICES=0-3: devices='0-3': range '0-3'"),
    ({"CONVOY_PARALLELISM": "dp=3"}, "launch {d}/train.py", 2, "CONVOY_PARALLELISM=dp=3: parallelism dp=3"),
    ({"CONVOY_NNODES": "2"}, "launch --standalone {d}/train.py", 2, "but CONVOY_NNODES=2; drop one"),
    ({"CONVOY_MAX_RESTARTS": "2"}, "launch --engine direct {d}/train.py", 2, "but CONVOY_MAX_RESTARTS=2 asks for"),
]


# every reader, each hole (issue 41): one line, exit 2, and an end (a FIFO waited for a writer forever)
READERS = {"--config_file": ({}, "launch --config_file {f} {d}/train.py"),
           "CONVOY_CONFIG": ({"CONVOY_CONFIG": "{f}"}, "config show"),
           "CONVOY_INVENTORY": ({"CONVOY_INVENTORY": "{f}"}, "select 1"),
           "--inventory": ({}, "select 1 --inventory {f}"),
           "plan MODEL": ({}, "plan {f} --hardware 8xH100-80GB")}
HOLES = {"{d}/fifo": "is a FIFO (named pipe), not a file", "/dev/zero": "is a character device, not a file",
         "/dev/urandom": "is a character device, not a file", "{d}/huge": "is 70.0 MiB; a"}
FILE_CASES = [({k: v.replace("{f}", hole) for k, v in env.items()}, line.replace("{f}", hole), 2, word)
              for env, line in READERS.values() for hole, word in HOLES.items()]
FILE_CASES += [({"CONVOY_CONFIG": "{d}/folder"}, "config show", 2, "is a directory, not a file"),
               ({}, "launch --config_file {d}/folder {d}/train.py", 2, "is a directory, not a file"),
               ({}, "select 1 --inventory {d}/folder", 2, "is a directory, not a file"),
               ({}, "launch --config_file {d}/huge.yaml {d}/train.py", 2, "may be at most 1 MiB"),
               ({}, "launch --config_file {d}/laughs.yaml {d}/train.py", 2, "alias 'a' refused"),
               ({}, "launch --config_file {d}/deep.yaml {d}/train.py", 2, "more than 64 deep"),
               ({}, "launch --config_file {d}/deep_block.yaml {d}/train.py", 2, "more than 64 deep"),
               ({}, "launch --config_file {d}/deep_config.json {d}/train.py", 2, "too deeply"),
               ({}, "launch --config_file {d}/deep.json {d}/train.py", 2, "too deeply"),
               ({"CONVOY_CONFIG": "{d}/deep.toml"}, "config show", 2, "too deeply"),
               ({}, "plan {d}/deep.json --hardware 8xH100-80GB", 2, "too deeply"),
               ({}, "launch --config_file {d}/nul.yaml {d}/train.py", 2, "is not valid YAML (unacceptable character"),
               ({}, "launch --config_file {d}/use_cpu_maybe.yaml {d}/train.py", 2, "use_cpu = maybe: give true or "
                                                                                 "false"),
               ({}, "launch --config_file {d}/wrap_nested.yaml {d}/train.py", 2, "give class names"),
               ({}, "launch --config_file {d}/ds_fifo.yaml {d}/train.py", 2, "is a FIFO"),
               ({}, "launch --config_file {d}/ds_zero.yaml {d}/train.py", 2, "is a character device"),
               ({}, "launch --config_file {d}/ds_deep.yaml {d}/train.py", 2, "too deeply"),
               ({}, "launch --config_file {d}/ds_huge.yaml {d}/train.py", 2, "may be at most 1 MiB")]
CASES += FILE_CASES


@pytest.mark.timeout(60)  # a hole that hangs is a failure, not a stalled suite
@pytest.mark.parametrize("env, line, code, word", CASES, ids=[" ".join([*c[0].values(), c[1]])[:60] for c in CASES])
def test_bad_input_is_one_convoy_line(env, line, code, word, files, monkeypatch, capfd, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path / "leases"))
    # launch runs on a CPU inventory (no GPU is touched even if a check were missing); the others on 8 H100s
    monkeypatch.setenv("CONVOY_INVENTORY", str(files / "cpu.json") if line.startswith("launch") else H100)
    for key in ("CUDA_VISIBLE_DEVICES", "CONVOY_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(d=files))
    argv = [word.format(d=files) for word in line.split(" ")]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    out, err = capfd.readouterr()  # file descriptors: a started rank or child would print here too
    lines = err.strip().splitlines()
    assert rc == code, err
    assert len(lines) == 1 and lines[0].startswith("convoy: ") and word in lines[0], err
    assert "a rank started" not in out + err


@pytest.mark.parametrize("argv", [
    ["select", "0-99999999999"],
    ["plan", "--params", "7e9", "--hardware", "99999999999999xH100-80GB"],
    ["launch", "--mixed-precision", "fp4", "--dry-run", "train.py"],
])
def test_no_traceback_end_to_end(argv, tmp_path):
    # the real console entry point, in a fresh process: one line, exit 2, whatever the size asked for
    proc = subprocess.run([sys.executable, "-m", "convoy", *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "CONVOY_INVENTORY": H100, "HOME": str(tmp_path)}, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("convoy: ")


def test_a_fifo_or_an_alias_bomb_is_one_line_end_to_end(files, tmp_path):
    # the console entry point in a fresh process: the FIFO once waited forever for a writer, the 370-byte YAML ran
    # past 55 s expanding its aliases
    for config in ("fifo", "laughs.yaml"):
        proc = subprocess.run([sys.executable, "-m", "convoy", "launch", "--config_file", str(files / config),
                               "--dry-run", "train.py"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "CONVOY_INVENTORY": str(files / "cpu.json"),
                                   "HOME": str(tmp_path)})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and str(files / config) in proc.stderr
