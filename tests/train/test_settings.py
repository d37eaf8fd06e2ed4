"""The training process's settings (``convoy.train.settings``): read with the launcher's own parsers, and
every bad ``Accelerator(...)`` argument refused at construction with one convoy error."""

from __future__ import annotations

import pytest

from convoy import Accelerator
from convoy.config.schema import DEFAULT_COLLECTIVE_TIMEOUT, MIXED_PRECISIONS
from convoy.errors import ConfigError, ConvoyError, StrategyError
from convoy.launch import rank_env as launch_env
from convoy.train.settings import TrainSettings, resolve_settings


@pytest.fixture(autouse=True)
def _no_job(monkeypatch, tmp_path):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CONVOY_MIXED_PRECISION", "CONVOY_STRATEGY",
                "CONVOY_PARALLELISM", "CONVOY_COLLECTIVE_TIMEOUT", "CONVOY_GRADIENT_ACCUMULATION_STEPS",
                "ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "CONVOY_CONFIG",
                "CONVOY_RECOMPUTE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def test_launcher_and_trainer_share_one_list_and_one_default():
    # issue 15: the launcher offered fp8 and every rank then refused it
    assert launch_env.MIXED_PRECISIONS is MIXED_PRECISIONS
    assert launch_env.DEFAULT_COLLECTIVE_TIMEOUT == TrainSettings().collective_timeout_s == DEFAULT_COLLECTIVE_TIMEOUT
    assert resolve_settings(env={}, cpu=True).collective_timeout_s == DEFAULT_COLLECTIVE_TIMEOUT
    for value in MIXED_PRECISIONS:  # whatever the launcher passes on, the trainer takes
        env = launch_env.convoy_env(launch_env.ConvoyEnv(mixed_precision=value, collective_timeout="60"))
        settings = resolve_settings(env=env, cpu=True)
        assert (settings.mixed_precision, settings.collective_timeout_s) == (value, 60.0)


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"dataloader_config": "x"}, ConfigError, "dataloader_config='x'"),
    ({"gradient_accumulation_steps": 2.5}, ConfigError, "expected a whole number >= 1"),
    ({"gradient_accumulation_steps": True}, ConfigError, "expected a whole number >= 1"),
    ({"collective_timeout": float("nan")}, ConfigError, "seconds > 0"),
    ({"collective_timeout": float("inf")}, ConfigError, "seconds > 0"),
    ({"parallelism": [1, 2]}, ConfigError, "parallelism=[1, 2]"),
    ({"parallelism": {"dp": "²"}}, StrategyError, "whole number"),
    ({"strategy_options": {"bogus": 1}}, StrategyError, "valid keys: "),
    ({"strategy": "ddp", "strategy_options": {"auto_wrap": set()}}, StrategyError, "find_unused_parameters"),
    ({"strategy_options": "find_unused_parameters"}, ConfigError, "give a dict"),
    ({"mixed_precision": "fp4"}, ConfigError, "expected one of no, fp16, bf16, fp8"),
    ({"fp8_recipe": "blockwise"}, ConfigError, "Accelerator(fp8_recipe='blockwise'): 'blockwise' is not valid; "
                                               "expected one of tensorwise, rowwise, rowwise_with_gw_hp"),
    ({"recompute": "half"}, ConfigError, "Accelerator(recompute='half'): 'half' is not valid; expected one of none, "
                                         "selective, full"),
    ({"recompute": True}, ConfigError, "expected one of none, selective, full"),
    ({"project_config": "runs"}, ConfigError, "project_config='runs'"),
])
def test_bad_arguments_are_one_error_at_construction(kwargs, error, fragment):
    with pytest.raises(error) as info:
        Accelerator(cpu=True, **kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("variable, value", [
    ("CONVOY_GRADIENT_ACCUMULATION_STEPS", "٣"), ("CONVOY_COLLECTIVE_TIMEOUT", "inf"),
    ("CONVOY_COLLECTIVE_TIMEOUT", "٣"), ("CONVOY_PARALLELISM", "dp=²"), ("WORLD_SIZE", "٣"),
    ("ACCELERATE_MIXED_PRECISION", "fp4"), ("CONVOY_STRATEGY", "no such name"),
    ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "0"), ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "four"),
    ("CONVOY_RECOMPUTE", "yes"), ("CONVOY_FP8_RECIPE", "blockwise"), ("CONVOY_FP8_EMULATE", "maybe"),
])
def test_bad_variables_are_one_error(variable, value):
    with pytest.raises(ConvoyError) as info:
        resolve_settings(env={variable: value}, cpu=True)
    assert variable in str(info.value) or variable == "CONVOY_PARALLELISM"  # that one names the degree
    assert "\n" not in str(info.value)


def test_accelerates_gradient_accumulation_variable_is_read_as_accelerate_reads_it(monkeypatch):
    # Accelerate's Accelerator() takes its gradient_accumulation_steps from this variable (its launcher's
    # --gradient_accumulation_steps); convoy's own variable and an explicit argument win over it
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    assert Accelerator(cpu=True).gradient_accumulation_steps == 4
    assert Accelerator(cpu=True, gradient_accumulation_steps=2).gradient_accumulation_steps == 2
    monkeypatch.setenv("CONVOY_GRADIENT_ACCUMULATION_STEPS", "3")
    assert Accelerator(cpu=True).gradient_accumulation_steps == 3
    monkeypatch.delenv("CONVOY_GRADIENT_ACCUMULATION_STEPS")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1.5")
    with pytest.raises(ConfigError, match="environment ACCELERATE_GRADIENT_ACCUMULATION_STEPS: '1.5' is not valid; "
                                          "expected .*>= 1") as info:
        Accelerator(cpu=True)
    assert "\n" not in str(info.value)


def test_good_arguments_still_work():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, collective_timeout=60,
                              strategy="ddp", strategy_options={"find_unused_parameters": True})
    assert accelerator.gradient_accumulation_steps == 2 and accelerator.settings.collective_timeout_s == 60.0
    assert resolve_settings(explicit={"parallelism": "dp=1"}, env={}, cpu=True).parallel_dims.dp == 1


def test_recompute_is_read_argument_first_then_variable_then_files_then_default(monkeypatch, tmp_path):
    assert Accelerator(cpu=True).settings.recompute == "none"
    (tmp_path / "convoy.toml").write_text('recompute = "selective"\n')
    assert Accelerator(cpu=True).settings.recompute == "selective"
    monkeypatch.setenv("CONVOY_RECOMPUTE", "FULL")  # as the launcher writes it from --recompute (any case)
    assert Accelerator(cpu=True).settings.recompute == "full"
    assert Accelerator(cpu=True, recompute="none").settings.recompute == "none"
    (tmp_path / "convoy.toml").write_text('recompute = "some"\n')
    monkeypatch.delenv("CONVOY_RECOMPUTE")
    with pytest.raises(ConfigError) as info:
        Accelerator(cpu=True)
    assert "convoy.toml" in str(info.value) and "expected one of none, selective, full" in str(info.value)
    (tmp_path / "convoy.toml").unlink()
    for value in ("none", "selective", "full"):  # whatever the launcher passes on, the trainer takes
        env = launch_env.convoy_env(launch_env.ConvoyEnv(recompute=value))
        assert env == {"CONVOY_RECOMPUTE": value} and resolve_settings(env=env, cpu=True).recompute == value


def test_a_script_argument_that_differs_from_the_launcher_is_named_with_the_launchers_flag():
    """Launcher and script: the script's argument wins (``resolve_settings``), and ``overridden`` names each
    difference in one line; the same value in another spelling, or a setting the launcher left unset, is none."""
    from convoy.train.settings import overridden

    env = {"WORLD_SIZE": "4", "CONVOY_STRATEGY": "ddp", "CONVOY_MIXED_PRECISION": "bf16",
           "CONVOY_PARALLELISM": "dp=2,pp=2", "CONVOY_PP_SCHEDULE": "interleaved_1f1b",
           "CONVOY_GRADIENT_ACCUMULATION_STEPS": "4"}
    line = overridden(explicit={"strategy": "zero3", "mixed_precision": "BF16", "parallelism": {"dp": 2, "pp": 2},
                                "gradient_accumulation_steps": 2, "recompute": "full"},
                      options={"loss_fn": print, "pp_schedule": "1f1b"}, env=env)
    assert line == ("the script's Accelerator(...) arguments win over what convoy launch was told: strategy='zero3' "
                    "(the launcher's --strategy: 'ddp'), gradient_accumulation_steps=2 (the launcher's "
                    "--gradient-accumulation-steps: 4), pp_schedule='1f1b' (the launcher's --pp-schedule: "
                    "'interleaved_1f1b'); leave them out of the script to run the launcher's")
    assert resolve_settings(explicit={"strategy": "zero3"}, env={"CONVOY_STRATEGY": "ddp"}, cpu=True).strategy == \
        "zero3"
    assert overridden(explicit={"strategy": "ddp", "parallelism": "dp=2,pp=2"}, options=None, env=env) is None
    assert overridden(explicit={"strategy": "zero3"}, options=None, env={}) is None
    assert overridden(explicit={"strategy": None}, options={"pp_schedule": "1f1b"},
                      env={"CONVOY_PP_SCHEDULE": "1f1b"}) is None


def test_a_plan_prices_float8_only_where_the_run_computes_in_float8():
    """The plan report and strategy="auto" price the run's float8 recipe; torchao's emulation runs the GEMMs in
    bf16, so an emulated run is planned as bf16."""
    def planned(**explicit):
        return resolve_settings(explicit=explicit, env={}, cpu=True).planned_fp8

    assert planned(mixed_precision="fp8", fp8_recipe="rowwise") == "rowwise"
    assert planned(mixed_precision="fp8", fp8_recipe="rowwise", fp8_emulate=True) == "none"
    assert planned(mixed_precision="bf16", fp8_recipe="rowwise") == "none"
