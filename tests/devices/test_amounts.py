"""Amounts users type: memory, percentages, durations."""

from __future__ import annotations

import math

import pytest

from convoy.devices.amounts import parse_duration, parse_memory, parse_percent
from convoy.errors import DeviceSpecError


@pytest.mark.parametrize("text, total, mib", [
    ("20GiB", 81559, 20480), ("20 GiB", 0, 20480), ("20GB", 0, 19074), ("512MiB", 0, 512), ("1TiB", 0, 2**20),
    ("80%", 1000, 800), ("100%", 81559, 81559), (1024, 0, 1024), ("2048", 0, 2048), ("1.5GiB", 0, 1536),
])
def test_memory(text, total, mib):
    assert parse_memory(text).mib_of(total) == mib


@pytest.mark.parametrize("text, fragment", [
    ("20XB", "unknown memory unit 'XB'"), ("lots", "cannot read memory amount 'lots'"),
    ("120%", "above 100%"), (-1, "negative"), (True, "bool"),
])
def test_bad_memory(text, fragment):
    with pytest.raises(DeviceSpecError, match=fragment):
        parse_memory(text)


def test_percent_and_duration():
    assert parse_percent("10%") == parse_percent(10) == parse_percent("10") == 10.0
    assert (parse_duration("30"), parse_duration("30s"), parse_duration("5m"), parse_duration("1h")) == \
        (30.0, 30.0, 300.0, 3600.0)
    assert parse_duration("inf") == math.inf and parse_duration(2) == 2.0
    for bad, fn in (("150%", parse_percent), ("x", parse_percent), ("5 min", parse_duration), (-1, parse_duration)):
        with pytest.raises(DeviceSpecError):
            fn(bad)


def test_a_number_that_is_not_finite_is_answered_with_examples_of_its_own_kind():
    with pytest.raises(DeviceSpecError) as memory:
        parse_memory(float("nan"))
    assert "'20GiB' or '80%'" in str(memory.value) and "30s" not in str(memory.value)  # a duration is no amount
    with pytest.raises(DeviceSpecError) as duration:
        parse_duration(float("nan"))
    assert "'30s'" in str(duration.value) and "GiB" not in str(duration.value)
