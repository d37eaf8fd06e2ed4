"""Everything a bug report needs, collected in one call: versions, builds, drivers, devices, variables, settings.

    from convoy.config.report import collect_report, format_report
    report = collect_report()                 # a frozen Report; report.to_dict() is what --json prints
    print(format_report(report))

    $ convoy env            # the same, as text
    $ convoy env --json     # ... or as JSON, to attach to an issue

Each section is collected on its own: a part that fails (no NVML, no torch, a malformed settings file) is
reported as ``{"error": "..."}`` in its section, never as a crash, because a broken setup is exactly when
this report is needed. torch is imported inside ``collect_report`` only (``include_torch=False`` skips it).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["Report", "collect_report", "format_report", "VISIBILITY_VARIABLES", "visibility_origins"]

#: every vendor's device-visibility variable convoy knows (design: "Visibility").
VISIBILITY_VARIABLES = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
    "ONEAPI_DEVICE_SELECTOR", "HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
)
_DISTRIBUTED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_DISTRIBUTED_", "TORCH_NCCL_", "TORCHELASTIC_", "CONVOY_")
_DISTRIBUTED_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                      "OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "SLURM_JOB_ID", "SLURM_PROCID")
_PACKAGES = ("convoy", "torch", "numpy", "safetensors", "tqdm", "nvidia-ml-py", "accelerate", "lightning",
             "transformers", "deepspeed")


@dataclass(frozen=True)
class Report:
    """The sections of ``convoy env``, each a JSON-ready dict."""

    sections: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.sections)


def _guard(collect: Callable[[], Any]) -> Any:
    try:
        return collect()
    except Exception as err:  # noqa: BLE001 - a bug report must survive any broken part of the setup
        return {"error": f"{type(err).__name__}: {err}"}


def _system() -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "executable": sys.executable, "platform": platform.platform(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "cpus_usable": affinity,
    }


def _packages() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _torch() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "version": torch.__version__, "git_version": getattr(torch.version, "git_version", None),
        "debug": bool(torch.version.debug), "cuda_build": torch.version.cuda, "hip_build": torch.version.hip,
        "cuda_available": torch.cuda.is_available(), "cuda_device_count": torch.cuda.device_count(),
        "threads": torch.get_num_threads(),
    }
    info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    info["nccl"] = nccl
    backends = ("gloo", "nccl", "mpi", "ucc", "xccl")
    info["distributed_backends"] = [b for b in backends if dist.is_available()
                                    and getattr(dist, f"is_{b}_available", lambda: False)()]
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
    info["accelerator"] = str(current) if current is not None else "cpu"
    return info


def _driver() -> dict[str, Any]:
    import pynvml  # nvidia-ml-py; loads libnvidia-ml only on nvmlInit

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"nvidia": None, "note": f"no NVIDIA driver found (NVML: {err})"}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {"nvidia": driver.decode() if isinstance(driver, bytes) else driver,
                "cuda_driver_api": f"{cuda // 1000}.{cuda % 1000 // 10}"}
    finally:
        pynvml.nvmlShutdown()


def _devices(env: Mapping[str, str]) -> dict[str, Any]:
    from convoy.devices.discovery import discover

    inventory = discover(env=env)
    return {"source": inventory.source, **inventory.to_dict()}


def visibility_origins(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Each visibility variable in force, and (a best guess of) what set it."""
    found: dict[str, dict[str, str]] = {}
    for name in VISIBILITY_VARIABLES:
        if name in env:
            found[name] = {"value": env[name], "origin": _origin(name, env)}
    return found


def _origin(name: str, env: Mapping[str, str]) -> str:
    if name == "NVIDIA_VISIBLE_DEVICES":
        return "container runtime (NVIDIA Container Toolkit or a Kubernetes device plugin)"
    if "TORCHELASTIC_RUN_ID" in env and any(k.startswith("CONVOY_") for k in env):
        return "convoy launch (this process is one of its ranks)"
    if "SLURM_JOB_ID" in env and any(k in env for k in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")):
        return f"Slurm (job {env['SLURM_JOB_ID']} was given these GPUs; indices are relative to them)"
    if "PBS_JOBID" in env:
        return f"PBS (job {env['PBS_JOBID']})"
    if "LSB_JOBID" in env:
        return f"LSF (job {env['LSB_JOBID']})"
    if "TORCHELASTIC_RUN_ID" in env:
        return "inherited by a torchrun worker from the shell that started torchrun"
    return "set before convoy started (your shell, a job script or a scheduler)"


def _distributed_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in sorted(env) if k.startswith(_DISTRIBUTED_PREFIXES) or k in _DISTRIBUTED_NAMES}


def _settings(env: Mapping[str, str], cwd: str | None) -> dict[str, Any]:
    from convoy.config.settings import effective_settings

    settings = effective_settings(env=env, cwd=cwd)
    return {"files": [str(p) for p in settings.files],
            "values": {k: {"value": settings.get(k), "source": settings.source(k)} for k in settings}}


def collect_report(*, env: Mapping[str, str] | None = None, cwd: str | None = None,
                   include_torch: bool = True) -> Report:
    """Collect every section of the bug report; no section's failure stops the others."""
    env = dict(os.environ if env is None else env)
    sections: dict[str, Any] = {
        "convoy": _guard(lambda: {"version": importlib.import_module("convoy").__version__,
                                  "location": os.path.dirname(cast(str, importlib.import_module("convoy").__file__))}),
        "system": _guard(_system),
        "packages": _guard(_packages),
        "torch": _guard(_torch) if include_torch else {"skipped": "--no-torch"},
        "driver": _guard(_driver),
        "devices": _guard(lambda: _devices(env)),
        "visibility": visibility_origins(env),
        "distributed_variables": _distributed_variables(env),
        "settings": _guard(lambda: _settings(env, cwd)),
    }
    return Report(sections)


def format_report(report: Report) -> str:
    """The report as text: one block per section, ``key: value`` lines, a table for devices."""
    out: list[str] = []
    for title, section in report.sections.items():
        out.append(f"{title}:")
        if isinstance(section, dict) and "error" in section:
            out.append(f"  unavailable: {section['error']}")
        elif title == "devices":
            out += _device_lines(section)
        elif title == "visibility":
            out += [f"  {k}={v['value']}  ({v['origin']})" for k, v in section.items()] or ["  (none set)"]
        elif title == "settings":
            out += [f"  files: {', '.join(section['files']) or '(none)'}"]
            out += [f"  {k} = {v['value']!r}  ({v['source']})" for k, v in section["values"].items()]
        elif isinstance(section, dict):
            out += [f"  {k}: {_text(v)}" for k, v in section.items()] or ["  (none)"]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _device_lines(section: dict[str, Any]) -> list[str]:
    devices = section.get("devices", [])
    lines = [f"  source: {section.get('source', '-')}"]
    if not devices:
        return lines + ["  (no accelerators; training runs on the CPU)"]
    lines.append(f"  {'idx':>3}  {'name':<28} {'vendor':<7} {'memory MiB (used/total)':>24} {'util':>5}")
    for d in devices:
        memory = f"{d.get('memory_used_mib', '?')}/{d.get('memory_total_mib', '?')}"
        util = d.get("utilization_pct")
        lines.append(f"  {d.get('index', '?'):>3}  {str(d.get('name', '?'))[:28]:<28} {d.get('vendor', '?'):<7} "
                     f"{memory:>24} {'-' if util is None else f'{util:g}%':>5}")
    return lines
