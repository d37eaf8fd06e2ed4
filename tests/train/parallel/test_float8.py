"""float8 training (``mixed_precision="fp8"``, torchao's ``Float8Linear``) on the CPU: each recipe's numerics against
bf16 with fp8's tolerances, in torchao's emulation and with the real ``torch._scaled_mm`` (which torch 2.13 runs on
the CPU); which linears convert; a tiny model trained through the Accelerator; zero3 with float8 all-gather on two
gloo ranks; a pp=2 pipeline against its bf16 run; checkpoints; and every refusal as one line. Speed needs a GPU
with float8 tensor cores (docs/performance.md).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchao.float8")

from convoy import Accelerator, AORecipeKwargs
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.train.parallel.float8 import (
    Float8Training,
    apply_float8,
    check_float8_board,
    float8_config,
    float8_filter,
    refuse_float8_tp,
)
from convoy.train.process_view import AcceleratorState
from tests.distributed import run_script
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_float8.py"
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
CFG = TinyConfig(vocab=64, dim=32, heads=4, layers=2, hidden=64, seq=16)


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("emulate", [True, False], ids=["emulated", "scaled_mm"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_computes_a_layer_within_fp8_tolerance_of_bf16(recipe, emulate):
    """Output, input gradient and weight gradient of a 2-layer MLP: ~5e-2 from bf16, as float8's 3 mantissa bits
    give; more than 1e-2, so float8 really ran (bf16 alone is ~4e-3 from fp32)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.Linear(64, 16))
    model = copy.deepcopy(ref)
    converted = apply_float8(model, Float8Training(recipe=recipe, emulate=emulate))
    assert converted == ["0", "2"]  # the head (the last linear) stays whole
    x = torch.randn(32, 64)
    outs, grads = [], []
    for net in (model, ref):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net[:3](xi)
        out.float().square().sum().backward()
        outs.append(out)
        grads.append((xi.grad, net[0].weight.grad))
    errors = [_relative(outs[0], outs[1]), _relative(grads[0][0], grads[1][0]), _relative(grads[0][1], grads[1][1])]
    assert all(1e-2 < e < 0.1 for e in errors), errors


def test_the_head_and_dims_that_are_not_multiples_of_16_stay_high_precision():
    model = TinyGPT(TinyConfig(vocab=64, dim=32, heads=4, layers=1, hidden=40))
    keep = float8_filter(model)
    chosen = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and keep(m, name)]
    assert chosen == ["layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj",
                      "layers.0.self_attn.o_proj"]  # the MLP's hidden 40 is not a multiple of 16; lm_head is the head
    tied = TinyGPT(TinyConfig(vocab=64, dim=32, heads=4, layers=1, hidden=64, tied=True))
    tied.extra = nn.Linear(32, 32)  # registered after the head: the last linear, but the tied one is still skipped
    keep = float8_filter(tied)
    assert not keep(tied.lm_head, "lm_head") and not keep(tied.extra, "extra")
    assert keep(tied.layers[0].mlp.up_proj, "layers.0.mlp.up_proj")
    untied = TinyGPT(TinyConfig(vocab=64, dim=32, heads=4, layers=1, hidden=64))
    untied.value_head = nn.Linear(32, 16)  # after lm_head: the last linear; lm_head is still the output head
    keep = float8_filter(untied)
    assert not keep(untied.lm_head, "lm_head") and not keep(untied.value_head, "value_head")


def test_a_users_filter_narrows_the_choice_with_accelerates_semantics():
    model = TinyGPT(CFG)
    converted = apply_float8(model, Float8Training(module_filter=lambda module, fqn: "mlp" in fqn))
    assert converted == [f"layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")]
    assert type(model.lm_head) is nn.Linear and type(model.layers[0].self_attn.q_proj) is nn.Linear
    with pytest.raises(ConfigError, match="module_filter_func=3: give a function"):
        Float8Training(module_filter=3)  # type: ignore[arg-type]


def test_fsdp_all_gather_in_float8_only_for_tensorwise_under_fsdp():
    assert float8_config(Float8Training(), fsdp=True).enable_fsdp_float8_all_gather
    assert not float8_config(Float8Training(), fsdp=False).enable_fsdp_float8_all_gather
    assert not float8_config(Float8Training(recipe="rowwise"), fsdp=True).enable_fsdp_float8_all_gather
    assert not float8_config(Float8Training(fsdp_float8_all_gather=False), fsdp=True).enable_fsdp_float8_all_gather
    assert float8_config(Float8Training(emulate=True), fsdp=False).emulate


def _train(mixed_precision: str, steps: int = 4, **kwargs) -> tuple[Accelerator, nn.Module, list[float]]:
    torch.manual_seed(0)
    acc = Accelerator(cpu=True, mixed_precision=mixed_precision, **kwargs)
    model = TinyGPT(CFG)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    losses = []
    for step in range(steps):
        x, y = batch(CFG, size=8, step=step)
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return acc, model, losses


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_tiny_model_trains_like_bf16_through_the_accelerator(recipe):
    _, _, bf16 = _train("bf16")
    AcceleratorState._reset_state()
    acc, model, fp8 = _train("fp8", fp8_recipe=recipe, fp8_emulate=True)
    assert (acc.mixed_precision, acc.fp8_backend, acc.settings.fp8_recipe) == ("fp8", "AO", recipe)
    assert isinstance(acc.fp8_recipe_handler, AORecipeKwargs)
    assert type(model.layers[0].mlp.up_proj).__name__ == "Float8Linear" and type(model.lm_head) is nn.Linear
    diffs = [abs(a - b) / b for a, b in zip(fp8, bf16)]
    assert max(diffs) < 1e-3 and fp8 != bf16, (fp8, bf16)


def test_recompute_of_float8_blocks_trains_bit_for_bit_as_without():
    """float8 comes first, recompute after (torchtitan's order): the recomputed forward casts again, to the same
    float8 values."""
    _, _, plain = _train("fp8", steps=3, fp8_emulate=True)
    for mode in ("selective", "full"):
        AcceleratorState._reset_state()
        _, model, got = _train("fp8", steps=3, fp8_emulate=True, recompute=mode)
        assert got == plain, (mode, got, plain)
        assert type(model.layers[0].mlp.up_proj).__name__ == "Float8Linear"


def test_bf16_runs_have_no_fp8_handler():
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    assert (acc.fp8_recipe_handler, acc.fp8_backend) == (None, "NO")


def test_a_checkpoint_holds_the_high_precision_weights_under_the_models_names(tmp_path):
    acc, model, _ = _train("fp8", steps=2, fp8_emulate=True, project_dir=str(tmp_path))
    state = acc.get_state_dict(model)
    assert list(state) == list(TinyGPT(CFG).state_dict()) and {v.dtype for v in state.values()} == {torch.float32}
    saved = acc.save_state()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(saved)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_an_ao_recipe_handler_sets_the_config_and_the_filter():
    from torchao.float8 import Float8LinearConfig

    handler = AORecipeKwargs(config=Float8LinearConfig.from_recipe_name("rowwise"),
                             module_filter_func=lambda module, fqn: fqn.endswith("down_proj"))
    acc, model, _ = _train("fp8", steps=1, fp8_emulate=True, kwargs_handlers=[handler])
    assert acc.fp8_recipe_handler is handler
    converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    assert converted == ["layers.0.mlp.down_proj", "layers.1.mlp.down_proj"]
    assert model.layers[0].mlp.down_proj.config.round_scales_to_power_of_2  # the rowwise config given


def test_accelerates_own_ao_handler_is_taken():
    accelerate_utils = pytest.importorskip("accelerate.utils")
    handler = accelerate_utils.AORecipeKwargs(module_filter_func=lambda module, fqn: "self_attn" in fqn)
    _, model, _ = _train("fp8", steps=1, fp8_emulate=True, kwargs_handlers=[handler])
    assert type(model.layers[0].self_attn.q_proj).__name__ == "Float8Linear"
    assert type(model.layers[0].mlp.up_proj) is nn.Linear


@pytest.mark.slow
def test_zero3_gathers_float8_weights_on_two_ranks_and_saves_high_precision(tmp_path):
    result = run_script(SCRIPT, nproc=2, args=[str(tmp_path / "ckpt")], timeout=240)
    assert result.returncode == 0, result.output
    for line in ("gathers float8 with precomputed scales OK", "losses within fp8 tolerance of bf16 OK",
                 "checkpoint round trip OK"):
        assert sum(line in out for out in result.output.splitlines()) == 2, result.output


@pytest.mark.slow
@pytest.mark.parametrize("layout, nproc", [("pp", 2), ("fsdp", 4)], ids=["pp2", "dp2_fsdp_x_pp2"])
def test_a_pipeline_runs_float8_stages_within_fp8_tolerance_of_its_bf16_run(layout, nproc):
    """pp=2: the model's Float8Linear on each stage, the head high precision, losses within 1e-3 of bf16; with FSDP2
    per stage (dp=2 x pp=2) the stages' weights are gathered in float8 with scales precomputed after each step."""
    result = run_script(Path(__file__).parent / "scripts" / "pp_float8.py", nproc=nproc,
                        args=["fsdp"] if layout == "fsdp" else [], timeout=300)
    assert result.returncode == 0, result.output
    lines = ["float8 stages OK", "losses within fp8 tolerance of the bf16 pipeline OK"]
    if layout == "fsdp":
        lines.append("gathers float8 with precomputed scales per stage OK")
    for line in lines:
        assert sum(line in out for out in result.output.splitlines()) == nproc, result.output


# --- refusals: one line each ---------------------------------------------------------------------------------------


def _one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def test_fp8_on_a_board_without_float8_tensor_cores_is_refused_unless_emulated():
    with pytest.raises(NotSupportedYetError) as info:
        Accelerator(cpu=True, mixed_precision="fp8")
    text = _one_line(info)
    assert "the CPU has no float8 tensor cores" in text and "Accelerator(fp8_emulate=True)" in text
    check_float8_board("cpu", emulate=True)  # asked for: runs


def test_fp8_emulate_from_the_environment(monkeypatch):
    monkeypatch.setenv("CONVOY_MIXED_PRECISION", "fp8")
    monkeypatch.setenv("CONVOY_FP8_EMULATE", "1")
    monkeypatch.setenv("CONVOY_FP8_RECIPE", "rowwise_with_gw_hp")
    acc = Accelerator(cpu=True)
    assert (acc.mixed_precision, acc.settings.fp8_recipe, acc.settings.fp8_emulate) == \
        ("fp8", "rowwise_with_gw_hp", True)


def test_without_torchao_fp8_is_one_line_with_the_install_command(monkeypatch):
    class NoTorchao:  # what a Python without torchao says to ``import torchao.float8``
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "torchao":
                raise ModuleNotFoundError("No module named 'torchao'", name="torchao")

    for name in [name for name in sys.modules if name == "torchao" or name.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoTorchao, *sys.meta_path])
    with pytest.raises(NotSupportedYetError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", fp8_emulate=True)
    assert _one_line(info) == "mixed_precision='fp8' needs torchao: pip install 'convoy[fp8]'"


def test_a_torchao_that_cannot_be_imported_is_named_with_its_error_and_this_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # torchao is there, its float8 fails to import
    with pytest.raises(NotSupportedYetError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", fp8_emulate=True)
    line = _one_line(info)
    assert line.startswith("mixed_precision='fp8': torchao 0.18.0 is installed but cannot be imported with "
                           f"torch {torch.__version__} ("), line
    assert "torchao.float8" in line and line.endswith("install the torchao release made for this torch "
                                                      "(convoy[fp8] pins torchao 0.18.0, for torch 2.11 to 2.13)")


@pytest.mark.parametrize("name, backend", [("TERecipeKwargs", "Transformer Engine"), ("MSAMPRecipeKwargs", "MS-AMP"),
                                           ("FP8RecipeKwargs", "Transformer Engine / MS-AMP")])
def test_other_fp8_backends_handlers_are_refused(name, backend):
    handler = type(name, (), {})()  # Accelerate's classes, by name: a script imports them from accelerate.utils
    with pytest.raises(NotSupportedYetError) as info:
        Accelerator(cpu=True, mixed_precision="fp8", fp8_emulate=True, kwargs_handlers=[handler])
    assert f"{name} ({backend} fp8) is not supported by convoy" in _one_line(info)


def test_an_ao_handler_without_fp8_is_refused():
    with pytest.raises(ConfigError) as info:
        Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()])
    assert "AORecipeKwargs configures fp8; give mixed_precision='fp8'" in _one_line(info)
    with pytest.raises(ConfigError) as info:
        Accelerator(cpu=True, mixed_precision="bf16", fp8_recipe="rowwise")
    assert _one_line(info) == ("Accelerator(fp8_recipe='rowwise') configures fp8; give mixed_precision='fp8' with it "
                               "(this run's is 'bf16')")
    with pytest.raises(ConfigError, match="AORecipeKwargs\\(config='rowwise'\\): give a torchao"):
        AORecipeKwargs(config="rowwise")


def test_float8_tensor_parallel_on_gloo_is_refused():
    with pytest.raises(NotSupportedYetError) as info:
        refuse_float8_tp(Float8Training(), backend=None, device_type="cpu")
    assert "gloo cannot all-gather float8 tensors ('Invalid scalar type')" in _one_line(info)
    refuse_float8_tp(None, backend=None, device_type="cpu")  # not fp8: nothing to refuse
    refuse_float8_tp(Float8Training(), backend="nccl", device_type="cuda")  # a GPU job: torchao's float8 TP styles


def test_float8_tensor_parallel_is_refused_before_the_model_is_touched():
    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.parallel import TensorParallelStrategy

    settings = resolve_settings(explicit={"mixed_precision": "fp8", "fp8_emulate": True, "strategy": "tp"},
                                env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                     "MASTER_PORT": "29999", "CONVOY_PARALLELISM": "tp=2"}, cpu=True)
    strategy = TensorParallelStrategy(settings)
    model = TinyGPT(CFG)
    with pytest.raises(NotSupportedYetError, match="tensor parallel \\(tp > 1\\) runs on GPUs only"):
        strategy._convert_layers(model)
    assert type(model.layers[0].mlp.up_proj) is nn.Linear


def test_fp8_with_data_parallel_threads_is_refused_with_the_reason():
    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.dp import DataParallelStrategy

    settings = resolve_settings(explicit={"mixed_precision": "fp8", "fp8_emulate": True, "strategy": "dp"}, env={},
                                cpu=True)
    with pytest.raises(NotSupportedYetError) as info:
        DataParallelStrategy(settings).setup_environment()
    assert "replica in a thread where autocast computes in fp16, not bf16" in _one_line(info)
    assert "use strategy='ddp'" in str(info.value)


@pytest.mark.parametrize("recipe, float8_styles", [("tensorwise", True), ("rowwise", False)])
def test_tensor_parallel_gives_tensorwise_float8_linears_torchaos_float8_styles(recipe, float8_styles):
    """On GPUs (NCCL), a tensorwise ``Float8Linear`` is split with ``Float8ColwiseParallel``/``Float8RowwiseParallel``
    (its activations cross the tp group in float8); rowwise ones keep torch's styles (bf16 traffic), as torchtitan."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    from convoy.train.parallel.styles import style_object

    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 16))
    apply_float8(model, Float8Training(recipe=recipe))
    colwise, rowwise = style_object("colwise", model[0], False), style_object("rowwise", model[1], False)
    assert isinstance(colwise, Float8ColwiseParallel) is float8_styles and isinstance(colwise, ColwiseParallel)
    assert isinstance(rowwise, Float8RowwiseParallel) is float8_styles and isinstance(rowwise, RowwiseParallel)
    assert not isinstance(style_object("colwise_rep", model[2], False), Float8ColwiseParallel)  # the head: plain
