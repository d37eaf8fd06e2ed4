"""The optimizer and scheduler a DeepSpeed config's ``optimizer`` / ``scheduler`` sections describe, built for
Accelerate's ``DummyOptim`` / ``DummyScheduler`` placeholders as torch objects.

    ds = {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto",
                                                            "warmup_min_lr": "auto", "warmup_max_lr": "auto"}}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds))
    optimizer = DummyOptim(model.parameters(), lr=1e-3)
    scheduler = DummyScheduler(optimizer, total_num_steps=100, warmup_num_steps=10)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)  # torch AdamW, LambdaLR

The sections are the ``DeepSpeedPlugin``'s, or, without one, those of the ``deepspeed_config_file`` that a
``convoy launch --config_file`` handed to the ranks (``convoy.train.deepspeed_view``).

"auto" values are filled as Accelerate's ``_prepare_deepspeed`` fills them: the optimizer's ``lr`` and
``weight_decay`` from the ``DummyOptim``; the scheduler's ``warmup_min_lr`` 0, ``warmup_max_lr`` the
``DummyOptim``'s lr, ``warmup_num_steps`` ``max(1, DummyScheduler.warmup_num_steps)`` and ``total_num_steps``
``ceil(DummyScheduler.total_num_steps / num_processes)`` (the steps each process takes; unchanged with
``split_batches``). A value the JSON gives wins.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from convoy.errors import ConfigError, shown
from convoy.train.placeholders import DummyOptim, DummyScheduler

__all__ = ["build_placeholders", "build_optimizer", "build_scheduler", "deepspeed_lr_factor", "steps_once"]

#: the schedulers built for a ``DummyScheduler``: DeepSpeed's engine steps them once per optimizer step (Accelerate's
#: ``DeepSpeedSchedulerWrapper``), not once per process as a scheduler the script makes
_STEPPED_ONCE: weakref.WeakSet[Any] = weakref.WeakSet()


def steps_once(scheduler: Any) -> bool:
    """Whether ``scheduler`` was built for a ``DummyScheduler`` (stepped once per optimizer step)."""
    return scheduler in _STEPPED_ONCE


def _filled(section: Mapping[str, Any], name: str, auto: Mapping[str, Any]) -> dict[str, Any]:
    params = dict(section.get("params", {}) or {})
    for key, value in params.items():
        if value == "auto":
            if key not in auto or auto[key] is None:
                hint = " (give DummyScheduler(total_num_steps=...))" if key == "total_num_steps" else ""
                raise ConfigError(f"DeepSpeed config {name}.params.{key} = \"auto\": convoy cannot fill it; give a "
                                  f"value{hint}")
            params[key] = auto[key]
    return params


def build_optimizer(section: Mapping[str, Any], dummy: DummyOptim) -> torch.optim.Optimizer:
    """The torch optimizer of a DeepSpeed ``optimizer`` section for ``dummy``'s parameters: ``AdamW``, or ``Adam``
    (DeepSpeed's ``adam_w_mode``, true unless given, makes it AdamW too)."""
    kind = section.get("type")
    params = _filled(section, "optimizer", {"lr": dummy.lr, "weight_decay": dummy.weight_decay})
    params.pop("torch_adam", None)  # DeepSpeed's choice of its fused kernel or torch's: torch's here
    decoupled = bool(params.pop("adam_w_mode", True)) if kind == "Adam" else True
    known = {"lr", "betas", "eps", "weight_decay", "amsgrad"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"DeepSpeed config optimizer.params.{unknown[0]}: convoy builds {kind} from "
                          f"{', '.join(sorted(known))}; remove it")
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return cls(dummy.params, **params)


def deepspeed_lr_factor(kind: str, params: Mapping[str, Any], base_lr: float) -> Callable[[int], float]:
    """The multiplier of ``base_lr`` after ``n`` calls of ``scheduler.step()``, as DeepSpeed's schedule of ``kind``
    sets the lr after its ``n``-th step (its ``last_batch_iteration`` is ``n - 1``; before the first, the iteration-0
    value). The formulas are DeepSpeed's ``deepspeed/runtime/lr_schedules.py`` (``WarmupLR._get_gamma``,
    ``WarmupDecayLR._get_gamma``, ``WarmupCosineLR.get_lr_ratio``), documented at
    https://deepspeed.readthedocs.io/en/latest/schedulers.html."""
    warmup = max(2, int(params.get("warmup_num_steps", 1000)))  # DeepSpeed: max(2, warmup_num_steps)
    warmup_type = params.get("warmup_type", "log")
    if warmup_type not in ("log", "linear"):
        raise ConfigError(f"DeepSpeed config scheduler.params.warmup_type = {shown(warmup_type)}: give 'log' or "
                          f"'linear'")
    if kind != "WarmupLR" and params.get("total_num_steps") is None:
        raise ConfigError(f"DeepSpeed config scheduler {kind}: give params.total_num_steps")
    total = int(params.get("total_num_steps", 0))

    def warming(it: int) -> float:  # 0 -> 1 over the warmup steps
        if warmup_type == "log":
            return math.log(it + 1) / math.log(warmup)
        return it / warmup

    if kind == "WarmupCosineLR":  # a ratio of the optimizer's lr
        min_ratio, cos_min = float(params.get("warmup_min_ratio", 0.0)), float(params.get("cos_min_ratio", 0.0001))

        def cosine(n: int) -> float:
            it = max(n - 1, 0)
            if it < warmup:
                return min_ratio + warming(it) * (1.0 - min_ratio)
            ratio = (1 + math.cos(math.pi * (it - warmup + 1) / (total - warmup))) / 2
            return max(0.0, cos_min + (1.0 - cos_min) * ratio)

        return cosine
    if base_lr <= 0:
        raise ConfigError(f"DeepSpeed config scheduler {kind} with optimizer lr {base_lr}: give an lr above 0")
    low, high = float(params.get("warmup_min_lr", 0.0)), float(params.get("warmup_max_lr", 0.001))

    def warmup_lr(n: int) -> float:  # absolute lrs, as a multiplier of the optimizer's
        it = max(n - 1, 0)
        if it < warmup:
            gamma = warming(it)
        elif kind == "WarmupDecayLR":
            gamma = max(0.0, (total - it) / max(1.0, total - warmup))
        else:
            gamma = 1.0
        return (low + (high - low) * gamma) / base_lr

    return warmup_lr


def build_scheduler(section: Mapping[str, Any], dummy: DummyScheduler, optimizer: torch.optim.Optimizer, *,
                    processes: int, split_batches: bool) -> Any:
    """The torch ``LambdaLR`` of a DeepSpeed ``scheduler`` section, or ``dummy.lr_scheduler_callable(optimizer)``."""
    if dummy.lr_scheduler_callable is not None:
        return dummy.lr_scheduler_callable(optimizer)
    kind = section.get("type")
    total = dummy.total_num_steps
    max_lr = dummy.optimizer.lr if isinstance(dummy.optimizer, DummyOptim) else optimizer.defaults["lr"]
    params = _filled(section, "scheduler", {
        "warmup_min_lr": 0, "warmup_max_lr": max_lr, "warmup_num_steps": max(1, dummy.warmup_num_steps),
        "total_num_steps": None if total is None else total if split_batches else math.ceil(total / processes)})
    known = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"}
    known |= {"total_num_steps"} if kind != "WarmupLR" else set()
    known |= {"warmup_min_ratio", "cos_min_ratio"} if kind == "WarmupCosineLR" else set()
    known -= {"warmup_min_lr", "warmup_max_lr"} if kind == "WarmupCosineLR" else set()
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"DeepSpeed config scheduler.params.{unknown[0]}: {kind} takes {', '.join(sorted(known))}")
    if params.get("last_batch_iteration", -1) != -1:
        raise ConfigError("DeepSpeed config scheduler.params.last_batch_iteration: give -1; convoy resumes a "
                          "schedule from accelerator.load_state")
    base = optimizer.param_groups[0]["lr"]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, deepspeed_lr_factor(str(kind), params, base))


def build_placeholders(args: tuple[Any, ...], ds_config: Mapping[str, Any] | None, *, processes: int,
                       split_batches: bool) -> tuple[Any, ...]:
    """``prepare``'s arguments with each ``DummyOptim`` / ``DummyScheduler`` replaced by what the DeepSpeed config
    describes; one ``ConfigError`` where a placeholder has no section to build from, or a section no placeholder."""
    config = ds_config or {}
    for section, kind, dummy in (("optimizer", torch.optim.Optimizer, "DummyOptim"),
                                 ("scheduler", torch.optim.lr_scheduler.LRScheduler, "DummyScheduler")):
        if section in config and any(isinstance(obj, kind) for obj in args):  # Accelerate refuses both as well
            raise ConfigError(f"prepare(): the DeepSpeed config's '{section}' section and the script's own {section}: "
                              f"give one of them ({dummy} in the script builds the section's)")
    built: dict[int, torch.optim.Optimizer] = {}
    out = list(args)
    placeholders = [obj for obj in args if isinstance(obj, (DummyOptim, DummyScheduler))]
    if not placeholders:
        return args
    for i, obj in enumerate(args):
        if isinstance(obj, DummyOptim):
            if "optimizer" not in config:
                raise ConfigError("prepare(DummyOptim): the DeepSpeed config has no 'optimizer' section; give "
                                  "Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...)) with one (or a "
                                  "--config_file whose deepspeed_config_file has one), or make a torch optimizer")
            out[i] = built[id(obj)] = build_optimizer(config["optimizer"], obj)
    for i, obj in enumerate(args):
        if isinstance(obj, DummyScheduler):
            optimizer = built.get(id(obj.optimizer), obj.optimizer)
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise ConfigError("prepare(DummyScheduler): give its DummyOptim to the same prepare() call")
            if obj.lr_scheduler_callable is None and "scheduler" not in config:
                raise ConfigError("prepare(DummyScheduler): the DeepSpeed config has no 'scheduler' section; give one, "
                                  "or DummyScheduler(..., lr_scheduler_callable=...)")
            out[i] = build_scheduler(config.get("scheduler", {}), obj, optimizer, processes=processes,
                                     split_batches=split_batches)
            _STEPPED_ONCE.add(out[i])
    return tuple(out)

