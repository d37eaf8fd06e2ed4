"""``convoy.launch(fn)``: run a function on several processes from a script or a notebook.

    import convoy
    def train(lr):
        import torch.distributed as dist
        dist.init_process_group("gloo")          # RANK, WORLD_SIZE, MASTER_ADDR, ... are set
        ...
        return dist.get_rank()
    convoy.launch(train, args=(1e-3,), nproc_per_node=2)   # -> rank 0's return value

The role of Accelerate's ``notebook_launcher``: each rank gets torchrun's environment (and the selected
devices' visibility variables); the call returns rank 0's return value, and when a rank raises, the other
ranks are stopped and *that rank's* exception is raised here, with its rank and remote traceback attached
as a note (``RankFailedError`` when it cannot be sent back, or the rank died without raising).
The first failing rank is decided by when each rank raised, not by which exit the parent noticed first.
The selected accelerators are leased for the call, like ``convoy launch`` (``lease=False``, ``wait=``).
``max_restarts=N`` starts every rank again after a failure, up to N times (torchrun's ``--max-restarts`` for
a function; the lease is held across restarts), each time with a line saying which rank failed and why.
The start method is chosen by ``start_method_for``: ``fork`` on Linux (fast, and it runs functions defined in
a notebook), but ``spawn`` once this process has initialised CUDA (a forked child cannot use the parent's CUDA
context; a notebook user has usually touched ``torch.cuda`` before launching). A spawned rank imports ``fn`` by
name; a function it cannot import (defined in a notebook cell or inside another function) is sent by value with
``cloudpickle`` (as Ray and Dask send functions), and without ``cloudpickle`` the call fails at once saying so.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from convoy.config.schema import KEYS, is_whole
from convoy.errors import ConfigError, LaunchError, RankFailedError, shown
from convoy.launch import hang_report
from convoy.launch.failures import describe_exit
from convoy.launch.loopback import is_loopback, keep_serving, loopback_env, prepare_worker, serving
from convoy.launch.ports import free_port
from convoy.launch.rank_env import ConvoyEnv, rank_env
from convoy.launch.resolve import LaunchRequest

__all__ = ["launch", "start_method_for", "importable"]

_GRACE = 3.0


def launch(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    devices: str | int | Sequence[int | str] | None = "auto",
    nproc_per_node: int | None = None,
    start_method: str | None = None,
    mixed_precision: str | None = None,
    collective_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    lease: bool = True,
    wait: float | str | None = None,
    max_restarts: int = 0,
) -> Any:
    """Run ``fn(*args, **kwargs)`` on one process per device (or ``nproc_per_node`` CPU processes).

    Returns rank 0's return value. Raises the first failing rank's exception (``RankFailedError`` when the
    rank died without one). ``devices``/``nproc_per_node`` mean what they mean for ``convoy launch``.
    The selected accelerators are leased for the call, as ``convoy launch`` leases them (``lease=False`` is
    ``--no-lease``; ``wait`` is ``--wait``: seconds (or ``"5m"``) to wait for another job's lease, else
    ``LeaseError`` at once).
    """
    from convoy.launch.job import DeviceFilters, lease_plan, plan_job

    _check_call(fn, args, kwargs)
    wait = _check_lease_options(env, lease, wait)
    if not is_whole(max_restarts):
        raise ConfigError(f"convoy.launch(max_restarts={shown(max_restarts)}): give a whole number >= 0")
    for name, value in (("nproc_per_node", nproc_per_node), ("mixed_precision", mixed_precision),
                        ("collective_timeout", collective_timeout)):
        if value is not None:  # named as this call's keywords, not as convoy launch's flags
            KEYS[name].parse(value, where=f"convoy.launch({name}=...)", typed=True)
    method = start_method_for(start_method, cuda_initialized=_cuda_initialized(), platform=sys.platform)
    target = _target(fn, method)
    name = getattr(fn, "__qualname__", repr(fn))
    request = LaunchRequest(
        program=(f"<function {name}>",), devices=_device_request(devices),
        nproc_per_node=None if nproc_per_node is None else str(nproc_per_node),
        settings=ConvoyEnv(mixed_precision=mixed_precision, collective_timeout=collective_timeout),
    )
    base_env = dict(os.environ if env is None else env)
    filters = DeviceFilters(lease=lease, lease_wait=wait)
    plan = plan_job(request, filters=filters, env=base_env)
    from convoy.launch.guard import job_guard

    # released after every rank is stopped; the guard stops the ranks' children too, even if this process dies
    with lease_plan(plan, filters=filters, env=base_env) as held, job_guard(held.fds if held else ()) as guard:
        for restart in range(max_restarts + 1):
            try:
                return _run(target, tuple(args), dict(kwargs or {}), plan, method, base_env,
                            replace_env=env is not None, job_env=guard.env if guard is not None else {})
            except Exception as err:  # noqa: BLE001 -- see _restartable
                if restart == max_restarts or not _restartable(err):
                    raise
                why = str(err).splitlines()[0] if str(err) else ""
                print(f"convoy: rank {getattr(err, _FAILED_RANK)} failed ({type(err).__name__}"
                      f"{': ' + why[:200] if why else ''}); starting every rank again (restart {restart + 1} of "
                      f"{max_restarts})", file=sys.stderr, flush=True)


#: set on the exception a failed rank raised here (its rank): only such a failure starts the ranks again
_FAILED_RANK = "_convoy_failed_rank"


def _restartable(err: BaseException) -> bool:
    """A rank's failure that another start may not repeat: not an error of this process (pickling the
    arguments, a port), and not a convoy error saying a setting or a call is wrong (those fail every time)."""
    from convoy.errors import ConvoyError, NotSupportedYetError

    if not hasattr(err, _FAILED_RANK):
        return False
    return not (isinstance(err, ConvoyError) and isinstance(err, (ValueError, NotSupportedYetError)))


def _check_call(fn: Any, args: Any, kwargs: Any) -> None:
    """What each rank will call, checked before a device is leased or a process started."""
    if not callable(fn):
        raise ConfigError(f"convoy.launch({shown(fn)}): give the function each process runs, e.g. "
                          "convoy.launch(train, args=(lr,))")
    if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
        raise ConfigError(f"convoy.launch(args={shown(args)}): give a tuple of positional arguments, e.g. args=(lr,)")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigError(f"convoy.launch(kwargs={shown(kwargs)}): give a dict of keyword arguments")


def _check_lease_options(env: Any, lease: Any, wait: Any) -> float | None:
    """``env``, ``lease`` and ``wait`` as ``convoy.launch`` documents them; returns ``wait`` in seconds."""
    if env is not None and (not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ConfigError(f"convoy.launch(env={shown(env)}): give a mapping of variable names to strings, "
                          "e.g. {**os.environ, 'NCCL_DEBUG': 'INFO'}")
    if not isinstance(lease, bool):
        raise ConfigError(f"convoy.launch(lease={shown(lease)}): give True (hold a lease on the devices) or False")
    if wait is None:
        return None
    if not lease:
        raise ConfigError(f"convoy.launch(wait={shown(wait)}, lease=False): wait is for devices another job "
                          "leased, and only a leasing call waits; drop wait= or lease=False")
    from convoy.devices.amounts import parse_duration
    from convoy.errors import DeviceSpecError

    try:
        return parse_duration(wait)
    except DeviceSpecError as err:
        raise ConfigError(f"convoy.launch(wait=...): {err}") from None


def _run(fn, args: tuple, kwargs: dict, plan, method: str, base_env: dict, *, replace_env: bool,
         job_env: dict[str, str]) -> Any:
    port = free_port(plan.master_addr)
    ctx = multiprocessing.get_context(method)
    run_id = f"convoy-fn-{os.getpid()}-{port}"
    procs, pipes = [], []
    release = ctx.Event()  # set once every rank has reported: rank 0, which serves the store, may then exit
    try:
        for local in range(plan.nproc_per_node):
            child_env = {**plan.env, **rank_env(
                rank=local, local_rank=local, world_size=plan.nproc_per_node, local_world_size=plan.nproc_per_node,
                master_addr=plan.master_addr, master_port=port, run_id=run_id)}
            child_env.update(job_env)
            if plan.max_nodes == 1 and is_loopback(plan.master_addr):  # the store on loopback only
                child_env.update(loopback_env(base_env))
            if replace_env:
                child_env = {**base_env, **child_env}
            receive, send = ctx.Pipe(duplex=False)
            # typeshed's BaseContext lacks Process; every start method's context has one
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=_child, args=(fn, args, kwargs, child_env, send, replace_env, release),
                daemon=True, name=f"convoy-rank{local}")
            proc.start()
            send.close()
            procs.append(proc)
            pipes.append(receive)
        return _collect(procs, pipes, release)
    finally:
        for proc in procs:
            if proc.is_alive():
                _kill_group(proc.pid, signal.SIGKILL)
            proc.join(timeout=5)
        for pipe in pipes:
            pipe.close()


def _device_request(devices: Any) -> str | None:
    """``devices`` as ``convoy launch --devices`` spells it. A list names devices (Lightning's rule): ``[0]`` is
    GPU 0 (``"0,"``), ``[2, 0]`` is ``"2,0"`` and ``[]`` is none, while the number ``0`` or ``"0"`` is a count."""
    if devices is None or devices == "auto":
        return None
    if isinstance(devices, (list, tuple)):
        if not devices:
            return "0"
        return ",".join(str(d) for d in devices) + ("," if len(devices) == 1 else "")
    return str(devices)


START_METHODS = ("fork", "spawn", "forkserver")


def start_method_for(requested: str | None, *, cuda_initialized: bool, platform: str) -> str:
    """The multiprocessing start method for the ranks. Pure.

    ``requested`` wins when given (``fork`` after CUDA is initialised is refused: the ranks could not use it).
    Otherwise ``fork`` on Linux while CUDA is untouched here, else ``spawn``.
    """
    if requested is not None and requested not in START_METHODS:
        raise LaunchError(f"start_method {requested!r}: use 'fork', 'spawn' or 'forkserver'")
    if requested == "fork" and cuda_initialized:
        raise LaunchError("start_method='fork': CUDA is already initialised in this process, so forked ranks "
                          "cannot use it; leave start_method unset (convoy then spawns the ranks) or use 'spawn'")
    if requested is not None:
        return requested
    return "spawn" if cuda_initialized or not platform.startswith("linux") else "fork"


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # not imported: nothing can have initialised CUDA through it
    return bool(torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)())


def importable(fn: Callable[..., Any]) -> bool:
    """True when a spawned process can import ``fn`` by its module and qualified name."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    qualname = getattr(fn, "__qualname__", "")
    if module is None or not qualname or "<" in qualname:  # <locals>, <lambda>
        return False
    if module.__name__ == "__main__" and not getattr(module, "__file__", None):  # a notebook or the REPL
        return False
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


class _ByValue:
    """``fn`` carried to a spawned rank as cloudpickle bytes (it cannot be imported there by name)."""

    def __init__(self, payload: bytes, name: str):
        self.payload, self.__qualname__ = payload, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return pickle.loads(self.payload)(*args, **kwargs)


def _target(fn: Callable[..., Any], method: str) -> Callable[..., Any]:
    """What the ranks call: ``fn`` itself, or for spawn/forkserver a by-value copy when it is not importable."""
    if method == "fork" or importable(fn):
        return fn
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        import cloudpickle
    except ImportError:
        raise LaunchError(f"the ranks must be spawned ({method}: CUDA is initialised here, or this is not Linux) "
                          f"and they cannot import {name!r} (defined in a notebook or inside a function); move "
                          "it to a module, or install cloudpickle (pip install cloudpickle) to send it by value"
                          ) from None
    return _ByValue(cloudpickle.dumps(fn), name)


def _child(fn, args, kwargs, env: dict, send, replace_env: bool, release) -> None:
    os.setpgrp()  # its own process group: the parent stops the rank together with anything it started
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the caller
    if replace_env:
        os.environ.clear()
    os.environ.update(env)
    prepare_worker(env)  # rank 0: serve the rendezvous store on loopback (convoy.launch.loopback)
    hang_report.install(env)  # raw collectives get convoy's default timeout
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # a forked intra-op pool hangs (notes: fork safety)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        stamp = time.time()
        text = traceback.format_exc()
        try:
            payload = pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            payload = None
        send.send(("error", stamp, text, payload))
        send.close()
        _exit(1)
    try:
        send.send(("ok", time.time(), None, pickle.dumps(result) if env["RANK"] == "0" else None))
    except Exception as exc:  # noqa: BLE001 - an unpicklable return value
        send.send(("error", time.time(), f"rank 0's return value cannot be sent back: {exc}\n", None))
        _exit(1)
    send.close()
    if serving() and env["WORLD_SIZE"] != "1":
        # a function that returns right after making its process group (PartialState() and return) would take
        # the store away from ranks still connecting to it: the caller's word is every rank reported
        keep_serving(lambda wait: release.wait(timeout=wait))
    _exit(0)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip atexit handlers inherited from the parent (fork)


def _collect(procs, pipes, release) -> Any:
    reports: dict[int, tuple] = {}
    failed_at: float | None = None
    while True:
        for rank, pipe in enumerate(pipes):
            if rank not in reports and pipe.poll():
                try:
                    reports[rank] = pipe.recv()
                except EOFError:
                    reports[rank] = ("died", time.time(), None, None)
        if len(reports) == len(procs):
            release.set()
        bad = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        # "died": its pipe closed without a report (os._exit(0) inside the function): a failure, not a result
        bad += [r for r, rep in reports.items() if rep[0] in ("error", "died") and r not in bad]
        if bad and failed_at is None:
            failed_at = time.monotonic()
        alive = [p for p in procs if p.is_alive()]
        if failed_at is not None and time.monotonic() - failed_at > 0.2:
            return _raise_first(procs, pipes, reports, bad)
        if not alive and failed_at is None:
            if all(rep[0] == "ok" for rep in reports.values()) and len(reports) == len(procs):
                return pickle.loads(reports[0][3])
            if len(reports) < len(procs) and all(not pipe.poll() for r, pipe in enumerate(pipes) if r not in reports):
                missing = [r for r in range(len(procs)) if r not in reports]
                raise RankFailedError(f"rank {missing[0]} exited without a result", rank=missing[0],
                                      host=socket.gethostname(), exitcode=procs[missing[0]].exitcode)
        time.sleep(0.01)


def _raise_first(procs, pipes, reports, bad) -> Any:
    for proc in procs:
        if proc.is_alive():
            _kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            _kill_group(proc.pid, signal.SIGKILL)
    raised = {r: rep for r, rep in reports.items() if rep[0] == "error"}
    host = socket.gethostname()
    if raised:
        rank, (_, _, text, payload) = min(raised.items(), key=lambda kv: (kv[1][1], kv[0]))
        header = f"rank {rank} on host {host} raised; stopped the other {len(procs) - 1} rank(s)"
        exc = None
        if payload is not None:
            try:
                exc = pickle.loads(payload)
            except Exception:  # noqa: BLE001
                exc = None
        if isinstance(exc, SystemExit):  # sys.exit() in a rank is that rank's failure, not the caller's exit
            code = exc.code if isinstance(exc.code, int) else 1
            exc = RankFailedError(f"rank {rank} on host {host} called sys.exit({exc.code!r}); stopped the other "
                                  f"{len(procs) - 1} rank(s)", rank=rank, host=host, exitcode=code, traceback=text)
        elif isinstance(exc, BaseException) and hasattr(exc, "add_note"):  # Python 3.11+: the rank's own error
            exc.add_note(f"{header}. Its traceback:\n{text.rstrip()}")
        else:
            exc = RankFailedError(f"{header}:\n{text.rstrip()}", rank=rank, host=host, exitcode=1, traceback=text)
        setattr(exc, _FAILED_RANK, rank)
        raise exc
    rank = bad[0]
    code = procs[rank].exitcode
    how = "exited without returning from the function" if code == 0 else f"died with {describe_exit(code or 1)}"
    exc = RankFailedError(f"rank {rank} on host {host} {how}; stopped the other {len(procs) - 1} rank(s)",
                          rank=rank, host=host, exitcode=code)
    setattr(exc, _FAILED_RANK, rank)
    raise exc


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
