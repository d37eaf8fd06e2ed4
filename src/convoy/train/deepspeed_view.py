"""What ``accelerator.state.deepspeed_plugin`` holds: the DeepSpeed config in effect, with the attributes Accelerate's
scripts read, whether the script passed ``DeepSpeedPlugin(hf_ds_config=...)`` or the launcher's Accelerate file named
a ``deepspeed_config`` (its ``deepspeed_config_file``'s JSON, or the config Accelerate's plugin builds from the
keys given inline).

    accelerator = Accelerator()      # under convoy launch --config_file ds.yaml (deepspeed_config_file: ds.json)
    plugin = accelerator.state.deepspeed_plugin
    "optimizer" in plugin.deepspeed_config        # ds.json's sections: DummyOptim / DummyScheduler build from them
    plugin.zero_stage, plugin.deepspeed_config["gradient_accumulation_steps"]

The script's own ``deepspeed_plugin=`` wins over the launcher's file (Accelerate's rule: its plugin replaces the one
``ACCELERATE_DEEPSPEED_CONFIG_FILE`` would make); where the two differ, one line on rank 0 says so. None when neither
gave a DeepSpeed config (or the script gave an FSDP plugin), as Accelerate has it when DeepSpeed is off.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from convoy.config.accelerate_mapping import deepspeed_fields_config

__all__ = ["DeepSpeedView", "deepspeed_in_effect"]


@dataclass
class DeepSpeedView:
    """Accelerate's ``DeepSpeedPlugin`` as its scripts read it after ``__post_init__``: ``deepspeed_config`` (the JSON
    object, or the one Accelerate builds from the plugin's fields), and the fields filled from it."""

    deepspeed_config: dict[str, Any]
    hf_ds_config: Any = None
    zero_stage: int = 2
    gradient_accumulation_steps: Any = 1
    gradient_clipping: Any = None
    offload_optimizer_device: str = "none"
    offload_param_device: str = "none"
    zero3_init_flag: bool = False
    zero3_save_16bit_model: bool = False
    source: str = field(default="", repr=False)
    """Where it came from: ``Accelerator(deepspeed_plugin=...)`` or the launcher's file."""

    def is_zero3_init_enabled(self) -> bool:
        return self.zero3_init_flag

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """A dotted key of ``deepspeed_config`` (``"zero_optimization.stage"``), as Accelerate's ``get_value``."""
        node: Any = self.deepspeed_config
        for key in ds_key_long.split("."):
            if not isinstance(node, Mapping) or key not in node:
                return default
            node = node[key]
        return node


def _from_fields(plugin: Any) -> dict[str, Any]:
    """The config Accelerate's ``DeepSpeedPlugin`` builds from its fields when no ``hf_ds_config`` is given."""
    return deepspeed_fields_config({f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)})


def _view(config: Mapping[str, Any], *, hf_ds_config: Any, accumulation_steps: int, source: str,
          plugin: Any = None) -> DeepSpeedView:
    filled: dict[str, Any] = copy.deepcopy(dict(config))  # the script may write into it, as into Accelerate's
    if filled.get("gradient_accumulation_steps", "auto") == "auto":  # Accelerate fills it from the Accelerator's
        filled["gradient_accumulation_steps"] = accumulation_steps
    block = filled.get("zero_optimization")
    zero: Mapping[str, Any] = block if isinstance(block, Mapping) else {}
    stage = zero.get("stage", "auto")
    if stage == "auto":
        stage = 2 if plugin is None or plugin.zero_stage is None else plugin.zero_stage
    view = DeepSpeedView(deepspeed_config=filled, hf_ds_config=hf_ds_config, zero_stage=int(stage),
                         gradient_accumulation_steps=filled["gradient_accumulation_steps"],
                         gradient_clipping=filled.get("gradient_clipping"), source=source)
    for name, key in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
        offload = zero.get(key)
        if isinstance(offload, Mapping) and offload.get("device") not in (None, "auto"):
            setattr(view, name, str(offload["device"]))
    view.zero3_save_16bit_model = bool(zero.get("stage3_gather_16bit_weights_on_model_save", False))
    flag = getattr(plugin, "zero3_init_flag", None)
    view.zero3_init_flag = view.zero_stage == 3 and (True if flag is None else bool(flag))
    return view


def deepspeed_in_effect(plugin: Any, *, fsdp_plugin: Any, launched: Mapping[str, Any] | None,
                        accumulation_steps: int) -> tuple[DeepSpeedView | None, str | None]:
    """The DeepSpeed config in effect (the script's ``plugin``, else the launcher's ``launched`` JSON object, else
    None) and the line to say once where the script's plugin replaces a launcher's config that differs."""
    if plugin is not None:
        config = plugin.ds_config()
        own = dict(config) if config is not None else _from_fields(plugin)
        view = _view(own, hf_ds_config=plugin.hf_ds_config, accumulation_steps=accumulation_steps,
                     source="Accelerator(deepspeed_plugin=...)", plugin=plugin)
        if launched is not None and dict(launched) != own:
            return view, ("Accelerator(deepspeed_plugin=...) is used; the launcher's DeepSpeed config "
                          "(--config_file's deepspeed_config), which differs, is not read (the script's wins, as in "
                          "Accelerate)")
        return view, None
    if launched is None:
        return None, None
    if fsdp_plugin is not None:
        return None, ("Accelerator(fsdp_plugin=...) is used; the launcher's DeepSpeed config (--config_file's "
                      "deepspeed_config) is not read (the script's wins, as in Accelerate)")
    return _view(launched, hf_ds_config=dict(launched), accumulation_steps=accumulation_steps,
                 source="--config_file's deepspeed_config"), None
