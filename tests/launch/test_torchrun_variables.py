"""torchrun's ``PET_<OPTION>`` variables (what Kubeflow's PyTorchJob sets in each pod) configure ``convoy launch``
as they configure torchrun: a flag wins, a bad value is one line naming the variable, the dry run says where
each value came from, and two loopback "pods" train together from their environment alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from convoy.cli import launch as cli
from convoy.cli.main import _command_parser, main
from convoy.config.settings import TORCHRUN_OPTIONS, TORCHRUN_SWITCHES, effective_settings, torchrun_env
from convoy.launch.ports import free_port
from tests.distributed import cpu_env
from tests.processes import finish, start

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = str(SCRIPTS / "show_env.py")


def pytorchjob(node_rank: int, port: int, *, nnodes: int = 2, nproc: str = "1") -> dict[str, str]:
    """What Kubeflow's training operator puts in a PyTorchJob pod (pkg/controller.v1/pytorch: master.go and
    envvar.go; Kubeflow Trainer's torch plugin sets the PET_ ones alike): torchrun's PET_ variables, and the
    pod's own MASTER_ADDR/MASTER_PORT/WORLD_SIZE (nodes)/RANK (node) that torchrun does not read."""
    return {"PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(node_rank),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": str(nnodes), "RANK": str(node_rank), "PYTHONUNBUFFERED": "0"}


@pytest.fixture
def pet(monkeypatch, tmp_path):
    """Set PET_ (and the pod's other) variables for one test, in a folder without settings files."""
    monkeypatch.chdir(tmp_path)

    def put(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return put


def request(*argv: str):
    return cli.build_request(_command_parser("launch", cli).parse_args([*argv, "train.py"]))


def test_every_torchrun_option_with_a_variable_is_read_and_is_one_of_convoys_flags():
    """The table is torchrun's own: each option torch reads from PET_ (its argparse ``env`` action, ``check_env``
    for switches) is read here, under the same dest, as a flag convoy launch has."""
    tdr = pytest.importorskip("torch.distributed.run")
    from torch.distributed.argparse_util import check_env, env

    actions = tdr.get_args_parser()._actions
    assert set(TORCHRUN_OPTIONS) == {a.dest for a in actions if isinstance(a, (env, check_env))}
    assert set(TORCHRUN_SWITCHES) == {a.dest for a in actions if isinstance(a, check_env)}
    ours = {a.dest for a in _command_parser("launch", cli)._actions}
    assert set(TORCHRUN_OPTIONS) <= ours


def test_a_pytorchjob_pods_variables_make_the_launch(pet, capsys):
    pet(**pytorchjob(1, 29555), CONVOY_DEVICES="0")
    r, _ = request()
    assert (r.nnodes, r.nproc_per_node, r.node_rank, r.master_addr, r.master_port) == ("2", "1", 1, "127.0.0.1",
                                                                                        29555)
    assert main(["launch", "--dry-run", SCRIPT]) == 0
    out = capsys.readouterr().out
    assert "nodes:      2 (this is node 1); 1 process per node; world size 2" in out, out
    assert "rendezvous: static at 127.0.0.1:29555" in out and "  rank 1 (local 0): cpu" in out, out
    given = next(line for line in out.splitlines() if line.startswith("given by:"))
    for said in ("PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PET_NODE_RANK=1", "PET_MASTER_ADDR=127.0.0.1",
                 "PET_MASTER_PORT=29555", "CONVOY_DEVICES=0"):
        assert said in given, given


def test_an_elastic_pytorchjobs_rendezvous_comes_from_its_variables(pet, capsys):
    pet(PET_RDZV_BACKEND="c10d", PET_RDZV_ENDPOINT="job-worker-0:23456", PET_NNODES="1:3", PET_RDZV_ID="job",
        PET_MAX_RESTARTS="3", PET_RDZV_CONF="join_timeout=600", PET_NPROC_PER_NODE="2", CONVOY_DEVICES="0")
    assert main(["launch", "--dry-run", SCRIPT]) == 0
    out = capsys.readouterr().out
    assert "engine:     elastic" in out and "nodes:      1:3 (this is node 0); 2 processes per node" in out, out
    assert "rendezvous: c10d at job-worker-0:23456;" in out and "run id job" in out and "restarts:   3" in out, out
    assert "PET_MAX_RESTARTS=3" in out and "PET_RDZV_CONF=join_timeout=600" in out, out


def test_a_flag_wins_and_the_variables_win_over_convoys_settings(pet):
    """torchrun: a flag over its PET_ variable. convoy: PET_ (written for this job on this node by whatever
    started it) over CONVOY_* and convoy.toml (standing preferences); a blank variable is unset."""
    pet(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="head", PET_ROLE="trainer", CONVOY_NNODES="3",
        PET_MONITOR_INTERVAL="0.5", PET_RDZV_ID=" ")
    Path("convoy.toml").write_text('nnodes = "4"\nrdzv_id = "from-file"\n')
    r, _ = request("--node-rank", "0", "--role", "default")
    assert (r.nnodes, r.node_rank, r.master_addr, r.rdzv_id) == ("2", 0, "head", "from-file")
    assert (r.workers.role, r.workers.monitor_interval) == ("default", 0.5)
    assert {name: str(source) for name, source in r.origins.items()} == {
        "nnodes": "environment PET_NNODES", "master_addr": "environment PET_MASTER_ADDR",
        "monitor_interval": "environment PET_MONITOR_INTERVAL", "rdzv_id": f"project file {Path.cwd()}/convoy.toml:2"}
    assert request("--nnodes", "5")[0].nnodes == "5"
    pet(PET_NPROC_PER_NODE="3")  # Accelerate's --num_processes is a flag for the count too: it wins
    assert request("--num_processes", "4", "--nnodes", "2")[0].nproc_per_node == "2"
    settings = effective_settings()  # convoy config show and convoy env say the same
    assert (settings.get("nnodes"), settings.source("nnodes")) == ("2", "environment PET_NNODES")
    assert torchrun_env({"PET_NNODES": "2", "PET_TEE": ""}, skip=["nnodes"]) == {}


def test_switches_are_read_as_torchruns_check_env_reads_them(pet, capsys):
    """``PET_STANDALONE=1`` is --standalone and 0 is off; a flag is on whatever the variable says (torch's
    check_env); anything but a number is one line (torchrun stops with a ValueError traceback)."""
    pet(PET_STANDALONE="1", PET_NO_PYTHON="0")
    r, _ = request()
    assert (r.standalone, r.no_python, r.origins["standalone"].location) == (True, False, "PET_STANDALONE")
    pet(PET_STANDALONE="0", PET_MODULE="2")
    r, _ = request("--standalone")
    assert (r.standalone, r.module) == (True, True)
    pet(PET_STANDALONE="true")
    assert main(["launch", "--dry-run", SCRIPT]) == 2
    err = capsys.readouterr().err
    assert err == "convoy: environment PET_STANDALONE: 'true' is not valid; expected 1 (on) or 0 (off), as " \
                  "torchrun reads it\n", err


@pytest.mark.parametrize("variables, code, why", [
    ({"PET_NNODES": "two"}, 2, "environment PET_NNODES: 'two' is not valid; expected a node count"),
    ({"PET_NPROC_PER_NODE": "0"}, 2, "environment PET_NPROC_PER_NODE: '0' is not valid"),
    ({"PET_NODE_RANK": "first"}, 2, "environment PET_NODE_RANK: 'first' is not a whole number"),
    ({"PET_NODE_RANK": "-1"}, 2, "PET_NODE_RANK=-1: give 0 or more"),
    ({"PET_MASTER_PORT": "70000"}, 2, "PET_MASTER_PORT=70000: give a TCP port from 1 to 65535"),
    ({"PET_MASTER_ADDR": "a b"}, 2, "PET_MASTER_ADDR='a b': give a host name or an IP address"),
    ({"PET_MAX_RESTARTS": "many"}, 2, "environment PET_MAX_RESTARTS: 'many' is not valid; expected a whole number"),
    ({"PET_MONITOR_INTERVAL": "-1"}, 2, "environment PET_MONITOR_INTERVAL: '-1' is not a number of seconds"),
    ({"PET_START_METHOD": "thread"}, 2, "environment PET_START_METHOD: 'thread' is not valid; expected one of spawn"),
    ({"PET_REDIRECTS": "9"}, 2, "PET_REDIRECTS='9': give one of 0 (none)"),
    ({"PET_LOCAL_RANKS_FILTER": "5"}, 2, "PET_LOCAL_RANKS_FILTER='5' shows no rank: this node runs 2 processes"),
    ({"PET_SIGNALS_TO_HANDLE": "SIGFOO"}, 2, "environment PET_SIGNALS_TO_HANDLE: 'SIGFOO' is not a signal"),
    ({"PET_RDZV_CONF": "timeout"}, 2, "PET_RDZV_CONF='timeout': 'timeout' is not KEY=VALUE"),
    ({"PET_RDZV_BACKEND": "etcd"}, 2, "environment PET_RDZV_BACKEND: 'etcd' is not valid; expected one of c10d"),
    ({"PET_VIRTUAL_LOCAL_RANK": "1"}, 2, "PET_VIRTUAL_LOCAL_RANK=1 is not supported by convoy launch yet"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "h"}, 2, "PET_NODE_RANK=2 is outside PET_NNODES=2"),
    ({"PET_NNODES": "2", "PET_STANDALONE": "1"}, 2, "PET_STANDALONE=1 means one node, but PET_NNODES=2"),
    ({"PET_MODULE": "1"}, 2, "PET_MODULE=1 and --no-python cannot be combined"),
    ({"PET_RDZV_ENDPOINT": "h:1", "PET_NNODES": "2", "PET_MASTER_ADDR": "x"}, 2,
     "PET_RDZV_ENDPOINT=h:1 and PET_MASTER_ADDR=x name different places for the static rendezvous"),
    ({"PET_EVENT_LOG_HANDLER": "console"}, 2, "PET_EVENT_LOG_HANDLER=console is carried out by torch's elastic agent"),
])
def test_a_bad_or_conflicting_variable_is_one_line_naming_it(pet, capsys, variables, code, why):
    pet(**variables, CONVOY_DEVICES="0")
    engine = ["--engine", "direct"] if "PET_EVENT_LOG_HANDLER" in variables else []
    no_python = ["--no-python"] if "PET_MODULE" in variables else []
    nproc = [] if "PET_NPROC_PER_NODE" in variables else ["--nproc-per-node", "2"]
    assert main(["launch", "--dry-run", *engine, *no_python, *nproc, SCRIPT]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err, err


def test_a_flag_given_is_not_read_from_its_variable_even_when_the_variable_is_bad(pet):
    pet(PET_NODE_RANK="first", PET_MASTER_PORT="70000", PET_NNODES="x")
    r, _ = request("--node-rank", "0", "--master-port", "1234", "--nnodes", "1")
    assert (r.node_rank, r.master_port, r.nnodes) == (0, 1234, "1")


@pytest.mark.slow
def test_two_pytorchjob_pods_on_loopback_train_from_their_environment_alone():
    """Two `convoy launch train.py` with nothing but a PyTorchJob pod's environment (and --devices 0 for CPU
    ranks on any machine): node ranks, world size and rendezvous come from PET_*, as under torchrun."""
    port = free_port()
    pods = [start([sys.executable, "-m", "convoy", "launch", "--devices", "0", str(SCRIPTS / "ddp_train.py"),
                   "--steps", "2"], env=cpu_env(pytorchjob(rank, port))) for rank in (1, 0)]
    outs = [finish(pod, timeout=120) for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], outs
    assert f"[rank1]: trained rank=1 world=2 local=0 port={port}" in outs[0], outs[0]  # PET_NODE_RANK=1
    assert f"[rank0]: trained rank=0 world=2 local=0 port={port}" in outs[1], outs[1]
