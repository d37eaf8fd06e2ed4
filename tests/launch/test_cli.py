"""``convoy launch`` flags: torchrun's all accepted, Accelerate aliases, conflicts as one line, dry run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from convoy.cli import launch as cli
from convoy.cli.main import _command_parser, main
from tests import processes
from tests.distributed import cpu_env

SHOW_ENV = str(Path(__file__).parent / "scripts" / "show_env.py")


def parser() -> argparse.ArgumentParser:
    return _command_parser("launch", cli)


def test_every_torchrun_flag_is_accepted_under_its_own_names():
    tdr = pytest.importorskip("torch.distributed.run")
    ours = set(parser()._option_string_actions)
    theirs = {s for a in tdr.get_args_parser()._actions for s in a.option_strings} - {"-h", "--help"}
    assert theirs - ours == set()


def request(*argv):
    return cli.build_request(parser().parse_args([*argv, "train.py", "--lr", "1"]))


def test_accelerate_aliases_map_to_torchrun_meanings():
    r, _ = request("--num_processes", "4", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip",
                   "h", "--main_process_port", "2", "--mixed_precision", "bf16", "--gpu_ids", "0,1")
    assert (r.nproc_per_node, r.nnodes, r.node_rank, r.master_addr, r.master_port) == ("2", "2", 1, "h", 2)
    assert (r.settings.mixed_precision, r.devices, r.program) == ("bf16", "0,1", ("train.py", "--lr", "1"))
    r, filters = request("--nproc_per_node=3", "--dp", "3", "--collective-timeout", "9", "--free", "--exclude",
                         "1,2", "--no-lease")
    assert (r.nproc_per_node, r.settings.parallelism, r.settings.collective_timeout) == ("3", "dp=3", 9.0)
    assert (filters.free, filters.exclude, filters.lease) == (True, (1, 2), False)


def test_conflicting_counts_exit_2_with_one_line(capsys):
    assert main(["launch", "--num_processes", "4", "--nproc-per-node", "3", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--num_processes 4 means 4 per node but --nproc-per-node 3 says otherwise" in err
    assert main(["launch", "--devices", "0", "--logs-specs", "x", "x.py"]) == 2  # not supported yet: a usage error
    assert "not supported by convoy launch yet" in capsys.readouterr().err
    # --num_processes divides by the nodes as the launch plan reads --nnodes (it was int('²') and a modulo by 0)
    for nodes, why in (("²", "--nnodes: '²' is not valid; expected a node count"), ("0", "a node count like 2")):
        assert main(["launch", "--num_processes", "2", "--nnodes", nodes, "x.py"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err


def test_no_program_says_to_give_one(capsys):
    for argv in ([], ["--dry-run", "--nproc-per-node", "2"]):
        with pytest.raises(SystemExit) as done:  # argparse's usage error: exit 2, one line
            main(["launch", "--devices", "0", *argv])  # starts nothing: no program
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("\n") == 1, err
        assert "give the program to run after convoy's flags" in err, err
        assert "ARGS" not in err, err  # the program's arguments are optional, not required


def test_a_malformed_count_is_named_before_devices_are_selected(inventory_path, capsys, monkeypatch):
    # every device excluded and a typo in --nproc-per-node / --nnodes: the typo is the line (exit 2), not the
    # empty selection (exit 1) -- found by the launch-flags property test
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("2_busy_exclusive")))
    for flag, value, why in (("--nproc-per-node", "²", "--nproc-per-node: '²' is not valid"),
                             ("--nnodes", "0", "--nnodes: '0' is not valid")):
        assert main(["launch", "--dry-run", "--exclude", "GPU-", flag, value, "x.py"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err


def test_the_process_count_has_one_grammar_in_flags_variables_and_files(inventory_path, capsys, monkeypatch,
                                                                        tmp_path):
    """torchrun's words work wherever the count is given (CONVOY_NPROC_PER_NODE and convoy.toml were refused
    'gpu', which the flag took); a count that would swamp the machine is a typo, refused before any start."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("8xh100_nvswitch")))
    for given in (["--nproc-per-node", "GPU"], []):
        if not given:
            monkeypatch.setenv("CONVOY_NPROC_PER_NODE", "gpu")
        assert main(["launch", "--dry-run", *given, SHOW_ENV]) == 0
        assert "8 processes per node" in capsys.readouterr().out
    monkeypatch.delenv("CONVOY_NPROC_PER_NODE")
    (tmp_path / "convoy.toml").write_text('nproc_per_node = "cuda"\n')
    assert main(["launch", "--dry-run", SHOW_ENV]) == 0
    assert "8 processes per node" in capsys.readouterr().out
    # torchrun's "cpu": one CPU process per core, on a box with 8 GPUs too (it asked for 8 GPUs per core)
    assert main(["launch", "--dry-run", "--nproc-per-node", "cpu", SHOW_ENV]) == 0
    out = capsys.readouterr().out
    assert f"{os.cpu_count()} processes per node" in out and "no accelerator asked for" in out, out
    cap = max(64, 8 * (os.cpu_count() or 1))  # CPU processes (--devices 0): a few per core are fine, not 999999
    assert main(["launch", "--dry-run", "--devices", "0", "--nproc-per-node", str(cap), SHOW_ENV]) == 0
    capsys.readouterr()
    assert main(["launch", "--dry-run", "--devices", "0", "--nproc-per-node", str(cap + 1), SHOW_ENV]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"would be {cap + 1} CPU processes" in err and f"at most {cap}" in err, err


@pytest.mark.parametrize("flags, why", [
    (["--redirects", "9"], "--redirects '9': give one of 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    (["--redirects", "0:9"], "--redirects '0:9'"),
    (["--tee", "7"], "--tee '7'"),  # was taken and ignored
    (["--local-ranks-filter", "a"], "--local-ranks-filter 'a': give local ranks like 0 or 0,2"),
    (["--local-ranks-filter", "5,7"], "'5,7' shows no rank: this node runs 2 processes (local ranks 0..1)"),
    (["--redirects", " "], "--redirects ' ': give one of"),
    (["--role", " "], "--role ''"),
    (["--rdzv-conf", "a=b,=c"], "'=c' is not KEY=VALUE"),
])
def test_output_flags_are_checked_before_anything_starts(flags, why, capsys, monkeypatch, tmp_path):
    """A typo in torchrun's output flags was found only once the ranks started (exit 1), or never (--tee, a
    filter naming no rank showed nothing): now it is one line and exit 2, dry run or not."""
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path))
    for dry in (["--dry-run"], []):
        assert main(["launch", *dry, "--devices", "0", "--nproc-per-node", "2", *flags, "x.py"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err, err


@pytest.mark.parametrize("flags, why", [
    # a flag skipped the checks CONVOY_RDZV_* and convoy.toml get: OverflowError from bind(), or torch's
    # "backend 'bogus' is not registered" once the agent ran, or a port read as 29400
    (["--rdzv-endpoint", "127.0.0.1:99999"], "--rdzv-endpoint: '127.0.0.1:99999' is not valid"),
    (["--rdzv-endpoint", "localhost:abc"], "--rdzv-endpoint: 'localhost:abc' is not valid"),
    (["--rdzv-backend", "bogus"], "--rdzv-backend: 'bogus' is not valid; expected one of c10d, static"),
    (["--master-addr", " "], "--master-addr ' ': give a host name or an IP address"),
    # socket.gaierror and OSError tracebacks from the free-port probe
    (["--master-addr", "nonexistent.invalid"], "--master-addr 'nonexistent.invalid': cannot listen there"),
    (["--master-addr", "192.0.2.1"], "--master-addr '192.0.2.1': cannot listen there on this machine"),
    # the program: every rank printed its own FileNotFoundError or runpy traceback
    (["{missing}"], "no such file; give the path of the Python script to run, or -m MODULE"),
    (["{tmp}"], "is a directory without __main__.py"),
    (["--no-python", "no-such-command-here"], "--no-python: 'no-such-command-here' is neither a command on PATH"),
])
def test_rendezvous_flags_and_the_program_are_one_line_before_any_rank(flags, why, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path))
    flags = [f.format(missing=tmp_path / "nope.py", tmp=tmp_path) for f in flags]
    program = [] if flags[-1].startswith(("/", "no-such")) else [SHOW_ENV]
    assert main(["launch", "--devices", "0", "--nproc-per-node", "1", *flags, *program]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err, err


def test_output_flags_naming_ranks_this_node_does_not_run_are_noted_as_torchrun_ignores_them(capsys, tmp_path,
                                                                                            monkeypatch):
    """A script written for 8 GPUs (--local-ranks-filter 0,1,...,7) still starts on a node of 2: the ranks the
    node runs are used, the others named in one note each."""
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path))
    assert main(["launch", "--dry-run", "--devices", "0", "--nproc-per-node", "2", "--local-ranks-filter",
                 "0,1,2,3,4,5,6,7", "--redirects", "0:3,3:1", SHOW_ENV]) == 0
    out = capsys.readouterr()
    assert "--local-ranks-filter names local ranks 2, 3, 4, 5, 6, 7, which this node does not run (2 processes)" \
        in out.out + out.err
    assert "--redirects names local rank 3, which this node does not run" in out.out + out.err


def test_dry_run_on_an_inventory_box_and_no_torch_in_the_parent(inventory_path, tmp_path):
    code = ("import sys; from convoy.cli.main import main; rc = main(['launch', '--dry-run', '--devices', '2,0',"
            f" '--strategy', 'ddp', {SHOW_ENV!r}]); print('torch' in sys.modules, rc)")
    env = {"CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "PATH": "/usr/bin:/bin"}
    out = processes.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                        timeout=120).stdout
    assert out.strip().endswith("False 0"), out
    assert "rank 0 (local 0): device 2" in out and "CUDA_VISIBLE_DEVICES=2,0" in out and "CONVOY_STRATEGY=ddp" in out


@pytest.mark.slow
def test_devices_on_an_inventory_box_reach_each_rank(inventory_path, tmp_path):
    """From inside the ranks: exactly 2 processes, physical 2 then 0 visible in that order, LOCAL_RANK 0/1."""
    env = {"CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "CONVOY_LEASE_DIR": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    proc = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "2,0", "--mixed-precision", "bf16",
                           "--dp", "2", SHOW_ENV], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = {}
    for line in proc.stdout.splitlines():
        prefix, _, rest = line.partition(": ENV ")
        if rest:
            data = json.loads(rest)
            assert prefix == f"[rank{data['RANK']}]"
            seen[data["RANK"]] = data
    assert sorted(seen) == ["0", "1"]
    for rank, data in seen.items():
        assert data["LOCAL_RANK"] == rank and data["WORLD_SIZE"] == "2" and data["LOCAL_WORLD_SIZE"] == "2"
        assert (data["CUDA_VISIBLE_DEVICES"], data["CUDA_DEVICE_ORDER"]) == ("2,0", "PCI_BUS_ID")
        assert (data["CONVOY_MIXED_PRECISION"], data["CONVOY_PARALLELISM"]) == ("bf16", "dp=2")
        assert data["MASTER_ADDR"] == "127.0.0.1" and data["MASTER_PORT"] != "29500"
    assert list(tmp_path.iterdir()) != []  # the leases' lock files lived there


def test_same_variables_as_torchrun():
    """An unmodified torchrun script sees the same variable names under convoy launch as under torchrun."""
    pytest.importorskip("torch")
    runs = {}
    for name, prefix in {"convoy": [sys.executable, "-m", "convoy", "launch", "--devices", "0"],
                         "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone"]}.items():
        out = processes.run([*prefix, "--nproc-per-node", "1", SHOW_ENV], capture_output=True, text=True,
                             env=cpu_env(), timeout=60, check=True).stdout
        runs[name] = json.loads(out.split("KEYS ", 1)[1].splitlines()[0])
    missing = set(runs["torchrun"]) - set(runs["convoy"])
    assert missing == set(), missing


def test_parallelism_from_a_settings_file_reaches_the_workers_and_flags_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVOY_PARALLELISM", raising=False)
    (tmp_path / "convoy.toml").write_text('parallelism = "dp=2,tp=2"\n')
    r, _ = request("--nproc-per-node", "4")
    assert r.settings.parallelism == "dp=2,tp=2"
    r, _ = request("--nproc-per-node", "4", "--tp", "4")  # a degree flag replaces the file's layout
    assert r.settings.parallelism == "tp=4"
    monkeypatch.setenv("CONVOY_PARALLELISM", "pp=4")  # the variable is above the file
    r, _ = request("--nproc-per-node", "4")
    assert r.settings.parallelism == "pp=4"
    r, _ = request("--nproc-per-node", "4", "--dp", "2", "--cp", "2")  # context parallel: a degree like the others
    assert r.settings.parallelism == "dp=2,cp=2"


def test_cp_that_does_not_divide_the_processes_is_one_line(capsys):
    from convoy.cli.main import main

    code = main(["launch", "--devices", "0", "--nproc-per-node", "4", "--cp", "3", "--dry-run", "train.py"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cp=3" in err, err


def test_recompute_reaches_the_ranks_and_a_bad_value_is_one_line_naming_its_source(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    r, _ = request("--recompute", "selective")
    assert r.settings.recompute == "selective"
    monkeypatch.setenv("CONVOY_RECOMPUTE", "full")
    assert request()[0].settings.recompute == "full" and request("--recompute", "none")[0].settings.recompute == "none"
    monkeypatch.delenv("CONVOY_RECOMPUTE")
    for given, source in ((["--recompute", "half"], "--recompute: 'half'"),
                          ([], "environment CONVOY_RECOMPUTE: 'half'")):
        if not given:
            monkeypatch.setenv("CONVOY_RECOMPUTE", "half")
        assert main(["launch", "--dry-run", *given, "x.py"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and source in err and "expected one of none, selective, full" in err, err
    monkeypatch.delenv("CONVOY_RECOMPUTE")
    (tmp_path / "convoy.toml").write_text('recompute = "Half"\n')
    assert main(["launch", "--dry-run", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "convoy.toml" in err and "expected one of none, selective, full" in err, err


@pytest.mark.parametrize("script_args", [["--start", "3"], ["--nproc", "2", "--devices", "x"], ["--help"],
                                         ["-m", "--", "--dry-run"]])
def test_the_programs_own_flags_reach_it_untouched_even_when_they_look_like_ours(script_args):
    # argparse would read `train.py --start 3` as an abbreviation of --start-method (torchrun does)
    for before in (["--nproc-per-node", "2"], ["--nproc-per-node=2", "--no-lease"], ["--devices", "0", "--"]):
        args = cli.parse_args(parser(), [*before, "train.py", *script_args])
        assert (args.training_script, args.training_script_args) == ("train.py", script_args)
        assert args.nproc_per_node == ("2" if "--devices" not in before else None)
