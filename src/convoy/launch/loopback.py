"""Single-node jobs listen on 127.0.0.1 only: the rendezvous store and gloo, never every interface.

    sock = listen_socket("127.0.0.1", 0)                  # launcher: the store's socket, bound to loopback
    env = {**loopback_env(), LISTEN_FD_VARIABLE: str(sock.fileno())}   # rank 0 gets the socket (pass_fds)
    prepare_worker(os.environ)                            # in rank 0 (convoy.launch.record does it)
    close_when_done(env)                                  # in the others: rank 0 may go once they are done
    keep_serving(others_done(env))                        # rank 0, its program done

torch's ``TCPStore`` server binds every interface whatever ``host_name`` says; its one knob for the address is
``master_listen_fd``, a socket the caller bound. torch reuses a ``multi_tenant`` server already running in the
process on that port, so convoy starts it first on a loopback socket: in rank 0 right after it imports torch
(``prepare_worker``), in the launcher for the elastic agent's rendezvous (``agent_store``). Gloo's listeners
follow ``GLOO_SOCKET_IFNAME=lo`` (set unless the user set it).

Rank 0, once its program has succeeded, keeps serving (``keep_serving``) until every other rank's program has
finished, the launcher is gone, or ``STORE_LINGER`` seconds have passed, so no rank loses the store mid-call.
Each other rank says it is done by closing its copy of a pipe's write end at exit (``close_when_done``), or, under
torch's elastic agent, which passes no descriptors, by letting go of a shared ``flock`` on a file of its own in
``HOLD_DIR_VARIABLE``'s directory (private to this user: ``convoy.launch.scratch``); the OS does either when the
rank dies first.

Multi-node jobs (a ``--master-addr``/``--rdzv-endpoint`` that is not a loopback address) are left as torch
makes them. A script that starts its own ``TCPStore`` server on ``MASTER_PORT`` without ``multi_tenant=True``
would find the port taken: give it ``--master-addr`` of a real interface, which turns this off.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["LOOPBACK_VARIABLE", "LISTEN_FD_VARIABLE", "RELEASE_FD_VARIABLE", "STORE_LINGER", "is_loopback",
           "listen_socket", "loopback_env", "prepare_worker", "agent_store", "after_torch_import", "serving",
           "keep_serving", "released_by_fd", "DONE_FD_VARIABLE", "HOLD_DIR_VARIABLE", "STORE_VARIABLES",
           "close_when_done", "others_done", "released_by_holds"]

LOOPBACK_VARIABLE = "CONVOY_LOOPBACK_STORE"
LISTEN_FD_VARIABLE = "CONVOY_STORE_LISTEN_FD"
RELEASE_FD_VARIABLE = "CONVOY_STORE_RELEASE_FD"  # rank 0: a pipe's read end, its end of file: the others are done
DONE_FD_VARIABLE = "CONVOY_STORE_DONE_FD"  # the other ranks: that pipe's write end, closed when the program is done
HOLD_DIR_VARIABLE = "CONVOY_STORE_HOLD_DIR"  # elastic engine, one node: where the other ranks hold their locks
STORE_VARIABLES = (LISTEN_FD_VARIABLE, RELEASE_FD_VARIABLE, DONE_FD_VARIABLE, HOLD_DIR_VARIABLE)
"""This rank's own: a worker takes them out of its environment, so that a program it starts has none."""
STORE_LINGER = 30.0  # seconds rank 0 keeps serving after its program is done, at most
_SERVERS: list[Any] = []  # the stores started here; torch reuses their servers while they live
_DONE_FDS: list[int] = []  # what this rank holds until its program is done (close_when_done)


def is_loopback(host: str | None) -> bool:
    """True for ``127.x.y.z``, ``::1`` and ``localhost``."""
    if not host:
        return False
    if host == "localhost":
        return True
    import ipaddress  # here: workers import this module, and only launchers need it

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` (0: a free port, never torchrun's 29500)."""
    from convoy.launch.ports import DEFAULT_TORCHRUN_PORT

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(8):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if port == 0 and sock.getsockname()[1] == DEFAULT_TORCHRUN_PORT:  # pragma: no cover - rare
            sock.close()
            continue
        sock.listen(2048)
        return sock
    raise OSError("no free port")  # pragma: no cover


def loopback_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every rank of a single-node job gets: the switch for ``prepare_worker`` and gloo's interface."""
    env = os.environ if env is None else env
    out = {LOOPBACK_VARIABLE: "1"}
    if not env.get("GLOO_SOCKET_IFNAME"):
        out["GLOO_SOCKET_IFNAME"] = "lo"
    return out


def _start_store(env: Mapping[str, str]) -> None:
    """Rank 0: start the store's server on the loopback socket, before anything else in torch does."""
    import torch.distributed as dist

    addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"])
    fd_text = env.get(LISTEN_FD_VARIABLE)
    if fd_text:
        fd = int(fd_text)
    else:  # started by torch's agent, which does not pass sockets: bind the port it chose, on loopback
        sock = listen_socket(addr if is_loopback(addr) and addr != "localhost" else "127.0.0.1", port)
        fd = sock.detach()
    os.set_inheritable(fd, False)  # the store owns it; this rank's children need no copy
    _SERVERS.append(dist.TCPStore(addr, port, is_master=True, multi_tenant=True, master_listen_fd=fd,
                                  wait_for_workers=False))


def _wants_store(env: Mapping[str, str]) -> bool:
    return (env.get(LOOPBACK_VARIABLE) == "1" and env.get("RANK") == "0" and bool(env.get("MASTER_PORT"))
            and env.get("TORCHELASTIC_USE_AGENT_STORE", "False") != "True")


class _AfterTorchImport:
    """A ``sys.meta_path`` finder that runs the callbacks once ``import torch`` has finished, whoever imports
    it (torch-free until then). It finds torch through the other finders and wraps that spec's loader."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(name, path, target)] if found is not None), None)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callbacks = spec.loader.exec_module, self.callbacks

        def exec_then_call(module):
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_call  # this spec's loader instance only
        return spec


def after_torch_import(callback: Callable[[], None]) -> None:
    """Call ``callback`` now if torch is imported, else right after the program's ``import torch`` finishes."""
    if "torch" in sys.modules:
        callback()
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterTorchImport)), None)
    if finder is None:
        finder = _AfterTorchImport()
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)


def prepare_worker(env: Mapping[str, str] | None = None) -> None:
    """In a worker: when it is rank 0 of a single-node job, serve the store on loopback once torch is imported.

    Does nothing for other ranks and other jobs. Cheap: torch is not imported here.
    """
    env = dict(os.environ if env is None else env)
    if not _wants_store(env):
        fd_text = env.get(LISTEN_FD_VARIABLE)
        if fd_text:  # not ours to serve (an agent store): do not keep the port bound
            try:
                os.close(int(fd_text))
            except (OSError, ValueError):
                pass
        return
    after_torch_import(lambda: _start_store(env))


def serving() -> bool:
    """True in a rank that serves the job's rendezvous store (rank 0 of a single-node job, once torch is in)."""
    return bool(_SERVERS)


def keep_serving(others_done: Callable[[float], bool], limit: float = STORE_LINGER) -> None:
    """Rank 0, its program done: keep the store up until ``others_done(wait)`` (which may block for ``wait``
    seconds) says the other ranks are done, the launcher (the parent) is gone, or ``limit`` seconds passed."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent, deadline = os.getppid(), time.monotonic() + limit
    while not others_done(min(1.0, max(0.0, deadline - time.monotonic()))):
        if os.getppid() != parent or time.monotonic() >= deadline:
            return


def close_when_done(env: Mapping[str, str] | None = None) -> None:
    """In a rank other than 0: hold what tells rank 0 that this program runs (the release pipe's write end,
    ``DONE_FD_VARIABLE``; under the elastic agent a lock in ``HOLD_DIR_VARIABLE``), and let go of it once this
    program has finished, so that rank 0 may stop serving the store while this interpreter tears itself down.

    Call it before the program starts: the ``atexit`` handler registered here runs after every one
    registered later (the program's, torch's) and after Python has joined the program's threads. A fork of
    this process (a data loader's worker) closes its copy at once, and an exec'd child never gets one, so only
    this program holds it; if it dies first, the OS lets go. A program that leaves an NCCL process group alive
    holds it until its process ends (``_let_go_at_exit``).
    """
    env = os.environ if env is None else env
    fd = _done_fd(env)
    if fd is None:
        return
    if not _DONE_FDS and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_close_done_fds)
    _DONE_FDS.append(fd)
    import atexit

    atexit.register(_let_go_at_exit)


def _let_go_at_exit() -> None:
    """The program is done: let rank 0 go, unless it left a process group other than gloo alive, which may still
    read the store while the interpreter tears it down (NCCL's monitor thread checks it until the group is
    destroyed, and warns "maybe TCPStore server has shut down too early" once it is gone); the OS then lets go
    with the process, as before. ``Accelerator`` destroys its group at exit, before this runs."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
            return
    except Exception:  # noqa: BLE001 - torch half torn down: nothing left that could read the store
        pass
    _close_done_fds()


def _done_fd(env: Mapping[str, str]) -> int | None:
    fd_text = env.get(DONE_FD_VARIABLE, "")
    if fd_text.isdigit():
        try:
            os.set_inheritable(int(fd_text), False)
        except OSError:  # not open here (a caller that closed it): nothing to hold
            return None
        return int(fd_text)
    directory, rank = env.get(HOLD_DIR_VARIABLE), env.get("RANK", "0")
    if not directory or rank == "0":
        return None
    import fcntl

    if not _own_private_dir(directory):  # not the launcher's (swapped by someone else): hold nothing there
        return None
    path = _hold_path(directory, env, rank)
    try:  # locked before it has its name: rank 0 never finds it unlocked while this program runs
        # never truncated, never through a link: a file planted under that name is not written to
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError:  # the launcher's directory is gone (the job is ending), or a link is in the way
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.replace(path + ".new", path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _own_private_dir(directory: str) -> bool:
    """``directory`` is a directory (not a link) of this user that nobody else may write to: the launcher's
    ``convoy-store-*`` (``convoy.launch.scratch``), not one put in its place."""
    import stat

    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _hold_path(directory: str, env: Mapping[str, str], rank: str | int) -> str:
    return os.path.join(directory, f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}.{rank}")


def others_done(env: Mapping[str, str] | None = None) -> Callable[[float], bool] | None:
    """Rank 0: how ``keep_serving`` learns that the other ranks' programs are done (None: nothing says it)."""
    env = os.environ if env is None else env
    fd_text = env.get(RELEASE_FD_VARIABLE, "")
    if fd_text.isdigit():
        return released_by_fd(int(fd_text))
    directory, world = env.get(HOLD_DIR_VARIABLE), env.get("WORLD_SIZE", "1")
    if directory and env.get("RANK") == "0" and world.isdigit():
        return released_by_holds([_hold_path(directory, env, rank) for rank in range(1, int(world))])
    return None


def released_by_holds(paths: list[str]) -> Callable[[float], bool]:
    """``others_done`` for the other ranks' lock files: each must exist (its rank started) and be free."""
    import fcntl

    waiting = list(paths)

    def done(wait: float) -> bool:
        deadline = time.monotonic() + wait
        while True:
            for path in list(waiting):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                except OSError:  # that rank has not started yet (or a link is in the way)
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    waiting.remove(path)
                except OSError:  # held: its program runs
                    pass
                finally:
                    os.close(fd)
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                return not waiting
            time.sleep(min(0.02, left))
    return done


def _close_done_fds() -> None:
    while _DONE_FDS:
        try:
            os.close(_DONE_FDS.pop())
        except OSError:
            pass


def released_by_fd(fd: int) -> Callable[[float], bool]:
    """``others_done`` for the release pipe's read end: end of file once every copy of its write end is closed
    (the other ranks' programs have finished, or they died; the launcher closed its own)."""
    def done(wait: float) -> bool:
        try:
            return bool(select.select([fd], [], [], wait)[0])  # readable: end of file (nothing is written)
        except (OSError, ValueError):
            return True
    return done


@contextmanager
def agent_store(host: str, port: int = 0) -> Iterator[int]:
    """The elastic agent's c10d rendezvous store on ``host`` (loopback), started here; yields its port.

    torch's c10d backend then creates ``TCPStore(host, port, is_master=True, multi_tenant=True)``, which
    reuses this server instead of binding every interface.
    """
    import torch.distributed as dist

    sock = listen_socket(host, port)
    port = sock.getsockname()[1]
    store = dist.TCPStore(host, port, is_master=True, multi_tenant=True, master_listen_fd=sock.detach(),
                          wait_for_workers=False)
    _SERVERS.append(store)
    try:
        yield port
    finally:
        _SERVERS.remove(store)
