"""torch.compile as a layout step (``Accelerator(compile=...)``): the same training compiled per block as in eager
mode, with every recompute mode and under each layout; the spellings that turn it on (Accelerate's included); one
line where it cannot run; graph breaks counted and a recompile after the first step named once.

Compiling costs 15-50 s per model on 2 cores: one tiny model per case, and inductor's cache in the test's own
directory. The multi-process layouts run ``scripts/compile_parity.py`` in two launched jobs.
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from convoy import Accelerator, TorchDynamoPlugin
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.launch.rank_env import convoy_env
from convoy.train.settings import resolve_settings
from tests.distributed import run_script
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

SCRIPT = Path(__file__).parent / "scripts" / "compile_parity.py"
LOGGER = "convoy.train.parallel.compile"


@pytest.fixture
def inductor_cache(tmp_path, monkeypatch):
    """Inductor's caches in this test's directory (not the user's /tmp/torchinductor_<user>)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "inductor"


def _train(start: TinyGPT, cfg: TinyConfig, steps: int, **kwargs) -> tuple[Accelerator, list[float], dict]:
    acc = Accelerator(cpu=True, **kwargs)
    model = copy.deepcopy(start)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = []
    for step in range(steps):
        x, y = batch(cfg, size=4, step=step % 3)
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return acc, losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_one_process_compiled_per_block_trains_as_eager_with_every_recompute_mode(inductor_cache, tmp_path):
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    _, eager, eager_state = _train(start, cfg, 7)
    for mode in ("none", "selective", "full"):
        steps = 7 if mode == "selective" else 3  # 7: the plan line comes after optimizer step 7
        acc, losses, state = _train(start, cfg, steps, compile="blocks", recompute=mode)
        blocks = [layer for layer in acc.unwrap_model(acc._models[0]).layers]
        assert all(getattr(b, "_compiled_call_impl", None) is not None for b in blocks), mode  # compiled in place
        assert max(abs(a - b) for a, b in zip(losses, eager, strict=False)) < 1e-6, (mode, losses, eager)
        assert list(state) == list(eager_state)  # names and state dict keys as in eager mode
        if steps == 7:
            gap = max((state[k] - eager_state[k]).abs().max().item() for k in state)
            assert gap < 1e-4, gap  # AdamW's normalised steps carry compile's last-bit differences into the weights
            acc.save_state(tmp_path / "ckpt")  # a compiled run's checkpoint: the keys an eager model loads
            again = Accelerator(cpu=True)
            fresh = TinyGPT(cfg)
            fresh, _ = again.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
            again.load_state(tmp_path / "ckpt")
            assert all(torch.equal(v, state[k]) for k, v in fresh.state_dict().items())
            # load_state stepped the optimizer once (DCP's _init_optim_state), which started the plan report's
            # operator counter (a dispatch mode, under which dynamo compiles nothing); freeing the run stops it
            again.free_memory()
            compiled = acc.plan_report().compiled
            found = re.fullmatch(r"compiled: (\d+) graphs?, 0 breaks", compiled)
            assert found and int(found[1]) >= 1, compiled


class _Breaking(nn.Module):
    """Two linears with a graph break between them (a print, a .item() branch, ... in a user's forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x).relu()
        torch._dynamo.graph_break()
        return self.second(h)


def test_graph_breaks_are_counted_and_a_recompile_after_the_first_step_is_named_once(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    torch.manual_seed(0)
    acc = Accelerator(cpu=True, compile="model", dynamo_backend="eager")  # dynamo alone: no code generation
    model = _Breaking()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def step(rows: int) -> None:
        acc.backward(model(torch.randn(rows, 4)).square().mean())
        opt.step()
        opt.zero_grad()

    for _ in range(7):
        step(8)
    found = re.fullmatch(r"compiled: (\d+) graphs?, (\d+) breaks?", acc.plan_report().compiled)
    assert found and int(found[1]) >= 2 and int(found[2]) >= 1, acc.plan_report().compiled
    assert not [r for r in caplog.records if r.name == LOGGER]  # one shape: compiled once
    step(3)  # a ragged last batch
    step(5)
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1, warned
    assert "compiled again after optimizer step 7" in warned[0] and "drop_last=True" in warned[0] and \
        "compile_dynamic=True" in warned[0] and "\n" not in warned[0], warned[0]


def test_compile_is_spelled_as_every_setting_and_a_bad_value_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert Accelerator(cpu=True, compile="blocks").settings.compile == "blocks"
    settings = resolve_settings(env={"CONVOY_COMPILE": "model", "CONVOY_COMPILE_BACKEND": "AOT_EAGER",
                                     "CONVOY_COMPILE_DYNAMIC": "true"}, cpu=True)
    assert (settings.compile, settings.compile_backend, settings.compile_dynamic) == ("model", "aot_eager", True)
    (tmp_path / "convoy.toml").write_text('compile = "blocks"\ncompile_mode = "max-autotune"\n')
    settings = resolve_settings(env={}, cpu=True)
    assert (settings.compile, settings.compile_mode, settings.compile_backend) == ("blocks", "max-autotune",
                                                                                  "inductor")
    from convoy.cli import launch
    from convoy.cli.main import _command_parser

    args = _command_parser("launch", launch).parse_args(["--compile", "blocks", "--compile-backend", "aot_eager",
                                                         "train.py"])
    request = launch.build_request(args)[0]
    assert convoy_env(request.settings)["CONVOY_COMPILE"] == "blocks"
    assert convoy_env(request.settings)["CONVOY_COMPILE_BACKEND"] == "aot_eager"
    for bad, said in (({"compile": "fast"}, "Accelerator(compile='fast')"),):
        with pytest.raises(ConfigError) as caught:
            Accelerator(cpu=True, **bad)
        assert said in str(caught.value) and "blocks" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"--compile: 'fast' is not valid; expected one of none, blocks, model"):
        launch.build_request(_command_parser("launch", launch).parse_args(["--compile", "fast", "train.py"]))


def test_accelerates_dynamo_arguments_map_onto_compile():
    regional = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="inductor", mode="max-autotune",
                                                                      use_regional_compilation=True))
    assert (regional.settings.compile, regional.settings.compile_mode) == ("blocks", "max-autotune")
    whole = Accelerator(cpu=True, dynamo_backend="AOT_EAGER")
    assert (whole.settings.compile, whole.settings.compile_backend) == ("model", "aot_eager")
    assert Accelerator(cpu=True, dynamo_backend="no").settings.compile == "none"
    assert Accelerator(cpu=True, compile="blocks", dynamo_plugin=TorchDynamoPlugin(
        backend="inductor", use_regional_compilation=True)).settings.compile == "blocks"
    with pytest.raises(ConfigError) as caught:
        Accelerator(cpu=True, compile="none", dynamo_backend="inductor")
    assert "Accelerator(compile='none') and Accelerator(dynamo_backend='inductor')" in str(caught.value)
    with pytest.raises(NotSupportedYetError, match=r"TorchDynamoPlugin\(options=.*not passed through yet"):
        TorchDynamoPlugin(backend="inductor", options={"triton.cudagraphs": True})


def test_what_cannot_compile_is_one_line():
    with pytest.raises(NotSupportedYetError) as caught:
        Accelerator(cpu=True, strategy="dp", compile="blocks").prepare(TinyGPT(TinyConfig()))
    assert "compile='blocks' with strategy='dp' is not supported yet" in str(caught.value)
    assert "\n" not in str(caught.value)


def _launched(tmp_path, layouts: list[str]) -> None:
    result = run_script(SCRIPT, nproc=2, args=layouts, timeout=280,
                        env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert result.returncode == 0, result.output
    for layout in layouts:
        name, _, mode = layout.partition("@")
        line = f" {name} recompute={mode} compiled:" if mode else f" {name} refused OK"
        assert sum(line in out for out in result.output.splitlines()) == 2, (layout, result.output)


@pytest.mark.slow
def test_ddp_and_offloaded_fsdp2_train_the_same_compiled_per_block_and_tp_is_refused(tmp_path):
    # the blocks of ddp and of zero2 with cpu offload are one graph (inductor's cache compiles it once); tensor
    # parallelism, with and without sequence parallelism, refused in one line
    _launched(tmp_path, ["tp=2", "tp=2+sp", "ddp@none", "zero2:offload@none"])


@pytest.mark.slow
def test_fsdp2_and_a_pipeline_stage_train_the_same_compiled_per_block_with_selective_recompute(tmp_path):
    # the pipeline's micro-batches have zero3's shapes, so its recomputed blocks come from inductor's cache; the
    # one-process test runs recompute none, selective and full
    _launched(tmp_path, ["zero3@selective", "pp=2@selective"])
