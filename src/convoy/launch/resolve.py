"""Resolve launch flags, the selected devices and the Slurm environment into one frozen ``LaunchPlan``.

    from convoy.launch.resolve import LaunchRequest, resolve_launch, describe_plan
    request = LaunchRequest(program=("train.py", "--lr", "1e-3"), devices="0,2")
    plan = resolve_launch(request, selection, env=os.environ)   # pure: no I/O, nothing started
    print("\n".join(describe_plan(plan)))                        # what ``convoy launch --dry-run`` prints

Every conflict (``--devices 0,2`` with ``--nproc-per-node 3``, ``--standalone`` with ``--nnodes 2``, ...) is
reported once here, by one error that names both sides. The plan also says which engine runs the job:
``direct`` (single node, no restarts: convoy starts the workers itself with torchrun's environment, without
importing torch) or ``elastic`` (several nodes, ``--max-restarts``, a c10d/etcd rendezvous: PyTorch's own
elastic agent, ``torch.distributed.launcher.api``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from convoy.config.schema import ACCELERATOR_WORDS, KEYS, is_host
from convoy.config.settings import Source, said
from convoy.devices.inventory import Device
from convoy.devices.selection import CPU_RUN_NOTES, Selection
from convoy.devices.vendors import vendor_facts
from convoy.errors import ConfigError, shown
from convoy.launch.rank_env import DEFAULT_SIGNALS, ConvoyEnv, check_launch_settings, convoy_env, rank_env
from convoy.launch.slurm import slurm_allocation

__all__ = ["WorkerOptions", "LaunchRequest", "LaunchPlan", "resolve_launch", "describe_plan", "node_range", "ENGINES",
           "CPU_DEFAULT_NPROC", "DEFAULT_SIGNALS", "EVENT_LOG_HANDLERS", "STOP_SIGNALS", "forwarded_signals"]

ENGINES = ("auto", "direct", "elastic")
#: processes started on a machine without accelerators when neither --devices nor --nproc-per-node says.
CPU_DEFAULT_NPROC = 2

EVENT_LOG_HANDLERS = ("null", "console")
"""torch's built-in elastic event handlers a launch can name (``torch.distributed.elastic.events``)."""
START_METHODS = ("spawn", "fork", "forkserver")
"""How torch's elastic agent can start its workers (torchrun's ``--start-method``)."""
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
"""Signals that stop a job however ``--signals-to-handle`` reads."""


def forwarded_signals(text: str, *, where: str = "--signals-to-handle") -> tuple[str, ...]:
    """``--signals-to-handle``'s names, checked (``ConfigError`` for one that is not a catchable signal; the
    message names ``where`` the value came from)."""
    import signal

    names = tuple(name.strip().upper() for name in text.split(",") if name.strip())
    for name in names:
        if name in ("SIGKILL", "SIGSTOP") or not isinstance(getattr(signal, name, None), signal.Signals):
            raise ConfigError(f"{where}: {shown(name, limit=20)} is not a signal the launcher can catch; give "
                              f"names such as {DEFAULT_SIGNALS},SIGUSR1")
    return names


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How the workers are started, watched and logged (torchrun's flags of the same names). Resolving
    changes none of them: the request's options are the plan's."""

    max_restarts: int = 0
    """Restart the whole worker group up to this many times after a failure (the elastic engine)."""
    monitor_interval: float = 0.1
    """Seconds between the elastic agent's checks on its workers."""
    start_method: str = "spawn"
    """How the elastic agent starts its workers: ``spawn``, ``fork`` or ``forkserver``."""
    log_dir: str | None = None
    """One log file per rank here; ``None``: no files."""
    redirects: str = "0"
    """Streams to keep off the console: ``0``-``3``, or ``RANK:0-3,...`` per local rank."""
    tee: str = "0"
    """Streams to also write to ``log_dir``, as ``redirects``."""
    local_ranks_filter: str = ""
    """Local ranks whose output is shown (``"0,2"``); empty: every rank."""
    role: str = "default"
    """The workers' role name (torchrun's ``--role``; each worker's ``ROLE_NAME``)."""
    signals_to_handle: str = DEFAULT_SIGNALS
    """Signals the launcher catches and passes on to the workers before stopping them (SLURM's ``SIGUSR1``
    warning, say); SIGINT, SIGTERM and SIGHUP stop the job (the workers get SIGTERM) whether listed or not."""
    shutdown_timeout: int | None = None
    """Seconds a stopping worker gets between the signal and SIGKILL (None: 3 s direct, torch's 30 s elastic)."""
    local_addr: str | None = None
    """The address this node's workers and agent are reached at by other nodes (torchrun's ``--local-addr``);
    a job on one node meets on loopback and does not need it."""
    event_log_handler: str = "null"
    """torch's elastic event handler: ``null``, ``console`` (the elastic engine's)."""
    duplicate_stdout_filters: str = ""
    """Comma-separated words: stdout lines holding one are also written to ``filtered_stdout.log`` (elastic)."""
    duplicate_stderr_filters: str = ""
    """As ``duplicate_stdout_filters``, for stderr (``filtered_stderr.log``)."""
    origins: Mapping[str, Source] = field(default_factory=dict, compare=False, repr=False)
    """Where an option came from when not from its flag (torchrun's ``PET_<OPTION>``, ``CONVOY_MAX_RESTARTS``,
    a settings file): option name -> ``Source``, for messages (``said``)."""

    def said(self, name: str, value: object) -> str:
        """Option ``name`` holding ``value`` as the user gave it: ``--role x`` or ``PET_ROLE=x``."""
        return said(self.origins, name, value)

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"{self.said('max_restarts', self.max_restarts)}: give 0 or more")
        if not 0 < self.monitor_interval < 10**9:
            raise ConfigError(f"{self.said('monitor_interval', self.monitor_interval)}: give a number of seconds > 0")
        # the grammars here; the local ranks they name are checked against the node's count when it is known
        for name in ("redirects", "tee"):
            stream_map(getattr(self, name), None, named=self.said(name, repr(getattr(self, name)[:40])))
        shown_ranks(self.local_ranks_filter, None, named=self.said("local_ranks_filter",
                                                                   repr(self.local_ranks_filter[:40])))
        if not self.role.strip():
            raise ConfigError(f"{self.said('role', repr(''))}: give the workers a role name (torchrun's default is "
                              f"'default')")
        # stored as checked (upper case): torch's agent and TORCHELASTIC_SIGNALS_TO_HANDLE skip 'sigusr1'
        source = self.origins.get("signals_to_handle")
        where = f"environment {source.location}" if source and source.kind == "environment" else \
            "--signals-to-handle"
        object.__setattr__(self, "signals_to_handle", ",".join(forwarded_signals(self.signals_to_handle,
                                                                                 where=where)))
        if self.shutdown_timeout is not None and not 0 <= self.shutdown_timeout < 10**9:
            raise ConfigError(f"{self.said('shutdown_timeout', self.shutdown_timeout)}: give a whole number of "
                              f"seconds >= 0")
        if self.event_log_handler not in EVENT_LOG_HANDLERS:
            raise ConfigError(f"{self.said('event_log_handler', repr(self.event_log_handler[:40]))}: give one of "
                              f"{', '.join(EVENT_LOG_HANDLERS)}")
        if self.local_addr is not None and not is_host(self.local_addr):
            raise ConfigError(f"{self.said('local_addr', repr(self.local_addr[:60]))}: give a host name or an IP "
                              "address of this node")

    def named(self, name: str, value: object) -> str:
        """How a message names option ``name``: its flag alone, or the variable or file it came from, with
        ``value``."""
        return self.said(name, value) if name in self.origins else "--" + name.replace("_", "-")

    @property
    def agent_only(self) -> list[str]:
        """The options given that only torch's elastic agent carries out, as ``named``."""
        return [self.named(name, value) for name, value, given in (
            ("event_log_handler", self.event_log_handler, self.event_log_handler != "null"),
            ("duplicate_stdout_filters", self.duplicate_stdout_filters, bool(self.duplicate_stdout_filters)),
            ("duplicate_stderr_filters", self.duplicate_stderr_filters, bool(self.duplicate_stderr_filters)))
            if given]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """The launch as the user asked for it (flags, in torchrun's meaning); nothing resolved yet."""

    program: tuple[str, ...]
    """Script (or module with ``module``, or command with ``no_python``) followed by its arguments."""
    module: bool = False
    """Run ``program[0]`` as a module (``python -m``)."""
    no_python: bool = False
    """Run ``program`` as a command, not a Python script."""
    devices: str | None = None
    """Device request (``"0,2"``, ``"2"``, ``"auto"``); ``None`` = ``"auto"``."""
    nproc_per_node: str | None = None
    """torchrun's ``--nproc-per-node``: a number, ``auto``, ``cpu`` or ``gpu``; ``None`` = follow the devices."""
    nnodes: str | None = None
    """``"N"`` or ``"MIN:MAX"``; ``None`` = 1, or the Slurm allocation's node count."""
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: str | None = None
    standalone: bool = False
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    """Restarts, monitoring, start method and logs; the plan carries them unchanged."""
    engine: str = "auto"
    """``auto`` picks ``direct`` for one node without restarts, else ``elastic``."""
    settings: ConvoyEnv = field(default_factory=ConvoyEnv)
    """What the ranks' ``Accelerator`` is asked for (``CONVOY_*`` variables)."""
    origins: Mapping[str, Source] = field(default_factory=dict)
    """Where a setting came from when not from its flag (``convoy.config.settings.fill_unset_with_origins``):
    setting name -> a ``CONVOY_*`` variable, a settings file's line, or an Accelerate config file's key (kind
    ``"accelerate config"``). Messages name that place (``said``)."""
    notes: tuple[str, ...] = ()
    """Lines about the request for the plan (an Accelerate config file's keys that run otherwise in convoy)."""

    def said(self, name: str, value: object) -> str:
        """Setting ``name`` holding ``value`` as the user wrote it, for a message: ``--nproc-per-node 99``, or
        ``CONVOY_NPROC_PER_NODE=99``, or ``nproc_per_node = 99 (/repo/convoy.toml, line 3)``."""
        return said(self.origins, name, value)

    def __post_init__(self) -> None:
        check_launch_settings(self.settings, said=self.said)
        if not self.program:
            raise ConfigError("no training script given; usage: convoy launch [options] train.py [args]")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.module and self.no_python:  # (either may be torchrun's PET_MODULE/PET_NO_PYTHON)
            module = self.said("module", True) if "module" in self.origins else "-m/--module"
            raise ConfigError(f"{module} and {self.said('no_python', True)} cannot be combined; choose one")
        if self.master_port is not None and not 0 <= self.master_port <= 65535:
            raise ConfigError(f"{self.said('master_port', self.master_port)}: give a TCP port from 1 to 65535 (0: a "
                              f"free one)")
        if self.node_rank is not None and self.node_rank < 0:
            raise ConfigError(f"{self.said('node_rank', self.node_rank)}: give 0 or more")
        # malformed counts are refused here, before any device is selected: a typo is named as a typo, not as
        # whatever selecting devices with the other flags runs into first
        asked_nproc(self.nproc_per_node)
        node_range(self.nnodes)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start this node's processes; ``describe_plan`` prints it.

    Fields named as the request's (``nproc_per_node``, ``master_port``, ...) hold the resolved values; the
    options resolving leaves alone are the request's own ``workers`` record.
    """

    command: tuple[str, ...]
    """argv of every worker (torchrun's: ``python -u script.py args``)."""
    engine: str
    """``direct`` or ``elastic``."""
    nproc_per_node: int
    min_nodes: int
    max_nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    """0 = a free port on ``master_addr`` is chosen when the job starts."""
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    rdzv_configs: tuple[tuple[str, str], ...] = ()
    vendor: str = "cpu"
    """The selected devices' vendor (``convoy.devices.vendors``); ``"cpu"`` without accelerators."""
    devices: tuple[Device, ...] = ()
    """Selected devices; local rank i uses ``devices[i]``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to every worker's environment (visibility, CONVOY_*, OMP_NUM_THREADS)."""
    workers: WorkerOptions = field(default_factory=WorkerOptions)
    """Restarts, monitoring, start method and logs, as the request gave them."""
    given_by: tuple[str, ...] = ()
    """The request's values that no flag gave, as they were given: torchrun's ``PET_NNODES=2``,
    ``CONVOY_STRATEGY=ddp``, ``nproc_per_node = 2 (/repo/convoy.toml, line 3)`` (``describe_plan`` shows them)."""
    from_file: tuple[str, ...] = ()
    """The values an Accelerate config file gave (``--config_file``), each with its key: ``strategy = zero3
    (fsdp.yaml: fsdp_config.fsdp_sharding_strategy = FULL_SHARD)``."""
    explanation: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        """The process-group backend the ranks will use (informative; the training layer chooses it)."""
        return vendor_facts(self.vendor).process_group_backend

    @property
    def world_size(self) -> int | None:
        """Total processes, or ``None`` when the node count is elastic (MIN < MAX)."""
        return self.min_nodes * self.nproc_per_node if self.min_nodes == self.max_nodes else None

    def rank_of(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def device_of(self, local_rank: int) -> Device | None:
        return self.devices[local_rank] if local_rank < len(self.devices) else None


def resolve_launch(request: LaunchRequest, selection: Selection, *, env: Mapping[str, str]) -> LaunchPlan:
    """The plan for ``request`` on the devices ``selection`` chose, under ``env``."""
    notes = _opening_notes(request, selection)
    nproc, devices = _processes(request, selection, notes)
    _check_ranks_filter(request.workers, nproc)
    notes.extend(_unrun_ranks_note(request.workers, nproc))
    nodes = _nodes(request, env, notes)
    _check_node_rank(request, nodes)
    _check_standalone(request, nodes.max_nodes)
    notes.extend(_unused_local_addr_note(request.workers, nodes.max_nodes))
    backend = (request.rdzv_backend or "static").lower()
    engine = _engine(request, backend, nodes.min_nodes, nodes.max_nodes)
    backend, master_addr, master_port, endpoint = _rendezvous(request, engine, backend, nodes, env, notes)
    extra = _rdzv_configs(request, backend, nodes.node_rank)
    _check_parallelism(request, nodes, nproc)
    command = _command(request)
    worker_env = _worker_env(request, selection, env, nproc)
    return LaunchPlan(
        command=command,
        engine=engine,
        nproc_per_node=nproc,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        node_rank=nodes.node_rank,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=tuple(sorted(extra.items())),
        run_id=nodes.run_id or "none",
        vendor=selection.vendor,
        devices=tuple(devices),
        env=worker_env,
        workers=request.workers,
        given_by=tuple(_given_elsewhere(request, from_file=False)),
        from_file=tuple(_given_elsewhere(request, from_file=True)),
        explanation=tuple(notes),
    )


def _opening_notes(request: LaunchRequest, selection: Selection) -> list[str]:
    """The selection's explanation, less its CPU-run lines, then the request's own notes."""
    # a CPU run is said once, by the launch's own note (_cpu_note), not three more times by the selection's
    return [*(n for n in selection.explanation if selection.devices or n not in CPU_RUN_NOTES), *request.notes]


def _check_ranks_filter(workers: WorkerOptions, nproc: int) -> None:
    """Refuse a ``--local-ranks-filter`` that shows none of this node's ``nproc`` ranks."""
    shown_ranks(workers.local_ranks_filter, nproc,
                named=workers.said("local_ranks_filter", repr(workers.local_ranks_filter[:40])))


@dataclass(frozen=True)
class _Nodes:
    """The job's nodes as the request and a Slurm allocation give them, before the rendezvous is planned."""

    min_nodes: int
    max_nodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None
    run_id: str | None
    slurm: bool
    """Whether a Slurm allocation of several nodes gave them."""


def _nodes(request: LaunchRequest, env: Mapping[str, str], notes: list[str]) -> _Nodes:
    """The node counts, this node's rank, the main node and the run id: the request's, else a multi-node Slurm
    allocation's (said in ``notes``)."""
    min_nodes, max_nodes = node_range(request.nnodes)
    node_rank = request.node_rank if request.node_rank is not None else 0
    master_addr, master_port = request.master_addr, request.master_port
    run_id = request.rdzv_id
    alloc = slurm_allocation(env) if request.nnodes is None else None
    slurm = alloc is not None and alloc.nnodes > 1
    if alloc is not None and alloc.tasks_per_node and alloc.tasks_per_node > 1:  # on one node as on several
        raise ConfigError(f"srun started {alloc.tasks_per_node} tasks on this node, but convoy launch starts the "
                          "ranks itself; run it with srun --ntasks-per-node=1")
    if alloc is not None and slurm:
        min_nodes = max_nodes = alloc.nnodes
        node_rank = request.node_rank if request.node_rank is not None else alloc.node_rank
        master_addr = master_addr or alloc.master_addr
        master_port = master_port or alloc.master_port
        run_id = run_id or alloc.job_id
        notes.append(f"Slurm job {alloc.job_id}: node {node_rank} of {alloc.nnodes}, main node {master_addr}")
    return _Nodes(min_nodes, max_nodes, node_rank, master_addr, master_port, run_id, slurm)


def _check_node_rank(request: LaunchRequest, nodes: _Nodes) -> None:
    """Refuse a node rank outside the job's nodes."""
    if not 0 <= nodes.node_rank < nodes.max_nodes:
        raise ConfigError(_node_rank_outside(request, nodes.node_rank, nodes.max_nodes, slurm=nodes.slurm))


def _check_standalone(request: LaunchRequest, max_nodes: int) -> None:
    """Refuse ``--standalone`` with several nodes or with a rendezvous endpoint."""
    if request.standalone and max_nodes > 1:
        raise ConfigError(f"{request.said('standalone', True)} means one node, but "
                          f"{request.said('nnodes', request.nnodes)}; drop one of them")
    if request.standalone and request.rdzv_endpoint:  # torchrun replaces the endpoint without a word
        raise ConfigError(f"{request.said('standalone', True)} runs the rendezvous on this machine, but "
                          f"{request.said('rdzv_endpoint', request.rdzv_endpoint)} names one; drop one of them")


def _unused_local_addr_note(workers: WorkerOptions, max_nodes: int) -> list[str]:
    """A note that ``--local-addr`` is not used by a one-node job."""
    if workers.local_addr and max_nodes == 1:
        return [f"{workers.said('local_addr', workers.local_addr)} is not used: the ranks of a one-node job "
                "meet on loopback"]
    return []


def _rendezvous(request: LaunchRequest, engine: str, backend: str, nodes: _Nodes, env: Mapping[str, str],
                notes: list[str]) -> tuple[str, str, int, str]:
    """Where the ranks meet, by engine and backend: (backend, master address, master port, endpoint)."""
    if engine == "direct":
        return _direct_rendezvous(backend, nodes)
    if request.standalone or (nodes.max_nodes == 1 and backend == "static" and not request.master_port):
        if request.rdzv_endpoint and backend == "static":
            _static_endpoint(request)  # refuses a --master-addr naming another place, on one node too
        return _local_agent_rendezvous(request)
    if backend == "static":
        return _static_rendezvous(request, backend, nodes, env)
    return _dynamic_rendezvous(request, backend, notes)


def _direct_rendezvous(backend: str, nodes: _Nodes) -> tuple[str, str, int, str]:
    """The direct engine's: the main node's address (loopback by default), a free port unless one is given."""
    master_addr, master_port = nodes.master_addr or "127.0.0.1", nodes.master_port or 0
    return backend, master_addr, master_port, f"{master_addr}:{master_port or 'free port'}"


def _local_agent_rendezvous(request: LaunchRequest) -> tuple[str, str, int, str]:
    """One node on torch's agent, on a free loopback port: c10d with restarts, else static."""
    # with restarts torchrun --standalone's c10d store (each attempt's workers then get a fresh store), without
    # torch's static rendezvous, which skips what c10d pays to meet other nodes (convoy.launch.elastic)
    backend = "c10d" if request.workers.max_restarts else "static"
    return backend, "127.0.0.1", 0, request.rdzv_endpoint or "127.0.0.1:0"


def _static_rendezvous(request: LaunchRequest, backend: str, nodes: _Nodes,
                       env: Mapping[str, str]) -> tuple[str, str, int, str]:
    """A static rendezvous at the endpoint or the main node (port 29500 by default); several nodes need one."""
    master_addr, master_port = nodes.master_addr, nodes.master_port
    if request.rdzv_endpoint:  # torchrun's static rendezvous is at the endpoint when one is given
        master_addr, master_port = _static_endpoint(request)
    elif nodes.max_nodes > 1 and not master_addr:  # torchrun would plan 127.0.0.1, which no other node reaches
        raise ConfigError(_no_meeting_place(request, nodes.max_nodes, env))
    master_addr, master_port = master_addr or "127.0.0.1", master_port or 29500
    return backend, master_addr, master_port, f"{master_addr}:{master_port}"


def _dynamic_rendezvous(request: LaunchRequest, backend: str, notes: list[str]) -> tuple[str, str, int, str]:
    """A c10d/etcd rendezvous at ``--rdzv-endpoint`` (required); ``--master-addr``/``--master-port`` are unused."""
    if not request.rdzv_endpoint:
        raise ConfigError(f"{request.said('rdzv_backend', request.rdzv_backend)} needs --rdzv-endpoint HOST:PORT "
                          f"(or PET_RDZV_ENDPOINT, CONVOY_RDZV_ENDPOINT, or rdzv_endpoint in convoy.toml), the "
                          f"same on every node")
    if request.master_addr or request.master_port:  # torchrun ignores them here too, with a warning
        unused = " and ".join(request.said(name, value) for name, value in (
            ("master_addr", request.master_addr), ("master_port", request.master_port)) if value)
        notes.append(f"{unused} {'are' if ' and ' in unused else 'is'} not used by a {backend} rendezvous: the "
                     f"rendezvous at {request.rdzv_endpoint} tells every rank where rank 0 is")
    return backend, "", 0, request.rdzv_endpoint


def _rdzv_configs(request: LaunchRequest, backend: str, node_rank: int) -> dict[str, str]:
    """``--rdzv-conf``'s pairs, with this node's rank for a static rendezvous."""
    extra = dict(_rdzv_conf(request.rdzv_conf, named=request.said("rdzv_conf", repr(request.rdzv_conf))))
    if backend == "static":
        extra["rank"] = str(node_rank)
    return extra


def _check_parallelism(request: LaunchRequest, nodes: _Nodes, nproc: int) -> None:
    """Refuse parallel degrees that do not fit a fixed world size, naming where they came from."""
    if request.settings.parallelism and nodes.min_nodes == nodes.max_nodes:
        from convoy.errors import StrategyError
        from convoy.plan.dims import ParallelDims

        try:
            ParallelDims.parse(request.settings.parallelism, world_size=nodes.min_nodes * nproc)
        except StrategyError as err:
            if "parallelism" not in request.origins:  # --dp/--tp/--pp: the message names the degrees
                raise
            raise StrategyError(f"{request.said('parallelism', request.settings.parallelism)}: {err}") from None


def _worker_env(request: LaunchRequest, selection: Selection, env: Mapping[str, str], nproc: int) -> dict[str, str]:
    """The variables every worker gets: the selection's visibility, CONVOY_*, and torchrun's OMP_NUM_THREADS."""
    worker_env = {**selection.env, **convoy_env(request.settings)}
    if "OMP_NUM_THREADS" not in env and nproc > 1:
        worker_env["OMP_NUM_THREADS"] = "1"  # torchrun's default, so N ranks do not oversubscribe the cores
    return worker_env


def _given_elsewhere(request: LaunchRequest, *, from_file: bool) -> list[str]:
    """Each value of the request that no flag gave, as it was given (``PET_NNODES=2``, ``CONVOY_STRATEGY=ddp``,
    ``nproc_per_node = 2 (/repo/convoy.toml, line 3)``): those of an Accelerate config file, or the others."""
    given = []
    options = request.settings.strategy_options or {}
    for name, source in request.origins.items():
        if (source.kind == "accelerate config") != from_file:
            continue
        holder = next((h for h in (request, request.workers, request.settings) if hasattr(h, name)), None)
        if name in options:
            value = options[name]
            given.append(source.said(name, ",".join(value) if isinstance(value, tuple) else value))
        elif name == "deepspeed_config":  # the JSON object, named by its sections (the environment shows it whole)
            given.append(source.said(name, "{" + ", ".join(request.settings.deepspeed_config or {}) + "}"))
        else:
            given.append(source.said(name, getattr(holder, name)) if holder is not None else str(source))
    return given


def _node_rank_outside(request: LaunchRequest, node_rank: int, max_nodes: int, *, slurm: bool) -> str:
    """The line for a node rank outside the job's nodes, naming where both came from."""
    rank = request.said("node_rank", node_rank) if request.node_rank is not None else f"SLURM_NODEID={node_rank}"
    if request.nnodes:
        return f"{rank} is outside {request.said('nnodes', request.nnodes)}; give 0..{max_nodes - 1}"
    if slurm:
        return f"{rank} is outside the Slurm job's {max_nodes} nodes; give 0..{max_nodes - 1}"
    return (f"{rank} is outside a one-node job (--nnodes is 1 when not given); give --nnodes N for a job on N "
            f"machines (node ranks 0..N-1), or leave out the node rank")


def _no_meeting_place(request: LaunchRequest, nodes: int, env: Mapping[str, str]) -> str:
    """The line for a job on several machines that names no rendezvous address (torchrun plans 127.0.0.1)."""
    asked = request.said("nnodes", request.nnodes) if request.nnodes else f"the Slurm job's {nodes} nodes"
    line = (f"{asked} runs on {nodes} machines, but nothing says where they meet: give --master-addr HOST (node "
            f"0's address, the same on every node, with --master-port PORT, default 29500) or --rdzv-endpoint "
            f"HOST:PORT (or PET_MASTER_ADDR/PET_RDZV_ENDPOINT in the environment, as torchrun reads them)")
    if env.get("MASTER_ADDR", "").strip():
        line += (f"; MASTER_ADDR={env['MASTER_ADDR'][:60]} in this environment is a rank's variable, which torchrun "
                 f"and convoy launch do not read: pass it as --master-addr \"$MASTER_ADDR\"")
    return line


#: CPU processes per core beyond which a count is taken for a typo (--nproc-per-node 999999): gloo ranks
#: oversubscribed 8 to a core already crawl; never below MIN_CPU_PROCESS_CAP
CPU_PROCESSES_PER_CORE = 8
MIN_CPU_PROCESS_CAP = 64


def asked_nproc(value: str | int | None) -> str | None:
    """``--nproc-per-node`` in the settings' grammar (``convoy.config.schema``'s ``nproc_per_node`` key, which
    ``CONVOY_NPROC_PER_NODE`` and convoy.toml go through too): None (not given), ``auto``, torchrun's ``cpu``,
    ``gpu``, ``xpu``, ``cuda``, or a whole number >= 1 as text; ``ConfigError`` otherwise."""
    return None if value is None else KEYS["nproc_per_node"].parse(value, where="--nproc-per-node")


def _cpu_cap() -> int:
    """The most CPU processes a launch starts on this machine."""
    return max(MIN_CPU_PROCESS_CAP, CPU_PROCESSES_PER_CORE * (os.cpu_count() or 1))


def _cpu_processes(count: int, request: LaunchRequest) -> int:
    """``count`` CPU processes, unless that many would swamp this machine."""
    cores, cap = os.cpu_count() or 1, _cpu_cap()
    if count > cap:
        raise ConfigError(f"{request.said('nproc_per_node', request.nproc_per_node)} would be {count} CPU processes "
                          f"on a machine with {cores} core{'s' if cores != 1 else ''}; give at most {cap}, or "
                          f"select accelerators")
    return count


_STREAMS = "0 (none), 1 (stdout), 2 (stderr) or 3 (both)"


def stream_map(text: str, nproc: int | None, *, flag: str = "--redirects", named: str | None = None
               ) -> dict[int, int]:
    """torchrun's ``--redirects``/``--tee`` value as {local rank: 0-3} for this node's ``nproc`` ranks: ``"3"``
    (every rank) or ``"0:1,1:2"`` (1 stdout, 2 stderr, 3 both; ranks this node does not run are left out, as
    torchrun leaves them; None: the grammar only). ``ConfigError`` for anything else, naming the value as
    ``named`` says (default: ``flag`` and the value; ``PET_TEE='7'`` for torchrun's variable)."""
    given = text
    text = (text or "0").strip()
    if re.fullmatch(r"[0-3]", text):
        return {rank: int(text) for rank in range(nproc or 0)}
    pairs = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,6}\s*:\s*[0-3]", pair) for pair in pairs):
        raise ConfigError(f"{named or f'{flag} {shown(given)}'}: give one of {_STREAMS} for every rank, or "
                          "LOCAL_RANK:VALUE pairs like '0:3,1:1'")
    mapping = {int(k): int(v) for k, _, v in (pair.partition(":") for pair in pairs)}
    return {k: v for k, v in mapping.items() if nproc is None or k < nproc}


def shown_ranks(text: str, nproc: int | None, *, named: str | None = None) -> set[int] | None:
    """torchrun's ``--local-ranks-filter`` (``"0,2"``) as the local ranks of this node's ``nproc`` whose output
    is shown (listed ranks it does not run are left out, as torchrun leaves them); None (empty): every rank.
    ``ConfigError`` for anything else, or for a filter that would show no rank at all (naming the value as
    ``named`` says; default: the flag and the value)."""
    if not (text or "").strip():
        return None
    named = named or f"--local-ranks-filter {shown(text)}"
    items = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,6}", item) for item in items):
        raise ConfigError(f"{named}: give local ranks like 0 or 0,2")
    ranks = {int(item) for item in items if nproc is None or int(item) < nproc}
    if not ranks:
        assert nproc is not None  # without nproc every listed rank is kept, and one is listed
        raise ConfigError(f"{named} shows no rank: this node runs {nproc} "
                          f"process{'es' if nproc != 1 else ''} (local ranks 0..{nproc - 1})")
    return ranks


def _unrun_ranks_note(workers: WorkerOptions, nproc: int) -> list[str]:
    """A note for each output flag that names local ranks this node does not run (they are ignored)."""
    notes = []
    for name, named in (("redirects", stream_map(workers.redirects, None)),
                        ("tee", stream_map(workers.tee, None, flag="--tee")),
                        ("local_ranks_filter", shown_ranks(workers.local_ranks_filter, None) or ())):
        beyond = sorted(rank for rank in named if rank >= nproc)
        if beyond:
            flag = workers.named(name, getattr(workers, name))
            notes.append(f"{flag} names local rank{'s' if len(beyond) > 1 else ''} "
                         f"{', '.join(map(str, beyond))}, which this node does not run ({nproc} "
                         f"process{'es' if nproc != 1 else ''}): ignored, as torchrun does")
    return notes


def _processes(request: LaunchRequest, selection: Selection, notes: list[str]) -> tuple[int, tuple[Device, ...]]:
    devices = selection.devices
    asked = asked_nproc(request.nproc_per_node)
    explicit_devices = request.devices not in (None, "auto")
    if asked is None or asked == "auto" or asked in ACCELERATOR_WORDS:
        if devices:
            return len(devices), devices
        if asked in ACCELERATOR_WORDS:
            raise ConfigError(f"{request.said('nproc_per_node', asked)} asks for one process per accelerator, but "
                              f"none was found; give a number of CPU processes instead, e.g. "
                              f"{request.said('nproc_per_node', CPU_DEFAULT_NPROC)}")
        count = CPU_DEFAULT_NPROC if asked is None else (os.cpu_count() or 1)
        notes.append(_cpu_note(count, asked=explicit_devices))
        return count, ()
    count = (os.cpu_count() or 1) if asked == "cpu" else int(asked)
    if explicit_devices and devices and count != len(devices):
        raise ConfigError(f"{request.said('devices', request.devices)} selects {len(devices)} device(s) but "
                          f"{request.said('nproc_per_node', request.nproc_per_node)} asks for {count} processes; "
                          f"give one of them, or make them agree")
    if not devices:
        notes.append(_cpu_note(_cpu_processes(count, request), asked=explicit_devices or asked == "cpu"))
    elif count > len(devices):
        # Each rank computes on the device of its LOCAL_RANK: a rank past the last device would find none.
        raise ConfigError(f"{request.said('nproc_per_node', request.nproc_per_node)} needs {count} devices (one per "
                          f"process) but {_devices_text(devices)} selected; give "
                          f"{request.said('nproc_per_node', len(devices))}"
                          + (f", or --devices 0 for {count} CPU processes" if count <= _cpu_cap() else ""))
    return count, devices[:count]


def _devices_text(devices: tuple[Device, ...]) -> str:
    labels = ", ".join(d.label for d in devices)
    return f"only {len(devices)} ({labels}) {'is' if len(devices) == 1 else 'are'}"


#: how the note that a job runs CPU processes begins (``convoy launch`` prints it): none found, none asked for, or
#: a torch that cannot use the devices (``convoy.launch.torch_build``)
CPU_NOTE_STARTS = ("no accelerator found", "no accelerator asked for", "this Python's torch (")


def _cpu_note(count: int, *, asked: bool = False) -> str:
    return (f"{CPU_NOTE_STARTS[asked]}: running {count} CPU process{'es' if count != 1 else ''} with the gloo "
            "backend")


def node_range(text: str | None) -> tuple[int, int]:
    """``--nnodes`` as (MIN, MAX) nodes: ``"2"`` is (2, 2), ``"1:4"`` is (1, 4); ``ConfigError`` otherwise
    (the grammar of the settings' ``nnodes`` key in ``convoy.config.schema``, which convoy.toml's
    ``nnodes`` go through too)."""
    low, sep, high = KEYS["nnodes"].parse((text or "1").strip(), where="--nnodes").partition(":")
    return int(low), int(high if sep else low)


def split_endpoint(endpoint: str, *, default_port: int) -> tuple[str, int]:
    """``HOST[:PORT]`` (IPv6 in brackets) -> (host, port), ``default_port`` where none is given (torch's: 29400
    for c10d, 29500 for a static rendezvous)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or (host.count(":") and not host.endswith("]")):  # no port, or a bare IPv6 address
        return endpoint.strip("[]"), default_port
    return host.strip("[]"), int(port) if port.isdigit() else default_port


def _static_endpoint(request: LaunchRequest) -> tuple[str, int]:
    """A static rendezvous's ``--rdzv-endpoint`` as (address, port), torchrun's reading (29500 without a port);
    ``ConfigError`` when ``--master-addr``/``--master-port`` name another place (torchrun took the endpoint)."""
    assert request.rdzv_endpoint is not None  # the caller checked that one is given
    address, number = split_endpoint(request.rdzv_endpoint, default_port=29500)
    if (request.master_addr and request.master_addr.strip("[]") != address) or \
            (request.master_port and request.master_port != number):
        given = " ".join(request.said(name, value) for name, value in (("master_addr", request.master_addr),
                                                                       ("master_port", request.master_port)) if value)
        raise ConfigError(f"{request.said('rdzv_endpoint', request.rdzv_endpoint)} and {given} name different "
                          f"places for the static rendezvous; give one of them")
    return address, number


def _engine(request: LaunchRequest, backend: str, min_nodes: int, max_nodes: int) -> str:
    single = max_nodes == 1 and request.workers.max_restarts == 0 and backend == "static" and not request.rdzv_endpoint
    agent_only = request.workers.agent_only
    if request.engine == "direct" and agent_only:
        raise ConfigError(f"{agent_only[0]} is carried out by torch's elastic agent: use --engine elastic (or "
                          "leave --engine out)")
    if request.engine == "direct" and not single:
        why = [request.said("nnodes", request.nnodes) if request.nnodes else f"the Slurm job's {max_nodes} nodes"
               ] if max_nodes > 1 else []
        why += [request.said(name, value) for name, value in (
            ("max_restarts", request.workers.max_restarts), ("rdzv_backend", request.rdzv_backend),
            ("rdzv_endpoint", request.rdzv_endpoint)) if value and value != "static"]
        raise ConfigError(f"--engine direct runs one node without restarts, but {' and '.join(why)} asks for more; "
                          f"drop it, or use --engine elastic")
    single = single and not agent_only
    if request.engine == "auto":
        return "direct" if single else "elastic"
    return request.engine


def _rdzv_conf(text: str | None, *, named: str | None = None) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{named or f'--rdzv-conf {text!r}'}: {item!r} is not KEY=VALUE (e.g. "
                              "join_timeout=600)")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _command(request: LaunchRequest) -> tuple[str, ...]:
    if request.no_python:
        return tuple(request.program)
    if request.module:
        return (sys.executable, "-u", "-m", *request.program)
    return (sys.executable, "-u", *request.program)


def _torch_cannot(plan: LaunchPlan) -> bool:
    return any(note.startswith(CPU_NOTE_STARTS[2]) for note in plan.explanation)


def describe_plan(plan: LaunchPlan, *, base_env: Mapping[str, str] | None = None) -> list[str]:
    """Human-readable lines: nodes, processes, each rank's device, environment and rendezvous."""
    world = plan.world_size if plan.world_size is not None else f"{plan.min_nodes * plan.nproc_per_node}+"
    nodes = f"{plan.min_nodes}" if plan.min_nodes == plan.max_nodes else f"{plan.min_nodes}:{plan.max_nodes}"
    port = plan.master_port or "a free port chosen at start"
    lines = [
        f"command:    {' '.join(plan.command)}",
        f"engine:     {plan.engine}" + ("  (torch elastic agent)" if plan.engine == "elastic" else
                                         "  (workers started directly, torchrun's environment)"),
        f"nodes:      {nodes} (this is node {plan.node_rank}); {plan.nproc_per_node} "
        f"process{'' if plan.nproc_per_node == 1 else 'es'} per node; "
        f"world size {world}",
        f"devices:    {plan.vendor}, backend {plan.backend}" if not _torch_cannot(plan) else
        f"devices:    {plan.vendor}, not used by this Python's torch: CPU processes, backend gloo",
        f"rendezvous: {plan.rdzv_backend} at {plan.rdzv_endpoint}; "
        + (f"MASTER_ADDR={plan.master_addr} MASTER_PORT={port}" if plan.master_addr else
           "MASTER_ADDR and MASTER_PORT set by the rendezvous") + f"; run id {plan.run_id}",
        f"restarts:   {plan.workers.max_restarts}",
    ]
    if plan.given_by:
        lines.append(f"given by:   {', '.join(plan.given_by)}  (not flags)")
    for i, value in enumerate(plan.from_file):
        lines.append(("config:     " if i == 0 else " " * 12) + value)
    prefix = vendor_facts(plan.vendor).device_type
    for local in range(plan.nproc_per_node):
        device = plan.device_of(local)
        where = (f"device {device.index} {device.name} uuid={device.uuid} as {prefix}:{local}"
                 if device is not None else "cpu")
        if device is not None and _torch_cannot(plan):
            where = (f"device {device.index} {device.name} uuid={device.uuid} visible as {prefix}:{local}, not used "
                     "(a CPU process)")
        lines.append(f"  rank {plan.rank_of(local)} (local {local}): {where}")
    lines.append("environment (every rank):")
    lines += [f"  {key}={value}" for key, value in sorted(plan.env.items())]
    if plan.world_size is not None:
        sample = rank_env(rank=plan.rank_of(0), local_rank=0, world_size=plan.world_size,
                          local_world_size=plan.nproc_per_node, master_addr=plan.master_addr,
                          master_port=plan.master_port, run_id=plan.run_id, group_rank=plan.node_rank,
                          group_world_size=plan.max_nodes, max_restarts=plan.workers.max_restarts,
                          signals_to_handle=plan.workers.signals_to_handle)
        if plan.engine == "elastic" and (plan.rdzv_backend == "static" or not plan.workers.max_restarts):
            sample["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the agent's store is the workers' but for c10d restarts
        lines.append("environment (per rank, shown for local rank 0; RANK/LOCAL_RANK differ):")
        lines += [f"  {key}={value}" for key, value in sorted(sample.items())]
    lines += [f"note: {text}" for text in plan.explanation]
    return lines

