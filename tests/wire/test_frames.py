"""Frame helpers: typed option readers, names, ids, status codes, reserved services."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scale0.wire import RESERVED_SERVICE_PREFIXES, ProtocolError, is_reserved_service
from scale0.wire.frames import (
    ConfigType,
    decode_json,
    decode_options,
    encode_options,
    encode_status,
    name_frame,
    opt_bool,
    opt_enum,
    opt_float,
    opt_int,
    opt_name,
    opt_str,
    opt_str_list,
    status_frame,
)
from tests.wire.strategies import json_objects, json_values


def test_reserved_service_prefixes() -> None:
    assert RESERVED_SERVICE_PREFIXES == ("mmi.", "scale0.")
    assert is_reserved_service("mmi.service")
    assert is_reserved_service("scale0.status")
    assert not is_reserved_service("mmi")
    assert not is_reserved_service("echo.mmi.")
    assert not is_reserved_service("MMI.service")  # names are case-sensitive (§2.3)


def test_opt_int_required_and_default() -> None:
    assert opt_int({"n": 3}, "n") == 3
    assert opt_int({}, "n", 7) == 7
    assert opt_int({"n": None}, "n", None) is None
    with pytest.raises(ProtocolError, match=r"^frame 5: option 'n' is missing$"):
        opt_int({}, "n", frame=5)


def test_opt_int_rejects_bool_float_and_range() -> None:
    with pytest.raises(ProtocolError, match="must be an integer, got a boolean"):
        opt_int({"n": True}, "n")
    with pytest.raises(ProtocolError, match="must be an integer, got a number"):
        opt_int({"n": 1.5}, "n")
    with pytest.raises(ProtocolError, match="must be an integer, got a string"):
        opt_int({"n": "1"}, "n")
    with pytest.raises(ProtocolError, match=r"is 0, outside 1\.\.10"):
        opt_int({"n": 0}, "n", minimum=1, maximum=10)


def test_opt_float_accepts_ints_and_rejects_bool() -> None:
    value = opt_float({"t": 5}, "t")
    assert value == 5.0
    assert isinstance(value, float)
    with pytest.raises(ProtocolError, match="must be a number, got a boolean"):
        opt_float({"t": False}, "t")
    with pytest.raises(ProtocolError, match=r"below 0\.0"):
        opt_float({"t": -1.0}, "t", minimum=0.0)
    with pytest.raises(ProtocolError, match="out of range"):
        opt_float({"t": 10**30}, "t")


def test_opt_bool_rejects_numbers() -> None:
    assert opt_bool({"b": False}, "b") is False
    assert opt_bool({}, "b", True) is True
    with pytest.raises(ProtocolError, match="must be a boolean, got an integer"):
        opt_bool({"b": 0}, "b")


def test_opt_str_and_name() -> None:
    assert opt_str({"s": "x\ny"}, "s") == "x\ny"  # free text may hold anything printable or not
    with pytest.raises(ProtocolError, match="is 5 characters, limit 4"):
        opt_str({"s": "abcde"}, "s", max_chars=4)
    with pytest.raises(ProtocolError, match="must be a string, got an array"):
        opt_str({"s": []}, "s")
    assert opt_name({"n": "broker-1"}, "n") == "broker-1"
    with pytest.raises(ProtocolError, match="'n' is empty"):
        opt_name({"n": ""}, "n")
    with pytest.raises(ProtocolError, match="non-printable"):
        opt_name({"n": "a\tb"}, "n")
    with pytest.raises(ProtocolError, match="is 256 bytes, limit 255"):
        opt_name({"n": "é" * 128}, "n")


def test_opt_str_list() -> None:
    assert opt_str_list({"l": ["a", "b"]}, "l") == ("a", "b")
    with pytest.raises(ProtocolError, match=r"option 'l\[1\]' must be a string, got an integer"):
        opt_str_list({"l": ["a", 1]}, "l")
    with pytest.raises(ProtocolError, match="must be an array of strings, got a string"):
        opt_str_list({"l": "a"}, "l")
    with pytest.raises(ProtocolError, match="has 3 items, limit 2"):
        opt_str_list({"l": ["a", "b", "c"]}, "l", max_items=2)


def test_opt_enum() -> None:
    assert opt_enum({"t": "zfl"}, "t", ConfigType) is ConfigType.ZFL
    assert opt_enum({}, "t", ConfigType, None) is None
    with pytest.raises(ProtocolError, match=r"expected json\|xml\|zfl"):
        opt_enum({"t": "JSON"}, "t", ConfigType)


def test_status_codes() -> None:
    assert status_frame(b"200", 5) == 200
    assert status_frame(b"599", 5) == 599
    assert encode_status(404) == b"404"
    with pytest.raises(ValueError):
        encode_status(600)


@given(st.integers(100, 599))
def test_status_round_trip(status: int) -> None:
    assert status_frame(encode_status(status), 5) == status


def test_name_frame_cache_does_not_bypass_validation() -> None:
    assert name_frame(b"echo", 3, "service") == "echo"
    assert name_frame(b"echo", 3, "service") == "echo"
    with pytest.raises(ProtocolError):
        name_frame(b"ec\x00ho", 3, "service")


def test_empty_options_frame() -> None:
    assert decode_options(b"") == {}
    assert encode_options({}) == b""
    assert encode_options({"a": None}) == b""


@given(json_objects)
def test_options_round_trip(options: dict[str, object]) -> None:
    present = {k: v for k, v in options.items() if v is not None}
    assert decode_options(encode_options(present)) == present  # type: ignore[arg-type]


@given(json_values)
def test_json_round_trip(value: object) -> None:
    from scale0.wire.frames import encode_json

    assert decode_json(encode_json(value), 4, "x") == value  # type: ignore[arg-type]
