"""Accelerate's plugin objects, taken by ``Accelerator(fsdp_plugin=, deepspeed_plugin=, parallelism_config=)`` and
run on convoy's strategies.

    from convoy import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False, cpu_offload=True)
    accelerator = Accelerator(fsdp_plugin=plugin)     # strategy zero2 with strategy_options cpu_offload=True
    Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
                parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))   # FSDP2 over dp, tp inside

Plain dataclasses with Accelerate 1.15's constructor arguments; a field left None is not given. They never read
the environment (Accelerate's read ``FSDP_*`` variables): under ``convoy launch --config_file`` the launcher's
settings fill what a plugin leaves unset, so a bare ``FullyShardedDataParallelPlugin()`` runs the file's strategy.
The mapping is ``convoy.config.accelerate_mapping``'s, the table the YAML reader uses; what convoy does not run
(DeepSpeed's own optimizers, ZeRO++, fp8, ...) is one line naming the field, at construction.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convoy.config.accelerate_mapping import (
    Translation,
    deepspeed_translation,
    dynamo_translation,
    fsdp_translation,
    parallelism_translation,
    plugin_cite,
)
from convoy.config.schema import KEYS
from convoy.errors import ConfigError, shown
from convoy.launch.rank_env import read_rank_env

__all__ = ["FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "ParallelismConfig", "TorchDynamoPlugin",
           "PluginArguments", "plugin_arguments", "dynamo_arguments"]


def _fields(plugin: Any, skip: Mapping[str, Any] = {}) -> dict[str, Any]:
    """The fields given (not None, and not at a default that is not None, ``skip``)."""
    return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)
            if getattr(plugin, f.name) is not None and skip.get(f.name, object()) != getattr(plugin, f.name)}


@dataclass
class FullyShardedDataParallelPlugin:
    """Accelerate's FSDP plugin: FSDP2 (``fully_shard``) as strategy zero3 (``reshard_after_forward`` True,
    ``FULL_SHARD``), zero2 (False, ``SHARD_GRAD_OP``), zero3/zero2 over dp_replicate x dp_shard (``HYBRID_SHARD``,
    ``HYBRID_SHARD_ZERO2``: sharded inside each machine) or ddp (``NO_SHARD``); ``cpu_offload`` ->
    ``strategy_options`` ``cpu_offload``, ``transformer_cls_names_to_wrap`` -> ``auto_wrap``. Both FSDP versions run
    as FSDP2."""

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Any = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: Any = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        self.translate(nodes=1, processes=None)  # refuse a field convoy cannot run now, not at prepare()

    def translate(self, *, nodes: int, processes: int | None) -> Translation:
        """The convoy settings this plugin asks for, in a job of ``processes`` on ``nodes`` machines."""
        return fsdp_translation(_fields(self, {"limit_all_gathers": True}), cite=plugin_cite(type(self).__name__),
                                nodes=nodes, processes=processes)


@dataclass
class DeepSpeedPlugin:
    """Accelerate's DeepSpeed plugin, run on PyTorch's engines: ZeRO stage 0-3 is strategy ddp, zero1, zero2, zero3;
    ``offload_*_device="cpu"`` is FSDP2's CPU offload; ``hf_ds_config`` (a dict, a JSON path, or an object holding
    ``.config``) is read as ``deepspeed_config_file`` is, its values winning over the fields and "auto" taking them.
    DeepSpeed's own engine features (its optimizers and schedulers, ZeRO++, MoE, fp8) are one line naming them."""

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        self.translate()

    def ds_config(self) -> Mapping[str, Any] | None:
        """The DeepSpeed JSON object ``hf_ds_config`` gives (read from its file), or None."""
        config = self.hf_ds_config
        if config is None or isinstance(config, Mapping):
            return config
        if isinstance(getattr(config, "config", None), Mapping):  # Accelerate's / transformers' HfDeepSpeedConfig
            return config.config
        if isinstance(config, (str, os.PathLike)) and str(config) != "none":
            from convoy.config.accelerate_file import read_deepspeed_json

            return read_deepspeed_json(config, where=f"DeepSpeedPlugin(hf_ds_config={shown(str(config))})",
                                       folders=(Path.cwd(),))[1]
        if config == "none":
            return None
        raise ConfigError(f"DeepSpeedPlugin(hf_ds_config={shown(config)}): give a DeepSpeed config dict or the path "
                          f"of its JSON file")

    def translate(self) -> Translation:
        """The convoy settings this plugin asks for."""
        json_config = self.ds_config()
        cite = plugin_cite(type(self).__name__)
        return deepspeed_translation(_fields(self, {"is_train_batch_min": True}), cite=cite, json_config=json_config,
                                     json_cite=lambda key, value: f"DeepSpeedPlugin(hf_ds_config)['{key}'] = "
                                                                  f"{shown(value)}")


@dataclass
class TorchContextParallelConfig:
    """Accelerate's context-parallel handler (``ParallelismConfig(cp_handler=...)``): how the ring passes K/V
    blocks, ``"allgather"`` (default) or ``"alltoall"``; never read from the environment here."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy not in (None, "allgather", "alltoall"):
            raise ConfigError(f"TorchContextParallelConfig(cp_comm_strategy={shown(self.cp_comm_strategy)}): "
                              f"choose 'allgather' or 'alltoall'")


@dataclass
class ParallelismConfig:
    """Accelerate 1.10+'s degrees: ``dp_replicate_size`` x ``dp_shard_size`` x ``cp_size`` x ``tp_size`` as convoy's
    ``parallelism`` (dp_replicate, dp_shard, cp, tp); ``cp_handler=TorchContextParallelConfig(cp_comm_strategy=...)``
    as strategy option ``cp_comm_strategy``. Sequence parallelism (Ulysses,
    ``sp_size`` > 1) is not in convoy yet."""

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None

    def __post_init__(self) -> None:
        self.translate()

    def translate(self) -> Translation:
        fields = _fields(self)
        if self.cp_handler is not None:  # TorchContextParallelConfig (convoy's or Accelerate's): its one field
            fields.pop("cp_handler")
            fields["cp_comm_strategy"] = getattr(self.cp_handler, "cp_comm_strategy", None) or "allgather"
        return parallelism_translation(fields, cite=plugin_cite(type(self).__name__))

    def _size(self, name: str) -> int:
        value = getattr(self, name)
        return 1 if value is None else int(value)

    @property
    def total_size(self) -> int:
        """The processes these degrees take (their product)."""
        sizes = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
        product = 1
        for name in sizes:
            product *= self._size(name)
        return product

    @property
    def data_parallel_size(self) -> int:
        return self._size("dp_replicate_size") * self._size("dp_shard_size")

    @property
    def non_data_parallel_size(self) -> int:
        """Processes that share each sample (tp x cp x sp)."""
        return self._size("tp_size") * self._size("cp_size") * self._size("sp_size")

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._size("dp_replicate_size") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self._size("dp_shard_size") > 1

    @property
    def tp_enabled(self) -> bool:
        return self._size("tp_size") > 1

    @property
    def cp_enabled(self) -> bool:
        return self._size("cp_size") > 1

    @property
    def sp_enabled(self) -> bool:
        return self._size("sp_size") > 1

    def _names(self, *names: str) -> list[str]:
        return [name for name in names if getattr(self, f"{name}_enabled")]

    @property
    def dp_dim_names(self) -> list[str]:
        """The enabled dimensions data is split over."""
        return self._names("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The enabled dimensions whose ranks read the same batch."""
        return self._names("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The enabled dimensions flattened into the mesh FSDP shards the model over."""
        return self._names("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The enabled dimensions the loss is averaged over."""
        return self._names("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The dimensions FSDP runs over (replication included)."""
        return self._names("dp_replicate") + ["dp_shard_cp"]


@dataclass
class TorchDynamoPlugin:
    """Accelerate's compile plugin: a ``backend`` other than ``"no"`` compiles the model (``compile="model"``), each
    repeated block in place with ``use_regional_compilation=True`` (``compile="blocks"``); ``backend``, ``mode``
    and ``dynamic`` pass through to ``torch.compile`` (``compile_backend``, ``compile_mode``, ``compile_dynamic``);
    ``convoy.train.parallel.compile`` applies it as one step of the layout."""

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool | None = None
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        self.translate()

    def translate(self) -> Translation:
        return dynamo_translation(_fields(self), cite=plugin_cite(type(self).__name__))


@dataclass(frozen=True)
class PluginArguments:
    """The ``Accelerator``'s settings once its plugins are read: the explicit arguments (``strategy``,
    ``parallelism``, ``mixed_precision``, ``gradient_accumulation_steps``, ...), the strategy options, and the
    strategies the plugin's engine runs as (a strategy the launcher set outside them becomes the first)."""

    explicit: Mapping[str, Any]
    options: Mapping[str, Any] | None
    family: tuple[str, ...] = ()
    gradient_clipping: float | None = None
    """The DeepSpeed config's ``gradient_clipping``: the global gradient norm clipped to at each optimizer step."""


def _same(name: str, mine: Any, theirs: Any) -> bool:
    if name in KEYS and isinstance(mine, str) and isinstance(theirs, str):
        return KEYS[name].parse(mine, where=name) == KEYS[name].parse(theirs, where=name)
    return mine == theirs


#: what a plugin sets that the strategy reads as its options, not as a setting of the Accelerator's arguments
_STRATEGY_OPTIONS = ("cpu_offload", "auto_wrap", "cp_comm_strategy")


def plugin_arguments(*, fsdp_plugin: Any, deepspeed_plugin: Any, parallelism_config: Any,
                     explicit: Mapping[str, Any], strategy_options: Mapping[str, Any] | None,
                     env: Mapping[str, str] | None = None) -> PluginArguments:
    """``explicit`` (the ``Accelerator``'s arguments, None: not given) and ``strategy_options`` with what the plugins
    ask for put in; one ``ConfigError`` naming both sides where an argument and a plugin disagree (``strategy='ddp'``
    with an FSDP plugin), as a plugin is an explicit argument too. ``env``: where HYBRID_SHARD's machines are read
    (``WORLD_SIZE / LOCAL_WORLD_SIZE``)."""
    for name, value, kind in (("fsdp_plugin", fsdp_plugin, FullyShardedDataParallelPlugin),
                              ("deepspeed_plugin", deepspeed_plugin, DeepSpeedPlugin),
                              ("parallelism_config", parallelism_config, ParallelismConfig)):
        if value is not None and not isinstance(value, kind):
            hint = " (one plugin: convoy runs one engine)" if isinstance(value, Mapping) else ""
            raise ConfigError(f"Accelerator({name}={shown(value)}): give a convoy.{kind.__name__}(...){hint}")
    if fsdp_plugin is not None and deepspeed_plugin is not None:
        raise ConfigError("Accelerator(fsdp_plugin=..., deepspeed_plugin=...): give one of them")
    if fsdp_plugin is None and deepspeed_plugin is None and parallelism_config is None:
        return PluginArguments(explicit=dict(explicit), options=strategy_options)
    if strategy_options is not None and not isinstance(strategy_options, Mapping):
        raise ConfigError(f"strategy_options={shown(strategy_options)}: give a dict such as {{'cpu_offload': True}}")
    ranks = read_rank_env(os.environ if env is None else env)
    nodes = ranks.world_size // ranks.local_world_size if ranks.world_size % ranks.local_world_size == 0 else 1
    translated = Translation()
    if fsdp_plugin is not None:
        translated = fsdp_plugin.translate(nodes=nodes, processes=ranks.world_size)
    elif deepspeed_plugin is not None:
        translated = deepspeed_plugin.translate()
    if parallelism_config is not None:
        degrees = parallelism_config.translate()
        if degrees.values and translated.get("parallelism") is not None:  # they replace HYBRID_SHARD's split
            translated = Translation(values=tuple(m for m in translated.values if m.name != "parallelism"),
                                     notes=translated.notes, family=translated.family)
        translated = translated + degrees
    merged = dict(explicit)
    options = dict(strategy_options or {})
    clipping = translated.value("gradient_clipping")
    for mapped in translated.values:
        if mapped.name == "gradient_clipping":
            continue
        if mapped.name in _STRATEGY_OPTIONS:
            if mapped.name in options and options[mapped.name] != mapped.value:
                raise ConfigError(f"strategy_options {mapped.name}={shown(options[mapped.name])} and {mapped.origin}: "
                                  f"give one of them")
            options[mapped.name] = mapped.value
            continue
        given = merged.get(mapped.name)
        if given is not None and not _same(mapped.name, given, mapped.value):
            raise ConfigError(f"Accelerator({mapped.name}={shown(given)}) and {mapped.origin}: give one of them")
        merged[mapped.name] = mapped.value
    plugin = fsdp_plugin if fsdp_plugin is not None else deepspeed_plugin
    chosen = merged.get("strategy")
    if plugin is not None and translated.get("strategy") is None and chosen is not None and \
            chosen not in translated.family:
        raise ConfigError(f"Accelerator(strategy={shown(chosen)}) and {type(plugin).__name__}(...): the plugin runs "
                          f"as {', '.join(translated.family)}; give one of them")
    family = translated.family if chosen is None else ()
    return PluginArguments(explicit=merged, options=options if options or strategy_options is not None else None,
                           family=family, gradient_clipping=clipping)


def dynamo_arguments(explicit: Mapping[str, Any], *, dynamo_plugin: Any, dynamo_backend: Any) -> dict[str, Any]:
    """``explicit`` with what Accelerate's ``Accelerator(dynamo_plugin=...)`` or ``Accelerator(dynamo_backend=...)``
    asks for put in (``compile``, ``compile_backend``, ...); one ``ConfigError`` where both are given, or where
    ``compile=`` disagrees with the plugin."""
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ConfigError("Accelerator(dynamo_plugin=..., dynamo_backend=...): give one of them")
    if dynamo_plugin is not None and not isinstance(dynamo_plugin, TorchDynamoPlugin):
        raise ConfigError(f"Accelerator(dynamo_plugin={shown(dynamo_plugin)}): give a convoy.TorchDynamoPlugin(...)")
    merged = dict(explicit)
    if dynamo_plugin is None and dynamo_backend is None:
        return merged
    translated = dynamo_plugin.translate() if dynamo_plugin is not None else dynamo_translation(
        {"backend": dynamo_backend}, cite=lambda name, value: f"Accelerator(dynamo_backend={shown(value)})")
    for mapped in translated.values:
        given = merged.get(mapped.name)
        if given is not None and not _same(mapped.name, given, mapped.value):
            raise ConfigError(f"Accelerator({mapped.name}={shown(given)}) and {mapped.origin}: give one of them")
        merged[mapped.name] = mapped.value
    return merged
