"""``convoy.reading``: the one bounded way every input file is read (issue 41)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convoy.errors import ConfigError, InventoryError
from convoy.reading import (
    ACCELERATE,
    INVENTORY,
    KINDS,
    MAX_DEPTH,
    SETTINGS,
    load_json,
    parse_json,
    parse_toml,
    parse_yaml,
    read_text,
)
from tests.bounded import BOUNDED, outcome


def test_a_file_past_its_kinds_limit_is_refused_with_the_limit(tmp_path):
    path = tmp_path / "config.toml"
    with open(path, "wb") as f:
        f.truncate(50 * 2**20)
    with pytest.raises(ConfigError, match=r"config.toml is 50.0 MiB; a settings file may be at most 1 MiB$"):
        read_text(path, SETTINGS)
    path.write_bytes(b"#" * SETTINGS.limit)  # at the limit: read
    assert len(read_text(path, SETTINGS)) == SETTINGS.limit


def test_a_socket_is_named_as_one(tmp_path):
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(InventoryError, match="is a socket, not a file"):
            load_json(path, INVENTORY)


def test_nesting_at_the_bound_is_read_one_past_it_refused():
    for parse in (parse_json, parse_yaml, parse_toml):  # TOML's document is a table: one level of the count
        wrap = (lambda n: "[" * n + "]" * n) if parse is not parse_toml else (lambda n: "a = " + "[" * (n - 1) +
                                                                               "]" * (n - 1))
        parse(wrap(MAX_DEPTH), "f", ACCELERATE)
        with pytest.raises(ConfigError, match="deep"):
            parse(wrap(MAX_DEPTH + 1), "f", ACCELERATE)


def test_a_file_nested_past_the_bound_says_so_in_the_same_words_whatever_the_recursion_limit():
    """1,000 nested lists hit json's recursion limit at Python's default, and parse when other code (torch.compile)
    raised the limit: the two refusals once had other words, and the suite's check of them broke by test order."""
    import sys

    texts = {parse_json: "[" * 1000 + "]" * 1000, parse_yaml: "[" * 1000 + "]" * 1000,
             parse_toml: "a = " + "[" * 1000 + "]" * 1000}
    seen: dict[object, set[str]] = {parse: set() for parse in texts}
    before = sys.getrecursionlimit()
    try:
        for limit in (1_000, 100_000):
            sys.setrecursionlimit(limit)
            for parse, text in texts.items():
                with pytest.raises(ConfigError) as err:
                    parse(text, "f", ACCELERATE)
                assert f"too deeply (more than {MAX_DEPTH} deep) to be an Accelerate config file" in str(err.value)
                seen[parse].add(str(err.value))
    finally:
        sys.setrecursionlimit(before)
    assert all(len(lines) == 1 for lines in seen.values()), [sorted(v) for v in seen.values()]


def test_yaml_anchors_are_read_aliases_refused():
    assert parse_yaml("a: &x 1\nb: 2\n", "f", ACCELERATE) == {"a": 1, "b": 2}
    with pytest.raises(ConfigError, match=r"line 2: alias 'x' refused \(an Accelerate config file has no aliases"):
        parse_yaml("a: &x [1]\nb: *x\n", "f", ACCELERATE)


def test_a_bad_value_is_shown_cut():
    with pytest.raises(ConfigError) as caught:
        parse_yaml("a: [" + "x" * 100_000, "f", ACCELERATE)
    assert len(str(caught.value)) < 300


def test_every_kind_names_its_limit_in_whole_mebibytes():
    assert all(kind.limit % 2**20 == 0 and kind.limit <= 64 * 2**20 for kind in KINDS)


_YAML_PIECES = st.sampled_from(["a", ":", " ", "\n", "  ", "-", "[", "]", "{", "}", ",", "&x", "*x", "!!python/name:os",
                                "'", '"', "#", "9" * 5000, "1e400", ".nan", "~", "? ", "|", ">", "%YAML 1.1", "---"])


@BOUNDED
@given(pieces=st.lists(_YAML_PIECES, max_size=40), raw=st.binary(max_size=32))
def test_any_text_is_a_value_or_one_line(pieces, raw):
    """Whatever the bytes, each parser gives a value or one ConvoyError line, in bounded time and memory."""
    text = "".join(pieces)
    for parse in (parse_yaml, parse_json, parse_toml):
        outcome(parse, text, "f", ACCELERATE)
        outcome(parse, raw.decode("utf-8", "replace"), "f", ACCELERATE)
