"""Accelerate's config files (written as `accelerate config` writes them, in tests/config/accelerate/) read as
convoy's settings, each value with the key it came from; every key convoy cannot run is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convoy.config.accelerate_file import TOP_LEVEL_KEYS, accelerate_default_config, read_accelerate_config
from convoy.config.accelerate_mapping import ROWS, fsdp_translation, plugin_cite
from convoy.errors import ConfigError, NotSupportedYetError

FILES = Path(__file__).parent / "accelerate"

def accelerate_built(stage: int, accumulation: int, offload_optimizer: str = "none", **extra) -> dict:
    """The DeepSpeed config Accelerate's DeepSpeedPlugin builds from inline deepspeed_config keys (its __post_init__),
    which the ranks' state.deepspeed_plugin.deepspeed_config holds."""
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": accumulation,
            "zero_optimization": {"stage": stage, "offload_optimizer": {"device": offload_optimizer},
                                  "offload_param": {"device": "none"},
                                  "stage3_gather_16bit_weights_on_model_save": False}, **extra}


#: each file -> the convoy values it sets (every one; num_processes is the total over the machines)
READ = {
    "fsdp1_questionnaire.yaml": {"strategy": "zero2", "auto_wrap": ("Block",), "num_processes": 2, "nnodes": "1",
                                 "rdzv_backend": "static", "mixed_precision": "no"},
    "fsdp_template.yaml": {"strategy": "zero3", "num_processes": 2, "mixed_precision": "bf16"},
    "fsdp2_fp8_ao.yaml": {"strategy": "zero3", "num_processes": 2, "mixed_precision": "fp8"},
    "fsdp2_offload.yaml": {"strategy": "zero3", "cpu_offload": True, "auto_wrap": ("Block",), "num_processes": 2,
                           "nnodes": "1", "rdzv_backend": "static", "mixed_precision": "no"},
    "fsdp_integer_strategy.yaml": {"strategy": "zero2", "num_processes": 2},
    "fsdp_no_shard.yaml": {"strategy": "ddp", "num_processes": 2},
    "fsdp_hybrid_two_machines.yaml": {"strategy": "zero3", "parallelism": "dp_replicate=2,dp_shard=4",
                                      "num_processes": 8, "nnodes": "2", "node_rank": 1, "rdzv_backend": "static",
                                      "master_addr": "10.1.2.3", "master_port": 29501, "mixed_precision": "bf16"},
    "context_parallel.yaml": {"strategy": "zero3", "parallelism": "dp_replicate=1,dp_shard=2,cp=2,tp=1",
                              "cp_comm_strategy": "allgather", "num_processes": 4},
    "fsdp2_parallelism.yaml": {"strategy": "zero3", "parallelism": "dp_replicate=1,dp_shard=2,tp=2",
                               "num_processes": 4, "nnodes": "1", "mixed_precision": "bf16"},
    "deepspeed_inline.yaml": {"strategy": "zero2", "cpu_offload": True, "gradient_accumulation_steps": 4,
                              "num_processes": 2, "nnodes": "1", "rdzv_backend": "static", "mixed_precision": "fp16",
                              "deepspeed_config": accelerate_built(2, 4, "cpu")},
    # a deepspeed_config_file's JSON is also handed to the ranks whole (CONVOY_DEEPSPEED_CONFIG): state.deepspeed_plugin
    "deepspeed_zero3_file.yaml": {"strategy": "zero3", "gradient_accumulation_steps": 2, "num_processes": 2,
                                  "deepspeed_config": json.loads((FILES / "zero3.json").read_text())},
    # ... and its optimizer / scheduler sections build the script's DummyOptim / DummyScheduler
    "deepspeed_optimizer_file.yaml": {"strategy": "zero2", "mixed_precision": "bf16", "num_processes": 2,
                                      "deepspeed_config": json.loads((FILES / "zero2_optimizer.json").read_text())},
    "multi_gpu.yaml": {"strategy": "ddp", "num_processes": 2, "nnodes": "1", "rdzv_backend": "static",
                       "devices": "2,0", "mixed_precision": "bf16"},
    "multi_node.yaml": {"strategy": "ddp", "num_processes": 8, "nnodes": "2", "node_rank": 0, "rdzv_backend": "static",
                        "master_addr": "10.0.0.1", "master_port": 9999},
    "multi_node_c10d.yaml": {"strategy": "ddp", "num_processes": 4, "nnodes": "2", "node_rank": 1,
                             "rdzv_backend": "c10d", "rdzv_endpoint": "head:29400"},
    "multi_cpu.yaml": {"strategy": "ddp", "num_processes": 2, "nnodes": "1", "rdzv_backend": "static",
                       "devices": "0", "mixed_precision": "no"},
    # torch dynamo: compiled (the whole model, or each block with regional compilation), the backend passed through
    "dynamo.yaml": {"strategy": "ddp", "num_processes": 2, "compile": "model", "compile_backend": "inductor"},
    "dynamo_regional.yaml": {"strategy": "zero3", "num_processes": 2, "nnodes": "1", "rdzv_backend": "static",
                             "mixed_precision": "bf16", "compile": "blocks", "compile_backend": "inductor",
                             "compile_mode": "max-autotune", "compile_dynamic": False},
    # DeepSpeed's gradient_clipping: carried to the ranks (CONVOY_GRADIENT_CLIPPING), clipped at each optimizer step
    "deepspeed_clipping.yaml": {"strategy": "zero1", "num_processes": 2, "gradient_accumulation_steps": 1,
                                "gradient_clipping": 0.05,
                                "deepspeed_config": accelerate_built(1, 1, gradient_clipping=0.05)},
    "default_config.yaml": {"num_processes": 1, "nnodes": "1", "rdzv_backend": "static", "devices": "0",
                            "mixed_precision": "no"},
}
#: each file convoy refuses -> the error and the key its one line names
REFUSED = {
    "fp8.yaml": (NotSupportedYetError, "fp8.yaml: fp8_config.backend = TE: Transformer Engine fp8 is not in convoy"),
    "megatron.yaml": (NotSupportedYetError, "megatron.yaml: megatron_lm_config = {...}: Megatron-LM"),
    "tpu.yaml": (NotSupportedYetError, "tpu.yaml: distributed_type = XLA: TPUs"),
    "deepspeed_nvme.yaml": (NotSupportedYetError, "deepspeed_config.offload_optimizer_device = nvme"),
}
RECOMPUTE = "fsdp_recompute.yaml"


def test_every_file_here_is_one_accelerate_itself_loads():
    """The files are real: Accelerate 1.15's own loader reads each (it refuses unknown keys and values)."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    names = sorted(p.name for p in FILES.glob("*.yaml"))
    assert set(names) == {*READ, *REFUSED, RECOMPUTE}
    for name in names:
        config_args.load_config_from_file(str(FILES / name))


@pytest.mark.parametrize("name", sorted(READ))
def test_each_file_maps_onto_convoys_settings_with_the_key_that_set_it(name):
    translated = read_accelerate_config(FILES / name)
    assert {m.name: m.value for m in translated.values} == READ[name]
    for mapped in translated.values:
        assert mapped.origin.startswith((f"{name}: ", "zero3.json: ", "zero2_optimizer.json: ")), mapped


def test_origins_name_the_key_as_the_file_writes_it():
    fsdp = read_accelerate_config(FILES / "fsdp1_questionnaire.yaml")
    assert fsdp.origin("strategy") == \
        "fsdp1_questionnaire.yaml: fsdp_config.fsdp_reshard_after_forward = SHARD_GRAD_OP"
    assert fsdp.origin("auto_wrap") == \
        "fsdp1_questionnaire.yaml: fsdp_config.fsdp_transformer_layer_cls_to_wrap = Block"
    hybrid = read_accelerate_config(FILES / "fsdp_hybrid_two_machines.yaml")
    assert hybrid.origin("parallelism") == "fsdp_hybrid_two_machines.yaml: fsdp_config.fsdp_sharding_strategy = " \
                                           "HYBRID_SHARD"
    assert hybrid.origin("num_processes") == "fsdp_hybrid_two_machines.yaml: num_processes = 8"
    ds = read_accelerate_config(FILES / "deepspeed_zero3_file.yaml")
    assert ds.origin("strategy") == "zero3.json: zero_optimization.stage = 3"
    assert "accepted, without effect" in " ".join(ds.notes) and "zero3_init_flag = true" in " ".join(ds.notes)
    c10d = read_accelerate_config(FILES / "multi_node_c10d.yaml")
    assert c10d.origin("rdzv_endpoint") == "multi_node_c10d.yaml: main_process_ip = head, main_process_port = 29400"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_convoy_cannot_run_is_one_line_naming_the_key(name):
    kind, words = REFUSED[name]
    with pytest.raises(kind) as caught:
        read_accelerate_config(FILES / name)
    assert words in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_dynamo_keys_are_compile_settings_with_the_key_that_set_them(tmp_path):
    regional = read_accelerate_config(FILES / "dynamo_regional.yaml")
    assert regional.origin("compile") == "dynamo_regional.yaml: dynamo_config.dynamo_use_regional_compilation = true"
    assert regional.origin("compile_mode") == "dynamo_regional.yaml: dynamo_config.dynamo_mode = max-autotune"
    assert any("fullgraph=True" in note for note in regional.notes)
    off = _write(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ndynamo_config:\n  dynamo_backend: 'NO'\n")
    assert read_accelerate_config(off).get("compile") is None
    legacy = _write(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ndynamo_backend: AOT_EAGER\n", "b.yaml")
    assert read_accelerate_config(legacy).value("compile_backend") == "aot_eager"
    bad = _write(tmp_path, "distributed_type: 'NO'\ndynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: fast\n",
                 "c.yaml")
    with pytest.raises(ConfigError) as caught:
        read_accelerate_config(bad)
    assert "c.yaml: dynamo_config.dynamo_mode = fast" in str(caught.value) and "\n" not in str(caught.value)


def test_activation_checkpointing_is_full_recompute():
    translated = read_accelerate_config(FILES / RECOMPUTE)
    assert translated.value("recompute") == "full"
    assert translated.origin("recompute") == f"{RECOMPUTE}: fsdp_config.fsdp_activation_checkpointing = true"


def _write(tmp_path, text, name="a.yaml"):
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.parametrize("text, words", [
    ("distributed_type: MULTI_GPU\nnum_procs: 2\n", "'num_procs' is not a key of Accelerate's config file"),
    ("num_processes: 2\n", "no distributed_type"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding: FULL_SHARD\n", "fsdp_config.'fsdp_sharding' is not"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: QUARTER_SHARD\n",
     "fsdp_sharding_strategy = QUARTER_SHARD: give one of FULL_SHARD"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 7\n", "(or its number 1-5)"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n", "fsdp_version = 3: give 1 or 2"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: maybe\n",
     "give true or false (FSDP2)"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n  fsdp_offload_params: true\n",
     "NO_SHARD keeps every parameter on the device"),
    ("distributed_type: FSDP\nnum_machines: 2\nnum_processes: 3\nfsdp_config:\n"
     "  fsdp_sharding_strategy: HYBRID_SHARD\n", "give num_processes, a multiple of 2"),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\nparallelism_config:\n"
     "  parallelism_config_dp_replicate_size: 4\n", "FSDP has no dimension to shard across"),
    ("distributed_type: MULTI_GPU\nparallelism_config:\n  parallelism_config_tp_size: 2\n",
     "Accelerate takes it with FSDP (fsdp_version 2) only"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 5\n", "give a ZeRO stage from 0 to 3"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n  offload_optimizer_device: cpu\n",
     "offloading needs stage 2 or 3"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: missing.json\n", "no such file"),
    ("distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: zero3.json\n",
     "give it in the JSON file only"),
    ("distributed_type: MULTI_GPU\ngpu_ids: first\n", "gpu_ids = first: give device indices"),
    ("distributed_type: MULTI_GPU\nnum_processes: -3\n", "num_processes = -3: give a whole number >= 1"),
    ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\n", "not on SageMaker"),
    ("distributed_type: MULTI_GPU\ntpu_use_cluster: true\n", "tpu_use_cluster = true: TPU pods"),
    ("distributed_type: MULTI_GPU\ndistributed_type: [\n", "not valid YAML"),
    ("- a list\n", "holds list"),
])
def test_malformed_files_are_one_line(tmp_path, text, words):
    (tmp_path / "zero3.json").write_text((FILES / "zero3.json").read_text())
    with pytest.raises((ConfigError, NotSupportedYetError)) as caught:
        read_accelerate_config(_write(tmp_path, text), cwd=tmp_path)
    assert words in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_deepspeed_json_values_win_and_auto_takes_the_rest(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}, '
                                      '"gradient_accumulation_steps": "auto", "fp16": {"enabled": false}}')
    translated = read_accelerate_config(_write(tmp_path, "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                                         "  deepspeed_config_file: ds.json\n"), cwd=tmp_path)
    values = {m.name: m.value for m in translated.values}
    assert values.pop("deepspeed_config") == json.loads((tmp_path / "ds.json").read_text())  # for the ranks, whole
    assert values == {"strategy": "zero1", "mixed_precision": "bf16"}
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2, "zero_quantized_weights": true}}')
    with pytest.raises(NotSupportedYetError, match="zero_optimization.zero_quantized_weights = true: ZeRO"):
        read_accelerate_config(tmp_path / "a.yaml", cwd=tmp_path)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "sparse_gradients_x": 1}')
    with pytest.raises(ConfigError, match="sparse_gradients_x = 1: convoy does not know this DeepSpeed key"):
        read_accelerate_config(tmp_path / "a.yaml", cwd=tmp_path)


def test_keys_that_change_nothing_are_accepted(tmp_path):
    text = ("compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\ndowncast_bf16: 'no'\n"
            "enable_cpu_affinity: true\nmain_training_function: train\nsame_network: true\ntpu_env: []\n"
            "tpu_use_cluster: false\ntpu_use_sudo: false\ndynamo_config: {}\nnum_processes: 2\n")
    translated = read_accelerate_config(_write(tmp_path, text))
    assert {m.name: m.value for m in translated.values} == {"strategy": "ddp", "num_processes": 2}


def test_the_table_covers_every_key_accelerate_writes():
    """Every ClusterConfig field is a top-level key here, and every FSDP key Accelerate's launcher copies has a row."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    assert set(config_args.ClusterConfig.__dataclass_fields__) == set(TOP_LEVEL_KEYS) - {"fp16", "dynamo_backend"}
    plugins = pytest.importorskip("accelerate.utils.dataclasses")
    fsdp_fields = set(plugins.FullyShardedDataParallelPlugin.__dataclass_fields__)
    assert {row.field for row in ROWS if row.block == "fsdp_config"} <= fsdp_fields
    ds_fields = set(plugins.DeepSpeedPlugin.__dataclass_fields__)
    assert {row.field for row in ROWS if row.block == "deepspeed_config" and row.field != "-"} <= ds_fields


@pytest.mark.parametrize("value, strategy", [("FULL_SHARD", "zero3"), (1, "zero3"), ("2", "zero2"), (3, "ddp"),
                                             ("hybrid_shard", "zero3"), (5, "zero2")])
def test_sharding_strategies_by_name_and_number(value, strategy):
    translated = fsdp_translation({"sharding_strategy": value}, cite=plugin_cite("P"), nodes=1, processes=2)
    assert translated.value("strategy") == strategy and translated.value("parallelism") is None


def test_accelerates_default_file_is_found_where_accelerate_looks(tmp_path):
    assert accelerate_default_config({"HF_HOME": str(tmp_path)}) == tmp_path / "accelerate" / "default_config.yaml"
    assert accelerate_default_config({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "huggingface" / "accelerate" / "default_config.yaml"
    assert accelerate_default_config({"HOME": str(tmp_path)}).name == "default_config.yaml"


@pytest.mark.parametrize("fp8_config, error, fragment", [
    ("{backend: MSAMP, optimization_level: O2}", NotSupportedYetError,
     "f.yaml: fp8_config.backend = MSAMP: MS-AMP fp8 is not in convoy; convoy's fp8 is torchao's: give backend AO"),
    ("{backend: AO, enable_fsdp_float8_all_gather: false}", NotSupportedYetError,
     "fp8_config.enable_fsdp_float8_all_gather = false: set it in the script (AORecipeKwargs("),
    ("{backend: AO, margin: 0}", ConfigError, "fp8_config.margin = 0: a Transformer Engine / MS-AMP key"),
    ("{backend: AO, bogus: 1}", ConfigError, "fp8_config.bogus = 1: not a key of Accelerate's fp8_config"),
    ("{backend: XLA}", ConfigError, "fp8_config.backend = XLA: give AO (torchao), TE or MSAMP"),
])
def test_fp8_config_keys_convoy_cannot_take_are_one_line(tmp_path, fp8_config, error, fragment):
    path = tmp_path / "f.yaml"
    path.write_text(f"distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp8\nfp8_config: {fp8_config}\n")
    with pytest.raises(error) as info:
        read_accelerate_config(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_fp8_config_maps_onto_mixed_precision_fp8_and_is_noted_when_unused(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp8\nfp8_config: {backend: AO}\n")
    translated = read_accelerate_config(path)
    assert translated.value("mixed_precision") == "fp8" and not translated.notes
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: bf16\nfp8_config: {backend: TE}\n")
    translated = read_accelerate_config(path)
    assert translated.value("mixed_precision") == "bf16"
    assert translated.notes == ("f.yaml: fp8_config = {...} is not used with mixed_precision bf16, as in accelerate "
                                "launch",)
    notes = read_accelerate_config(FILES / "fsdp2_fp8_ao.yaml").notes
    assert any("fp8_config.pad_inner_dim = true: convoy converts only linears whose dimensions are multiples of 16"
               in note for note in notes), notes
