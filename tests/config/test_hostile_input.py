"""Hostile files: entity expansion, object construction, size and depth bombs, arbitrary bytes."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scale0.config.errors import ConfigError
from scale0.config.formats import FORMATS, MAX_CONFIG_BYTES, Format
from scale0.config.loader import load, loads

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<network><family>&lol9;</family></network>
"""


def test_billion_laughs_is_rejected_fast_with_bounded_memory() -> None:
    tracemalloc.start()
    started = time.process_time()
    with pytest.raises(ConfigError, match="DOCTYPE"):
        loads(BILLION_LAUGHS, "xml")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Expanded, lol9 is 3 GB; refused at the DOCTYPE, the parse never gets near that.
    assert peak < 5 * 1024 * 1024
    assert time.process_time() - started < 5


def test_external_entity_is_not_fetched(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    doc = (
        f'<?xml version="1.0"?><!DOCTYPE n [<!ENTITY x SYSTEM "file://{secret}">]>'
        "<network><family>&x;</family></network>"
    ).encode()
    with pytest.raises(ConfigError) as info:
        loads(doc, "xml")
    assert "top secret" not in str(info.value)


def test_undeclared_entity_is_an_error() -> None:
    with pytest.raises(ConfigError, match="invalid XML"):
        loads(b"<network><family>&x;</family></network>", "xml")


def test_yaml_cannot_construct_python_objects() -> None:
    for doc in (
        b"family: !!python/object/apply:os.system ['echo pwned']\n",
        b"family: !!python/name:os.system\n",
        b"!!python/object:collections.OrderedDict {}\n",
    ):
        with pytest.raises(ConfigError, match="invalid YAML"):
            loads(doc, "yaml")


def test_yaml_alias_bomb_is_refused() -> None:
    doc = b"a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 12):
        doc += f"{'b' * i}: &{'b' * i} [*{'b' * (i - 1) if i > 1 else 'a'}".encode()
        doc += b", *" + ("b" * (i - 1) if i > 1 else "a").encode() + b"]\n"
    with pytest.raises(ConfigError, match="aliases are not supported"):
        loads(doc, "yaml")


def test_yaml_timestamps_and_binary_are_not_config_values() -> None:
    with pytest.raises(ConfigError, match="timestamp"):
        loads(b"family: 2026-01-01 10:00:00\n", "yaml")


@pytest.mark.parametrize("fmt", FORMATS)
def test_oversized_input_is_refused_before_parsing(fmt: Format) -> None:
    with pytest.raises(ConfigError, match="over the"):
        loads(b" " * (MAX_CONFIG_BYTES + 1), fmt)


def test_oversized_file_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as f:
        f.truncate(50 * MAX_CONFIG_BYTES)  # sparse: 50 MiB of NULs
    tracemalloc.start()
    with pytest.raises(ConfigError, match="byte limit"):
        load(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 * MAX_CONFIG_BYTES


@pytest.mark.parametrize(
    ("fmt", "doc"),
    [
        ("json", b"[" * 100_000),
        ("json", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("yaml", b"[" * 100_000),
        ("yaml", b"a:\n" + b"".join(b" " * i + b"a:\n" for i in range(1, 3000))),
        ("xml", b"<a>" * 100_000),
        ("zfl", b"".join(b"    " * i + b"a\n" for i in range(3000))),
    ],
)
def test_deep_nesting_is_a_config_error(fmt: Format, doc: bytes) -> None:
    with pytest.raises(ConfigError):
        loads(doc, fmt)


def test_invalid_utf8_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        loads(b"family: a\nconfig_version: \xff\n", "yaml")
    assert info.value.problems[0].line == 2


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FORMATS), st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_config_error(fmt: Format, data: bytes) -> None:
    with contextlib.suppress(ConfigError):
        loads(data, fmt)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FORMATS), st.text(max_size=300))
def test_arbitrary_text_raises_only_config_error(fmt: Format, text: str) -> None:
    with contextlib.suppress(ConfigError):
        loads(text.encode("utf-8", "surrogatepass"), fmt)


_MARKUP = st.sampled_from(
    [
        "<network>",
        "</network>",
        "<family>",
        "</family>",
        "<brokers>",
        "<broker>",
        "&amp;",
        "family",
        ":",
        "=",
        "\n",
        "    ",
        "- ",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        "#",
        "1",
        "true",
        "brokers",
        "identity",
        "<!--",
        "-->",
        "<![CDATA[",
        "]]>",
        "&",
        ";",
        "!!",
        "*a",
        "&a",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FORMATS), st.lists(_MARKUP, max_size=60))
def test_structured_garbage_raises_only_config_error(fmt: Format, parts: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        loads("".join(parts).encode(), fmt)
