"""Units the planner counts in, and how it prints them.

    from convoy.plan.units import GB, GiB, format_bytes
    format_bytes(31.4e9)          # '31.4 GB'
    format_bytes(3 * GiB, binary=True)   # '3.0 GiB'

The ZeRO paper and GPU datasheets count memory in decimal gigabytes (1e9 bytes); ``nvidia-smi`` and
``torch.cuda`` count in binary MiB/GiB. The planner computes in bytes and converts only to print.
"""

from __future__ import annotations

__all__ = ["KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "format_bytes", "format_count", "format_seconds"]

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB = 2**10, 2**20, 2**30


def format_bytes(n: float, *, binary: bool = False) -> str:
    """``n`` bytes as a short human string: decimal GB by default (as the ZeRO paper rounds), or GiB."""
    if binary:
        for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if abs(n) >= size:
                return f"{n / size:.1f} {unit}"
        return f"{n:.0f} B"
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_count(n: float) -> str:
    """A count as people say it, three digits at most: '70B', '6.74B', '125M', '82.3K', '512' (never '7e+10')."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def format_seconds(t: float) -> str:
    """A duration in the unit that reads best: '85 us', '20.7 ms', '412 ms', '3.10 s', '2.5 min'."""
    if t < 1e-3:
        return f"{t * 1e6:.0f} us"
    if t < 0.1:
        return f"{t * 1e3:.1f} ms"
    if t < 1:
        return f"{t * 1e3:.0f} ms"
    if t < 120:
        return f"{t:.2f} s"
    return f"{t / 60:.1f} min"
