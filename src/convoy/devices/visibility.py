"""Which devices a process can see, per vendor: the one module that knows the visibility variables.

    eval $(convoy select 2,0 --format env)   # CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0

    from convoy.devices.visibility import visibility_env, visible_devices
    view = visible_devices(inventory, env=os.environ)       # what requests are relative to
    child_env = {**os.environ, **visibility_env(chosen, vendor="nvidia", base_env=os.environ)}

Variables (design.md): NVIDIA ``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so numbers
match ``nvidia-smi`` (MIG slices by ``MIG-`` UUID); AMD ``ROCR_VISIBLE_DEVICES`` (outer) then
``HIP_VISIBLE_DEVICES`` (HIP also reads ``CUDA_VISIBLE_DEVICES``); Intel ``ZE_AFFINITY_MASK`` with
``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1``; Habana ``HABANA_VISIBLE_MODULES`` (module ids); Ascend
``ASCEND_RT_VISIBLE_DEVICES``. Apple has one device and no variable.

A mask already in the environment (set by the user or Slurm) is honoured the way the runtime would read it:
requests are relative to it, and a result never escapes it. Entries are indices or UUIDs (prefixes too,
as CUDA allows); like CUDA, enumeration stops at the first entry that matches nothing. Integer entries of
a pre-set ``CUDA_VISIBLE_DEVICES`` follow ``CUDA_DEVICE_ORDER``; CUDA's default is FASTEST_FIRST, which
on mixed boxes differs from ``nvidia-smi`` order (see ``fastest_order``). A ``CUDA_DEVICE_ORDER`` that is
neither FASTEST_FIRST nor PCI_BUS_ID (a typo such as ``pci_bus_id``) is refused when such indices depend on
it, since which devices they name would be a guess, and noted otherwise.

What the runtimes refuse or misread, convoy refuses with one line (``DeviceSpecError``) instead of guessing:
an entry with non-ASCII characters (``²``, ``٣``: Python's ``int()`` reads them, CUDA does not), an entry
that starts like a number but is not one (``--1``, ``1.5``), and a device named twice (``0,0,1``: CUDA
then shows no device at all). ``-1`` and unknown UUIDs end the list, as the runtimes do.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace

from convoy.devices.inventory import Device, Inventory
from convoy.errors import DeviceSpecError, VisibilityError

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "VisibleView",
    "visible_devices",
    "visibility_env",
    "fastest_order",
    "ensure_runtime_not_started",
    "MASK_VARIABLES",
    "HIDE_ALL",
]

# The variables that restrict what each vendor's runtime sees, outermost first.
MASK_VARIABLES: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "intel": ("ZE_AFFINITY_MASK",),
    "habana": ("HABANA_VISIBLE_MODULES",),
    "ascend": ("ASCEND_RT_VISIBLE_DEVICES",),
    "apple": (),
}

# CUDA_DEVICE_ORDER's values (CUDA Programming Guide, "CUDA Environment Variables"; FASTEST_FIRST is the default,
# and unset or empty is read as it). What CUDA does with another value is not documented: convoy refuses to
# guess it where it decides which devices a mask's indices name, and notes it where it does not.
CUDA_ORDERS = ("FASTEST_FIRST", "PCI_BUS_ID")

# What an empty selection exports: a CPU-only run that sees no accelerator.
HIDE_ALL: dict[str, str] = {"CUDA_VISIBLE_DEVICES": ""}

# FP32 cores per SM by compute capability, from the CUDA C++ Programming Guide, "Arithmetic Instructions"
# throughput table (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#arithmetic-instructions).
_CORES_PER_SM = {
    "3": 192, "5": 128, "6.0": 64, "6": 128, "7": 64, "8.0": 64, "8": 128, "9": 128, "10": 128, "12": 128,
}


@dataclass(frozen=True)
class VisibleView:
    """The devices a process would see, in the order it would number them (``cuda:0``, ``cuda:1``...)."""

    devices: tuple[Device, ...]
    vendor: str
    masks: tuple[tuple[str, str], ...] = ()
    """The pre-set mask variables that shaped this view, as (name, value)."""
    notes: tuple[str, ...] = ()
    """What a user should know about how the view was derived."""


def _cores_per_sm(cc: str | None) -> int | None:
    if not cc:
        return None
    major = cc.split(".")[0]
    return _CORES_PER_SM.get(cc) or _CORES_PER_SM.get(major)


def fastest_order(devices: Sequence[Device]) -> list[Device]:
    """Devices in CUDA's FASTEST_FIRST order: by SMs x cores/SM x clock, then compute capability, memory,
    and PCI order for ties (the CUDA runtime's own heuristic is undocumented; this is its published
    description: "fastest to slowest", equal devices in PCI order)."""

    def key(d: Device) -> tuple:
        cores = _cores_per_sm(d.compute_capability)
        score = (d.multiprocessor_count or 0) * (cores or 0) * (d.max_sm_clock_mhz or 0)
        cc = tuple(int(p) for p in (d.compute_capability or "0").split(".") if p.isdigit())
        return (-score, tuple(-x for x in cc), -d.memory_total_mib, d.index)

    return sorted(devices, key=key)


def _mig_units(gpu: Device) -> list[Device]:
    """A GPU in MIG mode is seen by CUDA as its slices; each slice becomes a Device of its own."""
    if not gpu.mig_devices:
        return [gpu]
    return [
        replace(
            gpu,
            uuid=m.uuid,
            name=f"{gpu.name} MIG {m.profile}".strip(),
            memory_total_mib=m.memory_total_mib,
            memory_used_mib=m.memory_used_mib,
            processes=m.processes,
            mig_devices=(),
            mig_parent_uuid=gpu.uuid,
            nvlink_peers=(),
        )
        for m in gpu.mig_devices
    ]


_INDEX = re.compile(r"-?[0-9]{1,12}")
_NUMBERISH = re.compile(r"[-+.0-9]")


def _mask_tokens(name: str, value: str, *, tiles: bool = False) -> list[str]:
    """The entries of a mask variable, each checked to be something the runtime reads the way convoy does.
    ``tiles``: entries may be ``N.M`` (Intel's ``ZE_AFFINITY_MASK``)."""
    tokens = [t.strip() for t in value.split(",")] if value.strip() else []
    number = r"-?[0-9]+(\.[0-9]+)?" if tiles else r"-?[0-9]+"
    for raw, token in zip(value.split(","), tokens):
        bad = ""
        if not raw.isascii():  # before strip(): it removes non-ASCII spaces too, which the runtime does not
            bad = "has non-ASCII characters (the runtime reads only ASCII digits and UUIDs)"
        elif _NUMBERISH.match(token) and not re.fullmatch(number, token):
            bad = "is not a whole number (write indices like 0,1 or UUIDs like GPU-...)"
        if bad:
            raise DeviceSpecError(f"{name}={_short(value)}: entry {_short(token)} {bad}; fix or unset {name}")
    return tokens


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _duplicate(name: str, value: str, device: Device) -> DeviceSpecError:
    return DeviceSpecError(f"{name}={_short(value)} names {device.label} twice; the runtime refuses such a mask "
                           f"(it then shows no device), so list each device once")


def _match(token: str, candidates: Sequence[Device], *, by_module: bool = False) -> Device | None:
    if re.fullmatch(r"-?[0-9]+", token):
        if not _INDEX.fullmatch(token):
            return None  # more digits than any machine has devices: matches nothing
        position = int(token)
        if by_module:
            return next((d for d in candidates if _module_id(d) == position), None)
        return candidates[position] if 0 <= position < len(candidates) else None
    hits = [d for d in candidates if d.uuid == token] or [d for d in candidates if d.uuid.startswith(token)]
    return hits[0] if len(hits) == 1 else None


def _module_id(device: Device) -> int:
    value = device.extra.get("module_id", device.index)
    return value if isinstance(value, int) else device.index


def visible_devices(inventory: Inventory, env: Mapping[str, str], vendor: str | None = None) -> VisibleView:
    """The devices of ``vendor`` (default: the inventory's main vendor) that ``env``'s masks leave visible,
    in the order the runtime numbers them."""
    vendor = vendor or inventory.vendor
    physical = [d for d in inventory.devices if d.vendor == vendor]
    notes: list[str] = []
    masks: list[tuple[str, str]] = []
    if vendor == "nvidia":
        return _nvidia_view(physical, env, notes)
    current = physical
    variables = list(MASK_VARIABLES.get(vendor, ()))
    if vendor == "amd" and "HIP_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" in env:
        variables.append("CUDA_VISIBLE_DEVICES")  # HIP reads it when HIP_VISIBLE_DEVICES is unset
    for name in variables:
        if name not in env:
            continue
        value = env[name]
        masks.append((name, value))
        tokens = _mask_tokens(name, value, tiles=(vendor == "intel"))
        if vendor == "intel" and any("." in t for t in tokens):
            notes.append(f"{name}={value!r} names tiles (N.M); convoy treats each as its whole device")
            tokens = list(dict.fromkeys(t.split(".")[0] for t in tokens))
        current = _apply_tokens(name, value, tokens, current, notes, by_module=(vendor == "habana"))
    return VisibleView(tuple(current), vendor, tuple(masks), tuple(notes))


def _apply_tokens(name: str, value: str, tokens: list[str], candidates: Sequence[Device], notes: list[str],
                  *, by_module: bool = False) -> list[Device]:
    chosen: list[Device] = []
    for token in tokens:
        device = _match(token, candidates, by_module=by_module)
        if device is None:
            notes.append(f"{name}={value!r}: entry {token!r} matches no device, so (as the runtime does) "
                         f"it and the entries after it are ignored")
            break
        if device in chosen:
            raise _duplicate(name, value, device)
        chosen.append(device)
    return chosen


def _nvidia_view(gpus: list[Device], env: Mapping[str, str], notes: list[str]) -> VisibleView:
    name = "CUDA_VISIBLE_DEVICES"
    order = env.get("CUDA_DEVICE_ORDER", "")
    unknown_order = order not in ("", *CUDA_ORDERS)
    if name not in env:
        if unknown_order:
            notes.append(_unknown_order(order) + "; it does not matter here: no mask is set, and the variables "
                         "convoy exports set CUDA_DEVICE_ORDER=PCI_BUS_ID")
        units = [u for gpu in gpus for u in _mig_units(gpu)]
        return VisibleView(tuple(units), "nvidia", (), tuple(notes))
    value = env[name]
    tokens = _mask_tokens(name, value)
    if unknown_order and any(re.fullmatch(r"[0-9]+", t) for t in tokens):
        raise DeviceSpecError(f"{_unknown_order(order)}, so the indices of {name}={_short(value)} have no known "
                              "order (CUDA documents FASTEST_FIRST as its default, not what it does with other "
                              "values); set CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's numbering) or FASTEST_FIRST")
    if unknown_order:
        notes.append(_unknown_order(order) + f"; it does not matter here: {name} names devices by UUID")
    pci_order = order == "PCI_BUS_ID"
    numbered = gpus if pci_order else fastest_order(gpus)
    if not pci_order and any(t.isdigit() for t in tokens) and [d.index for d in numbered] != [d.index for d in gpus]:
        order = ", ".join(f"{i}->GPU {d.index}" for i, d in enumerate(numbered))
        notes.append(f"{name}={value!r} uses indices without CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA reads them "
                     f"in FASTEST_FIRST order ({order}), not nvidia-smi order")
    all_slices = {u.uuid: u for gpu in gpus for u in _mig_units(gpu) if u.is_mig_slice}
    units = []
    for token in tokens:
        if token.startswith("MIG-"):
            hits = [u for uuid, u in all_slices.items() if uuid == token or uuid.startswith(token)]
            found = hits if len(hits) == 1 else []
        else:
            gpu = _match(token, numbered)
            found = _mig_units(gpu) if gpu is not None else []
        if not found:
            notes.append(f"{name}={value!r}: entry {token!r} matches no device, so (as CUDA does) it and the "
                         f"entries after it are ignored")
            break
        if any(u in units for u in found):
            raise _duplicate(name, value, found[0])
        units.extend(found)
    return VisibleView(tuple(units), "nvidia", ((name, value),), tuple(notes))


def _unknown_order(order: str) -> str:
    return f"CUDA_DEVICE_ORDER={_short(order)} is not one of CUDA's values ({', '.join(CUDA_ORDERS)})"


def visibility_env(
    devices: Sequence[Device],
    *,
    vendor: str,
    base_env: Mapping[str, str],
    inventory: Inventory | None = None,
) -> dict[str, str]:
    """The variables that make exactly ``devices`` visible, in this order, to a child of ``base_env``.

    An empty ``devices`` hides every accelerator (a CPU run). When ``base_env`` already masks devices, the
    result is relative to that mask, and :class:`VisibilityError` is raised for a device outside it
    (``inventory`` resolves the mask; by default the one ``discover(base_env)`` finds).
    """
    devices = list(devices)
    if not devices or vendor == "cpu":
        return dict(HIDE_ALL)
    if vendor == "apple":
        if len(devices) > 1:
            raise VisibilityError("Apple silicon has one GPU (mps); a process cannot be given more than one")
        return {}
    masked = [n for n in MASK_VARIABLES.get(vendor, ()) if n in base_env]
    if vendor == "amd" and "CUDA_VISIBLE_DEVICES" in base_env:
        masked.append("CUDA_VISIBLE_DEVICES")
    view: VisibleView | None = None
    if masked:
        if inventory is None:
            from convoy.devices.discovery import discover

            inventory = discover(base_env)
        view = visible_devices(inventory, base_env, vendor)
        outside = [d for d in devices if d not in view.devices]
        if outside:
            shown = ", ".join(f"{n}={base_env[n]!r}" for n in masked)
            raise VisibilityError(f"{outside[0].label} is outside the devices this environment allows ({shown}); "
                                  f"pick from the {len(view.devices)} visible ones")
    if vendor == "nvidia":
        if any(d.is_mig_slice for d in devices):
            return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices)}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(d.index) for d in devices)}
    if vendor == "amd":
        return _amd_env(devices, base_env, inventory)
    if vendor == "intel":
        return {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_AFFINITY_MASK": ",".join(str(d.index) for d in devices)}
    if vendor == "habana":
        return {"HABANA_VISIBLE_MODULES": ",".join(str(_module_id(d)) for d in devices)}
    if vendor == "ascend":
        return {"ASCEND_RT_VISIBLE_DEVICES": ",".join(str(d.index) for d in devices)}
    raise VisibilityError(f"convoy does not know the visibility variables of vendor {vendor!r}; "
                          f"known: {', '.join(MASK_VARIABLES)}")


def _amd_env(devices: list[Device], base_env: Mapping[str, str], inventory: Inventory | None) -> dict[str, str]:
    # ROCR_VISIBLE_DEVICES is applied first by the ROCm runtime; HIP_VISIBLE_DEVICES indexes what it leaves.
    if "ROCR_VISIBLE_DEVICES" in base_env and inventory is not None:
        outer = visible_devices(inventory, {"ROCR_VISIBLE_DEVICES": base_env["ROCR_VISIBLE_DEVICES"]}, "amd")
        value = ",".join(str(outer.devices.index(d)) for d in devices)
    else:
        value = ",".join(str(d.index) for d in devices)
    env = {"HIP_VISIBLE_DEVICES": value}
    if "CUDA_VISIBLE_DEVICES" in base_env:
        env["CUDA_VISIBLE_DEVICES"] = value  # HIP also reads it; keep the two in agreement
    return env


def ensure_runtime_not_started() -> None:
    """Raise :class:`VisibilityError` if this process already started CUDA (or XPU) through torch.

    Visibility variables are read once, when the runtime starts; changing them afterwards silently keeps the
    old devices. This never imports torch: if torch is not loaded, no runtime can have started through it.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for backend in ("cuda", "xpu"):
        module = getattr(torch, backend, None)
        is_initialized = getattr(module, "is_initialized", None)
        if callable(is_initialized) and is_initialized():
            raise VisibilityError(
                f"torch.{backend} is already initialised in this process, so changing device visibility now "
                f"would silently keep the old devices; select devices before the first torch.{backend} call, "
                f"or start a new process with 'convoy run --devices ... -- python script.py'"
            )
