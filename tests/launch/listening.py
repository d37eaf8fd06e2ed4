"""The TCP sockets some processes listen on, from /proc/net/tcp and tcp6 (Linux)."""

from __future__ import annotations

import ipaddress
import os
import socket


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    return str(ipaddress.IPv6Address(words))


def listening(pids) -> list[tuple[int, str, int]]:
    """(pid, address, port) for every TCP socket in LISTEN state that one of ``pids`` holds."""
    by_inode: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    addr, port = fields[1].split(":")
                    by_inode[fields[9]] = (_address(addr), int(port, 16))
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in by_inode:
                found.append((pid, *by_inode[target[8:-1]]))
    return found
