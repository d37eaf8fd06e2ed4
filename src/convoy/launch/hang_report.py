"""The launcher's side of hang detection (the trainer's is ``convoy.train.hang``): raw torch collectives get
a default timeout, and a report names the rank that never joined.

    install()                                        # in each worker (convoy.launch.record does it)
    missing_note({0: err0, 1: err1}, failed_rank=0)  # in the launcher: "rank 1 never joined collective #3 ..."

A script that calls ``init_process_group()`` itself gets torch's default timeout (30 minutes for gloo, 10 for
NCCL), and torch has no environment variable for it. Each worker therefore sets torch's own default,
``torch.distributed.distributed_c10d.default_pg_timeout`` (and the NCCL one), to ``CONVOY_COLLECTIVE_TIMEOUT``
(``--collective-timeout``, else 300 s) once torch is imported; a ``timeout=`` the script passes still wins.

When a collective times out, torch's error says nothing about who was missing. Each worker keeps a small
file beside its torchelastic error file (``<TORCHELASTIC_ERROR_FILE>.collectives``) with the number of
collectives it has issued on the default group (torch's own per-group sequence number, read by a daemon
thread every 0.2 s). When a rank fails, the launcher compares the numbers: the ranks that issued fewer than
the failing rank never joined the collective it waited in, and the report names them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SUFFIX", "install", "missing_note", "read_count"]

SUFFIX = ".collectives"
_INTERVAL = 0.2


def _timeout(env: Mapping[str, str]) -> float:
    """``CONVOY_COLLECTIVE_TIMEOUT`` read by the settings' own parser (the launcher checked it already; a value
    set by hand that it refuses is left to the trainer to report, and raw collectives keep the default)."""
    from convoy.config.schema import DEFAULT_COLLECTIVE_TIMEOUT
    from convoy.errors import ConfigError
    from convoy.launch.rank_env import read_collective_timeout

    try:
        return read_collective_timeout(env)
    except ConfigError:
        return DEFAULT_COLLECTIVE_TIMEOUT


def _after_torch(env: Mapping[str, str]) -> None:
    import datetime
    import threading

    import torch.distributed.distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=_timeout(env))
    c10d.default_pg_timeout = timeout  # what init_process_group(timeout=None) reads (_get_default_timeout)
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), datetime.timedelta):
        c10d.default_pg_nccl_timeout = timeout
    path = env.get("TORCHELASTIC_ERROR_FILE")
    if path:
        threading.Thread(target=_publish, args=(path + SUFFIX, c10d), daemon=True,
                         name="convoy-collectives").start()


def _publish(path: str, c10d) -> None:
    """Write the default group's collective count to ``path`` whenever it changes, while the program runs."""
    import threading

    last = None
    main = threading.main_thread()
    event = threading.Event()
    while main.is_alive():
        count = _count(c10d)
        if count is not None and count != last:
            try:
                with open(path + ".tmp", "w") as handle:
                    handle.write(str(count))
                os.replace(path + ".tmp", path)
                last = count
            except OSError:
                return
        event.wait(_INTERVAL)


def _count(c10d) -> int | None:
    """The default group's sequence number; no reference to the group outlives this call (the program's
    ``destroy_process_group()`` must stay the last owner)."""
    try:
        if not c10d.is_initialized():
            return None
        return int(c10d.GroupMember.WORLD._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a group being torn down; try again
        return None


def install(env: Mapping[str, str] | None = None) -> None:
    """In a worker: set torch's default collective timeout and start the count publisher once torch loads."""
    from convoy.launch.loopback import after_torch_import

    env = dict(os.environ if env is None else env)
    after_torch_import(lambda: _after_torch(env))


def read_count(error_file: str | None) -> int | None:
    if not error_file:
        return None
    try:
        return int(Path(error_file + SUFFIX).read_text().strip())
    except (OSError, ValueError):
        return None


def missing_note(error_files: Mapping[int, str | None], *, failed_rank: int) -> str | None:
    """"rank 1 never joined collective #3 ..." when some ranks issued fewer collectives than ``failed_rank``."""
    counts = {rank: read_count(path) for rank, path in error_files.items()}
    failed = counts.get(failed_rank)
    if not failed:
        return None
    behind = sorted(rank for rank, count in counts.items() if count is not None and count < failed)
    if not behind:
        return None
    who = ("rank " if len(behind) == 1 else "ranks ") + ", ".join(map(str, behind))
    had = ", ".join(f"rank {r}: {counts[r]}" for r in behind)
    return (f"{who} never joined collective #{failed} that rank {failed_rank} waited in (collectives issued: "
            f"rank {failed_rank}: {failed}, {had}); {'it' if len(behind) == 1 else 'they'} skipped it or "
            f"stopped before it")
