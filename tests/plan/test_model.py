"""Model descriptions: closed forms against the published parameter counts, factories on the meta device."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from convoy.errors import NotSupportedYetError, PlanError
from convoy.plan.model import from_factory, from_hf_config, from_numbers, resolve_model

CONFIGS = Path(__file__).parent / "configs"


@pytest.mark.parametrize("name,params", [
    ("llama2_7b", 6_738_415_616),     # Llama-2-7b-hf model card / sum of safetensors shapes
    ("llama2_70b", 68_976_648_192),   # Llama-2-70b-hf (grouped-query attention, 8 kv heads)
    ("gpt2", 124_439_808),            # GPT2LMHeadModel.num_parameters() (tied head)
    ("qwen2_0_5b", 494_032_768),      # Qwen2-0.5B (qkv bias, tied embeddings)
    ("pythia_160m", 162_322_944),     # Pythia paper, table of models ("total params"; untied embed_out)
    ("pythia_410m", 405_334_016),
])
def test_closed_forms_match_published_counts(name, params):
    spec = from_hf_config(CONFIGS / f"{name}.json")
    assert spec.num_params == params
    assert spec.has_shape and spec.layer_params * spec.num_layers < params


def test_configs_record_the_block_layout_for_activations():
    gpt2, llama, neox = (from_hf_config(CONFIGS / f"{n}.json") for n in ("gpt2", "llama2_70b", "pythia_410m"))
    assert (gpt2.family, gpt2.activation, gpt2.dropout) == ("gpt2", "gelu_new", 0.1)  # GPT-2's pdrop defaults
    assert (llama.family, llama.gated_mlp, llama.kv_heads, llama.dropout) == ("llama", True, 8, 0.0)
    assert (neox.family, neox.parallel_residual, neox.activation) == ("gpt_neox", True, "gelu")
    assert from_hf_config({**json.loads((CONFIGS / "gpt2.json").read_text()), "resid_pdrop": 0.0,
                           "attn_pdrop": 0.0, "embd_pdrop": 0.0}).dropout == 0.0


def test_config_directory_and_dict_work():
    by_dir = from_hf_config(CONFIGS.parent / "configs" / "llama2_7b.json")
    as_dict = from_hf_config(json.loads((CONFIGS / "llama2_7b.json").read_text()))
    assert by_dir.num_params == as_dict.num_params


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        from_hf_config(bad)
    with pytest.raises(NotSupportedYetError, match="mixture-of-experts"):
        from_hf_config(CONFIGS / "mixtral.json")
    partial = tmp_path / "partial.json"
    partial.write_text('{"model_type": "llama", "hidden_size": 64}')
    with pytest.raises(PlanError, match="lacks 'intermediate_size'"):
        from_hf_config(partial)


def test_other_model_types_without_and_with_transformers(monkeypatch):
    """A model_type without a closed form is built by transformers when it is installed (as on a GPU machine's
    image); whether it is or not, what cannot be built is one ConvoyError, never transformers' own exception."""
    import importlib.machinery
    import types

    config = {"model_type": "no-such-family", "hidden_size": 64}
    fake = types.ModuleType("transformers")
    fake.__spec__ = importlib.machinery.ModuleSpec("transformers", loader=None)

    class AutoConfig:
        @staticmethod
        def for_model(model_type, **kwargs):
            raise ValueError(f"Unrecognized model identifier: {model_type}. Should contain one of ...\nmore")

    fake.AutoConfig, fake.AutoModelForCausalLM = AutoConfig, object
    monkeypatch.setitem(sys.modules, "transformers", fake)
    with pytest.raises(PlanError, match=r"transformers cannot build .*'no-such-family'.*ValueError: Unrecognized"):
        from_hf_config(config)
    monkeypatch.setitem(sys.modules, "transformers", None)  # installed, but its import fails
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: fake.__spec__)
    with pytest.raises(NotSupportedYetError, match="transformers cannot be imported"):
        from_hf_config(config)
    monkeypatch.delitem(sys.modules, "transformers")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(NotSupportedYetError, match="transformers is not installed"):
        from_hf_config(config)


@pytest.mark.parametrize("name", ["llama2_7b", "llama2_70b", "gpt2", "pythia_160m", "pythia_410m", "qwen2_0_5b"])
def test_real_models_given_by_numbers_fit_their_shape(name):
    """A real model's own count and shape pass, with or without --ffn and --vocab (the 4h MLP assumed)."""
    spec = from_hf_config(CONFIGS / f"{name}.json")
    shape = dict(layers=spec.num_layers, hidden=spec.hidden, heads=spec.heads)
    assert from_numbers(spec.num_params, **shape).num_params == spec.num_params
    assert from_numbers(spec.num_params, **shape, kv_heads=spec.kv_heads, ffn=spec.ffn, vocab=spec.vocab)
    assert resolve_model(CONFIGS / f"{name}.json", params=spec.num_params * 1.1).num_params > spec.num_params


def test_heads_given_as_numbers_divide_the_hidden_size_as_in_a_config():
    """--params 7e9 --layers 32 --hidden 4096 --heads 7 was planned (every tp layout silently dropped: tp divides
    the heads) while the same shape in a config.json is refused: one rule for both."""
    llama = json.loads((CONFIGS / "llama2_7b.json").read_text())
    with pytest.raises(PlanError, match="hidden_size 4096 is not a multiple of num_attention_heads 7"):
        from_hf_config({**llama, "num_attention_heads": 7, "num_key_value_heads": 7})
    with pytest.raises(PlanError, match="--hidden 4096 is not a multiple of --heads 7: .* such as 8$"):
        from_numbers(7e9, layers=32, hidden=4096, heads=7)
    gpt2 = str(CONFIGS / "gpt2.json")  # over a config: the number given and the config's, each named
    with pytest.raises(PlanError, match=r"^hidden 768 \(of '.*gpt2.json'\) is not a multiple of --heads 7"):
        resolve_model(gpt2, heads=7)
    with pytest.raises(PlanError, match=r"^--hidden 1000 is not a multiple of heads 12 .* --hidden a multiple of "
                                        r"12, such as 996$"):
        resolve_model(gpt2, hidden=1000, params=1.3e8)
    assert from_numbers(7e9, layers=32, hidden=4096, heads=32).heads == 32
    assert resolve_model(gpt2, heads=8).heads == 8 and resolve_model(gpt2, vocab=50000).heads == 12


@pytest.mark.parametrize("numbers, words", [
    # 70e9 parameters in two blocks of hidden 64: the shape holds about 1e5; MFU came out at 279 %
    (dict(params=7e10, layers=2, hidden=64, heads=1, vocab=100), ["--params 7e+10", "--layers 2", "--vocab 100",
                                                                  "5.24e+04 to 9.36e+06"]),
    # a million parameters cannot hold 80 blocks of hidden 8192 (nor the 128000 x 8192 embedding alone)
    (dict(params=1e6, layers=80, hidden=8192, heads=64, vocab=128000), ["--params 1e+06", "--hidden 8192"]),
    (dict(params=1e6, hidden=8192, vocab=128000), ["at least 5.24e+08"]),
    # far more than any mixture of experts of that shape holds; --ffn and --vocab are suggested
    (dict(params=8.5e13, layers=28, hidden=3072, heads=16, vocab=256000), ["--ffn when its MLP is not 4 x hidden"]),
])
def test_a_count_its_shape_cannot_hold_is_refused(numbers, words):
    with pytest.raises(PlanError, match="cannot describe one model") as err:
        from_numbers(**numbers)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_mixture_of_experts_or_a_lighter_block_is_planned_by_its_numbers():
    """The planner times the dense shape; a count above it is the experts' (or a second stack's) weights, and
    below it a block lighter than a transformer's: both are planned, not refused."""
    mixtral = from_numbers(46.7e9, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000)
    deepseek_v3 = from_numbers(6.71e11, layers=61, hidden=7168, heads=128, ffn=18432, vocab=129280)
    mamba = from_numbers(2.77e9, layers=64, hidden=2560, heads=32, vocab=50280)
    assert (mixtral.num_params, deepseek_v3.num_params, mamba.num_params) == (46.7e9, 6.71e11, 2.77e9)


def test_overrides_that_contradict_a_config_are_refused():
    with pytest.raises(PlanError, match=r"--params 7e\+13 over '.*llama2_7b.json' cannot describe one model"):
        resolve_model(CONFIGS / "llama2_7b.json", params=7e13)
    with pytest.raises(PlanError, match=r"not the 6.74e\+09 of .*; give --params with --hidden, or leave --hidden out"):
        resolve_model(CONFIGS / "llama2_7b.json", hidden=64)
    assert from_numbers(8.5e9, layers=28, hidden=3072, heads=16, vocab=256000, ffn=24576).ffn == 24576


def test_numbers_and_overrides():
    spec = from_numbers(7.5e9, layers=32, hidden=4096, heads=32, vocab=32000)
    assert spec.num_params == 7_500_000_000 and spec.layer_params == (7_500_000_000 - 32000 * 4096) // 32
    with pytest.raises(PlanError, match="positive"):
        from_numbers(-1)
    over = resolve_model(CONFIGS / "gpt2.json", heads=16)
    assert over.heads == 16 and over.num_params == 124_439_808
    with pytest.raises(PlanError, match="unknown model field"):
        resolve_model(CONFIGS / "gpt2.json", depth=3)
    with pytest.raises(PlanError, match="no model given"):
        resolve_model(None)


FACTORY = '''
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, h, n_head):
        super().__init__()
        self.n_head = n_head
        self.attn = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.blocks = nn.ModuleList(Block(64, 4) for _ in range(3))
        self.head = nn.Linear(64, 1000, bias=False)
        self.head.weight = self.emb.weight   # tied: counted once

def build():
    net = Net()
    assert next(net.parameters()).is_meta
    return net

def not_a_module():
    return 3
'''


def test_factory_is_built_on_meta_and_counted_exactly(tmp_path):
    path = tmp_path / "tiny_factory.py"
    path.write_text(FACTORY)
    spec = from_factory(f"{path}:build")
    block = (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64)
    assert spec.num_params == 1000 * 64 + 3 * block
    assert (spec.num_layers, spec.hidden, spec.heads, spec.vocab, spec.layer_params) == (3, 64, 4, 1000, block)
    assert (spec.ffn, spec.gated_mlp, spec.kv_heads) == (256, False, None)  # a plain 4h MLP; q, k, v fused
    with pytest.raises(PlanError, match="not a torch.nn.Module"):
        from_factory(f"{path}:not_a_module")
    with pytest.raises(PlanError, match="no function"):
        from_factory(f"{path}:missing")
    with pytest.raises(PlanError, match="MODULE:FUNCTION"):
        from_factory("justaname:")
    with pytest.raises(PlanError, match="cannot import"):
        from_factory("no_such_package_xyz.mod:build")


def test_a_plain_llama_style_module_is_read_with_its_kv_heads_and_gated_mlp():
    """A model written in plain PyTorch (torchtitan's, the step benchmark's) has no config: the plan report read
    it as 4h GELU with no heads and planned 29.3 GiB where an H200 measured 40-48 GiB. Its heads, KV heads and
    SwiGLU width are read off the modules; the memory is then the config's."""
    import torch
    from torch import nn

    from convoy.plan.memory import Layout, memory_per_gpu
    from convoy.plan.model import describe_module
    from convoy.plan.run import RunSpec

    class Block(nn.Module):
        def __init__(self, h, heads, kv_heads, ffn):
            super().__init__()
            self.heads, self.kv_heads = heads, kv_heads
            self.wq, self.wo = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
            self.wk = nn.Linear(h, kv_heads * h // heads, bias=False)
            self.wv = nn.Linear(h, kv_heads * h // heads, bias=False)
            self.w1, self.w3 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
            self.w2 = nn.Linear(ffn, h, bias=False)
            self.norms = nn.ModuleList([nn.RMSNorm(h), nn.RMSNorm(h)])

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32000, 1024)
            self.layers = nn.ModuleList(Block(1024, 16, 4, 2816) for _ in range(4))
            self.norm = nn.RMSNorm(1024)
            self.output = nn.Linear(1024, 32000, bias=False)

    with torch.device("meta"):
        spec = describe_module(Llama(), name="Llama")
    assert (spec.num_layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.gated_mlp, spec.activation) == \
        (4, 1024, 16, 4, 2816, True, "silu")
    config = resolve_model({"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4,
                            "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
                            "vocab_size": 32000, "tie_word_embeddings": False})
    assert spec.num_params == config.num_params
    run, layout = RunSpec(seq_len=2048, micro_batch=4, precision="bf16", recompute="selective"), Layout()
    planned, wanted = memory_per_gpu(spec, run, layout).allocated, memory_per_gpu(config, run, layout).allocated
    assert abs(planned / wanted - 1) < 0.03, (planned, wanted)

    class Expert(nn.Module):  # a mixture of plain GELU experts: two of them are not a gate and an up
        def __init__(self, h, f):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(h, f), nn.Linear(f, h)

    class MoeBlock(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.num_heads = 4
            self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.experts = nn.ModuleList(Expert(h, 4 * h) for _ in range(4))

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 64)
            self.layers = nn.ModuleList(MoeBlock(64) for _ in range(2))

    with torch.device("meta"):
        moe = describe_module(Moe(), name="Moe")
    assert (moe.ffn, moe.gated_mlp, moe.activation) == (256, False, "gelu")


def test_a_bare_parameter_count_gets_the_usual_shape_and_says_so():
    """`convoy plan --params 7e9` had no shape: no activations, ZeRO-3 buffers of whole models, offload needing
    more GPU memory than no offload. A count alone now plans with Llama-2's blocks at hidden = 128 x layers, and
    the model line says the shape was derived."""
    from convoy.plan.model import resolve_model

    spec = resolve_model(params=7e9)
    assert (spec.hidden, spec.heads, spec.ffn, spec.vocab) == (4096, 32, 11008, 32000)
    assert 32 <= spec.num_layers <= 34 and spec.has_shape and "derived from the parameter count" in spec.source
    for count, hidden, layers in ((13e9, 5120, 40), (175e9, 12288, 96)):  # Llama-2-13B's and GPT-3's shapes
        derived = resolve_model(params=count)
        assert derived.hidden == hidden and abs(derived.num_layers - layers) <= 2, derived
    assert resolve_model(params=7e9, layers=32).num_layers == 32  # numbers given are kept
    assert resolve_model(params=7e9, hidden=4096, heads=64).heads == 64
    assert resolve_model(params=1e6).vocab is None  # too small for a 32,000-word table: blocks only
    with pytest.raises(PlanError, match="--layers 1000"):
        resolve_model(params=1e6, layers=1000)
