"""Each way a peer can send garbage, named: the decoders answer with one ProtocolError each."""

from __future__ import annotations

import pytest

from scale0.wire import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    ClientReply,
    ProtocolError,
    decode_config_publication,
    decode_from_broker,
    decode_to_broker,
)

LIMIT = 1 << 16
HB = [b"", b"S0C1", b"HEARTBEAT"]


def to_broker(*frames: bytes, **kwargs: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_to_broker(list(frames), max_frame_bytes=LIMIT, **kwargs)  # type: ignore[arg-type]
    return info.value


def from_broker(signature: bytes, *frames: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_from_broker(list(frames), signature=signature, max_frame_bytes=LIMIT)
    return info.value


def options(raw: bytes) -> ProtocolError:
    return to_broker(*HB, raw)


def assert_error(error: ProtocolError, code: int, text: str) -> None:
    assert error.code == code
    assert str(error) == text


# --- framing --------------------------------------------------------------------------------


def test_no_frames() -> None:
    assert_error(to_broker(), 400, "frame 0: empty delimiter missing (0 frames)")


def test_first_frame_not_empty() -> None:
    assert_error(to_broker(b"x", b"S0C1"), 400, "frame 0: expected empty delimiter, got 1 bytes")


def test_signature_missing() -> None:
    assert_error(to_broker(b""), 400, "frame 1: signature missing (1 frame)")


def test_unknown_signature_is_501() -> None:
    assert_error(to_broker(b"", b"S0X9", b"REQUEST"), 501, "frame 1: unknown signature b'S0X9'")


def test_known_signature_on_the_wrong_socket_is_400() -> None:
    error = to_broker(b"", b"S0W1", b"READY", b"", signatures=FRONTEND_SIGNATURES)
    assert_error(error, 400, "frame 1: signature b'S0W1' is not accepted here")


def test_decode_from_broker_wrong_signature() -> None:
    error = from_broker(b"S0C1", b"", b"S0W1", b"HEARTBEAT", b"")
    assert_error(error, 400, "frame 1: signature b'S0W1' is not accepted here")


def test_command_missing() -> None:
    assert_error(to_broker(b"", b"S0C1"), 400, "frame 2: command missing (2 frames)")


def test_unknown_command_is_501() -> None:
    error = to_broker(b"", b"S0C1", b"FROBNICATE", b"")
    assert_error(error, 501, "frame 2: unknown command b'FROBNICATE' for S0C1 to_broker")


def test_command_in_the_wrong_direction_is_501() -> None:
    # REPLY on S0C1 only travels broker -> client.
    error = to_broker(b"", b"S0C1", b"REPLY", b"svc", b"id", b"200")
    assert error.code == 501


def test_command_is_case_sensitive() -> None:
    assert to_broker(b"", b"S0C1", b"heartbeat", b"").code == 501


def test_oversize_frame_names_the_frame() -> None:
    big = b"x" * (LIMIT + 1)
    error = to_broker(b"", b"S0C1", b"REQUEST", b"svc", b"id", big)
    assert_error(error, 400, f"frame 5: {LIMIT + 1} bytes, limit max_frame_bytes={LIMIT}")


def test_oversize_check_comes_before_anything_else() -> None:
    assert to_broker(b"x" * (LIMIT + 1)).frame == 0


# --- missing and extra frames ------------------------------------------------------------------


def test_request_without_request_id() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"svc")
    assert_error(error, 400, "frame 4: request_id missing (4 frames)")


def test_request_without_service() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST")
    assert_error(error, 400, "frame 3: service missing (3 frames)")


def test_worker_reply_without_status() -> None:
    error = to_broker(b"", b"S0W1", b"REPLY", b"ticket")
    assert_error(error, 400, "frame 4: status missing (4 frames)")


def test_control_without_options_frame() -> None:
    assert_error(to_broker(*HB), 400, "frame 3: options missing (3 frames)")


def test_config_without_document() -> None:
    error = from_broker(b"S0C1", b"", b"S0C1", b"CONFIG", b"{}")
    assert_error(error, 400, "frame 4: document missing (4 frames)")


def test_control_with_extra_frame() -> None:
    error = to_broker(*HB, b'{"time":1,"config_version":1}', b"extra")
    assert_error(error, 400, "frame 4: unexpected frame (5 frames, 4 max)")


# --- options frame ---------------------------------------------------------------------------


def test_bad_json() -> None:
    error = options(b"{time: 1}")
    assert error.code == 400
    assert str(error).startswith("frame 3: options is not valid JSON")


def test_invalid_utf8() -> None:
    assert_error(options(b'{"time":"\xff"}'), 400, "frame 3: options is not valid UTF-8")


def test_json_not_an_object() -> None:
    assert_error(options(b"[1, 2]"), 400, "frame 3: options is not a JSON object")
    assert_error(options(b'"x"'), 400, "frame 3: options is not a JSON object")
    assert_error(options(b"null"), 400, "frame 3: options is not a JSON object")


def test_missing_required_option() -> None:
    assert_error(options(b'{"time": 1}'), 400, "frame 3: option 'config_version' is missing")


def test_null_counts_as_missing() -> None:
    error = options(b'{"time": 1, "config_version": null}')
    assert_error(error, 400, "frame 3: option 'config_version' is missing")


def test_bool_where_int_expected() -> None:
    error = options(b'{"time": 1, "config_version": true}')
    assert_error(error, 400, "frame 3: option 'config_version' must be an integer, got a boolean")


def test_float_where_int_expected() -> None:
    error = options(b'{"time": 1, "config_version": 1.0}')
    assert_error(error, 400, "frame 3: option 'config_version' must be an integer, got a number")


def test_bool_where_number_expected() -> None:
    error = options(b'{"time": false, "config_version": 1}')
    assert_error(error, 400, "frame 3: option 'time' must be a number, got a boolean")


def test_int_where_bool_expected() -> None:
    ready = b'{"services":[],"heartbeat":1,"hbeatinterval_ms":1000,"time":1,"config_version":1}'
    error = to_broker(b"", b"S0W1", b"READY", ready)
    assert_error(error, 400, "frame 3: option 'heartbeat' must be a boolean, got an integer")


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity(constant: bytes) -> None:
    error = options(b'{"time": ' + constant + b', "config_version": 1}')
    assert error.code == 400
    assert "is not allowed" in str(error)


def test_number_overflowing_to_infinity() -> None:
    error = options(b'{"time": 1e999, "config_version": 1}')
    assert_error(error, 400, "frame 3: options: number 1e999 is out of range")


def test_integer_with_too_many_digits() -> None:
    error = options(b'{"time": 1, "config_version": ' + b"9" * 5000 + b"}")
    assert error.code == 400
    assert str(error).startswith("frame 3: options is not valid JSON")


def test_integer_out_of_range() -> None:
    error = options(b'{"time": 1, "config_version": 9223372036854775808}')
    assert "outside 0..9223372036854775807" in str(error)


def test_negative_version() -> None:
    assert "outside" in str(options(b'{"time": 1, "config_version": -1}'))


def test_deeply_nested_json() -> None:
    deep = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
    assert_error(options(deep), 400, "frame 3: options nests deeper than 32")
    deep_list = b"[" * 60_000
    assert_error(options(deep_list), 400, "frame 3: options nests deeper than 32")


def test_nesting_bound_is_exactly_32() -> None:
    ok = b'{"time":1,"config_version":1,"x":' + b"[" * 31 + b"]" * 31 + b"}"
    # 1 object + 31 arrays = depth 32: accepted (unknown key ignored).
    decode_to_broker([*HB, ok], max_frame_bytes=LIMIT)
    too_deep = b'{"time":1,"config_version":1,"x":' + b"[" * 32 + b"]" * 32 + b"}"
    assert_error(options(too_deep), 400, "frame 3: options nests deeper than 32")


def test_duplicate_keys() -> None:
    error = options(b'{"time": 1, "config_version": 1, "time": 2}')
    assert_error(error, 400, "frame 3: options: duplicate key")


def test_unknown_option_keys_are_ignored() -> None:
    message = decode_to_broker(
        [*HB, b'{"time": 1, "config_version": 2, "future": {"x": [1]}}'], max_frame_bytes=LIMIT
    )
    assert message.to_frames()[3] == b'{"time":1.0,"config_version":2}'


def test_empty_options_frame_is_an_empty_object() -> None:
    assert_error(options(b""), 400, "frame 3: option 'time' is missing")


def test_lone_surrogate_in_string_option() -> None:
    raw = b'{"config_type": "json", "client_id": "\\ud800"}'
    error = to_broker(b"", b"S0C1", b"CHECKCONFIG", raw)
    assert_error(error, 400, "frame 3: option 'client_id' contains a lone surrogate")


def test_unknown_config_type() -> None:
    error = to_broker(b"", b"S0C1", b"CHECKCONFIG", b'{"config_type": "yaml"}')
    assert_error(error, 400, "frame 3: option 'config_type' is 'yaml', expected json|xml|zfl")


def test_bad_sha256() -> None:
    raw = b'{"config_type":"json","config_version":1,"sha256":"ABC","client_id":"c"}'
    error = from_broker(b"S0C1", b"", b"S0C1", b"CONFIG", raw, b"{}")
    assert_error(error, 400, "frame 3: option 'sha256' is not 64 lowercase hex digits")


def test_disconnecterror_301_needs_endpoint() -> None:
    error = from_broker(b"S0C1", b"", b"S0C1", b"DISCONNECTERROR", b'{"code":301,"message":"m"}')
    assert_error(error, 400, "frame 3: option 'endpoint' is missing (required with 301)")


def test_management_command_name_syntax() -> None:
    raw = b'{"auth_id":"a","auth_password":"p","command":"Drop Table","request_id":"1"}'
    error = to_broker(b"", b"S0C1", b"MANAGEMENTREQ", raw)
    assert "option 'command' is not a command name" in str(error)


# --- ids, names, status -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [b"20", b"2000", b"abc", b"099", b"600", b" 20", b"2 0", b""])
def test_bad_status(status: bytes) -> None:
    error = from_broker(b"S0C1", b"", b"S0C1", b"REPLY", b"svc", b"id", status)
    assert error.code == 400
    assert str(error).startswith("frame 5: status ")


def test_empty_service() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"", b"id")
    assert_error(error, 400, "frame 3: service is empty")


def test_service_with_control_character() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"ec\nho", b"id")
    assert_error(error, 400, "frame 3: service contains a non-printable character")


def test_service_not_utf8() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"\xc3\x28", b"id")
    assert_error(error, 400, "frame 3: service is not valid UTF-8")


def test_service_too_long() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"s" * 256, b"id")
    assert_error(error, 400, "frame 3: service is 256 bytes, limit 255")


def test_request_id_too_long() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"svc", b"r" * 300)
    assert_error(error, 400, "frame 4: request_id is 300 bytes, limit 1..255")


def test_empty_request_id() -> None:
    error = to_broker(b"", b"S0C1", b"REQUEST", b"svc", b"")
    assert_error(error, 400, "frame 4: request_id is 0 bytes, limit 1..255")


def test_empty_ticket() -> None:
    error = to_broker(b"", b"S0W1", b"PARTIAL", b"")
    assert_error(error, 400, "frame 3: ticket is 0 bytes, limit 1..255")


def test_ready_with_reserved_service() -> None:
    raw = (
        b'{"services":["echo","mmi.service"],"heartbeat":true,"hbeatinterval_ms":1000,'
        b'"time":1,"config_version":1}'
    )
    error = to_broker(b"", b"S0W1", b"READY", raw, signatures=BACKEND_SIGNATURES)
    assert_error(error, 400, "frame 3: option 'services[1]' 'mmi.service' is a reserved name")


def test_ready_with_duplicate_services() -> None:
    raw = (
        b'{"services":["echo","echo"],"heartbeat":true,"hbeatinterval_ms":1000,'
        b'"time":1,"config_version":1}'
    )
    error = to_broker(b"", b"S0W1", b"READY", raw)
    assert_error(error, 400, "frame 3: option 'services' has duplicate entries")


# --- peer, configsync, MDP ------------------------------------------------------------------


def test_table_row_names_the_entry() -> None:
    raw = b'{"echo":[{"worker_id":"w1","capacity":true,"last_heartbeat":1}]}'
    error = to_broker(b"", b"S0B1", b"TABLE", b'{"broker_id":"b","table_seq":1,"full":true}', raw)
    assert_error(
        error, 400, "frame 4: table['echo'][0] option 'capacity' must be an integer, got a boolean"
    )


@pytest.mark.parametrize(
    ("slots", "text"),
    [
        (b"[1]", "frame 3: option 'slots' is not a JSON object"),
        (b'{"echo":true}', "frame 3: option 'slots'['echo'] is not an integer within ±2147483648"),
        (b'{"echo":1.5}', "frame 3: option 'slots'['echo'] is not an integer within ±2147483648"),
        (
            b'{"echo":4294967296}',
            "frame 3: option 'slots'['echo'] is not an integer within ±2147483648",
        ),
        (b'{"":1}', "frame 3: option 'slots'['']: service is empty"),
    ],
)
def test_table_slots_name_what_is_wrong(slots: bytes, text: str) -> None:
    """F16's ``slots`` (docs/protocol.md §5.3): checked whole, before the table is used."""
    opts = b'{"broker_id":"b","table_seq":1,"full":true,"slots":' + slots + b"}"
    assert_error(to_broker(b"", b"S0B1", b"TABLE", opts, b"{}"), 400, text)


def test_hello_endpoint_not_a_string() -> None:
    raw = (
        b'{"broker_id":"b","family":"f","state":"active","config_version":1,'
        b'"endpoints":{"frontend":5},"table_mode":"push"}'
    )
    error = to_broker(b"", b"S0B1", b"HELLO", raw)
    assert_error(error, 400, "frame 3: option 'endpoints.frontend' is not a string")


def test_publication_wrong_topic() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_config_publication([b"CONFIX", b"{}", b""], max_frame_bytes=LIMIT)
    assert_error(info.value, 501, "frame 0: topic b'CONFIX' is not b'CONFIG'")


def test_publication_missing_document() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_config_publication([b"CONFIG", b"{}"], max_frame_bytes=LIMIT)
    assert_error(info.value, 400, "frame 2: document missing")


def test_publication_bad_signature() -> None:
    raw = (
        b'{"family":"f","config_version":1,"config_type":"json","sha256":"' + b"a" * 64 + b'",'
        b'"origin":"b1","signature":"zz"}'
    )
    with pytest.raises(ProtocolError) as info:
        decode_config_publication([b"CONFIG", raw, b"{}"], max_frame_bytes=LIMIT)
    assert_error(info.value, 400, "frame 1: option 'signature' is not 128 lowercase hex digits")


def test_signature_must_be_lowercase_hex() -> None:
    good = bytes(range(64)).hex()
    for bad in (good.upper(), good[:-2], good + "00", "zz" + good[2:]):
        raw = (
            b'{"config_type":"json","config_version":1,"sha256":"' + b"a" * 64 + b'",'
            b'"client_id":"c","signature":"' + bad.encode() + b'"}'
        )
        error = from_broker(b"S0C1", b"", b"S0C1", b"CONFIG", raw, b"{}")
        assert str(error) == "frame 3: option 'signature' is not 128 lowercase hex digits"


def test_view_signature_and_config_sha256_are_checked_in_config() -> None:
    good = bytes(range(64)).hex()
    base = b'{"config_type":"json","config_version":1,"sha256":"' + b"a" * 64 + b'","client_id":"c"'
    for option, bad, what in (
        (b"view_signature", good.upper(), "128 lowercase hex digits"),
        (b"view_signature", good[:-2], "128 lowercase hex digits"),
        (b"config_sha256", "A" * 64, "64 lowercase hex digits"),
        (b"config_sha256", "a" * 63, "64 lowercase hex digits"),
    ):
        raw = base + b',"' + option + b'":"' + bad.encode() + b'"}'
        error = from_broker(b"S0C1", b"", b"S0C1", b"CONFIG", raw, b"{}")
        assert str(error) == f"frame 3: option '{option.decode()}' is not {what}"


def test_publication_bad_view_signature() -> None:
    raw = (
        b'{"family":"f","config_version":1,"config_type":"json","sha256":"' + b"a" * 64 + b'",'
        b'"origin":"b1","signature":"' + b"0" * 128 + b'","view_signature":"zz"}'
    )
    with pytest.raises(ProtocolError) as info:
        decode_config_publication([b"CONFIG", raw, b"{}"], max_frame_bytes=LIMIT)
    assert_error(
        info.value, 400, "frame 1: option 'view_signature' is not 128 lowercase hex digits"
    )


def test_family_must_not_contain_a_bar() -> None:
    raw = (
        b'{"broker_id":"b","family":"a|1","state":"active","config_version":1,'
        b'"endpoints":{},"table_mode":"push"}'
    )
    assert_error(
        to_broker(b"", b"S0B1", b"HELLO", raw), 400, "frame 3: option 'family' contains '|'"
    )


def test_mdp_worker_delimiter_must_be_empty() -> None:
    error = to_broker(b"", b"MDPW01", b"\x03", b"ticket", b"x", b"body")
    assert_error(error, 400, "frame 4: expected empty delimiter, got 1 bytes")


def test_mdp_client_01_without_service() -> None:
    error = to_broker(b"", b"MDPC01")
    assert_error(error, 400, "frame 2: service missing (2 frames)")


def test_mdp_unknown_command_byte() -> None:
    assert to_broker(b"", b"MDPW02", b"\x09").code == 501


def test_error_reply_body() -> None:
    reply = ClientReply.failure("svc", b"id", 404, "no such service")
    assert reply.error_detail() == (404, "no such service")
    with pytest.raises(ProtocolError):
        ClientReply("svc", b"id", 500, (b"not json",)).error_detail()
    with pytest.raises(ProtocolError):
        ClientReply("svc", b"id", 500, (b"[]",)).error_detail()
