"""Run a launch request end to end: select devices, resolve the plan, lease, start, report.

    from convoy.launch.job import launch_job, DeviceFilters
    from convoy.launch.resolve import LaunchRequest
    launch_job(LaunchRequest(program=("train.py",), devices="0,2"))           # what `convoy launch` calls
    launch_job(LaunchRequest(program=("train.py",)), dry_run=True)            # prints the plan only

The devices are leased for the life of the job and released on exit, success or crash; a guard process
(``convoy.launch.guard``) stops every process of the job if the launcher dies, and only then lets the lease go.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from convoy.errors import ConfigError, shown
from convoy.launch.resolve import CPU_NOTE_STARTS, LaunchPlan, LaunchRequest, asked_nproc, describe_plan, resolve_launch

__all__ = ["DeviceFilters", "check_program", "launch_job", "lease_plan", "plan_job", "prepare_log_dir"]


@dataclass(frozen=True, kw_only=True)
class DeviceFilters:
    """Selection filters passed to ``convoy.devices.selection.select_devices``."""

    free: bool = False
    """Only devices no process is using."""
    min_free_memory: str | int | None = None
    """Minimum free memory per device (MiB, or a string such as "20GiB")."""
    max_utilization: int | None = None
    """Maximum utilisation percent."""
    exclude: tuple[int | str, ...] = ()
    """Visible indices or UUIDs never to use (as ``select_devices``' ``exclude``)."""
    order: str | None = None
    """Device order ("index", "memory", "topology", ...)."""
    lease_wait: float | None = None
    """Seconds to wait for leased devices to come free (None: fail at once)."""
    lease: bool = True
    """Hold an OS lease on the devices for the job's life."""


def _wanted(request: LaunchRequest) -> str:
    wanted = "auto" if request.devices is None else request.devices  # "" is no accelerator, as everywhere
    if wanted == "auto" and asked_nproc(request.nproc_per_node) == "cpu":
        wanted = "0"  # torchrun's --nproc-per-node cpu: one CPU process per core, whatever accelerators there are
    return wanted


def _filter_kwargs(filters: DeviceFilters) -> dict:
    return dict(free=filters.free, min_free_memory=filters.min_free_memory,
                max_utilization=filters.max_utilization, exclude=filters.exclude, order=filters.order)


def _select(request: LaunchRequest, filters: DeviceFilters, env: Mapping[str, str]):
    """The devices the job would take now. With ``--free``, devices another job has leased count as busy (as
    for ``convoy select --free``, also with ``--no-lease``); when every fitting device is leased and the job
    may wait for them, the plan names the devices it would wait for."""
    from convoy.devices.selection import select_devices
    from convoy.errors import SelectionError

    wanted = _wanted(request)
    if not filters.free:
        return select_devices(wanted, env=env, **_filter_kwargs(filters))
    from convoy.devices.discovery import discover
    from convoy.devices.lease import visible_holders

    inventory = discover(env)
    held = visible_holders(inventory, env)
    try:
        return select_devices(wanted, inventory=inventory, env=env, held=held, **_filter_kwargs(filters))
    except SelectionError:
        if not held or filters.lease_wait is None:
            raise
        return select_devices(wanted, inventory=inventory, env=env, **_filter_kwargs(filters))


def plan_job(request: LaunchRequest, *, filters: DeviceFilters = DeviceFilters(),
             env: Mapping[str, str] | None = None) -> LaunchPlan:
    """Select the devices and resolve the plan; starts nothing."""
    from convoy.errors import DeviceSpecError

    env = dict(os.environ if env is None else env)
    try:
        selection = _select(request, filters, env)
    except DeviceSpecError as err:
        if "devices" not in request.origins:  # a flag (or devices= in Python): the message quotes it
            raise
        # CONVOY_DEVICES or a settings file's devices: say which, the user may not know it is set
        raise DeviceSpecError(f"{request.said('devices', request.devices)}: {err}") from None
    return _torch_noted(resolve_launch(request, selection, env=env))


def _torch_noted(plan: LaunchPlan) -> LaunchPlan:
    """``plan`` with a note when it runs a Python program on devices this Python's torch cannot use (a CPU-only
    torch on a GPU box: ``convoy.launch.torch_build``), which the dry run shows and the run says once."""
    if not plan.devices or plan.command[:2] != (sys.executable, "-u"):  # another program: nothing is known
        return plan
    from dataclasses import replace

    from convoy.launch.torch_build import unusable_note

    note = unusable_note(plan.vendor, count=len(plan.devices))
    return plan if note is None else replace(plan, explanation=(*plan.explanation, note))


def launch_job(request: LaunchRequest, *, filters: DeviceFilters = DeviceFilters(),
               env: Mapping[str, str] | None = None, dry_run: bool = False,
               echo: Callable[[str], None] | None = None) -> int:
    """Run ``request``; returns 0, or raises ``RankFailedError`` naming the first failing rank."""
    echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    base_env = dict(os.environ if env is None else env)
    # No background import of torch's agent here: importing torch in a thread while this one selects
    # devices cost ~0.1 s more CPU than importing it afterwards (both share one GIL; docs/launching.md).
    plan = plan_job(request, filters=filters, env=base_env)
    check_program(request)  # after every flag's check, before anything is leased or started
    if plan.engine == "direct":
        _check_listen_address(plan.master_addr)
    if plan.workers.log_dir:
        prepare_log_dir(plan.workers.log_dir, create=not dry_run)
    if dry_run:
        for line in describe_plan(plan):
            print(line)
        return 0
    from convoy.launch.scratch import check_temp_dir

    check_temp_dir()  # where the job's temporary directory goes: refused before anything is said or leased
    for note in plan.explanation:
        if note.startswith(CPU_NOTE_STARTS):
            echo(f"convoy: {note}")
    from convoy.launch.console import guarded_consoles
    from convoy.launch.guard import job_guard

    plan, lease = _lease_job(request, plan, filters, base_env, say=echo)
    kept = "--log-dir" if plan.workers.log_dir else None  # where rank output goes once the console's reader left
    # The guard holds the lease's locks too: when this process dies, the devices stay leased until every
    # process of the job is gone (convoy.launch.guard).
    with lease as held, job_guard(held.fds if held else ()) as guard, guarded_consoles(kept=kept):
        if guard is not None:
            base_env = {**base_env, **guard.env}
        if plan.engine == "direct":
            from convoy.launch.workers import run_direct

            return run_direct(plan, base_env=base_env)
        from convoy.launch.elastic import run_elastic

        return run_elastic(plan, base_env=base_env)


def check_program(request: LaunchRequest) -> None:
    """The script (or command) exists here: one ``ConfigError`` line in the parent, not a traceback per rank.
    Modules (``-m``) are left to Python, which finds them on the ranks' path."""
    target = request.program[0] if request.program else ""
    if request.module:
        return
    if request.no_python:
        if not target or shutil.which(target) is None:
            raise ConfigError(f"--no-python: {shown(target, limit=80)} is neither a command on PATH nor an "
                              "executable file")
        return
    path = Path(target)
    if not target.strip() or not path.exists():
        raise ConfigError(f"{shown(target, limit=80)}: no such file; give the path of the Python script to run, "
                          "or -m MODULE")
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise ConfigError(f"{shown(target, limit=80)}: is a directory without __main__.py; give the Python script "
                          "to run")


def _check_listen_address(host: str) -> None:
    """Rank 0 of a one-machine job listens on ``--master-addr``: an address of another machine (or a name that
    does not resolve) is one ``ConfigError`` line here, not a ``socket.gaierror`` traceback after the lease."""
    from convoy.launch.ports import free_port

    try:
        free_port(host)
    except OSError as err:  # socket.gaierror included
        raise ConfigError(f"--master-addr {shown(host, limit=60)}: cannot listen there on this machine "
                          f"({err.strerror or err}); give an address of this machine (rank 0 runs here), or leave "
                          "it out for a job on one machine") from None


def prepare_log_dir(log_dir: str, *, create: bool = True) -> Path:
    """Check (and with ``create`` make) ``--log-dir`` in the parent, so that a bad one is one ``ConfigError``
    line before any rank starts rather than a failure in every rank."""
    if "\0" in str(log_dir):
        raise ConfigError(f"--log-dir {shown(str(log_dir))}: a path cannot hold a NUL character")
    path = Path(log_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--log-dir {log_dir}: is a file, not a directory; give a directory for the rank logs")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"--log-dir {log_dir}: cannot create it ({err.strerror or err}); give a writable "
                              f"directory") from None
        probe = path
    else:
        probe = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--log-dir {log_dir}: {probe} is not a writable directory; give a writable directory")
    return path


def _lease_job(request: LaunchRequest, plan: LaunchPlan, filters: DeviceFilters, env: Mapping[str, str], *,
               say: Callable[[str], None] | None = None):
    """``(plan, lease)``: the plan's devices leased. With ``--free`` the devices are chosen again under the
    lease (``select_and_lease``): a count moves on to devices no job holds, even one that another job leased
    since the plan was made, and the plan is resolved again for the devices taken."""
    if not (plan.devices and filters.lease and filters.free):
        return plan, lease_plan(plan, filters=filters, env=env, spec=_wanted(request), say=say)
    from convoy.devices.lease import select_and_lease

    selection, lease = _loopback_hint(plan, lambda: select_and_lease(
        _wanted(request), wait=filters.lease_wait, env=env, say=say, **_filter_kwargs(filters)))
    if selection.devices != plan.devices:
        try:
            plan = resolve_launch(request, selection, env=env)
        except BaseException:
            lease.release()  # taken above, and no `with` holds it yet
            raise
    return plan, lease


def _loopback_hint(plan: LaunchPlan, take: Callable):
    from convoy.errors import LeaseError

    try:
        return take()
    except LeaseError as err:
        if plan.max_nodes > 1 and plan.master_addr in _LOOPBACK:
            # Several "nodes" on one host (a loopback rehearsal of a multi-node job) each select the same
            # devices; the first holds them and waits for its peers, which never get them.
            raise LeaseError(f"{err}; several nodes on one host need devices of their own: give each node "
                             "different --devices, or --devices 0 for CPU processes") from None
        raise


def lease_plan(plan: LaunchPlan, *, filters: DeviceFilters = DeviceFilters(), env: Mapping[str, str] | None = None,
               spec: object = None, say: Callable[[str], None] | None = None):
    """A context manager holding a lease on ``plan.devices`` (in ``env``'s lease directory) while it is open.
    ``spec``: the device request, for the refusal's hint; ``say``: where a wait is told (``lease_devices``).

    Does nothing for a CPU plan or ``filters.lease=False``. Raises ``LeaseError`` naming the holders when
    another job still has a device after ``filters.lease_wait`` seconds. Used by ``convoy.launch(fn)`` too.
    """
    if not plan.devices or not filters.lease:
        return nullcontext()
    from convoy.devices.lease import default_lock_dir, lease_devices

    return _loopback_hint(plan, lambda: lease_devices(plan.devices, wait=filters.lease_wait,
                                                      lock_dir=default_lock_dir(env), spec=spec, say=say))


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
