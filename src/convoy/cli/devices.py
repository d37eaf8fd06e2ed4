"""``convoy devices``: this machine's accelerators (or an inventory file's), as a table or JSON.

    convoy devices                    # index, name, memory, utilisation, processes, NVLink/xGMI island, state, and the
                                      # planner's board row each name matched
    convoy devices --json > box.json  # the inventory format; replay with CONVOY_INVENTORY=box.json

Calls ``convoy.devices.discovery.discover``; never imports torch and never starts a CUDA context.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Sequence

DESCRIPTION = "List this machine's accelerators (or an inventory file's): memory, load, links, and who uses them."
EPILOG = """examples:
  convoy devices
  convoy devices --json > box.json && CONVOY_INVENTORY=box.json convoy select 2 --free"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the inventory file format instead of a table")
    parser.add_argument("--inventory", metavar="FILE",
                        help="read devices from an inventory file instead of the hardware (= CONVOY_INVENTORY)")


def run(args: argparse.Namespace) -> int:
    from convoy.cli.select import command_env
    from convoy.devices.discovery import discover

    env = command_env(args)
    inventory = discover(env)
    if args.json:
        print(inventory.to_json(), end="")
        return 0
    print(render_table(inventory, env))
    return 0


def islands(devices: Sequence) -> dict[int, str]:
    """Device index -> NVLink/xGMI island label (``A``, ``B``, ...); ``-`` for a device with no link."""
    peers = {d.index: set(d.nvlink_peers) for d in devices}
    labels: dict[int, str] = {}
    next_label = 0
    for d in devices:
        if d.index in labels:
            continue
        if not peers[d.index]:
            labels[d.index] = "-"
            continue
        stack = [d.index]
        name = chr(ord("A") + next_label % 26)
        next_label += 1
        while stack:
            i = stack.pop()
            if i in labels:
                continue
            labels[i] = name
            stack.extend(p for p in peers.get(i, ()) if p not in labels)
    return labels


def render_table(inventory, env) -> str:
    from convoy.devices.lease import lease_holders
    from convoy.devices.vendors import vendor_facts
    from convoy.devices.visibility import visible_devices

    if not inventory.devices:
        where = "" if inventory.source == "none" else f" ({inventory.source})"
        return f"no accelerators found{where}; jobs run on the CPU"
    vendor = inventory.vendor
    view = visible_devices(inventory, env, vendor)
    prefix = vendor_facts(vendor).device_type
    rank_of = {d.uuid: r for r, d in enumerate(view.devices)}
    held = lease_holders([u for u in view.devices])
    link = islands([d for d in inventory.devices if d.vendor == vendor])
    rows: list[tuple[str, ...]] = [("IDX", "NAME", "MEMORY USED/TOTAL", "UTIL", "PROCS", "LINK", "STATE", "AS")]
    for device in inventory.devices:
        units = [u for u in view.devices if u.mig_parent_uuid == device.uuid] or [device]
        rows.append(_row(device, link.get(device.index, "-") if device.vendor == vendor else "-",
                         held, rank_of, prefix, vendor))
        for unit in units:
            if unit.is_mig_slice:
                rows.append(_row(unit, "", held, rank_of, prefix, vendor, mig=True))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    footer = [f"source: {inventory.source}"] + planner_rows(inventory.devices)
    footer += [f"{name}={value!r} is set: AS shows the {prefix} index each device gets under it"
               for name, value in view.masks]
    footer += list(view.notes)
    return "\n".join(lines + footer)


def planner_rows(devices: Sequence) -> list[str]:
    """One line per board name: the planner's table row it matched (``convoy.plan.hardware``), what that row assumes
    of the board, or that no row matched (then ``convoy plan`` on this machine needs --peak-tflops; the memory is
    the inventory's)."""
    from convoy.errors import PlanError
    from convoy.plan.hardware import lookup_gpu

    lines = []
    for name in dict.fromkeys(d.name for d in devices):
        try:
            lines.append(f"planner: {name} is the {lookup_gpu(name).describe()} row")
        except PlanError:
            lines.append(f"planner: {name} has no row in the board table; convoy plan here needs --peak-tflops for "
                         "it (with --hardware, --gpu-memory-gib too)")
    return lines


def _row(device, link: str, held, rank_of, prefix: str, vendor: str, *, mig: bool = False) -> tuple[str, ...]:
    util = "?" if device.utilization_pct is None else f"{device.utilization_pct:g}%"
    procs = str(len(device.processes)) if device.processes else "-"
    if device.uuid in held:
        state = "leased"
    elif device.mig_devices:
        state = "mig"
    else:
        state = "busy" if device.busy_reason else "free"
    if device.vendor != vendor:
        as_ = "-"
    elif device.mig_devices:
        as_ = ""
    else:
        as_ = f"{prefix}:{rank_of[device.uuid]}" if device.uuid in rank_of else "hidden"
    name = f"  MIG {device.name.rsplit('MIG', 1)[-1].strip()} {device.uuid}" if mig else device.name
    index = "" if mig else str(device.index)
    memory = f"{device.memory_used_mib}/{device.memory_total_mib} MiB"
    return (index, name, memory, util, procs, link, state, as_)
