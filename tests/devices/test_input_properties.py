"""Property-based tests: every device-layer parser and reader answers any input with a valid result or one
``ConvoyError``, never another exception, in bounded time and memory (``tests/bounded.py``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convoy.devices.amounts import MemoryAmount, parse_duration, parse_memory, parse_percent
from convoy.devices.inventory import Inventory, inventory_from_dict, load_inventory
from convoy.devices.selection import Selection, select_devices
from convoy.devices.spec import parse_devices
from convoy.devices.visibility import MASK_VARIABLES, VisibleView, visible_devices
from convoy.errors import ConvoyError, DeviceSpecError
from tests.bounded import BOUNDED, outcome
from tests.conftest import INVENTORIES

# What users type, and what breaks parsers: ASCII and non-ASCII digits, signs, separators, huge numbers.
_CHARS = st.sampled_from(list("0123456789-,: +.aGPU") + ["²", "٣", "٠", "\u00a0", "\n", "ｆ"])
_TEXT = st.one_of(
    st.text(_CHARS, max_size=24),
    st.text(max_size=12),
    st.integers(0, 10**30).map(str),
    st.integers(1, 5000).map(lambda n: "9" * n),
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)).map(lambda t: f"{t[0]}-{t[1]}"),
)
_INVENTORY_FILES = sorted(INVENTORIES.glob("*.json"))
_INVENTORIES = {path.stem: load_inventory(path) for path in _INVENTORY_FILES}


@BOUNDED
@given(spec=st.one_of(_TEXT, st.integers(-10**40, 10**40), st.lists(st.integers(-10**40, 10**40), max_size=5)),
       n=st.integers(0, 64))
def test_device_spec(spec, n):
    result = outcome(parse_devices, spec, n)
    if not isinstance(result, ConvoyError):
        assert all(0 <= i < n for i in result) and len(set(result)) == len(result)
        if isinstance(spec, str):
            assert all(c.isascii() for c in spec.strip()), "a non-ASCII request must not select devices"


@BOUNDED
@given(name=st.sampled_from(sorted(_INVENTORIES)), value=_TEXT, order=st.booleans())
def test_visibility_variables(name, value, order):
    inventory = _INVENTORIES[name]
    for variable in MASK_VARIABLES.get(inventory.vendor, ()):
        env = {variable: value, **({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if order else {})}
        view = outcome(visible_devices, inventory, env)
        if isinstance(view, VisibleView):
            assert len(set(view.devices)) == len(view.devices), "a device is never visible twice"
            assert value.isascii() or not view.devices


def test_visibility_refuses_what_cuda_refuses():
    inventory = _INVENTORIES["8xh100_nvswitch"]
    for value in ("0,0,1", "²", "٣", "--1", "1.5"):
        with pytest.raises(DeviceSpecError, match="CUDA_VISIBLE_DEVICES="):
            visible_devices(inventory, {"CUDA_VISIBLE_DEVICES": value})
    # what CUDA reads as "stop here" still reads so: -1 hides everything, an unknown UUID ends the list
    assert visible_devices(inventory, {"CUDA_VISIBLE_DEVICES": "-1"}).devices == ()
    assert len(visible_devices(inventory, {"CUDA_VISIBLE_DEVICES": "1,GPU-nope,2"}).devices) == 1


@BOUNDED
@given(spec=_TEXT, exclude=st.one_of(_TEXT, st.integers(-3, 10**20), st.lists(st.one_of(_TEXT, st.integers()),
                                                                               max_size=3)),
       memory=st.one_of(st.none(), _TEXT, st.floats(), st.integers(-5, 10**400)),
       util=st.one_of(st.none(), _TEXT, st.floats()), mask=st.one_of(st.none(), _TEXT))
def test_select_devices(spec, exclude, memory, util, mask):
    env = {} if mask is None else {"CUDA_VISIBLE_DEVICES": mask}
    result = outcome(select_devices, spec, inventory=_INVENTORIES["8xh100_nvswitch"], env=env, exclude=exclude,
                     min_free_memory=memory, max_utilization=util)
    assert isinstance(result, (Selection, ConvoyError))


@pytest.mark.parametrize("kwargs", [
    {"min_free_memory": float("nan")}, {"min_free_memory": float("inf")}, {"min_free_memory": "9" * 400},
    {"exclude": 5}, {"exclude": object()}, {"inventory": 3},
    {"env": {"CUDA_VISIBLE_DEVICES": "²"}}, {"max_utilization": float("nan")},
])
def test_select_devices_api_refuses_with_one_error(kwargs):
    kwargs = {"inventory": _INVENTORIES["8xh100_nvswitch"], "env": {}, **kwargs}
    result = outcome(select_devices, 1, **kwargs)
    if kwargs.get("exclude") == 5:  # one index is a valid exclude
        assert isinstance(result, Selection) and 5 not in result.indices
    else:
        assert isinstance(result, ConvoyError)


def test_select_devices_reads_an_inventory_path():
    path = INVENTORIES / "4_mixed_pcie.json"
    assert select_devices(1, inventory=str(path), env={}).devices == select_devices(
        1, inventory=load_inventory(path), env={}).devices


@BOUNDED
@given(value=st.one_of(_TEXT, st.floats(), st.integers(-10, 10**400), st.none(), st.booleans()))
def test_units(value):
    assert isinstance(outcome(parse_memory, value), (MemoryAmount, ConvoyError))
    assert isinstance(outcome(parse_percent, value), (float, ConvoyError))
    duration = outcome(parse_duration, value)
    assert isinstance(duration, (float, ConvoyError))
    if isinstance(duration, float):
        assert duration >= 0


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
_FIELDS = st.sampled_from(["index", "uuid", "name", "vendor", "memory_total_mib", "memory_used_mib",
                           "utilization_pct", "compute_mode", "processes", "nvlink_peers", "mig_devices",
                           "multiprocessor_count"])


@BOUNDED
@given(name=st.sampled_from(sorted(_INVENTORIES)), edits=st.lists(st.tuples(st.integers(0, 15), _FIELDS, _JSON),
                                                                  max_size=3))
def test_inventory_fields(name, edits):
    data = _INVENTORIES[name].to_dict()
    for position, field, value in edits:
        data["devices"][position % len(data["devices"])][field] = value
    result = outcome(inventory_from_dict, data)
    if isinstance(result, Inventory):
        for device in result.devices:
            assert device.index >= 0 and device.memory_total_mib >= 0 and device.memory_used_mib >= 0
            peers = {d.index for d in result.devices if d.vendor == device.vendor} - {device.index}
            assert set(device.nvlink_peers) <= peers


_BYTES = st.one_of(
    st.binary(max_size=64),
    st.integers(1, 20000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 6000).map(lambda n: b'{"devices": [{"index": ' + b"9" * n + b', "uuid": "u", "name": "n"}]}'),
    st.sampled_from([b'{"devices": [{"index": NaN, "uuid": "u", "name": "n"}]}', b'\xff\xfe{"devices": []}',
                     b'{"devices": [{"index": 0, "uuid": "u", "name": "n", "utilization_pct": Infinity}]}']),
    _JSON.map(lambda v: json.dumps({"devices": v}).encode()),
)


@BOUNDED
@given(content=_BYTES)
def test_inventory_file(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "box.json"
        path.write_bytes(content)
        assert isinstance(outcome(load_inventory, path), (Inventory, ConvoyError))


def test_lease_waits_take_durations(tmp_path):
    from convoy.devices.lease import lease_devices, select_and_lease

    inventory = _INVENTORIES["8xh100_nvswitch"]
    selection, lease = select_and_lease(1, wait="5m", inventory=inventory, env={}, lock_dir=tmp_path)
    try:
        assert len(selection.devices) == 1
        with pytest.raises(DeviceSpecError, match="cannot read duration '5 minutes'"):
            select_and_lease(1, wait="5 minutes", inventory=inventory, env={}, lock_dir=tmp_path)
        with pytest.raises(DeviceSpecError, match="duration"):
            lease_devices(selection.devices, wait=float("nan"), lock_dir=tmp_path)
    finally:
        lease.release()
    # an inventory path works where an Inventory does
    selection, lease = select_and_lease(1, inventory=str(INVENTORIES / "8xh100_nvswitch.json"), env={},
                                        lock_dir=tmp_path)
    lease.release()
