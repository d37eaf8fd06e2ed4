"""Choose devices for a request: filters, order, topology, MIG, and an explanation of every decision.

    convoy select 2 --free --order topology --format env
    convoy select 2,0                      # physical 2 becomes cuda:0, physical 0 cuda:1

    from convoy.devices.selection import select_devices
    sel = select_devices(4, free=True, min_free_memory="20GiB", order="topology")
    sel.indices, sel.env, print("\\n".join(sel.explanation))

Requests are relative to what the environment leaves visible (a pre-set ``CUDA_VISIBLE_DEVICES``, see
``visibility.py``). A *count* (``2``, ``"all"``, ``"auto"``) is filled from the devices that pass the
filters, in ``order``; an *index list* names exact devices, keeps the user's order, and fails if a named
device does not pass. ``"auto"`` takes every visible device that passes; with no accelerator at all it is
an empty, CPU-only selection.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from convoy.devices.inventory import Device, Inventory, as_inventory
from convoy.devices.spec import describe_available, is_count, parse_devices
from convoy.devices.vendors import vendor_facts
from convoy.devices.visibility import HIDE_ALL, visibility_env, visible_devices
from convoy.errors import DeviceSpecError, SelectionError, shown

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from convoy.devices.amounts import MemoryAmount

__all__ = ["Selection", "select_devices", "ORDERS"]

#: the explanation's lines for a CPU run (``convoy launch`` says it once in a line of its own instead)
NO_INVENTORY_NOTE = "inventory: no accelerators found"
NO_ACCELERATOR_NOTE = "no accelerator is visible: the job runs on the CPU"
EMPTY_SELECTION_NOTE = "empty selection: every accelerator is hidden (CPU run)"
CPU_RUN_NOTES = (NO_INVENTORY_NOTE, NO_ACCELERATOR_NOTE, EMPTY_SELECTION_NOTE)

ORDERS = ("index", "free-memory", "fastest", "topology")


@dataclass(frozen=True)
class Selection:
    """The chosen devices, the environment that makes them visible, and why."""

    devices: tuple[Device, ...]
    """Physical devices in the order they become ``cuda:0``, ``cuda:1``, ..."""
    vendor: str
    """``"nvidia"``, ``"amd"``, ``"intel"``, ``"habana"``, ``"ascend"``, ``"apple"``; ``"cpu"`` when empty."""
    env: dict[str, str] = field(default_factory=dict, hash=False)
    """Visibility variables for child processes; an empty selection hides every accelerator."""
    explanation: tuple[str, ...] = ()
    """One line per decision: what was chosen, and why each other device was not."""

    @property
    def indices(self) -> list[int]:
        """Physical (``nvidia-smi``) indices of the chosen devices, in order."""
        return [d.index for d in self.devices]

    @property
    def uuids(self) -> list[str]:
        return [d.uuid for d in self.devices]


def select_devices(
    spec: Any = "auto",
    *,
    inventory: Inventory | None = None,
    env: Mapping[str, str] | None = None,
    free: bool = False,
    min_free_memory: str | int | float | MemoryAmount | None = None,
    max_utilization: str | int | float | None = None,
    exclude: int | str | Iterable[int | str] = (),
    order: str | None = None,
    held: Mapping[str, str] | None = None,
) -> Selection:
    """Resolve a device request against an inventory (default: this machine's) and an environment.

    Args:
        spec: ``parse_devices`` grammar, or ``"auto"``: every visible device that passes the filters.
        free: skip busy devices (any process on them, or compute mode prohibited/exclusive and taken).
        min_free_memory: ``"20GiB"``, ``"80%"`` (of each device's total) or MiB.
        max_utilization: ``"10%"`` or 10; devices whose utilisation is unknown pass.
        exclude: visible indices (as the request counts them) or UUIDs (prefixes allowed) never to take: one
            index, a comma-separated string (``"0,3"``) or an iterable of indices and UUIDs.
        inventory: an ``Inventory``, or the path of an inventory file; default: this machine's.
        order: ``"index"`` (default), ``"free-memory"``, ``"fastest"``, ``"topology"`` (a count from the best
            connected island of fast links: NVLink/NVSwitch on NVIDIA, xGMI on AMD). Explicit index lists keep
            the user's order unless ``order`` is given.
        held: UUID -> who holds it (leases of other jobs, see ``lease.py``): such devices are not taken.

    Raises:
        DeviceSpecError: malformed request or filter, or indices that do not exist (exit 2 in the CLI).
        SelectionError: too few devices pass the filters; the message names each rejected device and why.
    """
    env = _checked_env(os.environ if env is None else env)
    _check_free(free)
    inventory = _inventory_of(inventory, env)
    _check_order(order)
    need_mem, max_util = _thresholds(min_free_memory, max_utilization)
    view = visible_devices(inventory, env, inventory.vendor)
    units = list(view.devices)
    lines = _opening_lines(inventory, view, units)
    indices = _request_indices(spec, units, view, inventory)
    reasons = _rejections(units, exclude, free=free, need_mem=need_mem, max_util=max_util, held=held or {})
    prefix = vendor_facts(inventory.vendor).device_type  # explanations say "GPU 2 -> cuda:0"
    if is_count(spec) or _is_auto(spec):
        chosen, request = _fill_count(spec, indices, units, reasons, view, order, lines)
    else:
        chosen, request = _take_named(spec, indices, units, reasons, view, order, lines, prefix)
    devices = [units[p] for p in chosen]
    _check_mig(devices, spec)
    lines += _decision_lines(chosen, units, reasons, request, prefix, view)
    return _selection(devices, units, lines, inventory, env)


def _checked_env(env: Any) -> Mapping[str, str]:
    """``env`` itself, once it is known to be a mapping of strings to strings (``DeviceSpecError`` otherwise)."""
    from collections.abc import Mapping as _Mapping

    if not isinstance(env, _Mapping):
        raise DeviceSpecError(f"env={type(env).__name__}: give a mapping of environment variables (os.environ)")
    for key, value in env.items():  # os.environ holds only strings; a dict with an int crashed the mask parser
        if not isinstance(key, str) or not isinstance(value, str):
            bad, what = (value, "value") if isinstance(key, str) else (key, "name")
            raise DeviceSpecError(f"env[{key!r:.40}]={value!r:.40}: the {what} is a {type(bad).__name__}; "
                                  f"environment variable names and values are strings (os.environ)")
    return env


def _check_free(free: Any) -> None:
    """Refuse a ``free`` that is not a bool (``free='no'`` is truthy and silently skipped every busy device)."""
    if not isinstance(free, bool):
        raise DeviceSpecError(f"free={free!r:.40} is a {type(free).__name__}; give True or False")


def _inventory_of(inventory: Any, env: Mapping[str, str]) -> Inventory:
    """The given inventory (or inventory file's), else this machine's, discovered under ``env``."""
    found = as_inventory(inventory)
    if found is None:
        from convoy.devices.discovery import discover

        found = discover(env)
    return found


def _check_order(order: str | None) -> None:
    """Refuse an ``order`` that is not one of ``ORDERS``."""
    if order is not None and order not in ORDERS:
        raise DeviceSpecError(f"order {order!r} is not one of {', '.join(ORDERS)}")


def _thresholds(min_free_memory: Any, max_utilization: Any) -> tuple[MemoryAmount | None, float | None]:
    """The memory and utilisation filters, parsed (``None`` where not given; their parser is imported only then)."""
    if min_free_memory is None and max_utilization is None:
        return None, None
    from convoy.devices.amounts import parse_memory, parse_percent

    need_mem = None if min_free_memory is None else parse_memory(min_free_memory)
    max_util = None if max_utilization is None else parse_percent(max_utilization)
    return need_mem, max_util


def _opening_lines(inventory: Inventory, view, units: Sequence[Device]) -> list[str]:
    """The explanation's first lines: the inventory, the visibility masks already set, and the view's notes."""
    lines = [_inventory_line(inventory, inventory.vendor)]
    lines += [f"{name}={value!r} was already set: requests count within the {len(units)} device(s) it "
              f"leaves visible" for name, value in view.masks]
    lines += list(view.notes)
    return lines


def _is_auto(spec: Any) -> bool:
    """Whether ``spec`` is ``"auto"`` (any case, spaces around)."""
    return isinstance(spec, str) and spec.strip().lower() == "auto"


def _request_indices(spec: Any, units: Sequence[Device], view, inventory: Inventory) -> list[int]:
    """``spec`` parsed against the visible devices; an error says what a pre-set mask leaves visible."""
    try:
        return parse_devices(spec, len(units))
    except DeviceSpecError as err:
        raise DeviceSpecError(f"{err}{_mask_hint(view, inventory)}") from None


def _rejections(units: Sequence[Device], exclude: Any, *, free: bool, need_mem: MemoryAmount | None,
                max_util: float | None, held: Mapping[str, str]) -> dict[int, str]:
    """Visible position -> why that device cannot be taken, for each device a filter rejects."""
    excluded = _excluded(exclude, units)
    reasons: dict[int, str] = {}
    for position, device in enumerate(units):
        reason = _rejection(device, position, free=free, need_mem=need_mem, max_util=max_util,
                            excluded=excluded, held=held)
        if reason:
            reasons[position] = reason
    return reasons


def _fill_count(spec: Any, indices: list[int], units: Sequence[Device], reasons: Mapping[int, str], view,
                order: str | None, lines: list[str]) -> tuple[list[int], str]:
    """A count (or ``"all"``/``"auto"``) filled from the passing devices in ``order``: (positions, the request
    as the explanation names it); its notes go to ``lines``."""
    wants_all = _is_auto(spec) or _means_all(spec)
    eligible = [p for p in range(len(units)) if p not in reasons]
    count = len(eligible) if wants_all else len(indices)
    if count == 0 and not units:
        lines.append(NO_ACCELERATOR_NOTE)
    if len(eligible) < count or (wants_all and units and not eligible):
        raise SelectionError(_shortage(spec, count, units, reasons, view))
    chosen, why = _pick(eligible, count, units, order or "index")
    if why:
        lines.append(why)
    return chosen, f"request {spec!r}" + (f", {count} of {len(units)}" if not wants_all else "")


def _take_named(spec: Any, indices: list[int], units: Sequence[Device], reasons: Mapping[int, str], view,
                order: str | None, lines: list[str], prefix: str) -> tuple[list[int], str]:
    """An index list's devices, each of which must pass, in the user's order unless ``order`` is given:
    (positions, the request as the explanation names it); its notes go to ``lines``."""
    bad = [(p, reasons[p]) for p in indices if p in reasons]
    if bad:
        position, reason = bad[0]
        raise SelectionError(f"devices={spec!r}: {_name(units[position], position, prefix, view)} "
                             f"cannot be used: {reason}")
    chosen = list(indices)
    if order is not None:
        chosen, why = _pick(chosen, len(chosen), units, order)
        lines.append(why or f"ordered by {order}")
    return chosen, f"request {spec!r}, order kept" if order is None else f"request {spec!r}"


def _decision_lines(chosen: list[int], units: Sequence[Device], reasons: Mapping[int, str], request: str,
                    prefix: str, view) -> list[str]:
    """One line per visible device: which rank each chosen one becomes, and why each other one was left."""
    lines = [f"took {_name(units[position], position, prefix, view)} -> {prefix}:{rank} ({request})"
             for rank, position in enumerate(chosen)]
    lines += [f"left {_name(device, position, prefix, view)}: {reasons.get(position, 'not needed')}"
              for position, device in enumerate(units) if position not in chosen]
    return lines


def _selection(devices: list[Device], units: Sequence[Device], lines: list[str], inventory: Inventory,
               env: Mapping[str, str]) -> Selection:
    """The ``Selection``: the chosen devices made visible, or an empty one that hides every accelerator."""
    if not devices:
        if units:  # (none to hide: the explanation already said so)
            lines.append(EMPTY_SELECTION_NOTE)
        return Selection((), "cpu", dict(HIDE_ALL), tuple(lines))
    child_env = visibility_env(devices, vendor=inventory.vendor, base_env=env, inventory=inventory)
    return Selection(tuple(devices), inventory.vendor, child_env, tuple(lines))


def _means_all(spec: Any) -> bool:
    if isinstance(spec, str):
        return spec.strip().lower() in ("all", "auto", "-1")
    return not isinstance(spec, bool) and spec == -1


def _inventory_line(inventory: Inventory, vendor: str) -> str:
    n = sum(1 for d in inventory.devices if d.vendor == vendor)
    if not inventory.devices:
        return NO_INVENTORY_NOTE if inventory.source == "none" else f"inventory: no accelerators ({inventory.source})"
    others = len(inventory.devices) - n
    tail = f"; {others} device(s) of other vendors ignored" if others else ""
    return f"inventory: {n} {vendor} device(s) from {inventory.source}{tail}"


def _mask_hint(view, inventory: Inventory) -> str:
    if not view.masks:
        return ""
    shown = ", ".join(f"{n}={v!r}" for n, v in view.masks)
    total = sum(1 for d in inventory.devices if d.vendor == view.vendor)
    return f" ({shown} leaves {len(view.devices)} of the machine's {total} visible)"


def _name(device: Device, position: int, prefix: str, view) -> str:
    if view.masks and position != device.index:
        return f"{device.label} [visible #{position}]"
    return device.label


def _exclude_items(exclude: Any) -> list[Any]:
    if isinstance(exclude, bool):
        raise DeviceSpecError(f"exclude={exclude!r}: a bool is not a device; give indices or UUIDs")
    if isinstance(exclude, int):
        return [exclude]
    if isinstance(exclude, str):
        return [t for t in (part.strip() for part in exclude.split(",")) if t]
    try:
        return list(exclude)
    except TypeError:
        raise DeviceSpecError(f"exclude={type(exclude).__name__}: give device indices or UUIDs, e.g. [0, 3] or "
                              f"'0,3'") from None


def _excluded(exclude: Any, units: Sequence[Device]) -> set[int]:
    out: set[int] = set()
    for item in _exclude_items(exclude):
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise DeviceSpecError(f"exclude: {type(item).__name__} {shown(str(item))} is not a device; give "
                                  f"indices or UUIDs")
        text = str(item).strip() if isinstance(item, str) else None
        if isinstance(item, int) or _INDEX.fullmatch(text or ""):
            position = item if isinstance(item, int) else int(text)  # type: ignore[arg-type]
            if not 0 <= position < len(units):
                raise DeviceSpecError(f"exclude: index {_short_int(position)} is out of range; "
                                      f"{describe_available(len(units))}")
            out.add(position)
            continue
        assert text is not None  # item is a str here: an int was taken above
        hits = [p for p, d in enumerate(units) if text and (d.uuid.startswith(text) or d.mig_parent_uuid == text)]
        if not hits:
            raise DeviceSpecError(f"exclude: {shown(text)} matches no visible device's index or UUID; "
                                  f"{describe_available(len(units))}")
        out.update(hits)
    return out


_INDEX = re.compile(r"-?[0-9]{1,12}")


def _short_int(n: int) -> str:
    return str(n) if n.bit_length() < 40 else "<a very large number>"


def _rejection(device: Device, position: int, *, free: bool, need_mem: MemoryAmount | None,
               max_util: float | None, excluded: set[int], held: Mapping[str, str]) -> str | None:
    if position in excluded:
        return "excluded by request"
    if device.uuid in held:
        return f"leased by {held[device.uuid]}"
    if free and device.busy_reason:
        return f"busy: {device.busy_reason}"
    if need_mem is not None:
        need = need_mem.mib_of(device.memory_total_mib)
        if device.memory_free_mib < need:
            return f"only {device.memory_free_mib} MiB free, needs {need} MiB ({need_mem})"
    if max_util is not None and device.utilization_pct is not None and device.utilization_pct > max_util:
        return f"utilisation {device.utilization_pct:g}% is above {max_util:g}%"
    return None


def _shortage(spec: Any, count: int, units: Sequence[Device], reasons: Mapping[int, str], view) -> str:
    passing = len(units) - len(reasons)
    if not units:
        return f"devices={spec!r}: no accelerator is visible"
    why = "; ".join(f"GPU {units[p].index}: {r}" if units[p].vendor in ("nvidia", "amd")
                    else f"{units[p].label}: {r}" for p, r in sorted(reasons.items()))
    want = "at least one device" if count == 0 else f"{count} device(s)"
    return (f"devices={spec!r}: needs {want} but only {passing} of {len(units)} visible pass the filters "
            f"({why})")


def _pick(eligible: list[int], count: int, units: Sequence[Device], order: str) -> tuple[list[int], str]:
    if order == "index":
        return sorted(eligible)[:count], ""
    if order == "free-memory":
        ranked = sorted(eligible, key=lambda p: (-units[p].memory_free_mib, p))
        return ranked[:count], "ordered by free memory, most first"
    if order == "fastest":
        from convoy.devices.visibility import fastest_order

        ranked_devices = fastest_order([units[p] for p in eligible])
        ranked = [eligible[[units[p] for p in eligible].index(d)] for d in ranked_devices]
        return ranked[:count], "ordered fastest first (SMs x cores/SM x clock)"
    return _topology_pick(eligible, count, units)


def _topology_pick(eligible: list[int], count: int, units: Sequence[Device]) -> tuple[list[int], str]:
    """The best-connected ``count`` devices: inside one NVLink (xGMI on AMD) island when one has room (the
    smallest island that fits, so larger islands stay whole for bigger jobs), else filling the largest islands."""
    by_index = {units[p].index: p for p in eligible}
    links = {p: {by_index[i] for i in units[p].nvlink_peers if i in by_index} for p in eligible}
    kind = (vendor_facts(units[eligible[0]].vendor).link if eligible else None) or "fast-link"
    if count > 1 and not any(links.values()):
        return sorted(eligible)[:count], (f"topology: no {kind} links between the eligible devices were found "
                                          f"(none discovered, or none to a device that passes); took index order")
    islands: list[list[int]] = []
    seen: set[int] = set()
    for start in sorted(eligible):
        if start in seen:
            continue
        stack, island = [start], []
        seen.add(start)
        while stack:
            p = stack.pop()
            island.append(p)
            for q in links[p] - seen:
                seen.add(q)
                stack.append(q)
        islands.append(sorted(island))
    fitting = [isl for isl in islands if len(isl) >= count]
    if fitting:
        island = min(fitting, key=lambda isl: (len(isl), isl[0]))
        chosen = _densest(island, count, links)
        names = ",".join(str(units[p].index) for p in island)
        return chosen, f"topology: {count} device(s) inside one {kind} island (GPUs {names})"
    chosen = []
    for island in sorted(islands, key=lambda isl: (-len(isl), isl[0])):
        chosen.extend(_densest(island, min(count - len(chosen), len(island)), links))
        if len(chosen) == count:
            break
    return chosen, f"topology: no {kind} island has {count} eligible devices; took the largest islands"


def _densest(island: list[int], count: int, links: Mapping[int, set[int]]) -> list[int]:
    chosen: list[int] = []
    rest = list(island)
    while len(chosen) < count:
        best = max(rest, key=lambda p: (len(links[p] & set(chosen)), len(links[p]), -p))
        chosen.append(best)
        rest.remove(best)
    return sorted(chosen)


def _check_mig(devices: Sequence[Device], spec: Any) -> None:
    slices = [d for d in devices if d.is_mig_slice]
    if slices and len(devices) > 1:
        raise SelectionError(
            f"devices={spec!r} would give one process {len(devices)} devices including MIG slice "
            f"{slices[0].uuid}, but CUDA lets a process use a single MIG slice; ask for 1 device per process "
            f"(devices=1, or a one-index list such as '0,'; devices='0' means no accelerator), or run one "
            f"process per slice"
        )
