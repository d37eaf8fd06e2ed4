"""``convoy test``: launch a short self-check on the selected devices and print a PASS/FAIL line per check.

    convoy test                          # every visible device (2 CPU processes on a machine without any)
    convoy test --devices 0,1            # these two GPUs and the link between them
    convoy test --json                   # the results as JSON

Library: ``convoy.launch.selfcheck.run_selfcheck()``. Exits 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict

from convoy.errors import shown
from convoy.launch.selfcheck import CHECKS, format_selfcheck, run_selfcheck

DESCRIPTION = ("Launch a short self-check on the selected devices: rendezvous, each collective the strategies use, "
               "a few DDP steps, and the measured all-reduce bus bandwidth, with what to do when a check fails.")
EPILOG = f"""checks, in order: {', '.join(CHECKS)}

examples:
  convoy test                              all visible devices (2 CPU processes without accelerators)
  convoy test --devices 0,1                two GPUs and the link between them
  convoy test --nproc-per-node 4           four processes (CPU, or the first four devices)
  convoy test --size-mib 1024 --json       a bigger bandwidth sample, as JSON
exit status: 0 when every check passes, 1 when one fails or does not run."""


def _positive(kind):
    def convert(text: str):
        # ASCII digits only (int()/float() would read '٣'), finite, and below a day's worth or a billion
        number = r"\s*-?[0-9]{1,9}\s*" if kind is int else r"\s*-?([0-9]{1,9}(\.[0-9]*)?|\.[0-9]+)\s*"
        if not re.fullmatch(number, text):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number")
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", metavar="SPEC", help="devices to test ('0,1', '2', 'all'); default: all visible")
    parser.add_argument("--nproc-per-node", metavar="N", help="processes to start (default: one per device, 2 on CPU)")
    parser.add_argument("--timeout", type=_positive(float), default=30.0, metavar="SECONDS",
                        help="how long the rendezvous and each collective may take (default 30)")
    parser.add_argument("--size-mib", type=_positive(float), metavar="MIB",
                        help="all-reduce size for the bandwidth check (default 256 on GPUs, 16 on CPU)")
    parser.add_argument("--steps", type=_positive(int), default=3, metavar="N", help="DDP steps to train (default 3)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    report = run_selfcheck(devices=args.devices, nproc_per_node=args.nproc_per_node, timeout=args.timeout,
                           size_mib=args.size_mib, steps=args.steps)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    else:
        print(format_selfcheck(report))
    return 0 if report.ok else 1
