"""Frame-level building blocks of S0P/1: signatures, limits, ids, status codes, options frames."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, ClassVar, Final, NoReturn, Self, TypeVar, overload

from scale0.wire.errors import ProtocolError

# --- signatures and frame positions (docs/protocol.md §2) ------------------------------------

SIG_CLIENT: Final = b"S0C1"
SIG_WORKER: Final = b"S0W1"
SIG_BROKER: Final = b"S0B1"
S0_SIGNATURES: Final = frozenset({SIG_CLIENT, SIG_WORKER, SIG_BROKER})

FRAME_EMPTY: Final = 0
FRAME_SIGNATURE: Final = 1
FRAME_COMMAND: Final = 2
FRAME_OPTIONS: Final = 3

EMPTY: Final = b""

# --- limits (docs/protocol.md §2.3) ----------------------------------------------------------

#: request_id, ticket, service names and other ids: 1..255 bytes (a ZeroMQ routing id's limit).
MAX_ID_BYTES: Final = 255
#: JSON nesting bound for options and JSON payload frames; deeper is 400 (no RecursionError).
MAX_JSON_DEPTH: Final = 32
#: Integers in options are signed 64-bit so every implementation can hold them.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

#: Services under these prefixes are answered by the broker itself (docs/protocol.md §7.3).
RESERVED_SERVICE_PREFIXES: Final = ("mmi.", "scale0.")


def is_reserved_service(name: str) -> bool:
    """True when ``name`` belongs to the broker (``mmi.*``, ``scale0.*``), never to a worker."""
    return name.startswith(RESERVED_SERVICE_PREFIXES)


class ConfigType(StrEnum):
    """Serialisations a CONFIG document may travel in (docs/protocol.md §3.2)."""

    JSON = "json"
    XML = "xml"
    ZFL = "zfl"


# --- the message base class --------------------------------------------------------------------


_Cls = TypeVar("_Cls", bound=type)


def quick_init(cls: _Cls) -> _Cls:
    """Give a frozen, slotted dataclass an ``__init__`` that stores each field through its slot's
    descriptor: the signature and defaults of the one ``@dataclass`` writes, which stores each
    field with ``object.__setattr__`` (a lookup by name each time) and costs about 0.2 µs more
    per object. For the messages built once per request on the hot path (docs/performance.md,
    "Runs of REQUESTs and REPLYs in one call"). Only for fields that are positional-or-keyword
    with a plain default or none, and no ``__post_init__`` (checked here)."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init: {cls.__name__} is not a plain dataclass")
    namespace: dict[str, Any] = {}
    params: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        slot: Any = next((k.__dict__[f.name] for k in cls.__mro__ if f.name in k.__dict__), None)
        if (
            not f.init
            or f.kw_only
            or f.default_factory is not dataclasses.MISSING
            or type(slot).__name__ != "member_descriptor"
        ):
            raise TypeError(f"quick_init: {cls.__name__}.{f.name} is not a plain slotted field")
        namespace[f"_set_{f.name}"] = slot.__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        lines.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines or ["    pass"])
    exec(source, namespace)  # noqa: S102 (our own field names, checked above)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class Message:
    """Base of every typed message: ``to_frames`` and the ``from_frames`` classmethod.

    ``PROTOCOL`` is frame 1 for classes that belong to one family; classes shared by several
    families (CHECKCONFIG, HEARTBEAT, ...) override ``protocol`` with a dataclass field instead.
    """

    __slots__ = ()

    COMMAND: ClassVar[bytes]
    PROTOCOL: ClassVar[bytes] = b""

    @property
    def protocol(self) -> bytes:
        """Frame 1 of this message (the signature)."""
        return self.PROTOCOL

    def to_frames(self) -> list[bytes]:
        """Frames starting with the empty delimiter; the caller prepends a routing id."""
        raise NotImplementedError

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> Self:
        """Parse ``frames`` (frame 0 = empty delimiter) whose signature and command were checked."""
        raise NotImplementedError


# --- whole-message checks --------------------------------------------------------------------


def check_frame_sizes(frames: Sequence[bytes], max_frame_bytes: int) -> None:
    """400 naming the first frame longer than ``max_frame_bytes`` (docs/protocol.md §2.3)."""
    # max(map(len)) runs in C; only on failure do we walk again to name the frame.
    if frames and max(map(len, frames)) > max_frame_bytes:
        for index, frame in enumerate(frames):
            if len(frame) > max_frame_bytes:
                raise ProtocolError.malformed(
                    index, f"{len(frame)} bytes, limit max_frame_bytes={max_frame_bytes}"
                )


def need_frames(frames: Sequence[bytes], names: tuple[str, ...]) -> None:
    """400 unless the positional frames ``names`` (from frame 3 on) are all present."""
    if len(frames) < FRAME_OPTIONS + len(names):
        missing = names[max(0, len(frames) - FRAME_OPTIONS)]
        raise ProtocolError.malformed(len(frames), f"{missing} missing ({len(frames)} frames)")


def show(raw: bytes, limit: int = 32) -> str:
    """A short, safe rendering of untrusted bytes for error messages."""
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")


# --- ids, names, status (hot path: keep these cheap) ------------------------------------------


def opaque_id(frame: bytes, index: int, what: str) -> bytes:
    """request_id / ticket: opaque, 1..255 bytes (docs/protocol.md §2.3)."""
    size = len(frame)
    if size == 0 or size > MAX_ID_BYTES:
        raise ProtocolError.malformed(index, f"{what} is {size} bytes, limit 1..{MAX_ID_BYTES}")
    return frame


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid name (service, broker_id, client_id, ...), or None if it is.

    A name is 1..255 UTF-8 bytes of printable characters (``str.isprintable``: no control,
    format, separator other than U+0020, or surrogate code points), docs/protocol.md §2.3.
    """
    if not name:
        return "is empty"
    if not name.isprintable():
        return "contains a non-printable character"
    size = len(name) if name.isascii() else len(name.encode("utf-8"))
    if size > MAX_ID_BYTES:
        return f"is {size} bytes, limit {MAX_ID_BYTES}"
    return None


# Validated service names by raw frame. Services are few and hot, so REQUEST decoding usually
# costs one dict lookup; the bound keeps a sender cycling random names from growing it.
_NAME_CACHE: dict[bytes, str] = {}
_NAME_CACHE_MAX: Final = 4096
#: The same dict, read (never written) by the batch readers of scale0/wire/hot.py and their C
#: twin: a name is in it only once :func:`name_frame` has found it valid.
CHECKED_NAMES: Final[dict[bytes, str]] = _NAME_CACHE


def name_frame(frame: bytes, index: int, what: str) -> str:
    """Decode a name frame (service, origin_broker): UTF-8, rules of :func:`name_problem`."""
    cached = _NAME_CACHE.get(frame)
    if cached is not None:
        return cached
    if len(frame) > MAX_ID_BYTES:
        raise ProtocolError.malformed(index, f"{what} is {len(frame)} bytes, limit {MAX_ID_BYTES}")
    try:
        name = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError.malformed(index, f"{what} is not valid UTF-8") from None
    problem = name_problem(name)
    if problem is not None:
        raise ProtocolError.malformed(index, f"{what} {problem}")
    if len(_NAME_CACHE) >= _NAME_CACHE_MAX:
        _NAME_CACHE.clear()
    _NAME_CACHE[bytes(frame)] = name
    return name


def valid_name(frame: bytes) -> str | None:
    """The name in ``frame`` if it is a valid one (as :func:`name_frame` decides), else None.

    For the raw-frame readers of scale0/wire/hot.py: a cache hit costs one dict lookup, and a
    name seen for the first time is checked here and remembered, whichever path saw it first.
    """
    name = _NAME_CACHE.get(frame)
    if name is not None:
        return name
    try:
        return name_frame(frame, 0, "name")
    except ProtocolError:
        return None


_STATUS_CACHE: dict[int, bytes] = {code: b"%d" % code for code in range(100, 600)}


def status_frame(frame: bytes, index: int) -> int:
    """A status frame: exactly 3 ASCII digits, 100..599 (docs/protocol.md §2.3)."""
    # bytes.isdigit is ASCII-only, so int() below cannot see anything but 3 digits.
    if len(frame) != 3 or not frame.isdigit() or frame[0] not in b"12345":
        raise ProtocolError.malformed(index, f"status {show(frame)} is not 3 digits 100..599")
    return int(frame)


def encode_status(status: int) -> bytes:
    """The 3-digit ASCII form of ``status`` (100..599)."""
    encoded = _STATUS_CACHE.get(status)
    if encoded is None:
        raise ValueError(f"status {status} is not in 100..599")
    return encoded


# --- JSON frames (options, payloads) -----------------------------------------------------------

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
Options = Mapping[str, JsonValue]


class _JsonRejected(Exception):
    """Raised from inside the JSON decoder hooks; turned into ProtocolError below."""


def _reject_constant(name: str) -> NoReturn:
    raise _JsonRejected(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e999" parses to inf without ever saying "Infinity"
        raise _JsonRejected(f"number {text[:32]} is out of range")
    return value


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):  # a duplicate key would let two readers disagree
        raise _JsonRejected("duplicate key")
    return result


_DECODER: Final = json.JSONDecoder(
    parse_float=_finite_float, parse_constant=_reject_constant, object_pairs_hook=_unique_pairs
)
# ensure_ascii keeps output encodable even for strings a peer sent with lone surrogates.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True)


def _depth_exceeds(value: JsonValue, limit: int) -> bool:
    stack: list[tuple[JsonValue, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def decode_json(frame: bytes, index: int, what: str, *, empty: JsonValue = None) -> JsonValue:
    """Strict JSON of a frame: UTF-8, no NaN/Infinity, no duplicate keys, depth <= 32.

    An empty frame decodes to ``empty`` (docs/protocol.md §2.2).
    """
    if not frame:
        return empty
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError.malformed(index, f"{what} is not valid UTF-8") from None
    try:
        value: JsonValue = _DECODER.decode(text)
    except _JsonRejected as exc:
        raise ProtocolError.malformed(index, f"{what}: {exc}") from None
    except RecursionError:
        raise ProtocolError.malformed(index, f"{what} nests deeper than {MAX_JSON_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, and int() refusing > 4300 digits
        raise ProtocolError.malformed(index, f"{what} is not valid JSON ({exc})") from None
    # Only a text with enough brackets can be too deep; skip the walk for flat documents.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth_exceeds(value, MAX_JSON_DEPTH):
        raise ProtocolError.malformed(index, f"{what} nests deeper than {MAX_JSON_DEPTH}")
    return value


def control_options(frames: Sequence[bytes], payload: tuple[str, ...] = ()) -> dict[str, JsonValue]:
    """Check a control command has exactly options + ``payload`` frames; decode the options.

    ``payload`` names the frames after the options frame, for error messages.
    """
    names = ("options", *payload)
    count = FRAME_OPTIONS + len(names)
    if len(frames) < count:
        missing = names[max(0, len(frames) - FRAME_OPTIONS)]
        raise ProtocolError.malformed(len(frames), f"{missing} missing ({len(frames)} frames)")
    if len(frames) > count:
        raise ProtocolError.malformed(
            count, f"unexpected frame ({len(frames)} frames, {count} max)"
        )
    return decode_options(frames[FRAME_OPTIONS])


def control_frames(
    protocol: bytes, command: bytes, options: Mapping[str, JsonValue], *payload: bytes
) -> list[bytes]:
    """Frames of a control command: empty, signature, command, options, payload..."""
    return [EMPTY, protocol, command, encode_options(options), *payload]


def encode_json(value: JsonValue) -> bytes:
    """Compact JSON bytes of ``value`` (our own messages: never NaN)."""
    return _ENCODER.encode(value).encode("ascii")


def decode_options(frame: bytes, index: int = FRAME_OPTIONS) -> dict[str, JsonValue]:
    """The options frame: a JSON object; empty frame = ``{}`` (docs/protocol.md §2.2)."""
    value = decode_json(frame, index, "options", empty={})
    if not isinstance(value, dict):
        raise ProtocolError.malformed(index, "options is not a JSON object")
    return value


def encode_options(options: Mapping[str, JsonValue]) -> bytes:
    """Options frame bytes; ``None`` values (absent optional options) are left out."""
    present: dict[str, JsonValue] = {
        key: value for key, value in options.items() if value is not None
    }
    return encode_json(present) if present else EMPTY


# --- typed option readers -------------------------------------------------------------------

_D = TypeVar("_D")


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()


def _type_name(value: JsonValue) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int():
            return "an integer"
        case float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case _:
            return "an object"


@overload
def _lookup(opts: Options, key: str, default: _Missing, frame: int) -> JsonValue: ...
@overload
def _lookup(opts: Options, key: str, default: object, frame: int) -> JsonValue | _Missing: ...
def _lookup(opts: Options, key: str, default: object, frame: int) -> JsonValue | _Missing:
    """The option's value, or _MISSING when it is absent and ``default`` was given.

    An absent option with no default fails here, once for every reader below.
    """
    value = opts.get(key, _MISSING)
    if value is None:  # JSON null = absent, so optional options may be sent as null
        value = _MISSING
    if isinstance(value, _Missing) and default is _MISSING:
        _fail(frame, key, "is missing")
    return value


def _fail(frame: int, key: str, problem: str) -> NoReturn:
    raise ProtocolError.malformed(frame, f"option '{key}' {problem}")


@overload
def opt_int(
    opts: Options,
    key: str,
    *,
    frame: int = ...,
    minimum: int = ...,
    maximum: int = ...,
) -> int: ...
@overload
def opt_int(
    opts: Options,
    key: str,
    default: _D,
    *,
    frame: int = ...,
    minimum: int = ...,
    maximum: int = ...,
) -> int | _D: ...
def opt_int(
    opts: Options,
    key: str,
    default: object = _MISSING,
    *,
    frame: int = FRAME_OPTIONS,
    minimum: int = INT64_MIN,
    maximum: int = INT64_MAX,
) -> object:
    """An integer option in ``minimum..maximum``; a bool or a float is refused."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(frame, key, f"must be an integer, got {_type_name(value)}")
    if not minimum <= value <= maximum:
        _fail(frame, key, f"is {value}, outside {minimum}..{maximum}")
    return value


@overload
def opt_float(opts: Options, key: str, *, frame: int = ..., minimum: float = ...) -> float: ...
@overload
def opt_float(
    opts: Options, key: str, default: _D, *, frame: int = ..., minimum: float = ...
) -> float | _D: ...
def opt_float(
    opts: Options,
    key: str,
    default: object = _MISSING,
    *,
    frame: int = FRAME_OPTIONS,
    minimum: float = -math.inf,
) -> object:
    """A finite number option (an integer is accepted and becomes a float); bool is refused."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(frame, key, f"must be a number, got {_type_name(value)}")
    if isinstance(value, int):
        if abs(value) > 2**53:  # beyond exact float range: certainly not a time or a duration
            _fail(frame, key, "is out of range")
        value = float(value)
    if value < minimum:
        _fail(frame, key, f"is {value}, below {minimum}")
    return value


@overload
def opt_bool(opts: Options, key: str, *, frame: int = ...) -> bool: ...
@overload
def opt_bool(opts: Options, key: str, default: _D, *, frame: int = ...) -> bool | _D: ...
def opt_bool(
    opts: Options, key: str, default: object = _MISSING, *, frame: int = FRAME_OPTIONS
) -> object:
    """A JSON ``true``/``false`` option; 0/1 are refused."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    if not isinstance(value, bool):
        _fail(frame, key, f"must be a boolean, got {_type_name(value)}")
    return value


def _check_str(value: JsonValue, key: str, frame: int, max_chars: int | None) -> str:
    if not isinstance(value, str):
        _fail(frame, key, f"must be a string, got {_type_name(value)}")
    if max_chars is not None and len(value) > max_chars:
        _fail(frame, key, f"is {len(value)} characters, limit {max_chars}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            _fail(frame, key, "contains a lone surrogate")
    return value


@overload
def opt_str(opts: Options, key: str, *, frame: int = ..., max_chars: int | None = ...) -> str: ...
@overload
def opt_str(
    opts: Options, key: str, default: _D, *, frame: int = ..., max_chars: int | None = ...
) -> str | _D: ...
def opt_str(
    opts: Options,
    key: str,
    default: object = _MISSING,
    *,
    frame: int = FRAME_OPTIONS,
    max_chars: int | None = None,
) -> object:
    """A string option (any Unicode text without lone surrogates, optional length bound)."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    return _check_str(value, key, frame, max_chars)


@overload
def opt_name(opts: Options, key: str, *, frame: int = ...) -> str: ...
@overload
def opt_name(opts: Options, key: str, default: _D, *, frame: int = ...) -> str | _D: ...
def opt_name(
    opts: Options, key: str, default: object = _MISSING, *, frame: int = FRAME_OPTIONS
) -> object:
    """A name option (client_id, broker_id, family, ...): rules of :func:`name_problem`."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    name = _check_str(value, key, frame, None)
    problem = name_problem(name)
    if problem is not None:
        _fail(frame, key, problem)
    return name


def opt_match(
    opts: Options, key: str, pattern: re.Pattern[str], what: str, *, frame: int = FRAME_OPTIONS
) -> str:
    """A required string option that must fully match ``pattern`` (``what`` describes it)."""
    value = opt_str(opts, key, frame=frame)
    if pattern.fullmatch(value) is None:
        _fail(frame, key, f"is not {what}")
    return value


def opt_match_or_none(
    opts: Options, key: str, pattern: re.Pattern[str], what: str, *, frame: int = FRAME_OPTIONS
) -> str | None:
    """An optional string option that, when present, must fully match ``pattern``."""
    value = opt_str(opts, key, None, frame=frame)
    if value is not None and pattern.fullmatch(value) is None:
        _fail(frame, key, f"is not {what}")
    return value


_E = TypeVar("_E", bound=StrEnum)


@overload
def opt_enum(opts: Options, key: str, enum: type[_E], *, frame: int = ...) -> _E: ...
@overload
def opt_enum(
    opts: Options, key: str, enum: type[_E], default: _D, *, frame: int = ...
) -> _E | _D: ...
def opt_enum(
    opts: Options,
    key: str,
    enum: type[_E],
    default: object = _MISSING,
    *,
    frame: int = FRAME_OPTIONS,
) -> object:
    """A string option restricted to the values of ``enum``."""
    value = _lookup(opts, key, default, frame)
    if isinstance(value, _Missing):
        return default
    text = _check_str(value, key, frame, None)
    try:
        return enum(text)
    except ValueError:
        allowed = "|".join(member.value for member in enum)
        _fail(frame, key, f"is {text[:32]!r}, expected {allowed}")


def opt_str_list(
    opts: Options,
    key: str,
    *,
    frame: int = FRAME_OPTIONS,
    names: bool = False,
    max_items: int = 1024,
) -> tuple[str, ...]:
    """A required array of strings (``names=True``: each must be a valid name, no duplicates)."""
    value = _lookup(opts, key, _MISSING, frame)  # required: fails when absent
    if not isinstance(value, list):
        _fail(frame, key, f"must be an array of strings, got {_type_name(value)}")
    if len(value) > max_items:
        _fail(frame, key, f"has {len(value)} items, limit {max_items}")
    items: list[str] = []
    for position, item in enumerate(value):
        text = _check_str(item, f"{key}[{position}]", frame, None)
        if names:
            problem = name_problem(text)
            if problem is not None:
                _fail(frame, f"{key}[{position}]", problem)
        items.append(text)
    if names and len(set(items)) != len(items):
        _fail(frame, key, "has duplicate entries")
    return tuple(items)


def opt_object(opts: Options, key: str, *, frame: int = FRAME_OPTIONS) -> dict[str, JsonValue]:
    """An optional JSON object option; absent means ``{}``."""
    value = _lookup(opts, key, {}, frame)
    if isinstance(value, _Missing):
        return {}
    if not isinstance(value, dict):
        _fail(frame, key, f"must be an object, got {_type_name(value)}")
    return value


#: A sha256 digest as sent on the wire: 64 lower-case hex digits.
SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
#: An Ed25519 signature as sent on the wire: its 64 bytes as 128 lower-case hex digits, the one
#: spelling scale0.crypto.keys.sign_config produces (and signature files use).
ED25519_HEX: Final = re.compile(r"[0-9a-f]{128}")


@overload
def opt_family(opts: Options, key: str, *, frame: int = ...) -> str: ...
@overload
def opt_family(opts: Options, key: str, default: _D, *, frame: int = ...) -> str | _D: ...
def opt_family(
    opts: Options, key: str, default: object = _MISSING, *, frame: int = FRAME_OPTIONS
) -> object:
    """A family name: a name without ``|``, so the signing input ``family|version|sha256``
    (docs/protocol.md §6.2) can never stand for two different triples."""
    value = opt_name(opts, key, default, frame=frame)
    if isinstance(value, str) and "|" in value:
        _fail(frame, key, "contains '|'")
    return value


# --- positional layouts shared by several hot-path commands -------------------------------


def ticket_body(frames: Sequence[bytes]) -> tuple[bytes, tuple[bytes, ...]]:
    """``ticket, body...`` from frame 3 on (worker PARTIAL, FORWARDPARTIAL)."""
    if len(frames) < 4:
        need_frames(frames, ("ticket",))
    return opaque_id(frames[3], 3, "ticket"), tuple(frames[4:])


def ticket_status_body(frames: Sequence[bytes]) -> tuple[bytes, int, tuple[bytes, ...]]:
    """``ticket, status, body...`` from frame 3 on (worker REPLY, FORWARDREPLY)."""
    if len(frames) < 5:
        need_frames(frames, ("ticket", "status"))
    return opaque_id(frames[3], 3, "ticket"), status_frame(frames[4], 4), tuple(frames[5:])
