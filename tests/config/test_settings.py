"""Precedence of settings: flag > environment > project file > user file > default, with sources."""

from __future__ import annotations

import pytest

from convoy.config import effective_settings, user_config_path
from convoy.config.schema import SCHEMA
from convoy.errors import ConfigError


@pytest.fixture
def home(tmp_path):
    """An isolated HOME/XDG/cwd: returns (env, user_file, project_dir)."""
    xdg = tmp_path / "xdg"
    project = tmp_path / "project"
    project.mkdir()
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(xdg)}
    user_file = xdg / "convoy" / "config.toml"
    user_file.parent.mkdir(parents=True)
    return env, user_file, project


def test_defaults_when_nothing_is_set(home):
    env, _, project = home
    s = effective_settings(env=env, cwd=project)
    for key in SCHEMA:
        assert s.get(key.name) == key.default or key.default is None
        assert s.source(key.name) == "default"
    assert s.get("parallelism") is None and s.get("parallelism", "dp=1") == "dp=1"
    assert s.files == ()


def test_each_layer_overrides_the_one_below(home):
    env, user_file, project = home
    user_file.write_text('strategy = "zero1"\nmixed_precision = "fp16"\nmax_restarts = 1\nnnodes = 2\n')
    (project / "convoy.toml").write_text('mixed_precision = "bf16"\nmax_restarts = 2\nnnodes = "1:3"\n')
    env = {**env, "CONVOY_MAX_RESTARTS": "3", "CONVOY_NNODES": "4"}
    s = effective_settings(env=env, cwd=project, flags={"nnodes": "5", "strategy": None})
    assert (s.get("strategy"), s.source("strategy")) == ("zero1", f"user file {user_file}:1")
    assert (s.get("mixed_precision"), s.source("mixed_precision")) == (
        "bf16", f"project file {project / 'convoy.toml'}:1")
    assert (s.get("max_restarts"), s.source("max_restarts")) == (3, "environment CONVOY_MAX_RESTARTS")
    assert (s.get("nnodes"), s.source("nnodes")) == ("5", "flag --nnodes")
    assert s.origin("nnodes").kind == "flag"
    assert s.files == (project / "convoy.toml", user_file)
    assert s.as_dict()["max_restarts"]["source"] == "environment CONVOY_MAX_RESTARTS"


def test_convoy_config_replaces_the_user_file(home, tmp_path):
    env, user_file, project = home
    user_file.write_text('strategy = "zero1"\n')
    other = tmp_path / "elsewhere.toml"
    other.write_text('\n\nstrategy = "fsdp"\n')
    s = effective_settings(env={**env, "CONVOY_CONFIG": str(other)}, cwd=project)
    assert (s.get("strategy"), s.source("strategy")) == ("fsdp", f"user file {other}:3")
    assert user_config_path({**env, "CONVOY_CONFIG": str(other)}) == other


def test_missing_convoy_config_file_is_an_error(home, tmp_path):
    env, _, project = home
    with pytest.raises(ConfigError, match=r"missing\.toml: settings file not found"):
        effective_settings(env={**env, "CONVOY_CONFIG": str(tmp_path / "missing.toml")}, cwd=project)


def test_user_file_path_without_xdg_uses_home(tmp_path):
    assert user_config_path({"HOME": str(tmp_path)}) == tmp_path / ".config" / "convoy" / "config.toml"


def test_empty_environment_variable_counts_as_unset(home):
    env, _, project = home
    s = effective_settings(env={**env, "CONVOY_STRATEGY": " "}, cwd=project)
    assert s.source("strategy") == "default"


def test_env_values_are_converted_by_type(home):
    env, _, project = home
    env = {**env, "CONVOY_FREE": "yes", "CONVOY_COLLECTIVE_TIMEOUT": "12.5", "CONVOY_MIXED_PRECISION": "BF16",
           "CONVOY_PARALLELISM": "dp=2,tp=2", "CONVOY_INVENTORY": "/x.json"}  # other CONVOY_ vars are ignored
    s = effective_settings(env=env, cwd=project)
    assert s.get("free") is True and s.get("collective_timeout") == 12.5
    assert s.get("mixed_precision") == "bf16" and s.get("parallelism") == "dp=2,tp=2"


@pytest.mark.parametrize(("var", "value", "message"), [
    ("CONVOY_GRADIENT_ACCUMULATION_STEPS", "0", r"environment CONVOY_GRADIENT_ACCUMULATION_STEPS: '0' is not valid; "
                                                r"expected a whole number >= 1"),
    ("CONVOY_MIXED_PRECISION", "bf61", r"expected one of no, fp16, bf16, fp8 \(did you mean 'bf16'\?\)"),
    ("CONVOY_COLLECTIVE_TIMEOUT", "soon", r"expected a number of seconds > 0"),
    ("CONVOY_COLLECTIVE_TIMEOUT", "-1", r"expected a number of seconds > 0"),
    ("CONVOY_FREE", "maybe", r"expected true or false"),
    ("CONVOY_PARALLELISM", "dp=two", r"CONVOY_PARALLELISM: parallelism 'dp=two'"),
    ("CONVOY_DEVICES", "gpu0", r"CONVOY_DEVICES: .gpu0. is not valid: cannot parse .gpu0.; use a count"),
    ("CONVOY_NNODES", "3:1", r"MIN <= MAX"),
    ("CONVOY_NPROC_PER_NODE", "0", r"'auto' .* or a whole number >= 1"),
    ("CONVOY_RDZV_ENDPOINT", "host port", r"expected HOST:PORT"),
    ("CONVOY_STRATEGY", "d d p", r"expected a strategy name"),
])
def test_bad_environment_values_name_the_variable(home, var, value, message):
    env, _, project = home
    with pytest.raises(ConfigError, match=message):
        effective_settings(env={**env, var: value}, cwd=project)


def test_unknown_flag_key_suggests_the_closest(home):
    env, _, project = home
    with pytest.raises(ConfigError, match=r"unknown key 'mixed_precison' \(did you mean 'mixed_precision'\?\)"):
        effective_settings(env=env, cwd=project, flags={"mixed_precison": "bf16"})


def test_get_of_an_unknown_key_is_an_error_not_none(home):
    env, _, project = home
    s = effective_settings(env=env, cwd=project)
    with pytest.raises(ConfigError, match="did you mean 'strategy'"):
        s.get("stratgy")
    with pytest.raises(ConfigError):
        s.source("nope_nothing_like_it")


def test_project_file_that_is_the_user_file_is_read_once(home):
    env, _, project = home
    (project / "convoy.toml").write_text('strategy = "ddp"\n')
    s = effective_settings(env={**env, "CONVOY_CONFIG": str(project / "convoy.toml")}, cwd=project)
    assert s.source("strategy").startswith("user file") and len(s.files) == 1


def test_file_settings_env_holds_only_file_values(home):
    from convoy.config.settings import file_settings_env

    env, user_file, project = home
    user_file.write_text('strategy = "zero1"\nfree = true\n')
    (project / "convoy.toml").write_text("collective_timeout = 60\n")
    got = file_settings_env({**env, "CONVOY_STRATEGY": "fsdp"}, cwd=project)
    # the variable is not echoed back: callers put the environment on top of this layer
    assert got == {"CONVOY_STRATEGY": "zero1", "CONVOY_FREE": "true", "CONVOY_COLLECTIVE_TIMEOUT": "60.0"}


def test_fill_unset_keeps_flags_and_fills_from_files_and_env(home):
    from convoy.config.settings import fill_unset

    env, user_file, project = home
    user_file.write_text('strategy = "zero1"\nmixed_precision = "bf16"\nrdzv_endpoint = ""\n')
    flags = dict(strategy=None, mixed_precision="fp16", nnodes=None, rdzv_endpoint=None, collective_timeout=None,
                 script="train.py")
    got = fill_unset(flags, env={**env, "CONVOY_COLLECTIVE_TIMEOUT": "9"}, cwd=project)
    assert got == {"strategy": "zero1", "mixed_precision": "fp16", "nnodes": None, "rdzv_endpoint": None,
                   "collective_timeout": 9.0, "script": "train.py"}
    assert flags["strategy"] is None  # the original is not changed


def test_fill_unset_says_where_each_filled_value_came_from(home):
    from convoy.config.settings import fill_unset_with_origins

    env, user_file, project = home
    user_file.write_text('\nstrategy = "zero1"\n')
    flags = dict(strategy=None, nproc_per_node=None, max_restarts=2, nnodes=None)
    values, origins = fill_unset_with_origins(flags, env={**env, "CONVOY_NPROC_PER_NODE": "gpu"}, cwd=project)
    assert values == {"strategy": "zero1", "nproc_per_node": "gpu", "max_restarts": 2, "nnodes": None}
    assert set(origins) == {"strategy", "nproc_per_node"}  # given flags and unset values have none
    assert origins["nproc_per_node"].said("nproc_per_node", "gpu") == "CONVOY_NPROC_PER_NODE=gpu"
    assert origins["strategy"].said("strategy", "'zero1'") == f"strategy = 'zero1' ({user_file}, line 2)"


@pytest.mark.parametrize("seconds", ["1e20", "99999999", "0", "-1"])
def test_collective_timeout_beyond_what_torch_can_hold_is_refused_in_one_line(seconds):
    # 1e20 is finite, but timedelta(seconds=1e20) overflows in every rank: refuse it where it is read
    from convoy.config.schema import KEYS, MAX_SECONDS

    with pytest.raises(ConfigError, match=f"at most {MAX_SECONDS}"):
        KEYS["collective_timeout"].parse(seconds, where="--collective-timeout")
    assert KEYS["collective_timeout"].parse(str(MAX_SECONDS), where="x") == MAX_SECONDS
