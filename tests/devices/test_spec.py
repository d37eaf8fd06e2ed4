"""The device request grammar: Lightning's devices= table exactly, convoy's extensions, and the errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import convoy
from convoy.devices.spec import check_devices, is_count, parse_devices
from convoy.errors import DeviceSpecError

# Lightning's devices= table (lightning.fabric.utilities.device_parser), on a machine with 4 devices.
LIGHTNING_TABLE = [
    (3, [0, 1, 2]),
    ("3", [0, 1, 2]),
    (-1, [0, 1, 2, 3]),
    ("-1", [0, 1, 2, 3]),
    ([0], [0]),
    ([1, 3], [1, 3]),
    ((1, 3), [1, 3]),
    ("1, 3", [1, 3]),
    ("3,1", [3, 1]),
    ("2,", [2]),
    (0, []),
    ("0", []),
    ([], []),
    (None, []),
    ("", []),
]


@pytest.mark.parametrize("spec, expected", LIGHTNING_TABLE)
def test_lightning_table(spec, expected):
    assert parse_devices(spec, 4) == expected


@pytest.mark.parametrize("spec, expected", [
    ("0-3,6", [0, 1, 2, 3, 6]),
    ("6,0-2", [6, 0, 1, 2]),
    ("1-2", [1, 2]),
    ("all", list(range(8))),
    ("ALL", list(range(8))),
    ("auto", list(range(8))),
    (" 2 ", [0, 1]),
    ([7, 0], [7, 0]),
])
def test_extensions(spec, expected):
    assert parse_devices(spec, 8) == expected


@pytest.mark.parametrize("spec", [-1, "-1", "all"])
def test_all_of_nothing_is_refused_like_lightning(spec):
    # Lightning: "GPUs requested but none are available"; 'auto' is the request that falls back to the CPU
    with pytest.raises(DeviceSpecError, match="asks for every device but none are available"):
        parse_devices(spec, 0)
    assert parse_devices("auto", 0) == []


def test_top_level_name_is_the_same_function():
    assert convoy.parse_devices is parse_devices


@pytest.mark.parametrize("spec, fragment", [
    (True, "a bool is not a device request"),
    (False, "a bool"),
    (1.0, "1.0 is a float"),
    (float("nan"), "nan is a float"),
    (float("inf"), "inf is a float"),
    ([0, [1]], "list item [1] is not a device index"),
    ([0, "1"], "list item '1' is not a device index"),
    ([0, True], "list item True"),
    ([1, 1], "index 1 appears twice"),
    ("1,1", "index 1 appears twice"),
    ("0-2,1", "index 1 appears twice"),
    ([9], "index 9 is out of range"),
    ("1,9", "index 9 is out of range"),
    (-2, "-2 is negative"),
    ("-2", "-2 is negative"),
    ("0,-1", "index -1 is negative"),
    ([-1], "index -1 is negative"),
    (5, "asks for 5 devices"),
    ("5", "asks for 5 devices"),
    ("gpu0", "cannot parse 'gpu0'"),
    ("1,x", "cannot parse 'x'"),
    ("3-1", "range '3-1' runs backwards"),
    (",", "the list names no device"),
    ({"a": 1}, "a dict is not a device request"),
])
def test_errors_name_the_token_and_what_is_available(spec, fragment):
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(spec, 4)
    message = str(info.value)
    assert fragment in message
    assert "4 devices are available (0-3)" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("blank", [" ", "   ", "\t", " \n "])
def test_a_blank_request_is_refused_while_an_empty_one_means_no_accelerator(blank):
    """``--devices "$N "`` with N unset said ' ', silently read as no accelerator; Lightning refuses it."""
    assert parse_devices("", 4) == [] and check_devices("") is None  # the table's "": no accelerator
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(blank, 4)
    assert f"devices={blank!r} is blank" in str(info.value) and "4 devices are available" in str(info.value)
    with pytest.raises(DeviceSpecError, match="is blank"):
        check_devices(blank)  # settings files and convoy config: the same grammar without a machine
    assert is_count(blank) is False


def test_spaces_around_a_request_and_its_items_are_kept_and_a_blank_item_is_refused():
    assert [parse_devices(s, 8) for s in (" 1, 3 ", "1 ,3", " 2 ", "0 - 2, 6", "2, ", ",3")] == \
        [[1, 3], [1, 3], [0, 1], [0, 1, 2, 6], [2], [3]]
    for spec in ("1, ,3", "1,\t,3"):
        with pytest.raises(DeviceSpecError, match="an item between commas is blank"):
            parse_devices(spec, 8)


def test_a_settings_files_devices_are_read_as_the_flag_reads_them():
    from convoy.config.schema import KEYS
    from convoy.errors import ConfigError

    parse = KEYS["devices"].parse
    assert parse(" 0, 2 ", where="key 'devices'") == "0,2"
    for text, why in (("1 2", "cannot parse '1 2'"),  # the space was removed: a count of 12
                      ("1, ,3", "an item between commas is blank"), (" ", "not valid")):
        with pytest.raises(ConfigError, match=why):
            parse(text, where="key 'devices'")


@pytest.mark.parametrize("spec, shown", [
    ([1, 1], "devices=[1, 1]:"),  # was devices=['1', '1']: the user gave ints
    ((1, 1), "devices=(1, 1):"),
    ((9,), "devices=(9,):"),
    ([0, "1"], "devices=[0, '1']:"),
    ("1,1", "devices='1,1':"),
    (9, "devices=9:"),
    (list(range(30)), "devices=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16..."),
])
def test_errors_show_the_request_as_it_was_given(spec, shown):
    with pytest.raises(DeviceSpecError) as info:
        parse_devices(spec, 8)
    assert str(info.value).startswith(shown), str(info.value)


def test_error_wording_with_one_and_no_devices():
    with pytest.raises(DeviceSpecError, match=r"1 device is available \(0\)"):
        parse_devices("1,2", 1)
    with pytest.raises(DeviceSpecError, match="no devices are available"):
        parse_devices(1, 0)


def test_bad_num_available():
    with pytest.raises(DeviceSpecError, match="num_available"):
        parse_devices(1, -1)


@pytest.mark.parametrize("spec, expected", [
    (2, True), ("2", True), (-1, True), ("all", True), ("auto", True),
    ("1,2", False), ([1], False), (None, False), (True, False), ("0-3", False),
])
def test_is_count(spec, expected):
    assert is_count(spec) is expected


_tokens = st.one_of(
    st.integers(-3, 12).map(str),
    st.tuples(st.integers(0, 9), st.integers(0, 9)).map(lambda t: f"{t[0]}-{t[1]}"),
    st.sampled_from(["", " ", "all", "auto", "x", "-", "1.5", "--1"]),
)
_specs = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 20), st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(_tokens, max_size=6).map(",".join),
    st.lists(st.one_of(st.integers(-3, 12), st.booleans(), st.text(max_size=2), st.none()), max_size=6),
    st.lists(st.integers(-2, 12), max_size=6).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(spec=_specs, n=st.integers(0, 10))
def test_fuzz_returns_a_valid_list_or_raises_device_spec_error(spec, n):
    try:
        result = parse_devices(spec, n)
    except DeviceSpecError as err:
        assert str(err).startswith("devices=")
        return
    assert isinstance(result, list)
    assert all(type(i) is int and 0 <= i < n for i in result)
    assert len(set(result)) == len(result)


@settings(max_examples=400, deadline=None)
@given(spec=_specs)
def test_check_devices_refuses_exactly_what_no_machine_takes(spec):
    """check_devices (what convoy config writes, convoy.toml reads) against parse_devices on a machine with
    more devices than any count or index the specs name (21): one refuses what the other refuses."""
    try:
        check_devices(spec)
        machine_free = None
    except DeviceSpecError as err:
        machine_free = str(err)
    try:
        parse_devices(spec, 21)
        on_a_machine = None
    except DeviceSpecError as err:
        on_a_machine = str(err)
    assert (machine_free is None) == (on_a_machine is None), (machine_free, on_a_machine)
    if machine_free is not None:  # the same words, without the machine's "21 devices are available"
        assert on_a_machine == machine_free + "; 21 devices are available (0-20)"


def test_check_devices_never_expands_a_range():
    check_devices("0-999999999999")  # a list of 10^12 indices was one parse away
    with pytest.raises(DeviceSpecError, match="index 5 appears twice"):
        check_devices("0-999999999999,5")
