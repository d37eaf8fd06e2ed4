"""A DeepSpeed config's ``optimizer`` / ``scheduler`` sections built for Accelerate's ``DummyOptim`` /
``DummyScheduler``: the same losses as a hand-built torch AdamW on the same schedule, on 1 and 2 CPU processes
(tests/train/scripts/deepspeed_sections.py), and one line for what convoy does not build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from convoy import Accelerator, DeepSpeedPlugin, PartialState
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.utils import DummyOptim, DummyScheduler
from tests.distributed import run_script
from tests.train.test_scripts import SCRIPTS

pytestmark = pytest.mark.usefixtures("accelerator_in_this_process")


@pytest.mark.parametrize("nproc, kind", [(1, "WarmupDecayLR"), (2, "WarmupCosineLR")])
def test_placeholders_train_as_the_hand_built_optimizer_and_schedule(nproc, kind):
    result = run_script(SCRIPTS / "deepspeed_sections.py", nproc=nproc, args=[kind])
    assert result.returncode == 0, result.output[-4000:]
    assert result.output.count(f"DS SECTIONS OK {kind}") == nproc, result.output[-3000:]


def _prepare(ds: dict, **optim: float):
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds))
    model = torch.nn.Linear(2, 1)
    optimizer = DummyOptim(model.parameters(), **optim)
    return accelerator.prepare(model, optimizer, DummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=4))


def test_auto_values_are_filled_as_accelerate_and_the_json_wins():
    ds = {"optimizer": {"type": "Adam", "params": {"lr": "auto", "weight_decay": 0.5, "adam_w_mode": False}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "warmup_max_lr": "auto"}}}
    _, optimizer, scheduler = _prepare(ds, lr=0.2, weight_decay=0.1)
    inner = optimizer.optimizer
    assert type(inner) is torch.optim.Adam and inner.defaults["weight_decay"] == 0.5, inner  # adam_w_mode false
    lrs = []
    for _ in range(6):
        lrs.append(inner.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # warmup over DummyScheduler's 4 steps to DummyOptim's lr (log warmup: 0 at the first two steps)
    assert lrs[:2] == [0.0, 0.0] and 0 < lrs[2] < lrs[3] < 0.2 and lrs[5] == pytest.approx(0.2), lrs


@pytest.mark.parametrize("ds, error, words", [
    ({"optimizer": {"type": "SGD", "params": {}}}, NotSupportedYetError, "convoy builds AdamW and Adam optimizers"),
    ({"scheduler": {"type": "OneCycle", "params": {}}}, NotSupportedYetError, "WarmupCosineLR schedules"),
    ({"optimizer": "AdamW"}, ConfigError, "give an object with 'type' and 'params'"),
])
def test_a_section_convoy_does_not_build_is_one_line(ds, error, words):
    with pytest.raises(error, match=words) as caught:
        DeepSpeedPlugin(hf_ds_config=ds)
    assert "\n" not in str(caught.value)


def test_a_placeholder_without_its_section_is_one_line():
    with pytest.raises(ConfigError, match="has no 'optimizer' section"):
        _prepare({"zero_optimization": {"stage": 0}})
    with pytest.raises(ConfigError, match="optimizer.params.foo: convoy builds AdamW"):
        _prepare({"optimizer": {"type": "AdamW", "params": {"foo": 1}}, "scheduler": {"type": "WarmupLR"}})


def test_a_section_and_the_scripts_own_optimizer_are_one_line_as_in_accelerate():
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}))
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="config's 'optimizer' section and the script's own optimizer: give one"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


#: an Accelerate file's DeepSpeed JSON as `convoy launch --config_file` hands it to the ranks
LAUNCHED = {"zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": "auto"}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 0.02,
                                                         "warmup_type": "linear"}}}


def test_the_launchers_deepspeed_file_is_the_states_plugin_and_builds_the_placeholders(monkeypatch):
    monkeypatch.setenv("CONVOY_DEEPSPEED_CONFIG", json.dumps(LAUNCHED))
    accelerator = Accelerator()
    plugin = accelerator.state.deepspeed_plugin
    assert plugin is not None and accelerator.deepspeed_plugin is plugin
    # what Accelerate's deepspeed_with_config_support.py reads: the sections, and the accumulation steps filled
    assert "optimizer" in plugin.deepspeed_config and "scheduler" in plugin.deepspeed_config
    assert (plugin.zero_stage, plugin.deepspeed_config["gradient_accumulation_steps"]) == (1, 1)
    model = torch.nn.Linear(2, 1)
    optimizer = DummyOptim(model.parameters(), lr=1.0, weight_decay=0.25)
    _, optimizer, scheduler = accelerator.prepare(model, optimizer, DummyScheduler(optimizer, warmup_num_steps=9))
    inner = optimizer.optimizer
    assert type(inner) is torch.optim.AdamW and inner.defaults["weight_decay"] == 0.25  # "auto": DummyOptim's
    lrs = []
    for _ in range(6):
        optimizer.step()
        scheduler.step()
        lrs.append(inner.param_groups[0]["lr"])
    # DeepSpeed's WarmupLR, linear: min + (max - min) * it / warmup_num_steps after step it + 1, then max
    assert lrs == pytest.approx([0.02 * min(1.0, it / 4) for it in range(6)]), lrs


def test_a_file_section_beside_the_scripts_own_optimizer_is_accelerates_one_line(monkeypatch):
    monkeypatch.setenv("CONVOY_DEEPSPEED_CONFIG", json.dumps(LAUNCHED))
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="config's 'optimizer' section and the script's own optimizer: give one"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_the_scripts_plugin_wins_over_the_launchers_file_said_once(monkeypatch, caplog):
    monkeypatch.setenv("CONVOY_DEEPSPEED_CONFIG", json.dumps(LAUNCHED))
    mine = {"zero_optimization": {"stage": 0}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=mine))
    assert accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"] == {"stage": 0}
    assert "optimizer" not in accelerator.state.deepspeed_plugin.deepspeed_config
    said = [r.getMessage() for r in caplog.records if "--config_file's deepspeed_config" in r.getMessage()]
    assert len(said) == 1 and "the script's wins" in said[0], said


def test_without_a_deepspeed_config_the_state_has_no_plugin(monkeypatch):
    monkeypatch.delenv("CONVOY_DEEPSPEED_CONFIG", raising=False)
    assert Accelerator().state.deepspeed_plugin is None
    PartialState._reset_state()
    plugin = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3)).state.deepspeed_plugin
    assert plugin.zero_stage == 3 and plugin.deepspeed_config["zero_optimization"]["stage"] == 3  # built from fields
    monkeypatch.setenv("CONVOY_DEEPSPEED_CONFIG", "[1]")
    PartialState._reset_state()
    with pytest.raises(ConfigError, match="environment CONVOY_DEEPSPEED_CONFIG: .* is not a DeepSpeed config JSON"):
        Accelerator()


def test_the_same_config_from_the_script_and_the_launchers_inline_keys_is_not_said():
    """An Accelerate file's inline deepspeed_config keys reach the ranks as the config Accelerate's plugin builds
    from them: the same plugin in the script is no difference to say; another one is."""
    from convoy.config.accelerate_file import read_accelerate_config
    from convoy.train.deepspeed_view import deepspeed_in_effect

    files = Path(__file__).resolve().parents[1] / "config" / "accelerate"
    launched = read_accelerate_config(files / "deepspeed_clipping.yaml").value("deepspeed_config")
    same = DeepSpeedPlugin(zero_stage=1, gradient_accumulation_steps=1, gradient_clipping=0.05)
    view, said = deepspeed_in_effect(same, fsdp_plugin=None, launched=launched, accumulation_steps=1)
    assert said is None and (view.zero_stage, view.gradient_clipping) == (1, 0.05), (view, said)
    view, said = deepspeed_in_effect(None, fsdp_plugin=None, launched=launched, accumulation_steps=1)
    assert said is None and view.get_value("zero_optimization.stage") == 1 and view.deepspeed_config == launched
    _, said = deepspeed_in_effect(DeepSpeedPlugin(zero_stage=2), fsdp_plugin=None, launched=launched,
                                  accumulation_steps=1)
    assert said is not None and "the script's wins" in said
