"""The pure pieces: torchrun's rank variables, CONVOY_* settings, Slurm host lists, failure reports."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from convoy.errors import ConfigError, LaunchError, RankFailedError
from convoy.launch.failures import RankFailure, TracebackHold, describe_exit, failure_error, read_error_file
from convoy.launch.ports import DEFAULT_TORCHRUN_PORT, free_port
from convoy.launch.rank_env import (
    CONVOY_VARIABLES,
    RANK_VARIABLES,
    ConvoyEnv,
    check_launch_settings,
    convoy_env,
    rank_env,
    read_convoy_env,
    read_rank_env,
)
from convoy.launch.slurm import expand_hostlist, slurm_allocation
from tests.distributed import run_script


def test_rank_env_has_torchruns_variables():
    env = rank_env(rank=3, local_rank=1, world_size=4, local_world_size=2, master_addr="h", master_port=5,
                   run_id="j", group_rank=1, group_world_size=2, error_file="/e")
    assert set(env) == set(RANK_VARIABLES)
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"], env["WORLD_SIZE"]) == ("3", "1", "1", "4")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 creates the store itself
    with pytest.raises(ValueError):
        rank_env(rank=0, local_rank=2, world_size=2, local_world_size=2, master_addr="h", master_port=1, run_id="")


def test_a_ranks_variables_that_cannot_be_are_one_line():
    """A process reads who it is from torchrun's variables; an impossible set (a hand-written launcher, a stale
    export) was taken as is: LOCAL_RANK 3 of 2 picked a device that is not there, MASTER_PORT 99999 failed in
    torch's store."""
    base = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    assert read_rank_env(base).local_rank == 1
    for patch, why in (({"LOCAL_RANK": "3"}, "LOCAL_RANK=3 is outside LOCAL_WORLD_SIZE=2"),
                       ({"LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8 is above WORLD_SIZE=4"),
                       ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP port"),
                       ({"RANK": "4"}, "RANK=4 is outside WORLD_SIZE=4")):
        with pytest.raises(ConfigError, match=why):
            read_rank_env({**base, **patch})
    # a plain process (no WORLD_SIZE) with a stale LOCAL_RANK or MASTER_PORT in the shell is not refused
    alone = read_rank_env({"LOCAL_RANK": "1", "MASTER_PORT": "99999"})
    assert (alone.rank, alone.world_size, alone.local_rank, alone.master_port) == (0, 1, 1, None)


def test_convoy_env_round_trips_and_rejects_bad_values():
    settings = ConvoyEnv(mixed_precision="fp16", strategy="zero1", parallelism="dp=2,pp=2", cpu_offload=False,
                         pp_schedule="interleaved_1f1b", pp_stages_per_rank=4, pp_microbatches=8,
                         gradient_accumulation_steps=2, collective_timeout=12.5, recompute="selective",
                         fp8_recipe="rowwise", fp8_emulate=True, compile="blocks", compile_backend="aot_eager",
                         compile_mode="max-autotune", compile_dynamic=False, gradient_clipping=0.5)
    env = convoy_env(settings)
    assert set(env) == set(CONVOY_VARIABLES) and env["CONVOY_COLLECTIVE_TIMEOUT"] == "12.5"
    assert read_convoy_env(env) == settings
    assert read_convoy_env({}) == ConvoyEnv() and convoy_env(ConvoyEnv()) == {}
    # the launcher checks with the trainer's own list and parser (convoy.config.schema): fp4 is not offered
    for bad in ("fp12", "fp4"):
        with pytest.raises(ConfigError, match=f"'{bad}' is not valid; expected one of no, fp16, bf16, fp8"):
            ConvoyEnv(mixed_precision=bad)
    with pytest.raises(ConfigError, match="CONVOY_GRADIENT_ACCUMULATION_STEPS: 'x' is not valid; expected a whole"):
        read_convoy_env({"CONVOY_GRADIENT_ACCUMULATION_STEPS": "x"})
    for bad in (0, float("inf"), float("nan"), "inf", "٣"):
        with pytest.raises(ConfigError, match="expected a number of seconds > 0"):
            ConvoyEnv(collective_timeout=bad)
    with pytest.raises(ConfigError, match="is not one of convoy's strategies"):
        check_launch_settings(ConvoyEnv(strategy="bogus"))  # the parent's refusal; a rank may name its own
    with pytest.raises(ConfigError, match="not KEY=NUMBER"):
        ConvoyEnv(parallelism="dp2")
    # an Accelerate file's DeepSpeed JSON travels whole, as a JSON object
    ds = {"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "eps": 1e-8}}}
    env = convoy_env(ConvoyEnv(deepspeed_config=ds))
    assert set(env) == {"CONVOY_DEEPSPEED_CONFIG"} and read_convoy_env(env).deepspeed_config == ds
    for bad in ("[1]", "{", "3"):
        with pytest.raises(ConfigError, match="CONVOY_DEEPSPEED_CONFIG: .* is not a DeepSpeed config JSON object"):
            read_convoy_env({"CONVOY_DEEPSPEED_CONFIG": bad})


def test_free_port_is_bindable_and_never_torchruns_default():
    port = free_port()
    assert port != DEFAULT_TORCHRUN_PORT
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]), ("n1,n2", ["n1", "n2"]), ("gpu[01-03,07],login", ["gpu01", "gpu02", "gpu03", "gpu07", "login"]),
    ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_slurm_allocation():
    assert slurm_allocation({}) is None
    alloc = slurm_allocation({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "x[1-4]", "SLURM_NODEID": "2"})
    assert (alloc.nnodes, alloc.node_rank, alloc.master_addr) == (4, 2, "x1")
    with pytest.raises(LaunchError, match="outside the allocation"):
        slurm_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "x1", "SLURM_NODEID": "3"})
    with pytest.raises(LaunchError, match="cannot read the range"):
        expand_hostlist("x[a-b]")


def test_describe_exit():
    assert describe_exit(3) == "exit code 3" and describe_exit(-9) == "signal SIGKILL"


TB = ["Traceback (most recent call last):\n", '  File "t.py", line 1, in <module>\n', "    f()\n",
      "ValueError: boom\n"]


def test_traceback_hold_keeps_a_final_traceback_for_the_report():
    hold = TracebackHold()
    assert hold.feed("hello\n") == ["hello\n"]
    assert [hold.feed(line) for line in TB] == [[], [], [], []]
    assert hold.take() == "".join(TB) and not hold.holding


def test_traceback_hold_releases_a_caught_traceback_when_output_continues():
    hold = TracebackHold()
    for line in TB + ["\n", "During handling of the above exception, another exception occurred:\n", "\n"] + TB:
        assert hold.feed(line) == []
    assert hold.feed("still running\n") == TB + ["\n", "During handling of the above exception, another "
                                                 "exception occurred:\n", "\n"] + TB + ["still running\n"]
    assert hold.traceback.startswith("Traceback") and not hold.holding


def test_failure_error_prints_the_traceback_once_with_rank_host_and_cause():
    failure = RankFailure(rank=1, local_rank=1, host="h", returncode=-9, traceback="".join(TB), elapsed=2.0)
    err = failure_error(failure, stopped=3)
    assert isinstance(err, RankFailedError) and (err.rank, err.host, err.exitcode) == (1, "h", -9)
    lines = str(err).splitlines()
    assert lines[0] == "rank 1 (local rank 1) on host h failed with signal SIGKILL after 2.0 s; stopped the " \
                       "other 3 rank(s)"
    assert lines[1:] == [f"[rank1]: {line.rstrip()}" for line in TB]
    shown = RankFailure(rank=1, local_rank=1, host="h", returncode=1, traceback="".join(TB), traceback_shown=True)
    assert str(failure_error(shown, stopped=1)).endswith("(its traceback is above)")
    one = RankFailure(rank=1, local_rank=1, host="h", returncode=1, traceback="StrategyError: x\n",
                      traceback_shown=True)
    assert str(failure_error(one, stopped=1)).endswith("(its error is above)")


def test_traceback_hold_holds_a_convoy_errors_one_line_for_the_report():
    hold = TracebackHold()
    assert hold.feed("ValueError: not convoy's\n") == ["ValueError: not convoy's\n"]  # a line a program printed
    assert hold.feed("StrategyError: pp needs a loss function\n") == [] and hold.holding
    assert hold.take() == "StrategyError: pp needs a loss function\n"


def test_a_workers_convoy_error_is_one_line_not_a_traceback():
    """A ConvoyError raised in a rank (a pipeline without loss_fn, a CollectiveWatch timeout) is its one line, as
    the CLI prints one; CONVOY_DEBUG=1 shows the traceback."""
    script = Path(__file__).parent / "scripts" / "convoy_error.py"
    result = run_script(script, nproc=2, timeout=120)
    assert result.returncode == 1, result.output
    lines = [line for line in result.output.splitlines() if "pp needs a loss function" in line]
    assert lines and all(line.endswith("StrategyError: pp needs a loss function for Sequential: pass "
                                       "strategy_options={'loss_fn': fn}") for line in lines), result.output
    assert len(lines) <= 2 and "Traceback" not in result.output, result.output
    debug = run_script(script, nproc=1, env={"CONVOY_DEBUG": "1"}, timeout=120)
    assert "Traceback (most recent call last)" in debug.output, debug.output


def test_read_error_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"message": {"message": "E", "extraInfo": {"py_callstack": "TB", "timestamp": "1"}}}))
    assert read_error_file(path) == "TB"
    assert read_error_file(tmp_path / "missing.json") is None
