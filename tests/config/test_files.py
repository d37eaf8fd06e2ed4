"""Settings files: every malformed case gives one ConfigError naming file, line and key; writing merges."""

from __future__ import annotations

import pytest

from convoy.config import read_settings_file, write_settings_file
from convoy.errors import ConfigError


def _read(tmp_path, text):
    path = tmp_path / "convoy.toml"
    path.write_text(text)
    return path, lambda: read_settings_file(path)


@pytest.mark.parametrize(("text", "message"), [
    # not TOML at all
    ('strategy = "ddp"\nmixed_precision = = "bf16"\n', r"convoy.toml, line 2, column \d+: not valid TOML"),
    ('strategy = "ddp\n', r"convoy.toml, line 1, column \d+: not valid TOML"),
    ('strategy = "ddp"\nstrategy = "fsdp"\n', r"line 2, column \d+: not valid TOML"),
    # unknown keys, with the closest suggestion
    ('\nmixed_precison = "bf16"\n', r"convoy.toml, line 2, key 'mixed_precison': unknown key "
                                   r"\(did you mean 'mixed_precision'\?\)"),
    ('"max-restarts" = 2\n', r"line 1, key 'max-restarts': unknown key \(did you mean 'max_restarts'\?\)"),
    ('zzzzzz = 1\n', r"line 1, key 'zzzzzz': unknown key; known keys: devices, free, strategy"),
    ('[launch]\nnnodes = 2\n', r"line 1, key 'launch': unknown table"),
    ('[strategy]\nname = "ddp"\n', r"line 1, key 'strategy': expected a value, found a table"),
    # wrong types and values
    ('\n\ngradient_accumulation_steps = "four"\n', r"line 3, key 'gradient_accumulation_steps': 'four' is not "
                                                   r"valid; expected a whole number >= 1"),
    ('gradient_accumulation_steps = 2.5\n', r"expected a whole number >= 1"),
    ('max_restarts = -1\n', r"key 'max_restarts': -1 is not valid; expected a whole number >= 0"),
    ('free = "sometimes"\n', r"key 'free': 'sometimes' is not valid; expected true or false"),
    ('mixed_precision = "fp4"\n', r"key 'mixed_precision': 'fp4' is not valid; expected one of no, fp16, bf16, fp8"),
    ('fp8_recipe = "blockwise"\n', r"key 'fp8_recipe': 'blockwise' is not valid; expected one of tensorwise, rowwise"),
    ('collective_timeout = 0\n', r"key 'collective_timeout': 0 is not valid; expected a number of seconds > 0"),
    ('collective_timeout = true\n', r"expected a number of seconds > 0"),
    ('collective_timeout = 1e-300\n', r"expected a number of seconds > 0 \(at least 0.001\)"),  # a timedelta of 0
    ('rdzv_id = "a\\u0000b"\n', r"key 'rdzv_id': 'a\\x00b' is not valid; expected a string, without control"),
    ('devices = [0, -2]\n', r"key 'devices': \[0, -2\] is not valid; expected a non-empty list"),
    ('devices = 1.5\n', r"key 'devices': 1.5 is not valid; expected a device request"),
    ('devices = "0,0"\n', r"key 'devices': '0,0' is not valid: index 0 appears twice"),
    ('devices = [2, 2]\n', r"key 'devices': \[2, 2\] is not valid: index 2 appears twice"),
    ('devices = "all,1"\n', r"key 'devices': 'all,1' is not valid: cannot parse 'all'"),
    ('strategy = 3.0\n', r"key 'strategy': 3.0 is not valid"),
    ('parallelism = "dp=2,xx=2"\n', r"key 'parallelism': unknown parallelism key 'xx'"),
    ('rdzv_backend = "etcd"\n', r"expected one of c10d, static"),
    ('nnodes = 0\n', r"expected a node count"),
    # a number or a yes/no quoted: a string, refused as every other wrong type is (they were read as the value)
    ('\nnproc_per_node = "2"\n', r"line 2, key 'nproc_per_node': '2' is a string, not a number; write 2 without "
                                 r"quotes"),
    ('free = "true"\n', r"key 'free': 'true' is a string, not a bool; write true without quotes"),
    ('max_restarts = " 3 "\n', r"key 'max_restarts': ' 3 ' is a string, not a number; write 3 without quotes"),
    ('collective_timeout = "300"\n', r"'300' is a string, not a number; write 300 without quotes"),
    ('log_level = "loud"\n', r"expected one of debug, info, warning, error"),
])
def test_malformed_files_name_file_line_and_key(tmp_path, text, message):
    _, read = _read(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        read()
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_values_keep_their_lines_and_normalise(tmp_path):
    _, read = _read(tmp_path, '# comment\ndevices = [2, 0]\n\n"free" = true\nnproc_per_node = 4\ndevices_x = 1\n'
                    .replace("devices_x = 1\n", ""))
    values = read()
    assert values["devices"].value == "2,0" and values["devices"].line == 2
    assert values["free"].value is True and values["free"].line == 4
    assert values["nproc_per_node"].value == "4"


def test_single_index_list_stays_an_index_list(tmp_path):
    _, read = _read(tmp_path, "devices = [1]\n")
    assert read()["devices"].value == "1,"  # "1" alone would mean a count of one device


def test_unreadable_file(tmp_path):
    path = tmp_path / "convoy.toml"
    path.write_bytes(b"strategy = '\xff\xfe'\n")
    with pytest.raises(ConfigError, match=r"settings file .*convoy.toml is not UTF-8 text"):
        read_settings_file(path)


def test_write_merges_round_trips_and_removes(tmp_path):
    path = tmp_path / "sub" / "config.toml"
    write_settings_file(path, {"strategy": "ddp", "free": True})
    write_settings_file(path, {"mixed_precision": "bf16", "collective_timeout": "60", "free": None,
                               "rdzv_endpoint": 'node"0:29500'.replace('"', "")})
    values = {k: v.value for k, v in read_settings_file(path).items()}
    assert values == {"strategy": "ddp", "mixed_precision": "bf16", "collective_timeout": 60.0,
                      "rdzv_endpoint": "node0:29500"}
    assert "# How the model is spread" in path.read_text()


def test_what_convoy_config_writes_reads_back_a_number_unquoted(tmp_path):
    path = tmp_path / "convoy.toml"
    write_settings_file(path, {"nproc_per_node": "2", "max_restarts": "3", "free": "yes"})  # as typed at a prompt
    assert "nproc_per_node = 2\n" in path.read_text() and "max_restarts = 3\n" in path.read_text()
    assert {k: v.value for k, v in read_settings_file(path).items()} == {"nproc_per_node": "2", "max_restarts": 3,
                                                                        "free": True}


def test_the_accelerator_and_convoy_launch_refuse_a_quoted_number():
    import convoy

    with pytest.raises(ConfigError, match=r"Accelerator\(gradient_accumulation_steps=' 4 '\): ' 4 ' is a string, "
                                          r"not a number; write 4 without quotes"):
        convoy.Accelerator(gradient_accumulation_steps=" 4 ")
    with pytest.raises(ConfigError, match=r"convoy.launch\(nproc_per_node=...\): '2' is a string, not a number"):
        convoy.launch(print, nproc_per_node="2")


def test_write_rejects_bad_values_and_unknown_keys_and_keeps_the_file(tmp_path):
    path = tmp_path / "config.toml"
    write_settings_file(path, {"strategy": "ddp"})
    before = path.read_text()
    with pytest.raises(ConfigError, match="unknown key"):
        write_settings_file(path, {"stratgy": "fsdp"})
    with pytest.raises(ConfigError, match="setting 'max_restarts'"):
        write_settings_file(path, {"max_restarts": "x"})
    assert path.read_text() == before


@pytest.mark.parametrize(("name", "value", "message"), [
    # refused by every `convoy launch` (parse_devices), written by `convoy config` before
    ("devices", "0,0", "index 0 appears twice"),
    ("devices", "0-3,2", "index 2 appears twice"),
    ("devices", "3-1", "range '3-1' runs backwards"),
    ("devices", "all,1", "cannot parse 'all'"),
    ("devices", ",", "the list names no device"),
    ("devices", "-2", "-2 is negative"),
    # a byte that is not UTF-8 (the shell's 0xff): written as '\\udcff', which no TOML reader takes, so every
    # command reading the file stopped on it
    ("rdzv_id", "job\udcff", "is not UTF-8 text"),
])
def test_write_refuses_what_reading_would_and_keeps_the_file(tmp_path, name, value, message):
    path = tmp_path / "convoy.toml"
    write_settings_file(path, {"strategy": "ddp"})
    before = path.read_text()
    with pytest.raises(ConfigError, match=message) as info:
        write_settings_file(path, {name: value})
    assert f"setting '{name}'" in str(info.value)
    assert path.read_text() == before and read_settings_file(path)["strategy"].value == "ddp"


@pytest.mark.parametrize("value", ["0", "-1", "all", "ALL", "auto", "1,", "2,0", "0-3,6", "99", "0-99999999999"])
def test_write_keeps_requests_another_machine_may_meet(tmp_path, value):
    """Whether the indices exist is the launching machine's question: a request well formed anywhere is written."""
    path = write_settings_file(tmp_path / "convoy.toml", {"devices": value})
    assert read_settings_file(path)["devices"].value == value
