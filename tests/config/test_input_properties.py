"""Property-based tests: every setting, ``CONVOY_*`` variable and settings file answers any input with a valid
value or one ``ConvoyError``, never another exception, in bounded time and memory (``tests/bounded.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from convoy.config.files import read_settings_file, write_settings_file
from convoy.config.schema import KEYS, SCHEMA
from convoy.config.settings import Settings, effective_settings
from convoy.devices.discovery import discover
from convoy.devices.inventory import Inventory
from convoy.errors import ConvoyError
from convoy.launch.rank_env import ConvoyEnv, read_convoy_env
from convoy.train.settings import TrainSettings, resolve_settings
from tests.bounded import BOUNDED, outcome

_CHARS = st.sampled_from(list("0123456789-,:=. +eEinfa") + ["²", "٣", "\n", "ｆ"])
_WORDS = st.lists(st.sampled_from(["dp", "tp", "pp", "=", ",", "2", "auto", "bf16", ":", "٣", "-1", "0"]),
                  max_size=6).map("".join)
_TEXT = st.one_of(st.text(_CHARS, max_size=16), _WORDS, st.text(max_size=10),
                  st.integers(1, 5000).map(lambda n: "9" * n),
                  st.sampled_from(["inf", "nan", "-1", "0", "1e400", "fp8", "dp=²", "dp=2,tp=2", "1:2", "٣"]))
_VALUES = st.one_of(_TEXT, st.integers(-10**30, 10**30), st.floats(), st.booleans(), st.none(),
                    st.lists(st.integers(-2, 10**13), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                    max_size=2))
#: every CONVOY_* variable convoy reads: the settings keys, and the ones that name files
_VARIABLES = sorted({key.env_var for key in SCHEMA} | {"CONVOY_INVENTORY", "CONVOY_CONFIG"})


@BOUNDED
@given(name=st.sampled_from(sorted(KEYS)), value=_VALUES)
def test_every_key(name, value):
    outcome(KEYS[name].parse, value, where="test")


@BOUNDED
@given(variables=st.dictionaries(st.sampled_from(_VARIABLES), _TEXT, max_size=4))
def test_every_convoy_variable(variables):
    with tempfile.TemporaryDirectory() as tmp:
        env = {"XDG_CONFIG_HOME": tmp, "HOME": tmp, **variables}
        assert isinstance(outcome(effective_settings, env=env, cwd=tmp), (Settings, ConvoyError))
        assert isinstance(outcome(read_convoy_env, env), (ConvoyEnv, ConvoyError))
        assert isinstance(outcome(resolve_settings, env=env, cpu=True), (TrainSettings, ConvoyError))
        if "CONVOY_INVENTORY" in variables:
            assert isinstance(outcome(discover, env), (Inventory, ConvoyError))


_TOML_VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True).map(lambda f: repr(f).replace("inf", "inf")),
    st.text(_CHARS, max_size=8).map(lambda t: '"' + t.replace("\\", "").replace('"', "").replace("\n", "") + '"'),
    st.sampled_from(["true", "false", "nan", "inf", "-inf", "[1, 2]", "[]", "{}", "1979-05-27", "9" * 5000,
                     "[" * 3000 + "]" * 3000, "{a = 1}"]),
)
_LINES = st.tuples(st.one_of(st.sampled_from(sorted(KEYS)), st.text("abcz_", min_size=1, max_size=5)), _TOML_VALUES)


@BOUNDED
@given(lines=st.lists(_LINES, max_size=4), garbage=st.one_of(st.just(b""), st.binary(max_size=16)))
def test_settings_file(lines, garbage):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "convoy.toml"
        path.write_bytes("\n".join(f"{k} = {v}" for k, v in lines).encode() + garbage)
        values = outcome(read_settings_file, path)
        assert isinstance(values, (dict, ConvoyError))
        if isinstance(values, dict):  # what was read writes back and reads the same
            write_settings_file(path, {name: fv.value for name, fv in values.items()})
            assert {n: fv.value for n, fv in read_settings_file(path).items()} == {
                n: fv.value for n, fv in values.items()}


@BOUNDED
@given(name=st.sampled_from(sorted(KEYS)), value=_VALUES)
def test_write_settings_file(name, value):
    with tempfile.TemporaryDirectory() as tmp:
        written = outcome(write_settings_file, Path(tmp) / "c.toml", {name: value})
        assert isinstance(written, (Path, ConvoyError))
        if isinstance(written, Path):  # what convoy config writes, every reader takes (None removes the key)
            assert (name in read_settings_file(written)) == (value is not None)
