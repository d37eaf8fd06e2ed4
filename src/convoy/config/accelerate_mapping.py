"""Accelerate's FSDP, DeepSpeed and parallelism options in convoy's settings, one table for the YAML file and the
plugin objects. Torch-free.

    t = fsdp_translation({"fsdp_version": 2, "reshard_after_forward": False}, cite=plugin_cite("FSDP"), nodes=1,
                         processes=2)
    t.value("strategy"), t.origin("strategy")     # "zero2", "FSDP(reshard_after_forward=False)"

``convoy launch --config_file fsdp.yaml`` (``convoy.config.accelerate_file``) renames each key of a block to its
plugin field with ``ROWS`` (``fsdp_config.fsdp_offload_params`` is ``FullyShardedDataParallelPlugin.cpu_offload``)
and calls the same function as ``Accelerator(fsdp_plugin=...)`` (``convoy.train.plugins``), so a file and a plugin
saying the same thing run the same job. Each function returns the convoy values it sets (``Mapped``: a setting
such as ``strategy`` or a strategy option such as ``cpu_offload``, with the key or field that set it), and notes
for what is accepted without effect. What changes training and has no convoy meaning is one line naming the key:
``ConfigError``, or ``NotSupportedYetError`` for what convoy may run later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convoy.config.schema import KEYS
from convoy.errors import ConfigError, NotSupportedYetError, shown

__all__ = ["Row", "ROWS", "Mapped", "Translation", "fsdp_translation", "deepspeed_translation",
           "parallelism_translation", "plugin_cite", "block_fields", "FSDP_FAMILY", "DEEPSPEED_FAMILY",
           "ZERO_STRATEGIES", "DYNAMO_KEYS", "dynamo_translation", "DS_OPTIMIZERS", "DS_SCHEDULERS",
           "deepspeed_fields_config"]

#: the strategies a plugin given without its sharding field keeps when the launcher set one (its default first;
#: not ddp, which a plain multi-GPU launch sets too)
FSDP_FAMILY = ("zero3", "zero2", "fsdp")
#: the strategies a DeepSpeed plugin runs as, by ZeRO stage 0-3; Accelerate's default stage is 2
ZERO_STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
DEEPSPEED_FAMILY = ("zero2", "zero3", "zero1")

#: FSDP's sharding strategies by ``torch.distributed.fsdp.ShardingStrategy`` value (Accelerate's list, 1-based)
_SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_SHARDING_STRATEGY = {"FULL_SHARD": "zero3", "SHARD_GRAD_OP": "zero2", "NO_SHARD": "ddp", "HYBRID_SHARD": "zero3",
                      "HYBRID_SHARD_ZERO2": "zero2"}
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclass(frozen=True)
class Row:
    """One key of Accelerate's configuration and what it becomes in convoy."""

    block: str
    """Where the key sits in the YAML file: ``fsdp_config``, ``deepspeed_config``, ``parallelism_config``."""
    key: str
    """The key as ``accelerate config`` writes it (``fsdp_offload_params``)."""
    field: str
    """The plugin's field of the same meaning (``FullyShardedDataParallelPlugin.cpu_offload``)."""
    sets: str
    """What it sets in convoy (``strategy``, ``cpu_offload``, ...); ``""``: accepted, changes nothing; ``refused``."""


def _rows(block: str, table: str) -> tuple[Row, ...]:
    rows = []
    for line in table.strip().splitlines():
        key, name, sets = (part.strip() for part in line.split("|"))
        rows.append(Row(block=block, key=key, field=name, sets="" if sets == "-" else sets))
    return tuple(rows)


#: every key of the three blocks ``accelerate config`` writes (Accelerate 1.15's ``commands/config/cluster.py`` and
#: ``commands/launch.py``), with the plugin field it fills and what it sets here
ROWS: tuple[Row, ...] = (*_rows("fsdp_config", """
    fsdp_version                        | fsdp_version                      | (selects how the two below are read)
    fsdp_sharding_strategy              | sharding_strategy                 | strategy, parallelism (HYBRID_*)
    fsdp_reshard_after_forward          | reshard_after_forward             | strategy, parallelism (HYBRID_*)
    fsdp_offload_params                 | cpu_offload                       | cpu_offload
    fsdp_activation_checkpointing       | activation_checkpointing          | recompute
    fsdp_activation_checkpointing_offload | activation_checkpointing_offload | refused
    fsdp_auto_wrap_policy               | auto_wrap_policy                  | auto_wrap
    fsdp_transformer_layer_cls_to_wrap  | transformer_cls_names_to_wrap     | auto_wrap
    fsdp_min_num_params                 | min_num_params                    | -
    fsdp_state_dict_type                | state_dict_type                   | -
    fsdp_backward_prefetch              | backward_prefetch                 | -
    fsdp_forward_prefetch               | forward_prefetch                  | -
    fsdp_use_orig_params                | use_orig_params                   | -
    fsdp_sync_module_states             | sync_module_states                | -
    fsdp_cpu_ram_efficient_loading      | cpu_ram_efficient_loading         | -
    fsdp_ignored_modules                | ignored_modules                   | refused
"""), *_rows("deepspeed_config", """
    deepspeed_config_file               | hf_ds_config                      | (the JSON's keys, below)
    zero_stage                          | zero_stage                        | strategy
    offload_optimizer_device            | offload_optimizer_device          | cpu_offload
    offload_param_device                | offload_param_device              | cpu_offload
    offload_optimizer_nvme_path         | offload_optimizer_nvme_path       | -
    offload_param_nvme_path             | offload_param_nvme_path           | -
    gradient_accumulation_steps         | gradient_accumulation_steps       | gradient_accumulation_steps
    gradient_clipping                   | gradient_clipping                 | gradient_clipping
    zero3_init_flag                     | zero3_init_flag                   | -
    zero3_save_16bit_model              | zero3_save_16bit_model            | -
    deepspeed_moe_layer_cls_names       | transformer_moe_cls_names         | refused
    deepspeed_multinode_launcher        | -                                 | -
    deepspeed_hostfile                  | -                                 | -
    deepspeed_exclusion_filter          | -                                 | -
    deepspeed_inclusion_filter          | -                                 | -
"""), *_rows("parallelism_config", """
    parallelism_config_dp_replicate_size | dp_replicate_size               | parallelism
    parallelism_config_dp_shard_size    | dp_shard_size                     | parallelism
    parallelism_config_tp_size          | tp_size                           | parallelism
    parallelism_config_cp_size          | cp_size                           | parallelism
    parallelism_config_cp_comm_strategy | cp_comm_strategy                  | cp_comm_strategy
    parallelism_config_cp_backend       | cp_backend                        | -
    parallelism_config_sp_size          | sp_size                           | refused above 1
    parallelism_config_sp_backend       | sp_backend                        | -
    parallelism_config_sp_seq_length    | sp_handler                        | -
    parallelism_config_sp_seq_length_is_variable | sp_handler               | -
    parallelism_config_sp_attn_implementation | sp_handler                  | -
"""))


@dataclass(frozen=True)
class Mapped:
    """One convoy value and the Accelerate key or plugin field it came from."""

    name: str
    """A setting of ``convoy.config.schema`` (``strategy``, ``parallelism``, ...) or a strategy option
    (``cpu_offload``, ``auto_wrap``)."""
    value: Any
    origin: str
    """The key as the user wrote it: ``fsdp.yaml: fsdp_config.fsdp_offload_params = true``."""


@dataclass(frozen=True)
class Translation:
    """What a block of Accelerate's configuration (or a plugin) asks convoy for."""

    values: tuple[Mapped, ...] = ()
    notes: tuple[str, ...] = ()
    """What is accepted and runs otherwise, or not at all, in convoy (one line each)."""
    family: tuple[str, ...] = ()
    """The strategies this engine runs as (the first when nothing chose one): a plugin given without a sharding
    field keeps a strategy of the family that the launcher set, as Accelerate's plugin reads its variables."""

    def get(self, name: str) -> Mapped | None:
        return next((m for m in self.values if m.name == name), None)

    def value(self, name: str, default: Any = None) -> Any:
        found = self.get(name)
        return default if found is None else found.value

    def origin(self, name: str) -> str | None:
        found = self.get(name)
        return None if found is None else found.origin

    def __add__(self, other: Translation) -> Translation:
        return Translation(values=self.values + other.values, notes=self.notes + other.notes,
                           family=self.family or other.family)


def plugin_cite(plugin: str) -> Callable[[str, Any], str]:
    """How a plugin's field is named in messages: ``FullyShardedDataParallelPlugin(cpu_offload=True)``."""
    return lambda name, value: f"{plugin}({name}={shown(_enum_name(value) if _is_enum(value) else value)})"


def block_fields(block: str, items: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """A YAML block's keys as plugin fields, with each field's key: ``{"cpu_offload": True}``, ``{"cpu_offload":
    "fsdp_offload_params"}``. A key outside ``ROWS`` is a ``ConfigError`` naming it (Accelerate refuses it too);
    Accelerate's launcher also takes an FSDP key without its ``fsdp_`` prefix."""
    rows = {row.key: row for row in ROWS if row.block == block}
    fields: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in items.items():
        name = f"fsdp_{key}" if block == "fsdp_config" and not str(key).startswith("fsdp") else str(key)
        row = rows.get(name)
        if row is None:
            raise ConfigError(f"{block}.{shown(key)} is not a key Accelerate writes; known keys: "
                              f"{', '.join(rows)}")
        target = row.field if row.field != "-" else row.key
        if target in ("sp_handler", "cp_handler"):
            target = row.key  # several keys of one handler
        fields[target], keys[target] = value, row.key
    return fields, keys


# --- values -------------------------------------------------------------------------------------------------------

def _is_enum(value: Any) -> bool:
    return type(value).__module__ != "builtins" and hasattr(value, "name") and hasattr(value, "value")


def _enum_name(value: Any) -> str:
    return str(value.name).lstrip("_")  # torch's ShardingStrategy._HYBRID_SHARD_ZERO2


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{where}: give true or false")


def _whole(value: Any, where: str, low: int = 0) -> int:
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    if not text.isdigit() or not text.isascii() or len(text) > 12 or int(text) < low:
        raise ConfigError(f"{where}: give a whole number >= {low}")
    return int(text)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


# --- FSDP ---------------------------------------------------------------------------------------------------------

def _sharding(value: Any, where: str, version: int) -> str:
    """One of ``_SHARDINGS`` from a name, torch's enum, its 1-based number, or (FSDP2) a bool."""
    if _is_enum(value):
        value = _enum_name(value)
    if isinstance(value, bool) or (version == 2 and isinstance(value, str) and value.strip().lower() in
                                   _TRUE + _FALSE):
        return "FULL_SHARD" if _flag(value, where) else "SHARD_GRAD_OP"  # FSDP2's reshard_after_forward
    text = str(value).strip().upper() if isinstance(value, (str, int)) else ""
    if text.isdigit() and 1 <= int(text) <= len(_SHARDINGS):
        return _SHARDINGS[int(text) - 1]
    if text in _SHARDINGS:
        return text
    choices = "true or false (FSDP2), or " if version == 2 else ""
    raise ConfigError(f"{where}: give {choices}one of {', '.join(_SHARDINGS)} (or its number 1-5)")


def _auto_wrap(fields: Mapping[str, Any], cite: Callable[[str, Any], str]) -> tuple[list[Mapped], list[str]]:
    policy = fields.get("auto_wrap_policy")
    names = fields.get("transformer_cls_names_to_wrap")
    if policy is None:
        return [], []
    if callable(policy):
        return [], [f"{cite('auto_wrap_policy', policy)}: convoy shards each block of the model's ModuleLists "
                    f"(strategy_options auto_wrap= names the classes); wrapping changes memory, not the numbers"]
    kind = str(policy).strip().upper()
    if kind == "TRANSFORMER_BASED_WRAP" and names:
        if not isinstance(names, str) and not (isinstance(names, (list, tuple)) and all(isinstance(n, str)
                                                                                        for n in names)):
            raise ConfigError(f"{cite('transformer_cls_names_to_wrap', names)}: give class names, a list of strings "
                              f"such as [LlamaDecoderLayer] or one comma-separated string")
        listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else [n for n in names]
        return [Mapped("auto_wrap", tuple(n for n in listed if n), cite("transformer_cls_names_to_wrap", names))], []
    if kind == "TRANSFORMER_BASED_WRAP":
        return [], [f"{cite('auto_wrap_policy', policy)}: each block of the model's ModuleLists is sharded on its "
                    f"own (a transformers model's decoder layers, as its _no_split_modules)"]
    if kind in ("SIZE_BASED_WRAP", "NO_WRAP"):
        return [], [f"{cite('auto_wrap_policy', policy)}: convoy shards each block of the model's ModuleLists "
                    f"instead; wrapping changes memory, not the numbers"]
    raise ConfigError(f"{cite('auto_wrap_policy', policy)}: give TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")


def _recompute(value: Any, where: str) -> list[Mapped]:
    return [Mapped("recompute", "full", where)] if _flag(value, where) else []


def _mixed_precision_policy(value: Any, where: str) -> list[Mapped]:
    """Accelerate's ``mixed_precision_policy``: a name, or FSDP's policy object / dict of dtypes."""
    names = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "bfloat16": "bf16", "float16": "fp16", "float32": "no"}
    if isinstance(value, str):
        if value.strip().lower() not in names:
            raise ConfigError(f"{where}: give bf16, fp16 or fp32" + (" (fp8 is not in convoy)"
                                                                       if value.strip().lower() == "fp8" else ""))
        return [Mapped("mixed_precision", names[value.strip().lower()], where)]
    get = value.get if isinstance(value, Mapping) else lambda name: getattr(value, name, None)
    param, reduce = (str(get(n)).removeprefix("torch.") if get(n) is not None else None
                     for n in ("param_dtype", "reduce_dtype"))
    if param not in (None, "bfloat16", "float16", "float32") or reduce not in (None, "float32"):
        raise NotSupportedYetError(f"{where}: convoy gathers weights in the mixed precision's dtype and reduces "
                                   f"gradients in fp32; give mixed_precision='bf16' or 'fp16' instead")
    return [Mapped("mixed_precision", names[param], where)] if param else []


#: FSDP plugin fields that change nothing in convoy (FSDP2 prefetches and keeps the original parameters itself;
#: convoy's checkpoints are its own format, loadable at any layout)
_FSDP_INERT = ("fsdp_version", "min_num_params", "state_dict_type", "state_dict_config", "optim_state_dict_config",
               "backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states",
               "cpu_ram_efficient_loading", "limit_all_gathers", "transformer_cls_names_to_wrap")


def fsdp_translation(fields: Mapping[str, Any], *, cite: Callable[[str, Any], str], nodes: int,
                     processes: int | None) -> Translation:
    """``FullyShardedDataParallelPlugin``'s fields (None or absent: not given) in convoy's settings, for a job of
    ``processes`` processes on ``nodes`` machines (HYBRID_SHARD shards inside a machine, replicates across them).
    ``cite(field, value)``: how a message names a field (a YAML key, or the plugin's argument)."""
    given = {k: v for k, v in fields.items() if v is not None}
    version = _whole(given.get("fsdp_version", 1), cite("fsdp_version", given.get("fsdp_version")), 1)
    if version not in (1, 2):
        raise ConfigError(f"{cite('fsdp_version', version)}: give 1 or 2")
    values: list[Mapped] = []
    notes: list[str] = []
    chosen = "sharding_strategy" if "sharding_strategy" in given else \
        "reshard_after_forward" if "reshard_after_forward" in given else None
    if chosen is not None:  # Accelerate prefers sharding_strategy where both are given
        where = cite(chosen, given[chosen])
        sharding = _sharding(given[chosen], where, version)
        values.append(Mapped("strategy", _SHARDING_STRATEGY[sharding], where))
        if sharding.startswith("HYBRID") and nodes > 1:
            if processes is None or processes % nodes:
                raise ConfigError(f"{where} shards inside each of the {nodes} machines: give num_processes, a "
                                  f"multiple of {nodes}")
            values.append(Mapped("parallelism", f"dp_replicate={nodes},dp_shard={processes // nodes}", where))
        elif sharding.startswith("HYBRID"):
            notes.append(f"{where} on one machine shards over all of its processes")
    if _offloads(given.get("cpu_offload", False), cite("cpu_offload", given.get("cpu_offload"))):
        where = cite("cpu_offload", given["cpu_offload"])
        if values and values[0].value == "ddp":
            raise ConfigError(f"{where} with {values[0].origin}: NO_SHARD keeps every parameter on the device; "
                              f"give FULL_SHARD or SHARD_GRAD_OP to offload")
        values.append(Mapped("cpu_offload", True, where))
    if "activation_checkpointing" in given:
        values += _recompute(given["activation_checkpointing"], cite("activation_checkpointing",
                                                                     given["activation_checkpointing"]))
    if _flag(given.get("activation_checkpointing_offload", False), cite("activation_checkpointing_offload", None)):
        raise NotSupportedYetError(f"{cite('activation_checkpointing_offload', True)}: offloading the checkpointed "
                                   f"activations is not supported yet; set it to false")
    for name, why in (("ignored_modules", "modules FSDP leaves out are not reduced over the processes"),
                      ("param_init_fn", "convoy shards the model as built; build it on a real device")):
        if given.get(name) not in (None, "", [], ()):
            raise NotSupportedYetError(f"{cite(name, given[name])}: not supported yet ({why})")
    if "mixed_precision_policy" in given:
        values += _mixed_precision_policy(given["mixed_precision_policy"],
                                          cite("mixed_precision_policy", given["mixed_precision_policy"]))
    wrap, wrap_notes = _auto_wrap(given, cite)
    values += wrap
    notes += wrap_notes
    inert = [cite(name, given[name]) for name in _FSDP_INERT if name in given and name != "fsdp_version"
             and not (name == "transformer_cls_names_to_wrap" and wrap)]
    if inert:
        notes.append(f"accepted, without effect on convoy's FSDP2: {', '.join(inert)}")
    return Translation(values=tuple(values), notes=tuple(notes), family=FSDP_FAMILY)


def _offloads(value: Any, where: str) -> bool:
    """``cpu_offload`` as a bool: a yes/no, torch's ``CPUOffloadPolicy``/``OffloadPolicy`` (FSDP2) or
    ``CPUOffload(offload_params=...)`` (FSDP1), read without torch."""
    kind = type(value).__name__
    if kind in ("CPUOffloadPolicy", "OffloadPolicy"):
        return kind == "CPUOffloadPolicy"
    if kind == "CPUOffload":
        return bool(getattr(value, "offload_params", False))
    return _flag(value, where)


# --- DeepSpeed ----------------------------------------------------------------------------------------------------

#: the keys a DeepSpeed JSON may hold that change nothing here (logging, tuning of DeepSpeed's own buffers)
_DS_INERT = ("steps_per_print", "wall_clock_breakdown", "dump_state", "zero_allow_untested_optimizer",
             "zero_force_ds_cpu_optimizer", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet",
             "comms_logger", "memory_breakdown", "train_batch_size", "train_micro_batch_size_per_gpu",
             "prescale_gradients", "gradient_predivide_factor", "checkpoint", "aio", "activation_checkpointing",
             "data_types", "monitor_config", "timers", "graph_harvesting", "use_data_before_expert_parallelism")
#: DeepSpeed's own engine features convoy does not run, and what to do instead
_DS_REFUSED = {
    "amp": "apex AMP is not in convoy; use mixed_precision bf16 or fp16", "fp8": "fp8 training is not in convoy",
    "msamp": "MS-AMP fp8 is not in convoy", "compression_training": "DeepSpeed's compression is not in convoy",
    "sparse_attention": "DeepSpeed's sparse attention is not in convoy",
    "pipeline": "DeepSpeed's pipeline engine is not convoy's; use parallelism pp", "elasticity": "not in convoy",
    "data_efficiency": "DeepSpeed's data sampling is not in convoy", "curriculum_learning": "not in convoy",
    "autotuning": "DeepSpeed's autotuner is not in convoy", "quantize_training": "not in convoy",
    "progressive_layer_drop": "not in convoy", "eigenvalue": "not in convoy", "hybrid_engine": "not in convoy",
    "sequence_parallel_size": "sequence parallelism is not in convoy", "tensor_parallel": "use parallelism tp",
    "moe": "DeepSpeed's MoE is not in convoy",
}
#: the ``optimizer`` / ``scheduler`` section types convoy builds for ``DummyOptim`` / ``DummyScheduler``
#: (``convoy.train.deepspeed_sections``)
DS_OPTIMIZERS = ("AdamW", "Adam")
DS_SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
#: zero_optimization keys that change training (ZeRO++ quantized or hierarchical copies, MiCS), and when they do
_ZERO_PLUS = {"zero_quantized_weights": lambda v: v is True, "zero_quantized_gradients": lambda v: v is True,
              "zero_quantized_nontrainable_weights": lambda v: v is True,
              "zero_hpz_partition_size": lambda v: isinstance(v, int) and v > 1,
              "mics_shard_size": lambda v: isinstance(v, int) and v > 0}

def _ds_block(json_config: Mapping[str, Any], name: str, cite: Callable[[str, Any], str]) -> Mapping[str, Any]:
    block = json_config.get(name, {})
    if not isinstance(block, Mapping):
        raise ConfigError(f"{cite(name, block)}: give an object")
    return block


def _ds_section(key: str, value: Any, cite: Callable[[str, Any], str]) -> None:
    """An ``optimizer`` / ``scheduler`` section of a type convoy builds (``DummyOptim`` / ``DummyScheduler``)."""
    kinds = DS_OPTIMIZERS if key == "optimizer" else DS_SCHEDULERS
    if not isinstance(value, Mapping) or not isinstance(value.get("params", {}), Mapping):
        raise ConfigError(f"{cite(key, value)}: give an object with 'type' and 'params'")
    if value.get("type") not in kinds:
        raise NotSupportedYetError(f"{cite(key + '.type', value.get('type'))}: convoy builds {' and '.join(kinds)} "
                                   f"{'optimizers' if key == 'optimizer' else 'schedules'}; make the "
                                   f"{key} in the script instead of Accelerate's "
                                   f"{'DummyOptim' if key == 'optimizer' else 'DummyScheduler'} and drop the section")


def _ds_json(json_config: Mapping[str, Any], cite: Callable[[str, Any], str]) -> dict[str, Any]:
    """The DeepSpeed JSON's keys as the plugin's fields (``zero_optimization.stage`` -> ``zero_stage``), "auto"
    values left out (they are filled from the plugin's fields, the Accelerator or the loader, as in Accelerate),
    and the precision it asks for as ``mixed_precision``; ``ConfigError`` for what convoy does not run."""
    for key, value in json_config.items():
        if key in ("optimizer", "scheduler"):
            _ds_section(key, value, cite)
            continue
        if key in _DS_REFUSED:
            raise NotSupportedYetError(f"{cite(key, value)}: {_DS_REFUSED[key]}")
        if key not in _DS_INERT and key not in ("zero_optimization", "fp16", "bf16", "gradient_accumulation_steps",
                                                "gradient_clipping", "communication_data_type"):
            raise ConfigError(f"{cite(key, value)}: convoy does not know this DeepSpeed key; remove it if it only "
                              f"tunes or logs DeepSpeed")
    zero = _ds_block(json_config, "zero_optimization", cite)
    fields: dict[str, Any] = {}
    for key, changes in _ZERO_PLUS.items():
        if changes(zero.get(key)):
            raise NotSupportedYetError(f"{cite('zero_optimization.' + key, zero[key])}: ZeRO++ and MiCS are "
                                       f"DeepSpeed's own engine features, not in convoy; remove it")
    for key, name in (("stage", "zero_stage"), ("offload_optimizer.device", "offload_optimizer_device"),
                      ("offload_param.device", "offload_param_device")):
        head, _, tail = key.partition(".")
        value = zero.get(head)
        if tail:
            value = value.get(tail) if isinstance(value, Mapping) else None
        if value is not None and not _is_auto(value):
            fields[name] = (value, cite("zero_optimization." + key, value))
    if zero.get("cpu_offload") is True:  # DeepSpeed's older spelling of offload_optimizer.device cpu
        fields["offload_optimizer_device"] = ("cpu", cite("zero_optimization.cpu_offload", True))
    for key in ("gradient_accumulation_steps", "gradient_clipping"):
        if json_config.get(key) is not None and not _is_auto(json_config[key]):
            fields[key] = (json_config[key], cite(key, json_config[key]))
    enabled = {}
    for name in ("fp16", "bf16"):
        block = _ds_block(json_config, name, cite)
        value = block.get("enabled", name in json_config)
        if not _is_auto(value) and _flag(value, cite(f"{name}.enabled", value)):
            enabled[name] = cite(f"{name}.enabled", value)
        if name == "fp16" and block.get("loss_scale", 0) not in (0, 0.0, "auto"):
            raise NotSupportedYetError(f"{cite('fp16.loss_scale', block['loss_scale'])}: convoy scales fp16 losses "
                                       f"dynamically (torch's GradScaler); use 0")
    if len(enabled) == 2:
        raise ConfigError(f"{enabled['fp16']} and {enabled['bf16']}: give one of them")
    if enabled:
        name, where = next(iter(enabled.items()))
        fields["mixed_precision"] = (name, where)
    dtype = json_config.get("communication_data_type")
    if dtype not in (None, "fp32", "float32"):
        raise NotSupportedYetError(f"{cite('communication_data_type', dtype)}: convoy reduces gradients in fp32")
    return fields


def deepspeed_fields_config(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config Accelerate's ``DeepSpeedPlugin`` builds from its fields (``zero_stage``,
    ``offload_*_device``, ...) when no JSON is given: what ``accelerator.state.deepspeed_plugin.deepspeed_config``
    holds then. "auto" is filled later, as Accelerate fills it (the accumulation steps from the Accelerator)."""
    config: dict[str, Any] = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": fields.get("gradient_accumulation_steps") or "auto",
        "zero_optimization": {
            "stage": 2 if fields.get("zero_stage") is None else fields["zero_stage"],  # Accelerate's default
            "offload_optimizer": {"device": fields.get("offload_optimizer_device") or "none"},
            "offload_param": {"device": fields.get("offload_param_device") or "none"},
            "stage3_gather_16bit_weights_on_model_save": bool(fields.get("zero3_save_16bit_model"))}}
    if fields.get("gradient_clipping"):
        config["gradient_clipping"] = fields["gradient_clipping"]
    return config


def deepspeed_translation(fields: Mapping[str, Any], *, cite: Callable[[str, Any], str],
                          json_config: Mapping[str, Any] | None = None,
                          json_cite: Callable[[str, Any], str] | None = None) -> Translation:
    """``DeepSpeedPlugin``'s fields (None or absent: not given) and its DeepSpeed JSON (``json_config``, read by
    the caller; ``json_cite`` names its keys) in convoy's settings. A JSON value wins over the field of the same
    meaning, and a JSON "auto" takes the field's, as Accelerate fills them. ZeRO stage 0-3 is ddp, zero1, zero2,
    zero3 on PyTorch's engines; offloading to the CPU is FSDP2's ``CPUOffloadPolicy``."""
    given: dict[str, tuple[Any, str]] = {k: (v, cite(k, v)) for k, v in fields.items()
                                         if v is not None and not _is_auto(v) and k != "hf_ds_config"}
    if json_config is not None:
        given.update(_ds_json(json_config, json_cite or cite))
    values: list[Mapped] = []
    notes: list[str] = []
    if "zero_stage" in given:
        stage, where = given["zero_stage"]
        number = _whole(stage, f"{where}: the ZeRO stage")
        if number > 3:
            raise ConfigError(f"{where}: give a ZeRO stage from 0 to 3")
        values.append(Mapped("strategy", ZERO_STRATEGIES[number], where))
    for name in ("offload_optimizer_device", "offload_param_device"):
        if name not in given:
            continue
        device, where = given[name]
        device = str(device).strip().lower()
        if device == "nvme":
            raise NotSupportedYetError(f"{where}: offloading to NVMe is not supported yet; use cpu or none")
        if device not in ("none", "cpu"):
            raise ConfigError(f"{where}: give none, cpu or nvme")
        stage = values[0].value if values else DEEPSPEED_FAMILY[0]
        if device == "cpu" and stage in ("ddp", "zero1"):
            raise ConfigError(f"{where} with ZeRO stage {ZERO_STRATEGIES.index(stage)}: offloading needs stage 2 or 3")
        if device == "cpu" and not any(m.name == "cpu_offload" for m in values):
            values.append(Mapped("cpu_offload", True, where))
    if "gradient_accumulation_steps" in given:
        steps, where = given["gradient_accumulation_steps"]
        values.append(Mapped("gradient_accumulation_steps", _whole(steps, where, 1), where))
    if "gradient_clipping" in given:  # DeepSpeed's engine clips the global norm at each optimizer step
        value, where = given["gradient_clipping"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"{where}: give the largest gradient norm, a number >= 0 (0: no clipping)")
        if value > 0:
            values.append(Mapped("gradient_clipping", float(value), where))
    if "mixed_precision" in given:
        value, where = given["mixed_precision"]
        values.append(Mapped("mixed_precision", value, where))
    for name in ("transformer_moe_cls_names", "enable_msamp"):
        if name in given and given[name][0] not in (False, ""):
            raise NotSupportedYetError(f"{given[name][1]}: DeepSpeed's "
                                       f"{'MoE leaf modules' if name.startswith('transformer') else 'MS-AMP fp8'} "
                                       f"are not in convoy; remove it")
    inert = [where for name, (value, where) in given.items() if name in (
        "zero3_init_flag", "zero3_save_16bit_model", "is_train_batch_min", "offload_optimizer_nvme_path",
        "offload_param_nvme_path", "msamp_opt_level")]
    if inert:
        notes.append(f"accepted, without effect on convoy's engines: {', '.join(inert)}")
    return Translation(values=tuple(values), notes=tuple(notes), family=DEEPSPEED_FAMILY)


# --- ParallelismConfig ----------------------------------------------------------------------------------------------

def parallelism_translation(fields: Mapping[str, Any], *, cite: Callable[[str, Any], str]) -> Translation:
    """``ParallelismConfig``'s sizes as convoy's degrees (``parallelism = dp_replicate=2,dp_shard=2,cp=2,tp=2``) and
    ``cp_comm_strategy`` as the strategy option of that name; sequence parallelism above 1 is
    ``NotSupportedYetError``."""
    sizes = {}
    for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
        value = fields.get(name)
        sizes[name] = 1 if value is None else _whole(value, cite(name, value), 1)
    if sizes["sp_size"] > 1:
        raise NotSupportedYetError(f"{cite('sp_size', fields['sp_size'])}: sequence parallelism (Ulysses) is not in "
                                   f"convoy yet; give 1 (cp_size splits the sequence with ring attention)")
    values = []
    strategy = fields.get("cp_comm_strategy")
    if strategy is not None and sizes["cp_size"] > 1:
        if strategy not in ("allgather", "alltoall"):
            raise ConfigError(f"{cite('cp_comm_strategy', strategy)}: choose 'allgather' or 'alltoall'")
        values.append(Mapped("cp_comm_strategy", strategy, cite("cp_comm_strategy", strategy)))
    given = [name for name in ("dp_replicate_size", "dp_shard_size", "cp_size", "tp_size") if sizes[name] > 1]
    if not given:
        return Translation(values=tuple(values))
    where = ", ".join(cite(name, fields[name]) for name in given)
    degrees = f"dp_replicate={sizes['dp_replicate_size']},dp_shard={sizes['dp_shard_size']}"
    degrees += f",cp={sizes['cp_size']}" * (sizes["cp_size"] > 1) + f",tp={sizes['tp_size']}"
    return Translation(values=(Mapped("parallelism", degrees, where), *values))


#: ``TorchDynamoPlugin``'s fields and the ``dynamo_config`` keys of Accelerate's config file that say the same
DYNAMO_KEYS = {"backend": "dynamo_backend", "mode": "dynamo_mode", "fullgraph": "dynamo_use_fullgraph",
               "dynamic": "dynamo_use_dynamic", "use_regional_compilation": "dynamo_use_regional_compilation"}


def dynamo_translation(fields: Mapping[str, Any], *, cite: Callable[[str, Any], str]) -> Translation:
    """``TorchDynamoPlugin``'s fields (None or absent: not given; a YAML ``dynamo_config`` block renamed with
    ``DYNAMO_KEYS``) in convoy's settings: a backend other than ``no`` compiles (``compile`` ``model``, or
    ``blocks`` with ``use_regional_compilation``, each repeated block in place, as Accelerate's regional compilation
    does), the backend and mode pass through to ``torch.compile`` (``compile_backend``, ``compile_mode``),
    ``dynamic`` is ``compile_dynamic``. ``cite(field, value)``: how a message names a field."""
    given = {k: v for k, v in fields.items() if v is not None}
    unknown = [k for k in given if k not in (*DYNAMO_KEYS, "options", "disable")]
    if unknown:
        raise ConfigError(f"{cite(unknown[0], given[unknown[0]])}: not a TorchDynamoPlugin field; known: "
                          f"{', '.join(DYNAMO_KEYS)}, options, disable")
    backend = str(_enum_name(given["backend"]) if _is_enum(given.get("backend")) else given.get("backend", "no"))
    off = backend.strip().lower() in ("no", "none", "") or (
        "disable" in given and _flag(given["disable"], cite("disable", given["disable"])))
    if given.get("options"):
        raise NotSupportedYetError(f"{cite('options', given['options'])}: torch.compile options are not passed "
                                   f"through yet; set them with torch._inductor.config in the script")
    if off:
        return Translation()
    regional = "use_regional_compilation" in given and _flag(
        given["use_regional_compilation"], cite("use_regional_compilation", given["use_regional_compilation"]))
    where = cite("use_regional_compilation", True) if regional else cite("backend", backend)
    values = [Mapped("compile", "blocks" if regional else "model", where),
              Mapped("compile_backend", KEYS["compile_backend"].parse(backend, where=cite("backend", backend)),
                     cite("backend", backend))]
    notes: list[str] = []
    if "mode" in given:
        mode = str(given["mode"])
        values.append(Mapped("compile_mode", KEYS["compile_mode"].parse(mode, where=cite("mode", mode)),
                             cite("mode", mode)))
    if "dynamic" in given:
        values.append(Mapped("compile_dynamic", _flag(given["dynamic"], cite("dynamic", given["dynamic"])),
                             cite("dynamic", given["dynamic"])))
    if "fullgraph" in given:
        notes.append(f"{cite('fullgraph', given['fullgraph'])}: convoy compiles each block with fullgraph=True and "
                     f"a whole model with graph breaks allowed, whatever this says")
    return Translation(values=tuple(values), notes=tuple(notes))
