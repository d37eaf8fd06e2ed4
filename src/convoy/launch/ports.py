"""Free TCP ports for a job's rendezvous, chosen by the operating system.

    from convoy.launch.ports import free_port
    port = free_port("127.0.0.1")      # e.g. 41873; never the well-known 29500 that torchrun defaults to

The OS hands out a port nobody is listening on; two jobs started at the same moment get different ports,
so single-node launches never collide the way two ``torchrun`` runs on 29500 do.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "DEFAULT_TORCHRUN_PORT"]

#: torchrun's fixed default; convoy avoids it so that a torchrun job on the same box never collides.
DEFAULT_TORCHRUN_PORT = 29500


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now (bind to port 0 and ask the kernel which one it gave)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(8):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port != DEFAULT_TORCHRUN_PORT:
            return port
    return port  # pragma: no cover - eight hits on 29500 in a row cannot happen with an ephemeral range
