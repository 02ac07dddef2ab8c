"""Schema machinery: plain trees (parsed files) to frozen dataclasses and back, by annotation.

A *plain tree* is what a format parser yields: dicts, lists and scalars. Typed formats (JSON,
YAML) carry ints, floats and bools; text formats (XML, ZPL) carry only strings, so conversion goes
through the schema: the dataclass annotation says what a string must become. Lists in text formats
are a container element whose children all carry the field's item name (``brokers`` holds
``broker`` elements); an empty container means an empty list. See docs/config.md, "Formats".

Every problem found is collected (not just the first), each with the field path
(``brokers[1].frontend``) and, where the parser recorded one, the source line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, TypeVar, get_args, get_origin

from scale0.config.errors import ConfigError, Problem

T = TypeVar("T")

# A position in a parsed file: the keys and list indices from the root, as the parser saw them.
RawPath = tuple[str | int, ...]
LineMap = Mapping[RawPath, int]

_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")
_MAX_INT_DIGITS = 30


def doc(text: str, *, item: str = "item") -> dict[str, str]:
    """Field metadata: the one-line doc (shown in docs/config.md) and, for lists, the item name."""
    return {"doc": text, "item": item}


def field_doc(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("doc", ""))


def item_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("item", "item"))


class _Bad:
    """Sentinel: this value failed conversion (its problem is already recorded)."""


BAD: Any = _Bad()


@dataclass
class _Context:
    typed: bool
    lines: LineMap
    problems: list[Problem]

    def fail(self, path: str, raw: RawPath, message: str) -> Any:
        self.problems.append(Problem(message, path=path, line=self.line_of(raw)))
        return BAD

    def line_of(self, raw: RawPath) -> int | None:
        return line_for(self.lines, raw)


def normalized(raw: RawPath) -> RawPath:
    """The path with an occurrence index after every name: how XML and ZPL parsers record lines.

    Text formats cannot tell a lone child from a one-item list, so their line maps key every
    element by (name, index); ``("brokers", "broker", "identity")`` becomes
    ``("brokers", 0, "broker", 0, "identity", 0)``.
    """
    out: list[str | int] = []
    for i, part in enumerate(raw):
        out.append(part)
        if isinstance(part, str) and not (i + 1 < len(raw) and isinstance(raw[i + 1], int)):
            out.append(0)
    return tuple(out)


def line_for(lines: LineMap, raw: RawPath) -> int | None:
    """The line of ``raw`` or of its nearest recorded ancestor (a missing field: its parent's)."""
    for end in range(len(raw), -1, -1):
        part = raw[:end]
        line = lines.get(part)
        if line is None:
            line = lines.get(normalized(part))
        if line is not None:
            return line
    return None


_SEGMENT = re.compile(r"([^.\[\]]+)|\[([0-9]+)\]")


def raw_path(cls: type, path: str, *, typed: bool) -> RawPath:
    """Translate a field path (``brokers[1].frontend``) to where a parser of that kind put it."""
    out: list[str | int] = []
    current: Any = cls
    item = "item"
    for name, index in _SEGMENT.findall(path):
        if index:
            if not typed:
                out.append(item)
            out.append(int(index))
            continue
        out.append(name)
        if not (dataclasses.is_dataclass(current) and isinstance(current, type)):
            break
        fields = {f.name: f for f in dataclasses.fields(current)}
        if name not in fields:
            break
        item = item_name(fields[name])
        tp = _hints(current)[name]
        current = _element_type(tp)
    return tuple(out)


def _element_type(tp: Any) -> Any:
    """The dataclass a field leads to (its own type, or its list's item type), else None."""
    candidates = get_args(tp) if _is_union(tp) else (tp,)
    for candidate in candidates:
        inner = get_args(candidate)[0] if get_origin(candidate) is tuple else candidate
        if dataclasses.is_dataclass(inner):
            return inner
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (empty)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def from_tree(cls: type[T], tree: Any, *, typed: bool, lines: LineMap | None = None) -> T:
    """Build ``cls`` from a plain tree, or raise ConfigError listing every problem found."""
    ctx = _Context(typed=typed, lines=lines or {}, problems=[])
    result = _convert(cls, tree, "", (), ctx)
    if ctx.problems or result is BAD:
        raise ConfigError(ctx.problems)
    return typing.cast(T, result)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, path, raw, ctx)
    if _is_union(tp):
        return _convert_union(tp, value, path, raw, ctx)
    origin = get_origin(tp)
    if origin is tuple:
        return _convert_list(get_args(tp)[0], "item", value, path, raw, ctx)
    if origin is Literal:
        return _convert_literal(get_args(tp), value, path, raw, ctx)
    if isinstance(tp, type) and issubclass(tp, Enum):
        # A choice the code also uses as a type of its own (the broker's state): the file
        # spells a member's value, the object holds the member.
        choice = _convert_literal(tuple(m.value for m in tp), value, path, raw, ctx)
        return choice if choice is BAD else tp(choice)
    if tp is str:
        return _convert_str(value, path, raw, ctx)
    if tp is bool:
        return _convert_bool(value, path, raw, ctx)
    if tp is int:
        return _convert_int(value, path, raw, ctx)
    if tp is float:
        return _convert_float(value, path, raw, ctx)
    raise TypeError(f"schema type {tp!r} at {path} is not supported")  # a bug in the schema


def _convert_dataclass(cls: type, value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    if value is None and not ctx.typed:
        value = {}  # an empty element in XML/ZPL is an empty section
    if not isinstance(value, dict):
        return ctx.fail(path, raw, f"expected a section (mapping), got {_describe(value)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    hints_for_keys: Mapping[str, str] = getattr(cls, "UNKNOWN_KEY_HINTS", {})
    kwargs: dict[str, Any] = {}
    ok = True
    for key, item in value.items():
        if not isinstance(key, str):
            ctx.fail(path, raw, f"key {key!r} is not a string")
            ok = False
            continue
        if key not in fields:
            hint = hints_for_keys.get(key)
            if hint is None:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = (
                    f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(fields)}"
                )
            ctx.fail(_join(path, key), (*raw, key), f"unknown key {key!r}: {hint}")
            ok = False
            continue
        f = fields[key]
        tp = hints[key]
        if get_origin(tp) is tuple or _tuple_in_union(tp):
            converted = _convert_field_list(
                tp, item_name(f), item, _join(path, key), (*raw, key), ctx
            )
        else:
            converted = _convert(tp, item, _join(path, key), (*raw, key), ctx)
        if converted is BAD:
            ok = False
        else:
            kwargs[key] = converted
    for name, f in fields.items():
        if name in value:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            ctx.fail(_join(path, name), raw, "missing required field")
            ok = False
    if not ok:
        return BAD
    return cls(**kwargs)


def _tuple_in_union(tp: Any) -> bool:
    return _is_union(tp) and any(get_origin(a) is tuple for a in get_args(tp))


def _convert_field_list(
    tp: Any, item: str, value: Any, path: str, raw: RawPath, ctx: _Context
) -> Any:
    """A field whose type is ``tuple[X, ...]`` or ``tuple[X, ...] | Literal[...]``."""
    if get_origin(tp) is tuple:
        return _convert_list(get_args(tp)[0], item, value, path, raw, ctx)
    literals = [a for a in get_args(tp) if get_origin(a) is Literal]
    seq = next(a for a in get_args(tp) if get_origin(a) is tuple)
    if isinstance(value, str) and literals:
        return _convert_literal(get_args(literals[0]), value, path, raw, ctx)
    return _convert_list(get_args(seq)[0], item, value, path, raw, ctx)


def _convert_list(
    item_tp: Any, item: str, value: Any, path: str, raw: RawPath, ctx: _Context
) -> Any:
    items: list[Any]
    item_raw: RawPath
    if ctx.typed:
        if not isinstance(value, list):
            return ctx.fail(path, raw, f"expected a list, got {_describe(value)}")
        items, item_raw = value, raw
    else:
        # Text formats: a container whose children are all named `item` (one child is not a list).
        if value is None:
            return ()
        if not isinstance(value, dict):
            return ctx.fail(
                path, raw, f"expected a list of <{item}> entries, got {_describe(value)}"
            )
        extra = [k for k in value if k != item]
        if extra:
            return ctx.fail(
                path, raw, f"a list holds only {item!r} entries, found {', '.join(map(str, extra))}"
            )
        children = value.get(item)
        items = children if isinstance(children, list) else [children]
        item_raw = (*raw, item)
        if not isinstance(children, list):
            out = _convert(item_tp, children, f"{path}[0]", (*item_raw, 0), ctx)
            return BAD if out is BAD else (out,)
    converted = [
        _convert(item_tp, v, f"{path}[{i}]", (*item_raw, i), ctx) for i, v in enumerate(items)
    ]
    if any(c is BAD for c in converted):
        return BAD
    return tuple(converted)


def _convert_union(tp: Any, value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    if len(args) != len(get_args(tp)) and value is None:
        return None
    if len(args) == 1:
        return _convert(args[0], value, path, raw, ctx)
    raise TypeError(f"schema union {tp!r} at {path} is not supported")  # a bug in the schema


def _convert_literal(
    choices: tuple[Any, ...], value: Any, path: str, raw: RawPath, ctx: _Context
) -> Any:
    if isinstance(value, str) and value in choices:
        return value
    allowed = " | ".join(str(c) for c in choices)
    return ctx.fail(path, raw, f"expected one of {allowed}, got {_describe(value)}")


def _convert_str(value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    if value is None and not ctx.typed:
        return ""
    if isinstance(value, str):
        return value
    return ctx.fail(path, raw, f"expected a string, got {_describe(value)}")


def _convert_bool(value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    if ctx.typed and isinstance(value, bool):
        return value
    if not ctx.typed and isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    return ctx.fail(path, raw, f"expected true or false, got {_describe(value)}")


def _convert_int(value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    if ctx.typed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if not ctx.typed and isinstance(value, str):
        text = value.strip()
        if _INT_TEXT.match(text) and len(text) <= _MAX_INT_DIGITS:
            return int(text)
    return ctx.fail(path, raw, f"expected an integer, got {_describe(value)}")


def _convert_float(value: Any, path: str, raw: RawPath, ctx: _Context) -> Any:
    number: float | None = None
    if ctx.typed and isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif not ctx.typed and isinstance(value, str) and len(value) <= 64:
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        return ctx.fail(path, raw, f"expected a finite number, got {_describe(value)}")
    return number


def typed_fields(cls: type, tree: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """A text-format tree of some of ``cls``'s fields in JSON types, as ``to_tree(typed=True)``.

    For a partial document such as the client view (protocol.md §3.2): each key that is a field
    of ``cls`` is converted by its annotation (numbers, booleans, lists, nested sections with
    their defaults) and rendered back typed, so the result equals the JSON form of the same
    values. A key that is no field, or whose value does not convert, is kept as it came; its
    problem is returned (never raised).
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    ctx = _Context(typed=False, lines={}, problems=[])
    out: dict[str, Any] = {}
    for key, value in tree.items():
        f = fields.get(key)
        if f is None:
            out[key] = value
            continue
        tp = hints[key]
        if get_origin(tp) is tuple or _tuple_in_union(tp):
            converted = _convert_field_list(tp, item_name(f), value, key, (key,), ctx)
        else:
            converted = _convert(tp, value, key, (key,), ctx)
        if converted is BAD:
            out[key] = value
        elif isinstance(converted, tuple):
            out[key] = [to_tree(item, typed=True) for item in converted]
        else:
            out[key] = to_tree(converted, typed=True)
    return out, ctx.problems


def to_tree(obj: Any, *, typed: bool) -> Any:
    """The plain tree of a config object, every field present (None fields left out).

    ``typed=True`` gives JSON types (the canonical form is built from it); ``typed=False`` gives
    strings and item containers, for XML and ZPL.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                items = [to_tree(v, typed=typed) for v in value]
                out[f.name] = items if typed else ({item_name(f): items} if items else None)
            else:
                out[f.name] = to_tree(value, typed=typed)
        return out
    if isinstance(obj, Enum):
        return obj.value
    if typed or isinstance(obj, str):
        return obj
    if isinstance(obj, bool):
        return "true" if obj else "false"
    if isinstance(obj, int | float):
        return repr(obj)
    raise TypeError(f"cannot render {type(obj).__name__}")  # a bug in the schema
