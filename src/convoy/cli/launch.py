"""``convoy launch``: one process per device, on one machine or many, with torchrun's flags.

    convoy launch train.py --lr 1e-3                  # every free accelerator here, or 2 CPU processes
    convoy launch --devices 2,0 train.py              # 2 processes; physical GPU 2 is cuda:0 of rank 0
    convoy launch --nproc-per-node 4 -m my.trainer    # torchrun's meaning
    convoy launch --nnodes 2 --node-rank 0 --master-addr head --master-port 29500 train.py
    convoy launch --dry-run --devices 0,1 train.py    # print the plan and exit
    convoy launch --config_file fsdp.yaml train.py    # an Accelerate config file (accelerate launch --config_file)

Python: ``convoy.launch.job.launch_job(LaunchRequest(...))``; functions: ``convoy.launch(fn, args)``.
"""

from __future__ import annotations

import argparse
import os
import re

from convoy.config.schema import (
    COMPILE_MODES,
    COMPILE_SCOPES,
    DEFAULT_COLLECTIVE_TIMEOUT,
    FP8_RECIPES,
    KEYS,
    MIXED_PRECISIONS,
    PP_SCHEDULES,
    RECOMPUTE_MODES,
    is_host,
)
from convoy.errors import ConfigError, shown
from convoy.launch.rank_env import LAUNCHED_OPTIONS
from convoy.launch.resolve import DEFAULT_SIGNALS, EVENT_LOG_HANDLERS, START_METHODS

DESCRIPTION = ("Start one process per selected device (or N CPU processes with gloo) with torchrun's "
               "environment; torchrun's flags keep their names and meanings, Accelerate's spellings are aliases.")
EPILOG = """examples:
  convoy launch train.py                          all accelerators here (CPU: 2 gloo processes)
  convoy launch --devices 0,2 --free train.py     GPUs 0 and 2, only if nobody uses them
  convoy launch --nproc-per-node 2 train.py       as torchrun --nproc-per-node 2 train.py
  convoy launch --num_processes 2 train.py        as accelerate launch --num_processes 2 train.py
  convoy launch --max-restarts 2 train.py         restart the group up to twice (torch elastic agent)
  convoy launch --dry-run --devices 2,0 train.py  print nodes, ranks, devices, environment, rendezvous
  convoy launch --config_file fsdp.yaml train.py  the settings an Accelerate config file holds (flags win)

torchrun's variables: every torchrun flag is also read from PET_<FLAG> (PET_NNODES, PET_NODE_RANK,
PET_MASTER_ADDR, ...: what Kubeflow's PyTorchJob sets), as torchrun reads them; a flag wins.
Precedence: flag > PET_<FLAG> > --config_file > CONVOY_<KEY> > ./convoy.toml > user settings file > default."""

STOPPED_BY_SIGTERM = True  # convoy.cli.main: SIGTERM ends the job with 143 and "terminated"

_UNSUPPORTED = {"logs_specs": None, "numa_binding": None, "virtual_local_rank": False}


#: the flags ``WorkerOptions`` holds (not given: its defaults, torchrun's)
_WORKER_OPTIONS = ("max_restarts", "monitor_interval", "start_method", "log_dir", "redirects", "tee",
                   "local_ranks_filter", "role", "signals_to_handle", "shutdown_timeout", "local_addr",
                   "event_log_handler", "duplicate_stdout_filters", "duplicate_stderr_filters")


def _whole(text: str) -> int:
    """argparse type of every whole-number flag: ASCII digits only (``int()`` would read '٣'), at most 9."""
    if not re.fullmatch(r"\s*-?[0-9]{1,9}\s*", text):
        too_long = re.fullmatch(r"\s*-?[0-9]+\s*", text)
        raise argparse.ArgumentTypeError(f"{shown(text)} is " + ("too large (at most 9 digits)" if too_long
                                                                  else "not a whole number"))
    return int(text)


def _seconds(text: str) -> float:
    if not re.fullmatch(r"\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*", text) or not 0 < float(text) < 10**9:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds > 0")
    return float(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``convoy launch``'s flags: devices, torchrun's, the training settings, then the program."""
    _add_device_flags(parser.add_argument_group("devices"))
    tr = parser.add_argument_group("torchrun's flags (same names and meanings)")
    _add_node_flags(tr)
    _add_restart_flags(tr)
    _add_program_flags(tr)
    _add_output_flags(tr)
    _add_agent_flags(tr)
    _add_unsupported_flags(tr)
    _add_training_flags(parser.add_argument_group("training settings (CONVOY_* variables for the ranks' Accelerator)"))
    _add_program_arguments(parser)


def _add_device_flags(dev) -> None:
    """Which devices: the request, its filters and order, and the lease."""
    dev.add_argument("--devices", "--gpu_ids", "--gpu-ids", default=None, metavar="SPEC",
                     help="devices to use: '0,2', '2' (first two), 'all', 'auto' (default; CPU when none)")
    dev.add_argument("--free", action="store_true", default=None,
                     help="only devices no process is using and no other job has leased")
    dev.add_argument("--min-free-memory", default=None, metavar="MEM", help="e.g. 20GiB")
    dev.add_argument("--max-utilization", type=_whole, default=None, metavar="PCT")
    dev.add_argument("--exclude", default="", metavar="IDX,...",
                     help="devices never to use: visible indices or UUIDs, comma-separated")
    from convoy.devices.selection import ORDERS  # torch-free, and the orders' one home

    dev.add_argument("--order", default=None, choices=ORDERS,
                     help=f"device order for a count: {', '.join(ORDERS)} (default: index)")
    dev.add_argument("--wait", default=None, metavar="T",
                     help="wait up to T (30s, 5m, 1h, inf) for devices leased by another job")
    dev.add_argument("--no-lease", action="store_true", help="do not hold a lease on the devices")


def _add_node_flags(tr) -> None:
    """torchrun's processes, nodes and rendezvous (with Accelerate's spellings)."""
    tr.add_argument("--nproc-per-node", "--nproc_per_node", default=None, metavar="N",
                    help="processes per node: a number, auto, cpu or gpu (default: one per selected device)")
    tr.add_argument("--num_processes", "--num-processes", dest="num_processes", type=_whole, default=None,
                    help="Accelerate: total processes over all machines")
    tr.add_argument("--nnodes", "--num_machines", "--num-machines", default=None, metavar="N[:M]")
    tr.add_argument("--node-rank", "--node_rank", "--machine_rank", "--machine-rank", type=_whole, default=None)
    tr.add_argument("--master-addr", "--master_addr", "--main_process_ip", "--main-process-ip", default=None)
    tr.add_argument("--master-port", "--master_port", "--main_process_port", "--main-process-port", type=_whole,
                    default=None)
    tr.add_argument("--rdzv-backend", "--rdzv_backend", default=None)
    tr.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None)
    tr.add_argument("--rdzv-id", "--rdzv_id", default=None)
    tr.add_argument("--rdzv-conf", "--rdzv_conf", default=None)
    tr.add_argument("--standalone", action="store_true")


def _add_restart_flags(tr) -> None:
    """torchrun's restarts, monitoring, start method and role."""
    tr.add_argument("--max-restarts", "--max_restarts", type=_whole, default=None,
                    help="restart the whole worker group up to N times after a failure (default 0)")
    tr.add_argument("--monitor-interval", "--monitor_interval", type=_seconds, default=None,
                    help="seconds between the elastic agent's checks on its workers (default 0.1)")
    tr.add_argument("--start-method", "--start_method", default=None, choices=START_METHODS,
                    help="how the elastic agent starts its workers (default spawn)")
    tr.add_argument("--role", default=None, help="the workers' role name (default 'default')")


def _add_program_flags(tr) -> None:
    """torchrun's ways to run the program: a script, a module or a command."""
    tr.add_argument("-m", "--module", action="store_true", help="run the program as a Python module")
    tr.add_argument("--no-python", "--no_python", action="store_true", help="run the program as a command")
    tr.add_argument("--run-path", "--run_path", action="store_true", help="accepted; scripts run by path anyway")


def _add_output_flags(tr) -> None:
    """torchrun's logs, redirects and the local ranks whose output is shown."""
    tr.add_argument("--log-dir", "--log_dir", default=None, help="one log file per rank here")
    tr.add_argument("-r", "--redirects", default=None, help="streams to keep off the console: 0-3 or RANK:0-3,..")
    tr.add_argument("-t", "--tee", default=None, help="streams to also write to --log-dir (always on there)")
    tr.add_argument("--local-ranks-filter", "--local_ranks_filter", default=None)


def _add_agent_flags(tr) -> None:
    """torchrun's local address, event log, signals, shutdown time and duplicated output."""
    tr.add_argument("--local-addr", "--local_addr", default=None,
                    help="this node's address for the other nodes (several nodes; one node meets on loopback)")
    tr.add_argument("--event-log-handler", "--event_log_handler", default=None, choices=EVENT_LOG_HANDLERS,
                    help="torch's elastic event handler (the elastic engine; default null)")
    tr.add_argument("--signals-to-handle", "--signals_to_handle", default=None, metavar="SIGNALS",
                    help="signals passed on to the workers before they are stopped, e.g. SIGUSR1 (default "
                         f"{DEFAULT_SIGNALS})")
    tr.add_argument("--shutdown-timeout", "--shutdown_timeout", type=_whole, default=None, metavar="S",
                    help="seconds a stopping worker gets before SIGKILL (default 3; torch's agent: 30)")
    tr.add_argument("--duplicate-stdout-filters", "--duplicate_stdout_filters", default=None, metavar="WORDS",
                    help="stdout lines with one of these words also go to filtered_stdout.log (elastic engine)")
    tr.add_argument("--duplicate-stderr-filters", "--duplicate_stderr_filters", default=None, metavar="WORDS",
                    help="as --duplicate-stdout-filters, for stderr")


def _add_unsupported_flags(tr) -> None:
    """torchrun's flags convoy refuses (hidden: build_request names them)."""
    tr.add_argument("--logs-specs", "--logs_specs", default=None, help=argparse.SUPPRESS)
    tr.add_argument("--numa-binding", "--numa_binding", default=None, help=argparse.SUPPRESS)
    tr.add_argument("--virtual-local-rank", "--virtual_local_rank", action="store_true", help=argparse.SUPPRESS)


def _add_training_flags(cv) -> None:
    """The ranks' training settings: an Accelerate config file, precision, strategy and parallel degrees."""
    cv.add_argument("--config_file", "--config-file", default=None, metavar="FILE",
                    help="an Accelerate config file (what `accelerate config` wrote): its settings, below the flags")
    cv.add_argument("--mixed-precision", "--mixed_precision", default=None, choices=MIXED_PRECISIONS)
    cv.add_argument("--strategy", default=None, help="auto, ddp, zero1, zero2, zero3, fsdp, hsdp, tp, pp, ...")
    cv.add_argument("--dp", type=_whole, default=None)
    cv.add_argument("--dp-replicate", "--dp_replicate", type=_whole, default=None,
                    help="HSDP: replicas (across nodes), with --dp-shard")
    cv.add_argument("--dp-shard", "--dp_shard", type=_whole, default=None,
                    help="HSDP: ranks each replica is sharded over (inside a node), with --dp-replicate")
    cv.add_argument("--cp", type=_whole, default=None,
                    help="context parallel: each sequence split over this many ranks (ring attention)")
    cv.add_argument("--tp", type=_whole, default=None)
    cv.add_argument("--pp", type=_whole, default=None)
    cv.add_argument("--cpu-offload", "--cpu_offload", action="store_const", const=True, default=None,
                    help="keep FSDP2's shards (weights, gradients, optimizer state) in host memory")
    cv.add_argument("--pp-schedule", "--pp_schedule", default=None, choices=PP_SCHEDULES,
                    help="the pipeline schedule with --pp (default 1f1b)")
    cv.add_argument("--pp-stages-per-rank", "--pp_stages_per_rank", type=_whole, default=None,
                    help="stages each process holds under interleaved_1f1b or looped_bfs (default 2)")
    cv.add_argument("--pp-microbatches", "--pp_microbatches", type=_whole, default=None,
                    help="micro-batches a pipeline cuts each batch into (default: one per stage)")
    cv.add_argument("--gradient-accumulation-steps", "--gradient_accumulation_steps", type=_whole, default=None)
    cv.add_argument("--recompute", default=None, metavar="MODE",
                    help=f"activation recomputation: {', '.join(RECOMPUTE_MODES)} (default none): 'selective' keeps "
                         "each block's matmul and attention outputs, 'full' only its input")
    cv.add_argument("--fp8-recipe", "--fp8_recipe", default=None, choices=FP8_RECIPES,
                    help="with --mixed-precision fp8: how float8 scales (default tensorwise)")
    cv.add_argument("--fp8-emulate", "--fp8_emulate", action="store_const", const=True, default=None,
                    help="with --mixed-precision fp8: run on a board without float8 tensor cores, emulated (tests)")
    cv.add_argument("--compile", default=None, metavar="SCOPE",
                    help=f"torch.compile: {', '.join(COMPILE_SCOPES)} (default none): 'blocks' compiles each repeated "
                         "block in place (fullgraph), 'model' the whole model")
    cv.add_argument("--compile-backend", "--compile_backend", default=None, metavar="NAME",
                    help="the torch.compile backend with --compile (default inductor)")
    cv.add_argument("--compile-mode", "--compile_mode", default=None, metavar="MODE",
                    help=f"torch.compile's mode with --compile: {', '.join(COMPILE_MODES)}")
    cv.add_argument("--compile-dynamic", "--compile_dynamic", default=None, metavar="BOOL",
                    help="torch.compile(dynamic=...) with --compile: true compiles for changing shapes up front")
    cv.add_argument("--collective-timeout", default=None, metavar="SECONDS",
                    help=f"fail a collective not every rank reached after this long (default "
                         f"{DEFAULT_COLLECTIVE_TIMEOUT:g}; finite)")


def _add_program_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine, --dry-run, and the program with its own arguments."""
    parser.add_argument("--engine", default="auto", choices=["auto", "direct", "elastic"],
                        help="direct: one node, no restarts, workers started without torch's agent; "
                             "elastic: torch's agent (default for several nodes or restarts)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("training_script", metavar="PROGRAM", help="script (or module with -m, command with "
                        "--no-python)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="ARGS")


#: how torchrun's options that are not convoy settings are read from their PET_ variable (text otherwise)
_READERS = {"node_rank": _whole, "master_port": _whole, "shutdown_timeout": _whole, "monitor_interval": _seconds}
_CHOICES = {"start_method": START_METHODS, "event_log_handler": EVENT_LOG_HANDLERS}


def _torchrun_options(args: argparse.Namespace) -> dict:
    """torchrun's options that no flag gave, from their ``PET_<OPTION>`` variables as torchrun reads them
    (``convoy.config.settings.torchrun_env``): option name -> (value, ``Source``). The settings among them
    (``nnodes``, ...) were filled with the settings, in their precedence. ``ConfigError`` names the variable of a
    value its flag's parser refuses."""
    from convoy.config.settings import TORCHRUN_SWITCHES, read_switch, torchrun_env

    # given: a value other than the parser's None/False (``--node-rank 0`` is given: 0 == False, but not False)
    given = {name for name, value in vars(args).items() if name in KEYS or (value is not None and value is not False)}
    found = {}
    value: bool | str | float
    for name, (raw, source) in torchrun_env(skip=given).items():
        where = f"environment {source.location}"
        if name in TORCHRUN_SWITCHES:
            value = read_switch(raw, where=where)
        elif name in _CHOICES and raw.strip().lower() not in _CHOICES[name]:
            raise ConfigError(f"{where}: {shown(raw)} is not valid; expected one of {', '.join(_CHOICES[name])}")
        elif name in _CHOICES:
            value = raw.strip().lower()
        else:
            try:
                value = _READERS[name](raw) if name in _READERS else raw
            except argparse.ArgumentTypeError as err:
                raise ConfigError(f"{where}: {err}") from None
        found[name] = (value, source)
    return found


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """convoy's flags up to the program; everything after it is the program's own, untouched (``train.py
    --start 3`` is not read as an abbreviation of ``--start-method``, which torchrun itself gets wrong)."""
    end = _program_position(parser, argv)
    if end is None:
        if not {"-h", "--help"} & set(argv):  # argparse would say 'PROGRAM, ARGS are required'
            parser.error("give the program to run after convoy's flags: convoy launch [flags] train.py [its "
                         "arguments], or -m MODULE")
        return parser.parse_args(argv)
    args = parser.parse_args(argv[:end + 1])
    args.training_script_args = list(argv[end + 1:])
    return args


def _program_position(parser: argparse.ArgumentParser, argv: list[str]) -> int | None:
    """Index of the program in ``argv``: the first word that is neither a flag nor a flag's value."""
    options = parser._option_string_actions  # noqa: SLF001 - argparse keeps its flag table here
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return i + 1 if i + 1 < len(argv) else None
        if not word.startswith("-") or word == "-":
            return i
        if "=" not in word:
            name = word if word in options else next(iter(o for o in options if o.startswith(word)), None)
            action = options.get(name) if name else None
            if action is not None and action.nargs != 0:
                i += 1  # the flag's value
        i += 1
    return None


#: the torchrun options (not settings) an Accelerate config file sets: machine_rank, main_process_ip/port
_FILE_OPTIONS = ("node_rank", "master_addr", "master_port")


def _accelerate_file(args: argparse.Namespace, given: dict, env: dict) -> tuple[dict, dict, tuple[str, ...]]:
    """``--config_file``'s values put into ``given`` (settings) and ``args`` (torchrun's options, the total
    ``num_processes``) where no flag and no torchrun ``PET_<OPTION>`` gave them, as Accelerate's flags beat its file:
    returns their origins (name -> ``Source``), the strategy options it sets, and its notes. Without the flag, a file
    at Accelerate's default place is named once on stderr, not read."""
    import sys

    from convoy.config.settings import Source, torchrun_variable

    if args.config_file is None:
        from convoy.config.accelerate_file import accelerate_default_config

        default = accelerate_default_config(env)
        if default.is_file():
            print(f"convoy: Accelerate's default config {default} is not read; --config_file {default} would use it",
                  file=sys.stderr, flush=True)
        return {}, {}, ()
    from convoy.config.accelerate_file import read_accelerate_config

    translated = read_accelerate_config(args.config_file)
    origins, options = {}, {}

    def unset(name: str) -> bool:  # no flag, and no torchrun variable (set for this job, as a flag would be)
        pet = torchrun_variable("nproc_per_node" if name == "num_processes" else name)
        return not (env.get(pet) or "").strip()

    dims_given = any(getattr(args, axis) is not None for axis in ("dp", "dp_replicate", "dp_shard", "cp", "tp", "pp"))
    for mapped in translated.values:
        source = Source("accelerate config", mapped.origin)
        name = mapped.name
        if name in LAUNCHED_OPTIONS:
            options[name] = mapped.value
            origins[name] = source
        elif name == "deepspeed_config":  # the DeepSpeed JSON, handed to the script's Accelerator whole
            args.deepspeed_config = mapped.value
            origins[name] = source
        elif name == "num_processes":
            if args.num_processes is None and args.nproc_per_node is None and unset(name):
                args.num_processes, origins[name] = mapped.value, source
        elif name in _FILE_OPTIONS:
            if getattr(args, name) is None and unset(name):
                setattr(args, name, mapped.value)
                origins[name] = source
        elif name in given and given[name] is None and unset(name) and not (name == "parallelism" and dims_given):
            given[name], origins[name] = mapped.value, source
    return origins, options, translated.notes


def build_request(args: argparse.Namespace):
    """The ``LaunchRequest`` and ``DeviceFilters`` for parsed flags (``ConfigError`` for conflicts)."""
    args, origins, options, file_notes = _filled_args(args)
    _check_unsupported(args, origins)
    _check_lease_flags(args)
    _parse_rdzv_flags(args, origins)
    _check_master_addr(args, origins)
    nproc = _nproc_per_node(args, origins)
    settings = _settings(args, options)
    workers = _worker_options(args, origins)
    request = _launch_request(args, nproc, workers, settings, origins, file_notes)
    return request, _device_filters(args)


def _filled_args(args: argparse.Namespace) -> tuple[argparse.Namespace, dict, dict, tuple[str, ...]]:
    """The flags with what no flag gave filled in: (args, origins, the file's strategy options, the file's notes)."""
    from convoy.config.settings import fill_unset_with_origins, torchrun_variable

    # flags not given: torchrun's PET_<OPTION>, then CONVOY_<KEY>, ./convoy.toml, the user file (convoy config);
    # ``parallelism`` has no flag of its own (--dp/--tp/--pp spell it) but comes from the same places. Where
    # each filled value came from travels with the request, so that a later check names that variable or file,
    # not the flag
    given = {"parallelism": None, "gradient_clipping": None,  # no flags of their own (clipping: an Accelerate file's)
             **{name: value for name, value in vars(args).items() if name in KEYS}}
    env = dict(os.environ)
    from_file, options, file_notes = _accelerate_file(args, given, env)
    if args.num_processes is not None:  # a flag for the per-node count: its PET_ variable is not read (a flag wins)
        env.pop(torchrun_variable("nproc_per_node"), None)
    filled, origins = fill_unset_with_origins(given, env=env)  # the settings' PET_ (nnodes, ...) included
    origins.update(from_file)
    if "num_processes" in from_file:  # the file's total beats CONVOY_NPROC_PER_NODE and convoy.toml's count
        filled["nproc_per_node"] = None
        origins.pop("nproc_per_node", None)
    args = argparse.Namespace(**{**vars(args), **filled})
    for name, (value, source) in _torchrun_options(args).items():
        setattr(args, name, value)
        origins[name] = source
    return args, origins, options, file_notes


def _said(origins: dict, name: str, value: object) -> str:
    """As ``LaunchRequest.said``, before there is a request."""
    from convoy.config.settings import said

    return said(origins, name, value)


def _check_unsupported(args: argparse.Namespace, origins: dict) -> None:
    """Refuse torchrun's options that convoy launch does not carry out yet."""
    for name, default in _UNSUPPORTED.items():
        if getattr(args, name) != default:
            from convoy.errors import NotSupportedYetError

            raise NotSupportedYetError(f"{_said(origins, name, getattr(args, name))} is not supported by convoy "
                                       "launch yet; use torchrun for it")


def _check_lease_flags(args: argparse.Namespace) -> None:
    """Refuse ``--wait`` with ``--no-lease``."""
    if args.wait is not None and args.no_lease:
        from convoy.cli.select import NO_LEASE_WAIT

        raise ConfigError(NO_LEASE_WAIT)


def _parse_rdzv_flags(args: argparse.Namespace, origins: dict) -> None:
    """``--rdzv-backend``/``--rdzv-endpoint`` read as CONVOY_RDZV_* and convoy.toml are."""
    for name in ("rdzv_backend", "rdzv_endpoint"):
        if getattr(args, name) is not None and name not in origins:
            setattr(args, name, KEYS[name].parse(getattr(args, name), where="--" + name.replace("_", "-")))


def _check_master_addr(args: argparse.Namespace, origins: dict) -> None:
    """Refuse a ``--master-addr`` that is not a host name or an IP address."""
    if args.master_addr is not None and not is_host(args.master_addr):
        raise ConfigError(f"{_said(origins, 'master_addr', repr(args.master_addr[:60]))}: give a host name or an IP "
                          "address (or leave it out for a job on one machine)")


def _nproc_per_node(args: argparse.Namespace, origins: dict) -> str | None:
    """The per-node count: ``--nproc-per-node``, or Accelerate's total ``--num_processes`` over the machines."""
    from convoy.launch.resolve import node_range

    nproc = args.nproc_per_node
    if args.num_processes is not None:
        _, machines = node_range(args.nnodes)  # the launch plan's own reading of --nnodes
        total = _said(origins, "num_processes", args.num_processes).replace("--num-processes", "--num_processes")
        if args.num_processes % machines:
            nodes = _said(origins, "nnodes", args.nnodes) if "nnodes" in origins else f"--num_machines {machines}"
            raise ConfigError(f"{total} is not divisible by {nodes}")
        per_node = str(args.num_processes // machines)
        if nproc is not None and nproc != per_node:
            raise ConfigError(f"{total} means {per_node} per node but "
                              f"{_said(origins, 'nproc_per_node', nproc)} says otherwise; give one of them")
        nproc = per_node
        origins.pop("nproc_per_node", None)  # from --num_processes now
        if "num_processes" in origins:  # the file's total over its machines
            origins["nproc_per_node"] = origins.pop("num_processes")
    return nproc


def _settings(args: argparse.Namespace, options: dict):
    """The ranks' training settings (``ConvoyEnv``), the parallel degrees from --dp/--cp/--tp/--pp where given."""
    from convoy.launch.rank_env import ConvoyEnv

    dims = {k: getattr(args, k) for k in ("dp", "dp_replicate", "dp_shard", "cp", "tp", "pp")
            if getattr(args, k) is not None}
    return ConvoyEnv(
        mixed_precision=args.mixed_precision, strategy=args.strategy,
        parallelism=",".join(f"{k}={v}" for k, v in dims.items()) or args.parallelism,
        cpu_offload=args.cpu_offload, pp_schedule=args.pp_schedule,
        pp_stages_per_rank=args.pp_stages_per_rank, pp_microbatches=args.pp_microbatches,
        gradient_accumulation_steps=args.gradient_accumulation_steps, collective_timeout=args.collective_timeout,
        recompute=args.recompute, fp8_recipe=args.fp8_recipe, fp8_emulate=args.fp8_emulate,
        compile=args.compile, compile_backend=args.compile_backend, compile_mode=args.compile_mode,
        compile_dynamic=args.compile_dynamic, strategy_options=options or None,
        gradient_clipping=getattr(args, "gradient_clipping", None),
        deepspeed_config=getattr(args, "deepspeed_config", None),
    )


def _worker_options(args: argparse.Namespace, origins: dict):
    """The ``WorkerOptions`` given (the others: torchrun's defaults), with where each came from."""
    from convoy.launch.resolve import WorkerOptions

    options = {name: getattr(args, name) for name in _WORKER_OPTIONS if getattr(args, name) is not None}
    return WorkerOptions(**options, origins={k: v for k, v in origins.items() if k in _WORKER_OPTIONS})


def _launch_request(args: argparse.Namespace, nproc: str | None, workers, settings, origins: dict,
                    file_notes: tuple[str, ...]):
    """The ``LaunchRequest`` of the program and the resolved flags."""
    from convoy.launch.resolve import LaunchRequest

    return LaunchRequest(
        program=(args.training_script, *args.training_script_args), module=args.module, no_python=args.no_python,
        devices=args.devices, nproc_per_node=nproc, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, rdzv_conf=args.rdzv_conf,
        standalone=args.standalone, workers=workers, engine=args.engine, settings=settings, origins=origins,
        notes=file_notes,
    )


def _device_filters(args: argparse.Namespace):
    """The ``DeviceFilters`` of the device flags."""
    from convoy.devices.amounts import parse_duration
    from convoy.launch.job import DeviceFilters

    exclude = tuple(int(t) if re.fullmatch(r"[0-9]{1,9}", t) else t  # indices or UUIDs; select_devices checks
                    for t in (part.strip() for part in args.exclude.split(",")) if t)
    return DeviceFilters(free=bool(args.free), min_free_memory=args.min_free_memory,
                         max_utilization=args.max_utilization, exclude=exclude, order=args.order,
                         lease_wait=None if args.wait is None else parse_duration(args.wait),
                         lease=not args.no_lease)


def run(args: argparse.Namespace) -> int:
    from convoy.launch.job import launch_job

    request, filters = build_request(args)
    return launch_job(request, filters=filters, dry_run=args.dry_run)
