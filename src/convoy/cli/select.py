"""``convoy select``: which devices a request gets, printed as an environment, indices, UUIDs or JSON.

    convoy select 2 --free --format env        # export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,3
    eval $(convoy select 2 --free --format env) && python train.py
    convoy select 4 --order topology --explain # why these four, and why not the others

Calls ``convoy.devices.selection.select_devices``. It only prints: to *hold* devices while a job runs, use
``convoy run`` (it leases them). With ``--free``, devices another job has leased count as busy.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

DESCRIPTION = "Choose devices for a request and print them, or the environment that makes them visible."
EPILOG = """examples:
  eval $(convoy select 2 --free --format env)      # bash: make 2 free GPUs visible
  convoy select 2,0 --format env                   # physical 2 becomes cuda:0
  convoy select 4 --order topology --explain       # 4 GPUs inside one NVLink (NVIDIA) or xGMI (AMD) island
  CONVOY_INVENTORY=box.json convoy select 1 --free # replay another machine's decision"""

FORMATS = ("env", "index", "uuid", "json")


NO_LEASE_WAIT = ("--wait waits for devices another job has leased, and --no-lease takes no lease (so waits for "
                 "nothing): give one of them")
"""``convoy run`` and ``convoy launch`` refuse the two together (--wait was ignored)."""


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """The filters ``convoy select`` and ``convoy run`` share."""
    from convoy.devices.selection import ORDERS

    group = parser.add_argument_group("filters")
    group.add_argument("--free", action="store_true",
                       help="skip busy devices (processes on them, exclusive/prohibited mode, leased by a job)")
    group.add_argument("--min-free-memory", metavar="AMOUNT",
                       help="at least this much free memory per device: 20GiB, 512MiB, 80%% (of its total)")
    group.add_argument("--max-utilization", metavar="PCT", help="at most this utilisation: 10%% or 10")
    group.add_argument("--exclude", metavar="LIST", default="",
                       help="never take these devices: visible indices or UUIDs, comma-separated")
    group.add_argument("--order", choices=ORDERS, default=None,
                       help="how to rank devices for a count: index (default; lists keep your order), "
                            "free-memory, fastest, topology (best-connected NVLink/xGMI island)")
    parser.add_argument("--inventory", metavar="FILE",
                        help="read devices from an inventory file instead of the hardware (= CONVOY_INVENTORY)")


def selection_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``select_devices`` keyword arguments from the parsed filter flags."""
    return {
        "free": args.free,
        "min_free_memory": args.min_free_memory,
        "max_utilization": args.max_utilization,
        "exclude": [t.strip() for t in args.exclude.split(",") if t.strip()],
        "order": args.order,
    }


def command_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment the request is resolved in: this process's, plus ``--inventory``."""
    from convoy.errors import InventoryError

    env = dict(os.environ)
    if args.inventory is not None:
        if not args.inventory.strip():  # was ignored: the hardware (or CONVOY_INVENTORY) answered instead
            raise InventoryError(f"--inventory {args.inventory!r} names no file; give an inventory file such as "
                                 f"box.json (written by 'convoy devices --json'), or leave --inventory out")
        env["CONVOY_INVENTORY"] = args.inventory
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", nargs="?", default="auto",
                        help="count (2), index list (2,0), range (0-3,6), -1/all, or auto (default: every "
                             "visible device that passes the filters)")
    add_filter_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="env",
                        help="env: one 'export ...' line for eval (default); index: 2,0; uuid; json")
    parser.add_argument("--explain", action="store_true", help="also print why, one line per device, to stderr")


def run(args: argparse.Namespace) -> int:
    from convoy.devices.discovery import discover
    from convoy.devices.lease import visible_holders
    from convoy.devices.selection import select_devices

    env = command_env(args)
    inventory = discover(env)
    held = visible_holders(inventory, env) if args.free else {}
    selection = select_devices(args.spec, inventory=inventory, env=env, held=held, **selection_kwargs(args))
    if args.explain:
        print("\n".join(selection.explanation), file=sys.stderr)
    print(render(selection, args.format))
    return 0


def render(selection, fmt: str) -> str:
    if fmt == "env":
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in selection.env.items())
    if fmt == "index":
        return ",".join(str(i) for i in selection.indices)
    if fmt == "uuid":
        return ",".join(selection.uuids)
    return json.dumps({
        "vendor": selection.vendor,
        "indices": selection.indices,
        "devices": [d.to_dict() for d in selection.devices],
        "env": selection.env,
        "explanation": list(selection.explanation),
    }, indent=2)
