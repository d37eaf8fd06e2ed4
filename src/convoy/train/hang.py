"""Hang detection: a collective that not every rank reaches ends the job with the names of the missing ranks.

    from convoy.train.hang import CollectiveWatch
    watch = CollectiveWatch(timeout=60)                 # default: CONVOY_COLLECTIVE_TIMEOUT, else 300 s
    with watch.guard("all_reduce loss"):                # every rank must arrive here within 60 s ...
        dist.all_reduce(loss)
    watch.barrier()                                     # a barrier that names the ranks that never came
    watch_call("gather", timeout=60)                    # one watched call, no watch kept (the Accelerator's way)

If a rank skips the collective (or is stuck before it), the ranks that did arrive raise
``CollectiveTimeoutError``: ``collective 'all_reduce loss' (#3) did not complete within 60 s: rank 1 of 2
did not arrive ...``. Ranks that arrive at *different* guarded collectives raise the same error naming who is
where. The exception ends the rank; ``convoy launch`` (like torchrun) then stops the others, so the job ends
instead of hanging for torch's default 30 minutes.

How it works: before the collective each rank writes ``<seq>/<rank> = name`` into the job's rendezvous
store (the c10d store every process group already has) and waits, with the timeout, for every rank's key;
on a timeout the keys that are missing are exactly the ranks that did not arrive. This works for every
backend (gloo, NCCL) and costs two small store round trips per guarded call, so guard the collectives you
want watched, not every tensor operation. The process-group timeout (``CONVOY_COLLECTIVE_TIMEOUT``, passed
to ``init_process_group``) still catches a collective that hangs after every rank arrived.

``watch_call`` is for callers that must not hold the store between calls (a watch kept for the life of the
group holds the c10d store past ``destroy_process_group()``, and gloo then aborts the process at exit): it
makes a short-lived watch whose call number is counted in the store itself, so every caller of the job
shares one sequence and the store keeps at most two keys per rank.

The launcher's side (raw collectives' default timeout, the report naming a rank that never joined) is
``convoy.launch.hang_report``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from convoy.config.schema import DEFAULT_COLLECTIVE_TIMEOUT
from convoy.errors import CollectiveTimeoutError, ConfigError
from convoy.launch.rank_env import read_collective_timeout

__all__ = ["CollectiveWatch", "watch_call", "collective_timeout", "DEFAULT_COLLECTIVE_TIMEOUT"]


def collective_timeout(env: Mapping[str, str] | None = None) -> float:
    """Seconds from ``CONVOY_COLLECTIVE_TIMEOUT`` (what ``convoy launch`` sets), else convoy's default."""
    return read_collective_timeout(os.environ if env is None else env)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class CollectiveWatch:
    """Watches the collectives of one process group; every rank of the group must create one and guard the
    same collectives in the same order. Hold it for the life of the group (the Accelerator does)."""

    def __init__(self, *, timeout: float | None = None, group: Any = None, store: Any = None,
                 prefix: str = "convoy/arrive") -> None:
        if not dist.is_initialized():
            raise ConfigError("CollectiveWatch needs an initialised process group: call "
                              "torch.distributed.init_process_group() (or create the Accelerator) first")
        self.timeout = collective_timeout() if timeout is None else float(timeout)
        if self.timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} is not valid; expected a number of seconds > 0")
        self._dist = dist
        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if store is None:
            store = _get_default_store()
        group_name = getattr(group, "group_name", "default") if group is not None else "default"
        self._store = dist.PrefixStore(f"{prefix}/{group_name}/", store)
        self._seq = 0

    @property
    def calls(self) -> int:
        """How many guarded collectives this rank has passed."""
        return self._seq

    def arrive(self, name: str, *, timeout: float | None = None) -> None:
        """Mark this rank as arrived at collective ``name`` and wait for the others (``timeout`` seconds).

        Raises ``CollectiveTimeoutError`` naming the ranks that did not arrive, or the ranks that arrived
        at a different collective.
        """
        seconds = self.timeout if timeout is None else float(timeout)
        seq, self._seq = self._seq, self._seq + 1
        keys = [f"{seq}/{r}" for r in range(self.world_size)]
        self._store.set(keys[self.rank], name)
        if not self._arrived(keys, seconds):
            missing = [r for r, key in enumerate(keys) if not self._store.check([key])]
            if missing:
                raise CollectiveTimeoutError(
                    f"collective {name!r} (#{seq}) did not complete within {seconds:g} s: {_ranks(missing)} of "
                    f"{self.world_size} did not arrive (they skipped it, or are stuck or slower before it; "
                    f"their stack traces show where: 'py-spy dump --pid PID'); raise CONVOY_COLLECTIVE_TIMEOUT "
                    f"if they are only slow") from None
        names = dict(enumerate(value.decode() for value in self._values(keys)))
        strays = {r: n for r, n in names.items() if n != name}
        if strays:
            where = "; ".join(f"rank {r} is at {n!r}" for r, n in sorted(strays.items()))
            raise CollectiveTimeoutError(
                f"ranks are out of step at guarded collective #{seq}: rank {self.rank} is at {name!r}; {where} "
                f"(every rank must run the same collectives in the same order)")
        if seq:  # every rank has passed seq-1 (they set seq only after), so its key can go
            self._store.delete_key(f"{seq - 1}/{self.rank}")

    def _arrived(self, keys: list[str], seconds: float) -> bool:
        """True once every key is in the store, False after ``seconds``. Polled with ``check`` rather than one
        ``store.wait``: a wait that times out has torch's C++ client print two ``[c10d] waitForInput ... timed
        out`` warnings per rank just before convoy's ``CollectiveTimeoutError`` says what happened."""
        deadline = time.monotonic() + seconds
        pause, longest = 0.0002, min(0.01 * max(1.0, self.world_size / 64), 0.1)  # a large job polls less often
        while not self._store.check(keys):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, longest)
        return True

    def _values(self, keys: list[str]) -> list[bytes]:
        try:  # one round trip where the store has it (TCPStore, HashStore)
            return list(self._store.multi_get(keys))
        except (RuntimeError, NotImplementedError):
            return [self._store.get(key) for key in keys]

    @contextlib.contextmanager
    def guard(self, name: str, *, timeout: float | None = None) -> Iterator[None]:
        """``with watch.guard("all_reduce"): dist.all_reduce(t)``: check arrival, then run the block."""
        self.arrive(name, timeout=timeout)
        yield

    def barrier(self, name: str = "barrier", *, timeout: float | None = None) -> None:
        """A barrier that names the ranks that did not reach it (works on every backend)."""
        self.arrive(name, timeout=timeout)


def watch_call(name: str, *, timeout: float | None = None, group: Any = None,
               prefix: str = "convoy/watched") -> None:
    """Wait until every rank of ``group`` arrives at collective ``name`` (``timeout`` seconds); no watch is kept.

    The call number comes from a per-rank counter in the store, so separate callers (two Accelerators of one
    job) stay in one sequence; raises ``CollectiveTimeoutError`` like ``CollectiveWatch.arrive``.
    """
    watch = CollectiveWatch(timeout=timeout, group=group, prefix=prefix)
    watch._seq = int(watch._store.add(f"calls/{watch.rank}", 1)) - 1
    watch.arrive(name)
