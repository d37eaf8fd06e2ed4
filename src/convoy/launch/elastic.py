"""The elastic engine: PyTorch's own agent (``torch.distributed.launcher.api``) for multi-node jobs and restarts.

    from convoy.launch.elastic import run_elastic
    run_elastic(plan, base_env=os.environ)     # 0, or raises RankFailedError for the root-cause rank

convoy writes no agent and no rendezvous: this module turns a ``LaunchPlan`` into a ``LaunchConfig``, runs
``elastic_launch`` with the worker command, and turns ``ChildFailedError`` into one ``RankFailedError`` for
the root-cause rank. Two fixes over plain torchrun: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` whenever
``max_restarts > 0`` (restarted groups otherwise hang on stale peer addresses in the shared store, see
notes item 9), and Python workers start through ``convoy.launch.record`` so unmodified scripts leave their
traceback in the error file.

On one node the agent meets no one. Without restarts convoy plans torch's static rendezvous there
(``convoy.launch.resolve``), not c10d as ``torchrun --standalone`` does (c10d's random join delay, state machine,
heartbeat and per-event stack walks cost time and serve several nodes only): the agent's store, started here on
loopback, is the workers' (``TORCHELASTIC_USE_AGENT_STORE=True``) and lives as long as the agent. With restarts
the c10d rendezvous stays, and each attempt's rank 0 serves a fresh store until the other ranks' programs are
done (``_store_holds``).

The objects torch's import made are frozen out of the garbage collector's reach (``_gc_paused``), so this
process's exit does not walk them (~0.4 s on 2 cores). Imports torch (the agent needs it); the direct engine
does not.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

from convoy.errors import LaunchError, Terminated
from convoy.launch.blocked_stop import StopGate, stoppable_while_blocked
from convoy.launch.failures import PEER_GONE, RankFailure, describe_exit, failure_error
from convoy.launch.hang_report import missing_note
from convoy.launch.loopback import HOLD_DIR_VARIABLE, agent_store, is_loopback, loopback_env
from convoy.launch.resolve import DEFAULT_SIGNALS, LaunchPlan, shown_ranks, split_endpoint, stream_map

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

C10D_PORT = 29400
"""torch's c10d rendezvous port where an endpoint gives none."""

__all__ = ["run_elastic", "launch_config"]


def launch_config(plan: LaunchPlan, *, endpoint: str | None = None, local_addr: str | None = None):
    """The ``LaunchConfig`` torchrun would build for the same flags (``endpoint``: instead of the plan's)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    redirects = stream_map(plan.workers.redirects, plan.nproc_per_node)
    # Output reaches the console through torch's tee (log file, then tailed with the "[rankN]: " prefix);
    # streams the user redirected stay in the files only.
    tee = {rank: Std(3 & ~redirects.get(rank, 0)) for rank in range(plan.nproc_per_node)}
    logs = DefaultLogsSpecs(log_dir=plan.workers.log_dir, redirects={r: Std(v) for r, v in redirects.items()},
                            tee=tee,
                            local_ranks_filter=shown_ranks(plan.workers.local_ranks_filter, plan.nproc_per_node))
    configs: dict[str, object] = dict(plan.rdzv_configs)
    if "rank" in configs:
        configs["rank"] = int(cast(str, configs["rank"]))  # static rendezvous: this node's rank
    if plan.rdzv_backend == "c10d" and (endpoint is not None or plan.rdzv_endpoint == "127.0.0.1:0"):
        configs.setdefault("is_host", True)
    endpoint = endpoint or plan.rdzv_endpoint
    workers = plan.workers
    return LaunchConfig(
        min_nodes=plan.min_nodes, max_nodes=plan.max_nodes, nproc_per_node=plan.nproc_per_node,
        logs_specs=logs, run_id=plan.run_id, role=workers.role, rdzv_endpoint=endpoint,
        rdzv_backend=plan.rdzv_backend, rdzv_configs=configs, max_restarts=workers.max_restarts,
        monitor_interval=workers.monitor_interval, start_method=workers.start_method,
        log_line_prefix_template="[rank${rank}]: ", local_addr=local_addr or _local_addr(plan),
        **_agent_options(LaunchConfig, workers),
    )


def _filters(text: str) -> list[str]:
    """torchrun's comma-separated filter words, ``,,`` standing for a comma inside one."""
    return [word.replace("\0", ",") for word in text.replace(",,", "\0").split(",") if word] if text else []


def _agent_options(config_type, workers) -> dict:
    """torchrun's agent options for ``LaunchConfig``, each only where this torch's agent has it (signals and the
    filters came with torch 2.9, the shutdown timeout later): a flag left at its default is then simply not
    passed, and a flag given is one ``NotSupportedYetError`` line rather than a TypeError for every job."""
    fields = {f.name for f in dataclasses.fields(config_type)}
    options = {  # LaunchConfig field: (value, torchrun's default, the flag)
        "event_log_handler": (workers.event_log_handler, "null", "--event-log-handler"),
        "signals_to_handle": (workers.signals_to_handle, DEFAULT_SIGNALS, "--signals-to-handle"),
        "duplicate_stdout_filters": (_filters(workers.duplicate_stdout_filters), [], "--duplicate-stdout-filters"),
        "duplicate_stderr_filters": (_filters(workers.duplicate_stderr_filters), [], "--duplicate-stderr-filters"),
        "shutdown_timeout": (workers.shutdown_timeout, None, "--shutdown-timeout"),
    }
    out = {}
    for name, (value, default, flag) in options.items():
        if name in fields:
            if value is not None:
                out[name] = value
        elif value != default:
            import torch

            from convoy.errors import NotSupportedYetError

            raise NotSupportedYetError(f"{flag}: the elastic agent of torch {torch.__version__} has no such setting; "
                                       "leave it out for a job the elastic engine runs, or update torch")
    return out


def _local_addr(plan: LaunchPlan) -> str | None:
    """The address this node's workers reach rank 0's store on. One node: loopback. Without it torch's agent
    publishes ``socket.getfqdn()``, and with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (restarts) every restarted
    group's ``MASTER_ADDR`` is that name, which on a container or cloud host often does not resolve to this
    machine, so the restarted ranks never meet. Several nodes: ``--local-addr``, else torch's default (the host
    name)."""
    return "127.0.0.1" if plan.max_nodes == 1 else plan.workers.local_addr


def _worker_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    command = list(plan.command)
    if command[:2] == [sys.executable, "-u"]:
        return sys.executable, ["-u", "-m", "convoy.launch.record", *command[2:]]
    return command[0], command[1:]


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """The agent copies ``os.environ`` into each worker; set ``extra`` for the job only, then restore."""
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while torch's agent is imported.

    ``import torch`` allocates hundreds of thousands of objects, which triggers full collections that find
    next to nothing: on a 2-core box the import took ~0.1 s less CPU with the collector paused (median of 5,
    1.22 -> 1.09 s; docs/launching.md). The collector's previous state is restored afterwards. (What those
    objects cost at exit, the ``convoy`` command spares itself by freezing them as it leaves,
    ``convoy.cli.main.entry_point``; a program calling ``run_elastic`` keeps its collector as it was.)
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_elastic(plan: LaunchPlan, *, base_env: Mapping[str, str]) -> int:
    """Run ``plan`` under torch's elastic agent; 0 on success, else raise ``RankFailedError``."""
    with _gc_paused():
        from torch.distributed.elastic.multiprocessing import tail_log
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

    from convoy.launch.console import tail_rank_file

    # torch's tee reads each rank's file line by line, a carriage return ending a line: a progress bar became a
    # line per redraw. convoy's reader keeps the bar (convoy.launch.console), with the same arguments
    tail_log.tail_logfile = tail_rank_file

    extra = {key: value for key, value in {**base_env, **plan.env}.items() if os.environ.get(key) != value}
    if plan.workers.max_restarts > 0:  # restarts hang otherwise (notes item 9); on one node each attempt's rank 0
        extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # serves its store on loopback (convoy.launch.loopback)
    if plan.rdzv_backend == "static":
        extra.setdefault("MASTER_ADDR", plan.master_addr)
        extra.setdefault("MASTER_PORT", str(plan.master_port))
    host = _loopback_host(plan)
    if host is not None:  # one node: every store and gloo listen on loopback only (convoy.launch.loopback)
        extra.update({k: v for k, v in loopback_env(base_env).items() if os.environ.get(k) != v})
    entrypoint, args = _worker_command(plan)
    start = time.monotonic()
    watch = _AgentWatch()
    try:
        with _store_holds(plan, host) as holds, _environment({**extra, **holds}), \
                _rendezvous_store(plan, host) as endpoint, _told_agent(plan, watch):
            config = launch_config(plan, endpoint=endpoint, local_addr=host)
            with stoppable_while_blocked(watch.gate):  # torch waits for the other nodes in C++ (no handler runs)
                elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as err:
        raise _root_cause(err, plan, elapsed=time.monotonic() - start) from None
    except SignalException as err:  # the agent stopped the workers on a signal to this process (was a traceback)
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Terminated(err.sigval) from None
    except json.JSONDecodeError as err:  # torch's agent reading a failed rank's error file
        raise LaunchError(f"torch's agent stopped the job: a failed rank's error file (TORCHELASTIC_ERROR_FILE) is "
                          f"not JSON ({err}), as torch's @record leaves it when the rank is stopped while writing "
                          "it") from None
    except (RuntimeError, ValueError) as err:  # rendezvous errors, closed stores, ...
        when = "while the workers ran" if watch.workers_started else "before the workers ran"
        raise LaunchError(f"the elastic agent failed {when}: {err}") from None
    return 0


@dataclasses.dataclass
class _AgentWatch:
    """What convoy knows of torch's agent: whether it has started workers (a failure is then theirs), and the gate
    it shuts then (a stop signal is no longer the launcher's to end at once: ``convoy.launch.blocked_stop``)."""

    workers_started: bool = False
    gate: StopGate = dataclasses.field(default_factory=StopGate)


def _local_error_files(rank: int, pf, nproc: int) -> dict[int, str]:
    """Every local rank's error file path: torch's agent lays them out as ``.../<local rank>/error.json``."""
    if not pf.error_file or pf.error_file == "<N/A>":
        return {}
    path = Path(pf.error_file)
    if path.parent.name != str(pf.local_rank):
        return {rank: str(path)}
    first = rank - pf.local_rank
    return {first + local: str(path.parent.parent / str(local) / path.name) for local in range(nproc)}


def _loopback_host(plan: LaunchPlan) -> str | None:
    """The loopback address of a single-node rendezvous, else None (multi-node: left to torch)."""
    if plan.max_nodes != 1 or plan.rdzv_backend not in ("c10d", "static"):
        return None
    host, _ = split_endpoint(plan.rdzv_endpoint, default_port=C10D_PORT)
    return ("127.0.0.1" if host == "localhost" else host) if is_loopback(host) else None


@contextmanager
def _store_holds(plan: LaunchPlan, host: str | None) -> Iterator[dict[str, str]]:
    """One node with restarts, where each attempt's rank 0 serves the workers' store: a directory in which the
    other ranks hold a lock while their program runs, so that rank 0 keeps serving until then
    (``convoy.launch.loopback``; the agent passes no descriptors, so the direct engine's pipe cannot be used)."""
    from convoy.launch.scratch import Scratch, sweep_stale

    if host is None or plan.workers.max_restarts == 0 or plan.rdzv_backend != "c10d":
        sweep_stale()  # what a killed launcher left, swept by every elastic launch, not only one that makes its own
        yield {}  # (static: the agent's store is the workers', for every attempt)
        return

    scratch = Scratch.create("convoy-store-")  # (a launcher killed before left one: swept there)
    try:
        yield {HOLD_DIR_VARIABLE: str(scratch.path)}
    finally:
        scratch.remove()


@contextmanager
def _rendezvous_store(plan: LaunchPlan, host: str | None) -> Iterator[str | None]:
    """The agent's rendezvous store, started on ``host`` before torch's rendezvous (c10d or static) would bind
    every interface; yields its endpoint."""
    if host is None:
        yield None
        return
    _, port = split_endpoint(plan.rdzv_endpoint, default_port=C10D_PORT)
    try:
        with agent_store(host, port) as port:
            yield f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    except OSError as err:
        raise LaunchError(f"cannot listen on {plan.rdzv_endpoint} for the rendezvous: {err.strerror}") from None


def _first_cause(failures: Mapping[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """(global rank, ProcessFailure) of the failure that caused the others. The agent SIGTERMs the rest after the
    failures it saw in one poll (-15: consequences). Of those it saw, a rank whose traceback says a peer closed its
    connection lost that peer, which is the cause: a rank killed by SIGKILL has no traceback, and its timestamp is
    when the agent saw it, which can be a second after the error file of the rank it took down. Then the earliest,
    then the lowest rank."""
    seen = {rank: pf for rank, pf in failures.items() if pf.exitcode != -15} or dict(failures)
    causes = {rank: pf for rank, pf in seen.items() if not _lost_a_peer(_traceback_of(pf))} or seen
    return min(causes.items(), key=lambda kv: (kv[1].timestamp, kv[0]))


def _lost_a_peer(text: str | None) -> bool:
    if not text:
        return False
    return any(words in text for words in PEER_GONE)


def _traceback_of(pf) -> str | None:
    """The traceback a failure's error file holds (torch's ``ProcessFailure.message`` is that file's content, a
    dict; without one it is a sentence about the signal, or "To enable traceback ...": no traceback)."""
    message = pf.message
    if isinstance(message, dict):
        return (message.get("extraInfo") or {}).get("py_callstack") or message.get("message")
    return None


def _death(pf) -> str:
    """``died (SIGKILL)``, ``failed (exit code 1)``."""
    how = describe_exit(pf.exitcode)
    return f"died ({how.removeprefix('signal ')})" if pf.exitcode < 0 else f"failed ({how})"


@contextmanager
def _told_agent(plan: LaunchPlan, watch: _AgentWatch) -> Iterator[None]:
    """torch's agent, while the job runs: its restarts said in one convoy line each, its own INFO/WARNING lines
    (which repeat what convoy says, or say what goes well) and its 'failed (exitcode ...)' lines left out
    (``LOGLEVEL`` set, as torchrun reads it, shows them all); ``watch`` told once it watches workers."""
    import logging

    from torch.distributed.launcher import api as launcher

    agent_class = launcher.LocalElasticAgent
    launcher.LocalElasticAgent = _restart_telling(agent_class, plan, watch)  # type: ignore[misc]  # restored below
    quiet = _AgentNoise() if not os.environ.get("LOGLEVEL") else None
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher"))]
    if quiet is not None:
        for logger in loggers:
            logger.addFilter(quiet)
    try:
        yield
    finally:
        launcher.LocalElasticAgent = agent_class  # type: ignore[misc]  # the class torch had
        if quiet is not None:
            for logger in loggers:
                logger.removeFilter(quiet)


class _AgentNoise:
    """A logging filter: torch's agent's records at ERROR and above, except its per-failure line and its traceback
    of an error file it could not parse (convoy says that in one line)."""

    @staticmethod
    def filter(record) -> bool:
        import logging

        return record.levelno >= logging.ERROR and not str(record.msg).startswith(
            ("failed (exitcode", "Failed to parse reply file"))


def _restart_telling(agent_class, plan: LaunchPlan, watch: _AgentWatch):
    """``agent_class`` (torch's ``LocalElasticAgent``) that says on convoy's stderr which rank failed each time it
    restarts the worker group: ``convoy: rank 1 died (SIGKILL); restarting, attempt 1 of 3``."""

    class RestartTellingAgent(agent_class):
        _last_failures: dict = {}

        def _start_workers(self, worker_group):
            watch.gate.shut()
            watch.workers_started = True
            return super()._start_workers(worker_group)

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.failures:
                self._last_failures = dict(result.failures)
            return result

        def _restart_workers(self, worker_group):
            spec = worker_group.spec
            failures, self._last_failures = self._last_failures, {}
            attempt = spec.max_restarts - self._remaining_restarts
            if failures:
                rank, pf = _first_cause(failures)
                who = f"rank {rank}" if plan.max_nodes == 1 else f"rank {rank} (local rank {pf.local_rank})"
                others = len(failures) - 1
                also = f" ({others} other rank{'s' if others > 1 else ''} failed after it)" if others else ""
                print(f"convoy: {who} {_death(pf)}{also}; restarting, attempt {attempt} of {spec.max_restarts}",
                      file=sys.stderr, flush=True)
            super()._restart_workers(worker_group)

    return RestartTellingAgent


def _root_cause(err, plan: LaunchPlan, *, elapsed: float) -> Exception:
    failures = err.failures  # {global rank: ProcessFailure}
    rank, pf = _first_cause(failures)
    text = _traceback_of(pf)
    note = missing_note(_local_error_files(rank, pf, plan.nproc_per_node), failed_rank=rank)
    failure = RankFailure(rank=rank, local_rank=pf.local_rank, host=socket.gethostname(), returncode=pf.exitcode,
                          traceback=text, traceback_shown=text is not None, elapsed=elapsed, note=note)
    return failure_error(failure, stopped=len(failures) - 1 if len(failures) > 1 else plan.nproc_per_node - 1)
