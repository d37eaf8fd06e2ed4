"""``convoy launch --config_file FILE``: an Accelerate config file (the YAML ``accelerate config`` writes, or its
JSON) read as convoy's settings, each with the key that set it. Torch-free; PyYAML is imported only to read one.

    t = read_accelerate_config("fsdp.yaml")
    t.value("strategy"), t.origin("strategy")   # "zero3", "fsdp.yaml: fsdp_config.fsdp_sharding_strategy = FULL_SHARD"
    accelerate_default_config(os.environ)       # ~/.cache/huggingface/accelerate/default_config.yaml, as Accelerate

    $ convoy launch --config_file fsdp.yaml --dry-run train.py

Every key Accelerate 1.15 writes is read or refused: the top level here (``distributed_type``, ``num_processes``
as the total over the machines, ``num_machines``, ``machine_rank``, ``main_process_ip``/``port``,
``rdzv_backend``, ``gpu_ids``, ``mixed_precision``, ``use_cpu``, ...), the ``fsdp_config``, ``deepspeed_config``
(with its ``deepspeed_config_file``) and ``parallelism_config`` blocks through the table that the plugin objects
share (``convoy.config.accelerate_mapping``). Keys that change nothing in convoy (``compute_environment``,
``debug``, ``main_training_function``, the TPU keys at their defaults, ...) are accepted; keys that change training
without a convoy meaning are one line naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from convoy.config.accelerate_mapping import (
    DYNAMO_KEYS,
    Mapped,
    Translation,
    block_fields,
    deepspeed_fields_config,
    deepspeed_translation,
    dynamo_translation,
    fsdp_translation,
    parallelism_translation,
)
from convoy.errors import ConfigError, NotSupportedYetError, shown
from convoy.reading import ACCELERATE, DEEPSPEED, load_json, parse_json, parse_yaml, read_text, shown_path

__all__ = ["read_accelerate_config", "read_deepspeed_json", "accelerate_default_config", "TOP_LEVEL_KEYS",
           "MULTI_DEVICE_TYPES"]

#: Accelerate's ``distributed_type`` values that run one DDP process per device (or CPU core)
MULTI_DEVICE_TYPES = ("MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
                      "MULTI_HPU", "MULTI_NEURON")
#: the top-level keys of Accelerate 1.15's ``ClusterConfig`` (``commands/config/config_args.py``), and the two
#: older spellings it still converts (``fp16``, ``dynamo_backend``)
TOP_LEVEL_KEYS = ("compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes",
                  "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend",
                  "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config", "deepspeed_config",
                  "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16",
                  "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm",
                  "tpu_env", "dynamo_config", "fp16", "dynamo_backend")
#: keys that change nothing in convoy whatever their value
_INERT = ("compute_environment", "debug", "main_training_function", "same_network", "enable_cpu_affinity")
#: keys that change nothing at these values (the TPU keys ``accelerate config`` writes for every machine)
_INERT_AT = {"downcast_bf16": ("no", False, None), "tpu_use_cluster": (False, None), "tpu_use_sudo": (False, None),
             "tpu_name": (None,), "tpu_zone": (None,), "command_file": (None,), "commands": (None, []),
             "tpu_vm": (None, [], [""]), "tpu_env": (None, [], [""])}
#: blocks that change training, refused unless empty
_REFUSED_BLOCKS = {"megatron_lm_config": "Megatron-LM is not in convoy; use convoy's parallelism (tp, pp)",
                   "mpirun_config": "convoy launch starts the processes itself; run it on each machine"}


def accelerate_default_config(env: Mapping[str, str] | None = None) -> Path:
    """Where ``accelerate launch`` looks without ``--config_file``, as Accelerate resolves it: ``$HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``, then ``accelerate/default_config.yaml``."""
    env = os.environ if env is None else env
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def _yaml_text(value: Any) -> str:
    """A value as the YAML file shows it: ``true``, ``null``, ``FULL_SHARD``, ``[a, b]``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{...}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _load(path: Path) -> Mapping[str, Any]:
    """The file's mapping, read bounded (``convoy.reading``: a regular file, 1 MiB, nesting, no YAML aliases)."""
    try:
        text = read_text(path, ACCELERATE)
    except FileNotFoundError:
        raise ConfigError(f"--config_file {shown_path(path)}: no such file; give the YAML file `accelerate config` "
                          f"wrote") from None
    data = parse_json(text, path, ACCELERATE) if path.suffix == ".json" else parse_yaml(text, path, ACCELERATE)
    if not isinstance(data, Mapping):
        raise ConfigError(f"--config_file {shown_path(path)}: holds {type(data).__name__}, not the mapping of keys "
                          f"`accelerate config` writes")
    return data


def read_deepspeed_json(name: Any, *, where: str, folders: tuple[Path, ...]) -> tuple[Path, Mapping[str, Any]]:
    """A DeepSpeed JSON config (``deepspeed_config_file``, ``DeepSpeedPlugin(hf_ds_config=path)``), looked up in
    ``folders`` in turn (a relative path): the file and its object; ``ConfigError`` naming ``where`` otherwise."""
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise ConfigError(f"{where}: give the path of a DeepSpeed JSON file")
    found = next((p for p in (folder / name for folder in folders) if os.path.lexists(p)), None)
    if found is None:
        raise ConfigError(f"{where}: no such file (looked in {', '.join(str(f) for f in folders)})")
    try:
        data = load_json(found, DEEPSPEED)  # bounded (convoy.reading): a FIFO or /dev/zero is one line
    except FileNotFoundError:  # a dangling link
        raise ConfigError(f"{where}: no such file ({shown_path(found)} is a broken link)") from None
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: {shown_path(found)} holds {type(data).__name__}, not a DeepSpeed config object")
    return found, data


def _whole(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: give a whole number >= {low}")
    return value


def _devices(value: Any, where: str) -> str | None:
    """``gpu_ids`` (Accelerate's ``CUDA_VISIBLE_DEVICES``: indices, never a count) as convoy's device request."""
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value).strip()
    if text.lower() == "all":
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and p.isascii() for p in parts):
        raise ConfigError(f"{where}: give device indices like 0,1 or all")
    return ",".join(parts) + ("," if len(parts) == 1 else "")  # one index, not a count ('1' is the first device)


def read_accelerate_config(path: str | os.PathLike[str], *, cwd: str | os.PathLike[str] | None = None) -> Translation:
    """The convoy settings an Accelerate config file asks for (``Translation.values``: settings such as
    ``strategy``, torchrun's ``node_rank``/``master_addr``/``master_port``, ``num_processes`` as the total over the
    machines, strategy options ``cpu_offload``/``auto_wrap``), each with the key that set it, and notes for what
    runs otherwise in convoy. ``ConfigError`` (``NotSupportedYetError`` for what convoy may run later) names the
    first key convoy cannot take."""
    file = Path(path)
    data = _load(file)

    def cite(key: str, value: Any) -> str:
        return f"{file.name}: {key} = {_yaml_text(value)}"

    unknown = [str(k) for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:  # Accelerate refuses them too ("had unknown keys")
        raise ConfigError(f"{file.name}: {shown(unknown[0])} is not a key of Accelerate's config file; known keys: "
                          f"{', '.join(TOP_LEVEL_KEYS[:-2])}")
    _check_booleans(data, cite)
    _refuse_top_level(data, cite)
    if "distributed_type" not in data:
        raise ConfigError(f"{file.name}: no distributed_type; give one (NO, MULTI_GPU, MULTI_CPU, FSDP, DEEPSPEED, "
                          f"...), as `accelerate config` writes it")
    kind = str(data["distributed_type"]).strip().upper()
    where_kind = cite("distributed_type", data["distributed_type"])
    machines = _whole(data.get("num_machines", 1), cite("num_machines", data.get("num_machines")), 1)
    total = data.get("num_processes")
    total = None if total in (None, -1) else _whole(total, cite("num_processes", total), 1)
    values: list[Mapped] = []
    notes: list[str] = []
    if kind == "NO":
        if total not in (None, 1):
            notes.append(f"{where_kind} runs one process, as accelerate launch does: num_processes = {total} is "
                         f"not used")
        total = 1
    elif kind in MULTI_DEVICE_TYPES:
        values.append(Mapped("strategy", "ddp", where_kind))
    elif kind not in ("FSDP", "DEEPSPEED"):
        why = {"XLA": "TPUs (torch_xla) are not in convoy", "MEGATRON_LM": "Megatron-LM is not in convoy; use "
               "convoy's parallelism (tp, pp) with strategy zero3"}.get(kind)
        if why:
            raise NotSupportedYetError(f"{where_kind}: {why}")
        raise ConfigError(f"{where_kind}: give NO, {', '.join(MULTI_DEVICE_TYPES)}, FSDP or DEEPSPEED")
    blocks = _blocks(data, cite)
    fsdp = kind == "FSDP"
    translated = Translation()
    if fsdp:
        fields, keys = block_fields("fsdp_config", blocks["fsdp_config"])
        translated = fsdp_translation(fields, cite=lambda f, v: cite(f"fsdp_config.{keys.get(f, f)}", v),
                                      nodes=machines, processes=total)
        if translated.get("strategy") is None:
            values.append(Mapped("strategy", "zero3", f"{where_kind} (FULL_SHARD, Accelerate's default)"))
    elif kind == "DEEPSPEED":
        translated = _deepspeed(blocks["deepspeed_config"], data, file, cite, Path(cwd or os.getcwd()))
        if translated.get("strategy") is None:
            values.append(Mapped("strategy", "zero2", f"{where_kind} (ZeRO stage 2, Accelerate's default)"))
    for block, used in (("fsdp_config", fsdp), ("deepspeed_config", kind == "DEEPSPEED")):
        if blocks[block] and not used:
            notes.append(f"{file.name}: {block} is not used with {where_kind.split(': ', 1)[1]}, as in accelerate "
                         f"launch")
    values += translated.values
    notes += translated.notes
    if blocks["parallelism_config"]:
        values = _parallelism(blocks["parallelism_config"], values, fsdp=fsdp, cite=cite, where_kind=where_kind)
    values += _top_level(data, cite, kind=kind, machines=machines, total=total)
    notes += _fp8(data, cite)
    compiled = _dynamo(data, cite)
    values += compiled.values
    notes += compiled.notes
    if data.get("debug") is True:
        notes.append(f"{cite('debug', True)}: set ACCELERATE_DEBUG_MODE=1 for convoy's shape checks before each "
                     f"collective")
    prefix = f", {file.name}: "  # one file: named once per line
    return Translation(values=tuple(Mapped(m.name, m.value, m.origin.replace(prefix, ", ")) for m in values),
                       notes=tuple(note.replace(prefix, ", ") for note in notes))


def _blocks(data: Mapping[str, Any], cite: Callable[[str, Any], str]) -> dict[str, Mapping[str, Any]]:
    blocks = {}
    for name in ("fsdp_config", "deepspeed_config", "parallelism_config"):
        block = data.get(name) or {}
        if not isinstance(block, Mapping):
            raise ConfigError(f"{cite(name, block)}: give a mapping of keys")
        blocks[name] = block
    return blocks


#: top-level keys Accelerate reads as true or false (``ClusterConfig``'s bool fields)
_BOOLEANS = ("use_cpu", "debug", "same_network", "enable_cpu_affinity", "fp16", "tpu_use_cluster", "tpu_use_sudo")


def _check_booleans(data: Mapping[str, Any], cite: Callable[[str, Any], str]) -> None:
    """A yes/no key holds true or false (or nothing): ``use_cpu: maybe`` is refused, never read as false."""
    for name in _BOOLEANS:
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise ConfigError(f"{cite(name, data[name])}: give true or false")


def _refuse_top_level(data: Mapping[str, Any], cite: Callable[[str, Any], str]) -> None:
    """One line for the first top-level key that changes training and has no convoy meaning."""
    environment = str(data.get("compute_environment", "LOCAL_MACHINE")).strip().upper()
    if environment != "LOCAL_MACHINE":
        raise NotSupportedYetError(f"{cite('compute_environment', data['compute_environment'])}: convoy launches "
                                   f"on the machines it runs on (LOCAL_MACHINE), not on SageMaker")
    for name, why in _REFUSED_BLOCKS.items():
        if data.get(name):
            raise NotSupportedYetError(f"{cite(name, data[name])}: {why}")
    for name, fine in _INERT_AT.items():
        if name in data and data[name] not in fine:
            raise NotSupportedYetError(f"{cite(name, data[name])}: TPU pods are not in convoy; remove the key")


def _dynamo(data: Mapping[str, Any], cite: Callable[[str, Any], str]) -> Translation:
    """The ``dynamo_config`` block (and the older top-level ``dynamo_backend``) as convoy's compile settings."""
    block = data.get("dynamo_config") or {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"{cite('dynamo_config', block)}: give a mapping of keys")
    fields = {field: block[key] for field, key in DYNAMO_KEYS.items() if key in block}
    keys = {field: f"dynamo_config.{key}" for field, key in DYNAMO_KEYS.items()}
    unknown = [str(k) for k in block if k not in DYNAMO_KEYS.values()]
    if unknown:  # Accelerate's config writes these keys only
        raise ConfigError(f"{cite('dynamo_config.' + unknown[0], block[unknown[0]])}: not a key of Accelerate's "
                          f"dynamo_config; known: {', '.join(DYNAMO_KEYS.values())}")
    if "dynamo_backend" in data:
        fields["backend"], keys["backend"] = data["dynamo_backend"], "dynamo_backend"
    return dynamo_translation(fields, cite=lambda f, v: cite(keys.get(f, f), v))


#: ``fp8_config`` keys of Transformer Engine and MS-AMP (``accelerate config`` writes them for those backends only)
_OTHER_FP8_KEYS = ("use_autocast_during_eval", "margin", "interval", "fp8_format", "amax_history_length",
                   "amax_history_len", "amax_compute_algorithm", "override_linear_precision", "optimization_level")
_FP8_KEYS = ("backend", "enable_fsdp_float8_all_gather", "pad_inner_dim", *_OTHER_FP8_KEYS)


def _fp8(data: Mapping[str, Any], cite: Callable[[str, Any], str]) -> list[str]:
    """``fp8_config`` beside ``mixed_precision: fp8``, which ``_top_level`` maps as it is: backend AO (torchao, convoy's
    fp8) is read, Transformer Engine and MS-AMP are one line each; notes for what changes nothing."""
    block = data.get("fp8_config") or {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"{cite('fp8_config', block)}: give a mapping of keys")
    mixed = str(data.get("mixed_precision") or "no").strip().lower()
    if not block:
        return []
    if mixed != "fp8":
        return [f"{cite('fp8_config', block)} is not used with mixed_precision {mixed}, as in accelerate launch"]
    backend = str(block.get("backend") or "AO").strip().upper()
    if backend in ("TE", "MSAMP"):
        name = "Transformer Engine" if backend == "TE" else "MS-AMP"
        raise NotSupportedYetError(f"{cite('fp8_config.backend', block['backend'])}: {name} fp8 is not in convoy; "
                                   f"convoy's fp8 is torchao's: give backend AO (or leave fp8_config out)")
    if backend != "AO":
        raise ConfigError(f"{cite('fp8_config.backend', block['backend'])}: give AO (torchao), TE or MSAMP")
    unknown = [str(k) for k in block if k not in _FP8_KEYS]
    if unknown:
        raise ConfigError(f"{cite('fp8_config.' + unknown[0], block[unknown[0]])}: not a key of Accelerate's "
                          f"fp8_config; known keys: {', '.join(_FP8_KEYS)}")
    given = [k for k in _OTHER_FP8_KEYS if k in block]
    if given:
        raise ConfigError(f"{cite('fp8_config.' + given[0], block[given[0]])}: a Transformer Engine / MS-AMP key, "
                          f"not read with backend AO; remove it")
    if block.get("enable_fsdp_float8_all_gather", True) is not True:
        raise NotSupportedYetError(f"{cite('fp8_config.enable_fsdp_float8_all_gather', False)}: set it in the script "
                                   f"(AORecipeKwargs(enable_fsdp_float8_all_gather=False)); the launcher does not "
                                   f"carry it")
    if "pad_inner_dim" in block:
        return [f"{cite('fp8_config.pad_inner_dim', block['pad_inner_dim'])}: convoy converts only linears whose "
                f"dimensions are multiples of 16, which need no padding"]
    return []


def _deepspeed(block: Mapping[str, Any], data: Mapping[str, Any], file: Path, cite: Callable[[str, Any], str],
               cwd: Path) -> Translation:
    fields, keys = block_fields("deepspeed_config", block)
    json_file = fields.pop("hf_ds_config", None)
    inline = sorted(keys[name] for name in fields if name in (
        "zero_stage", "offload_optimizer_device", "offload_param_device", "gradient_accumulation_steps",
        "gradient_clipping"))
    if json_file is not None and (inline or data.get("mixed_precision") not in (None, "no")):
        both = inline[0] if inline else "mixed_precision"
        raise ConfigError(f"{file.name}: deepspeed_config.deepspeed_config_file and "
                          f"{'deepspeed_config.' if inline else ''}{both}: give it in the JSON file only (Accelerate "
                          f"refuses both too)")
    json_config, json_cite = None, None
    if json_file is not None:
        # relative to the current directory, as Accelerate opens it, else to the YAML file's own folder
        where = cite("deepspeed_config.deepspeed_config_file", json_file)
        found, json_config = read_deepspeed_json(json_file, where=where, folders=(cwd, file.resolve().parent))

        def json_cite(key: str, value: Any) -> str:
            return f"{found.name}: {key} = {_yaml_text(value)}"

    translated = deepspeed_translation(fields, cite=lambda f, v: cite(f"deepspeed_config.{keys.get(f, f)}", v),
                                       json_config=json_config, json_cite=json_cite)
    # the JSON itself (or, with the keys inline, the config Accelerate's plugin builds from them), for the script's
    # Accelerator: its optimizer / scheduler sections build DummyOptim / DummyScheduler, and
    # accelerator.state.deepspeed_plugin.deepspeed_config holds it (as Accelerate's launcher hands it to the script)
    if json_config is not None:
        carried = Mapped("deepspeed_config", dict(json_config),
                         cite("deepspeed_config.deepspeed_config_file", json_file))
    else:
        carried = Mapped("deepspeed_config", deepspeed_fields_config(fields), cite("deepspeed_config", block))
    return Translation(values=(*translated.values, carried), notes=translated.notes, family=translated.family)


def _parallelism(block: Mapping[str, Any], values: list[Mapped], *, fsdp: bool, cite: Callable[[str, Any], str],
                 where_kind: str) -> list[Mapped]:
    """The ``parallelism_config`` degrees, which Accelerate's launcher takes with FSDP2 only; they replace
    HYBRID_SHARD's split over the machines."""
    fields, keys = block_fields("parallelism_config", block)
    names = {f.removeprefix("parallelism_config_"): v for f, v in fields.items()}
    if not fsdp:
        raise ConfigError(f"{cite('parallelism_config', block)} with {where_kind.split(': ', 1)[1]}: Accelerate "
                          f"takes it with FSDP (fsdp_version 2) only; use distributed_type FSDP")
    degrees = parallelism_translation(names, cite=lambda f, v: cite(f"parallelism_config.{keys.get(f, f)}", v))
    found = degrees.get("parallelism")
    if found is None:
        return values
    if "dp_shard=1," in found.value and "tp=1" in found.value and ",cp=" not in found.value:
        raise ConfigError(f"{found.origin}: FSDP has no dimension to shard across with dp_shard_size 1 (Accelerate "
                          f"refuses it too); give dp_shard_size > 1")
    # with cp: the ring's rotation, a strategy option the launcher hands to the ranks
    return [m for m in values if m.name != "parallelism"] + list(degrees.values)


def _top_level(data: Mapping[str, Any], cite: Callable[[str, Any], str], *, kind: str, machines: int,
               total: int | None) -> list[Mapped]:
    """The launch keys: processes, machines, rendezvous, devices, precision."""
    values: list[Mapped] = []
    if total is not None:
        origin = cite("num_processes", data.get("num_processes", 1)) if "num_processes" in data else \
            f"{cite('distributed_type', data['distributed_type'])} (one process)"
        values.append(Mapped("num_processes", total, origin))
    if "num_machines" in data:
        values.append(Mapped("nnodes", str(machines), cite("num_machines", machines)))
    if machines > 1 and "machine_rank" in data:
        values.append(Mapped("node_rank", _whole(data["machine_rank"], cite("machine_rank", data["machine_rank"]), 0),
                             cite("machine_rank", data["machine_rank"])))
    backend = str(data.get("rdzv_backend") or "static").strip().lower()
    ip, port = data.get("main_process_ip"), data.get("main_process_port")
    if "rdzv_backend" in data:
        values.append(Mapped("rdzv_backend", backend, cite("rdzv_backend", data["rdzv_backend"])))
    if backend == "static":
        if ip is not None:
            values.append(Mapped("master_addr", str(ip), cite("main_process_ip", ip)))
        if port is not None:
            values.append(Mapped("master_port", _whole(port, cite("main_process_port", port), 0),
                                 cite("main_process_port", port)))
    elif ip is not None:  # Accelerate's launcher meets at main_process_ip:port for any other rendezvous
        endpoint = f"{ip}:{port}" if port is not None else str(ip)
        values.append(Mapped("rdzv_endpoint", endpoint, ", ".join(cite(k, v) for k, v in (
            ("main_process_ip", ip), ("main_process_port", port)) if v is not None)))
    if data.get("use_cpu") is True or kind == "MULTI_CPU":
        key = "use_cpu" if data.get("use_cpu") is True else "distributed_type"
        values.append(Mapped("devices", "0", cite(key, data[key])))
    elif data.get("gpu_ids") is not None:
        devices = _devices(data["gpu_ids"], cite("gpu_ids", data["gpu_ids"]))
        if devices is not None:
            values.append(Mapped("devices", devices, cite("gpu_ids", data["gpu_ids"])))
    mixed = data.get("mixed_precision")
    if mixed is None and data.get("fp16") is True:  # Accelerate's older spelling
        values.append(Mapped("mixed_precision", "fp16", cite("fp16", True)))
    elif mixed is not None and not any(m.name == "mixed_precision" for m in values):
        values.append(Mapped("mixed_precision", str(mixed).strip().lower(), cite("mixed_precision", mixed)))
    return values
