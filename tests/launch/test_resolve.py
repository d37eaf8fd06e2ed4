"""Resolving flags + a selection + the environment into a LaunchPlan: pure, no process started."""

from __future__ import annotations

import pytest

from convoy.cli.main import main
from convoy.devices.inventory import Inventory, load_inventory
from convoy.devices.selection import select_devices
from convoy.errors import ConfigError, StrategyError
from convoy.launch.rank_env import ConvoyEnv
from convoy.launch.resolve import LaunchRequest, WorkerOptions, describe_plan, resolve_launch

CPU = select_devices("auto", inventory=Inventory(devices=(), source="none"), env={})


def req(**kw) -> LaunchRequest:
    return LaunchRequest(program=kw.pop("program", ("train.py", "--lr", "1")), **kw)


def test_cpu_box_defaults_to_two_gloo_processes_on_a_free_loopback_port():
    plan = resolve_launch(req(), CPU, env={})
    assert (plan.nproc_per_node, plan.world_size, plan.engine, plan.backend) == (2, 2, "direct", "gloo")
    assert (plan.master_addr, plan.master_port) == ("127.0.0.1", 0)
    assert plan.command[1:] == ("-u", "train.py", "--lr", "1")
    assert plan.env["OMP_NUM_THREADS"] == "1"
    assert any("no accelerator found: running 2 CPU processes" in n for n in plan.explanation)
    # said once: the selection's "no accelerators" / "no accelerator is visible" / "empty selection (CPU run)"
    # lines repeated it three more times in every dry run
    assert plan.explanation == ("no accelerator found: running 2 CPU processes with the gloo backend",), \
        plan.explanation
    assert sum("note:" in line for line in describe_plan(plan)) == 1


def test_no_accelerator_is_said_without_a_source_in_brackets():
    from convoy.cli.devices import render_table  # what `convoy devices` prints
    from convoy.devices.discovery import discover

    empty = discover(env={}, backends=())
    assert empty.source == "none" and empty.devices == ()
    assert render_table(empty, {}) == "no accelerators found; jobs run on the CPU"  # was "(none (no accelerator ...))"


def test_nproc_per_node_keeps_torchruns_meaning_and_user_omp_wins():
    plan = resolve_launch(req(nproc_per_node="3"), CPU, env={"OMP_NUM_THREADS": "4"})
    assert plan.nproc_per_node == 3 and "OMP_NUM_THREADS" not in plan.env
    with pytest.raises(ConfigError, match="--nproc-per-node gpu asks for one process per accelerator"):
        resolve_launch(req(nproc_per_node="gpu"), CPU, env={})
    with pytest.raises(ConfigError, match="'two' is not valid; expected 'auto' .*torchrun's 'cpu' or 'gpu'"):
        resolve_launch(req(nproc_per_node="two"), CPU, env={})


def test_devices_decide_the_process_count_and_order(inventory_path):
    inv = load_inventory(inventory_path("8xh100_nvswitch"))
    sel = select_devices("2,0", inventory=inv, env={})
    plan = resolve_launch(req(devices="2,0"), sel, env={})
    assert plan.nproc_per_node == 2 and [d.index for d in plan.devices] == [2, 0]
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,0" and plan.backend == "nccl"
    assert plan.device_of(0).index == 2 and plan.device_of(1).index == 0
    with pytest.raises(ConfigError, match="--devices 2,0 selects 2 device.* --nproc-per-node 3 asks for 3"):
        resolve_launch(req(devices="2,0", nproc_per_node="3"), sel, env={})
    assert resolve_launch(req(devices="2,0", nproc_per_node="2"), sel, env={}).nproc_per_node == 2


def test_one_node_on_the_agent_meets_through_torchs_static_rendezvous_unless_it_restarts():
    """One node has no one to meet: torch's static rendezvous on a free loopback port, whose store the workers
    use (c10d paid a random delay and per-event stack walks); restarts keep c10d, a fresh store per attempt."""
    plan = resolve_launch(req(engine="elastic"), CPU, env={})
    assert (plan.engine, plan.rdzv_backend, plan.rdzv_endpoint) == ("elastic", "static", "127.0.0.1:0")
    assert dict(plan.rdzv_configs)["rank"] == "0"
    shown = "\n".join(describe_plan(plan))
    assert "rendezvous: static at 127.0.0.1:0" in shown and "TORCHELASTIC_USE_AGENT_STORE=True" in shown
    restarting = resolve_launch(req(workers=WorkerOptions(max_restarts=1)), CPU, env={})
    assert "TORCHELASTIC_USE_AGENT_STORE=False" in "\n".join(describe_plan(restarting))


def test_engine_choice_direct_only_for_one_node_without_restarts():
    assert resolve_launch(req(workers=WorkerOptions(max_restarts=1)), CPU, env={}).engine == "elastic"
    plan = resolve_launch(req(workers=WorkerOptions(max_restarts=1)), CPU, env={})
    assert (plan.rdzv_backend, plan.rdzv_endpoint) == ("c10d", "127.0.0.1:0")  # as torchrun --standalone
    two = resolve_launch(req(nnodes="2", node_rank=1, master_addr="127.0.0.1", master_port=29600,
                             nproc_per_node="1"), CPU, env={})
    assert (two.engine, two.world_size, two.rank_of(0), two.rdzv_backend) == ("elastic", 2, 1, "static")
    assert dict(two.rdzv_configs)["rank"] == "1" and two.rdzv_endpoint == "127.0.0.1:29600"
    with pytest.raises(ConfigError, match="--engine direct runs one node"):
        resolve_launch(req(engine="direct", workers=WorkerOptions(max_restarts=2)), CPU, env={})
    elastic = resolve_launch(req(nnodes="1:4", rdzv_backend="c10d", rdzv_endpoint="h:1"), CPU, env={})
    assert elastic.world_size is None and (elastic.min_nodes, elastic.max_nodes) == (1, 4)


def test_torchruns_agent_flags_reach_the_plan_and_choose_the_engine_that_carries_them_out():
    """--event-log-handler and --duplicate-std*-filters are the elastic agent's: such a job runs there (they were
    accepted and dropped); --signals-to-handle reaches the ranks' environment as torchrun exports it."""
    filtered = WorkerOptions(duplicate_stdout_filters="apple")
    assert resolve_launch(req(workers=filtered), CPU, env={}).engine == "elastic"
    assert resolve_launch(req(workers=WorkerOptions(event_log_handler="console")), CPU, env={}).engine == "elastic"
    with pytest.raises(ConfigError, match="--duplicate-stdout-filters is carried out by torch's elastic agent"):
        resolve_launch(req(engine="direct", workers=filtered), CPU, env={})
    plan = resolve_launch(req(workers=WorkerOptions(signals_to_handle="SIGTERM,SIGUSR1")), CPU, env={})
    assert plan.engine == "direct" and "  TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGUSR1" in describe_plan(plan)
    one = resolve_launch(req(workers=WorkerOptions(local_addr="10.0.0.2")), CPU, env={})
    assert "--local-addr 10.0.0.2 is not used: the ranks of a one-node job meet on loopback" in one.explanation
    for kw, why in ((dict(signals_to_handle="SIGTERM,SIGFOO"), "'SIGFOO' is not a signal the launcher can catch"),
                    (dict(signals_to_handle="SIGKILL"), "'SIGKILL' is not a signal"),
                    (dict(shutdown_timeout=-1), "--shutdown-timeout -1: give a whole number"),
                    (dict(event_log_handler="bogus"), "--event-log-handler 'bogus': give one of null, console"),
                    (dict(local_addr="a b"), "--local-addr 'a b': give a host name")):
        with pytest.raises(ConfigError, match=why):
            WorkerOptions(**kw)


def test_the_elastic_agent_gets_the_flags_torchrun_would_give_it():
    pytest.importorskip("torch.distributed.launcher.api")
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    from convoy.launch.elastic import launch_config

    workers = WorkerOptions(event_log_handler="console", signals_to_handle="SIGTERM,SIGUSR1",
                            duplicate_stdout_filters="apple,,pear,plum", duplicate_stderr_filters="oops")
    two = resolve_launch(req(nnodes="2", node_rank=1, master_addr="10.0.0.1", master_port=29600, nproc_per_node="1",
                             workers=dataclasses.replace(workers, local_addr="10.0.0.2")), CPU, env={})
    config = launch_config(two)
    assert (config.event_log_handler, config.signals_to_handle, config.local_addr) == (
        "console", "SIGTERM,SIGUSR1", "10.0.0.2")
    assert (config.duplicate_stdout_filters, config.duplicate_stderr_filters) == (["apple,pear", "plum"], ["oops"])
    if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}:  # torch 2.13's agent has it
        timed = resolve_launch(req(workers=WorkerOptions(max_restarts=1, shutdown_timeout=7)), CPU, env={})
        assert launch_config(timed).shutdown_timeout == 7
    # signal names as torch's agent reads them (it skipped 'sigusr1' with a warning, and SIGUSR1 then killed it)
    assert WorkerOptions(signals_to_handle="sigterm, sigusr1").signals_to_handle == "SIGTERM,SIGUSR1"


def test_an_older_torchs_agent_gets_only_the_options_it_has():
    """torch before 2.9 has no signals_to_handle or filters in LaunchConfig: at their defaults they are not
    passed (every elastic job was a TypeError), and a flag given is one NotSupportedYetError line."""
    import dataclasses

    from convoy.errors import NotSupportedYetError
    from convoy.launch.elastic import _agent_options

    @dataclasses.dataclass
    class OldLaunchConfig:
        event_log_handler: str = "null"

    assert _agent_options(OldLaunchConfig, WorkerOptions()) == {"event_log_handler": "null"}
    with pytest.raises(NotSupportedYetError, match="--signals-to-handle: the elastic agent of torch .* has no such"):
        _agent_options(OldLaunchConfig, WorkerOptions(signals_to_handle="SIGTERM,SIGUSR1"))


def test_rendezvous_flags_are_read_as_torchrun_reads_them_or_refused_when_they_disagree():
    """torchrun's static rendezvous is at --rdzv-endpoint when one is given (convoy took 127.0.0.1, or
    --master-addr's host with the endpoint's port); --standalone replaced an endpoint without a word; c10d
    ignores --master-addr/--master-port (the plan showed them as the workers' MASTER_ADDR)."""
    two = dict(nnodes="2", nproc_per_node="1")
    static = resolve_launch(req(**two, rdzv_backend="static", rdzv_endpoint="h:29501"), CPU, env={})
    assert (static.master_addr, static.master_port, static.rdzv_endpoint) == ("h", 29501, "h:29501")
    same = resolve_launch(req(**two, rdzv_backend="static", rdzv_endpoint="h:29501", master_addr="h",
                              master_port=29501), CPU, env={})
    assert same.rdzv_endpoint == "h:29501"
    with pytest.raises(ConfigError, match="--rdzv-endpoint h:29501 and --master-addr x name different places"):
        resolve_launch(req(**two, rdzv_backend="static", rdzv_endpoint="h:29501", master_addr="x"), CPU, env={})
    with pytest.raises(ConfigError, match="--rdzv-endpoint 127.0.0.1:29400 and --master-addr 10.0.0.1 name different"):
        resolve_launch(req(rdzv_endpoint="127.0.0.1:29400", master_addr="10.0.0.1"), CPU, env={})  # one node too
    resolve_launch(req(rdzv_endpoint="127.0.0.1:29400", master_addr="127.0.0.1"), CPU, env={})  # the same place
    with pytest.raises(ConfigError, match="--standalone runs the rendezvous on this machine, but --rdzv-endpoint "
                                          "h:1 names one"):
        resolve_launch(req(standalone=True, rdzv_endpoint="h:1"), CPU, env={})
    c10d = resolve_launch(req(**two, rdzv_backend="c10d", rdzv_endpoint="h:1", master_addr="x", master_port=5),
                          CPU, env={})
    assert "--master-addr x and --master-port 5 are not used by a c10d rendezvous" in " ".join(c10d.explanation)
    assert "MASTER_ADDR and MASTER_PORT set by the rendezvous" in "\n".join(describe_plan(c10d))


@pytest.mark.parametrize("kw, message", [
    (dict(nnodes="2", standalone=True), "--standalone means one node"),
    (dict(nnodes="2", node_rank=2), "--node-rank 2 is outside --nnodes 2"),
    (dict(nnodes="x"), "--nnodes: 'x' is not valid"),
    (dict(nnodes="3:2"), "MIN <= MAX"),
    (dict(nnodes="2", rdzv_backend="c10d"), "needs --rdzv-endpoint"),
    (dict(rdzv_conf="timeout"), "is not KEY=VALUE"),
])
def test_conflicts_are_one_clear_error(kw, message):
    with pytest.raises(ConfigError, match=message):
        resolve_launch(req(**kw), CPU, env={})


def test_a_node_rank_outside_a_one_node_job_says_nnodes_not_slurm(capsys):
    """Outside Slurm, --node-rank 1 said "outside the Slurm job's 1 nodes": the job is one node because --nnodes
    was not given."""
    for env in ({}, {**SLURM, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "gpu07", "SLURM_NODEID": "0"}):
        with pytest.raises(ConfigError) as info:
            resolve_launch(req(node_rank=1), CPU, env=env)
        assert str(info.value) == ("--node-rank 1 is outside a one-node job (--nnodes is 1 when not given); give "
                                   "--nnodes N for a job on N machines (node ranks 0..N-1), or leave out the node rank")
    with pytest.raises(ConfigError, match=r"^--node-rank 2 is outside the Slurm job's 2 nodes; give 0..1$"):
        resolve_launch(req(node_rank=2, nproc_per_node="1"), CPU, env=SLURM)
    assert main(["launch", "--dry-run", "--node-rank", "1", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside a one-node job" in err and "Slurm" not in err, err


def test_several_nodes_without_a_meeting_place_are_refused_instead_of_planned_at_127_0_0_1(capsys):
    """docs/choosing-a-strategy.md's case 3 for 4 nodes without an endpoint planned a static rendezvous at
    127.0.0.1, which no other node reaches: the line says what is missing, dry run included."""
    with pytest.raises(ConfigError) as info:
        resolve_launch(req(nnodes="4", nproc_per_node="1"), CPU, env={})
    assert str(info.value).startswith("--nnodes 4 runs on 4 machines, but nothing says where they meet: give "
                                      "--master-addr HOST (node 0's address, the same on every node")
    assert "--rdzv-endpoint HOST:PORT" in str(info.value) and "PET_MASTER_ADDR" in str(info.value)
    with pytest.raises(ConfigError, match="; MASTER_ADDR=head in this environment is a rank's variable, which "
                                          "torchrun and convoy launch do not read: pass it as --master-addr"):
        resolve_launch(req(nnodes="2", master_port=29600, nproc_per_node="1"), CPU, env={"MASTER_ADDR": "head"})
    assert main(["launch", "--dry-run", "--nnodes", "4", "--strategy", "zero3", "--tp", "2", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing says where they meet" in err, err
    # every way of naming the place: an address (loopback too, a rehearsal on one host), an endpoint, Slurm
    for kw in (dict(master_addr="127.0.0.1"), dict(master_addr="node0", master_port=29600),
               dict(rdzv_endpoint="node0:29600"), dict(rdzv_backend="c10d", rdzv_endpoint="node0:29400")):
        plan = resolve_launch(req(nnodes="4", nproc_per_node="1", **kw), CPU, env={})
        assert plan.max_nodes == 4 and plan.rdzv_endpoint.startswith(("127.0.0.1:", "node0:")), plan
    assert resolve_launch(req(nproc_per_node="1"), CPU, env=SLURM).master_addr == "gpu07"


def test_request_validation():
    with pytest.raises(ConfigError, match="no training script"):
        LaunchRequest(program=())
    with pytest.raises(ConfigError, match="cannot be combined"):
        req(module=True, no_python=True)
    assert resolve_launch(req(module=True), CPU, env={}).command[1:4] == ("-u", "-m", "train.py")
    assert resolve_launch(req(no_python=True, program=("echo", "hi")), CPU, env={}).command == ("echo", "hi")


def test_convoy_settings_are_forwarded_and_parallelism_must_fit_the_world():
    settings = ConvoyEnv(mixed_precision="bf16", strategy="fsdp", parallelism="dp=1,tp=2",
                         gradient_accumulation_steps=4, collective_timeout=60.0)
    plan = resolve_launch(req(settings=settings), CPU, env={})
    assert {k: v for k, v in plan.env.items() if k.startswith("CONVOY_")} == {
        "CONVOY_MIXED_PRECISION": "bf16", "CONVOY_STRATEGY": "fsdp", "CONVOY_PARALLELISM": "dp=1,tp=2",
        "CONVOY_GRADIENT_ACCUMULATION_STEPS": "4", "CONVOY_COLLECTIVE_TIMEOUT": "60"}
    with pytest.raises(StrategyError, match="needs 4 processes but the job has 2"):
        resolve_launch(req(settings=ConvoyEnv(parallelism="dp=2,tp=2")), CPU, env={})


SLURM = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}


def test_slurm_allocation_gives_nodes_rank_and_main_address():
    plan = resolve_launch(req(nproc_per_node="1"), CPU, env=SLURM)
    assert (plan.min_nodes, plan.node_rank, plan.master_addr, plan.run_id) == (2, 1, "gpu07", "123456")
    assert plan.engine == "elastic" and 15000 <= plan.master_port < 35000
    assert resolve_launch(req(nproc_per_node="1"), CPU, env={**SLURM, "SLURM_NODEID": "0"}).master_port == \
        plan.master_port  # every node derives the same port
    assert resolve_launch(req(nnodes="1"), CPU, env=SLURM).engine == "direct"  # explicit flags win
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=1") as refused:
        resolve_launch(req(), CPU, env={**SLURM, "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    assert refused.value.exit_code == 2  # the command is wrong here, however often it is retried
    one_node = {**SLURM, "SLURM_JOB_NODELIST": "gpu07", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    with pytest.raises(ConfigError, match="srun started 2 tasks on this node"):
        resolve_launch(req(), CPU, env={**one_node, "SLURM_NTASKS_PER_NODE": "2"})
    assert resolve_launch(req(), CPU, env={**one_node, "SLURM_NTASKS_PER_NODE": "1"}).min_nodes == 1


def test_describe_plan_shows_ranks_devices_env_and_rendezvous(inventory_path):
    inv = load_inventory(inventory_path("8xh100_nvswitch"))
    sel = select_devices("2,0", inventory=inv, env={})
    text = "\n".join(describe_plan(resolve_launch(req(devices="2,0", settings=ConvoyEnv(strategy="ddp")), sel,
                                                  env={})))
    assert f"rank 0 (local 0): device 2 NVIDIA H100 80GB HBM3 uuid={inv.devices[2].uuid} as cuda:0" in text
    assert "rank 1 (local 1): device 0" in text and "CUDA_VISIBLE_DEVICES=2,0" in text
    assert "CONVOY_STRATEGY=ddp" in text and "WORLD_SIZE=2" in text and "rendezvous: static" in text


def test_more_processes_than_gpus_is_one_clear_error_and_devices_0_means_cpu(inventory_path):
    """Two ranks on a one-GPU box would put rank 1 on a device that does not exist (issue 11)."""
    inv = load_inventory(inventory_path("1xh100"))
    with pytest.raises(ConfigError, match=r"--nproc-per-node 2 needs 2 devices .* only 1 \(GPU 0 .*\) is selected; "
                                          r"give --nproc-per-node 1, or --devices 0 for 2 CPU processes"):
        resolve_launch(req(nproc_per_node="2"), select_devices("auto", inventory=inv, env={}), env={})
    with pytest.raises(ConfigError, match=r"give --nproc-per-node 1$"):  # 999 CPU processes: refused in turn
        resolve_launch(req(nproc_per_node="999"), select_devices("auto", inventory=inv, env={}), env={})
    cpu = resolve_launch(req(devices="0", nproc_per_node="2"), select_devices("0", inventory=inv, env={}), env={})
    assert (cpu.nproc_per_node, cpu.devices, cpu.backend, cpu.env["CUDA_VISIBLE_DEVICES"]) == (2, (), "gloo", "")
    one = resolve_launch(req(nproc_per_node="1"), select_devices("auto", inventory=inv, env={}), env={})
    assert (one.nproc_per_node, one.backend, len(one.devices)) == (1, "nccl", 1)
