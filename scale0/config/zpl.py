"""ZPL codec: parse and write the ZeroMQ Property Language (rfc.zeromq.org spec 4/ZPL).

A ZPL document is a list of properties, one per line; each has a name, an optional value and
children, which are the following lines indented exactly 4 spaces more. ``parse`` turns text into
a list of ``ZplNode`` trees and ``dump`` turns them back into text; ``parse(dump(nodes))`` equals
``nodes`` apart from ``line``. Every failure of either is a ``ConfigError`` naming the line (when
parsing) or the node path such as ``brokers/item/identity`` (when writing).

The parser is a strict subset of the spec: every document it accepts means the same under any
reasonable reading of the spec (and of CZMQ's ``zconfig``, the reference implementation), and it
refuses documents where those readings differ or where a typing mistake is the likely cause.
Decisions on points the spec leaves open or that we tighten:

* Input is ``str``; decoding bytes is the caller's job. The spec says ASCII, but values and
  comments may hold any printable Unicode character (``str.isprintable``). Names are ASCII.
* Line ends are LF, CR and CRLF, one line end each (the spec's hex for CRLF, ``%x0A %x0D``, is a
  typo for what its words say). No other character ends a line: U+2028, VT, FF and the like are
  refused, as is every character that is not printable, anywhere, comments included.
* The only whitespace is the space. A tab anywhere is an error, as in indentation it would be
  ambiguous. A byte-order mark is refused: open the file with ``encoding="utf-8-sig"``.
* Blank lines, space-only lines and comment-only lines are ignored whatever their indentation.
* Indentation is a multiple of 4 spaces. Top-level properties start in column 1. A property is
  at most one level deeper than the one before it; it may be any number of levels shallower.
* A name is one or more of ASCII letters, digits and ``$ - _ @ . & + /``; any of them may come
  first (the spec's note that a file starts with ``#`` or an alphanumeric is not enforced).
* Spaces around ``=`` are optional and insignificant: ``a=1``, ``a = 1`` and ``a   =  1`` agree.
* A bare ``name`` has value ``None``; ``name = ""`` has value ``""``. ``name =`` with nothing
  after it is refused (CZMQ reads it as ``""``; write ``""`` to mean that).
* An unquoted value is one run of printable characters other than space, ``#``, ``=``, ``'`` and
  ``"``. Anything but a comment after it is refused: ``a = two words`` means ``"two words"`` to
  CZMQ and ``"two"`` to others, so it must be quoted.
* A quoted value runs from the opening quote to the next quote of the same kind; there are no
  escapes, so it may hold the other kind of quote, spaces, ``#`` and ``=``. Only spaces and a
  comment may follow it.
* A value that opens a quote and never closes it is refused ("unterminated quoted value"), as
  CZMQ does; the spec's reading (keep it unquoted, quote included) hides typos in config.
* ``#`` starts a comment at the start of a line's content or after a space; a ``#`` stuck to a
  name or value (``a = b#c``, ``a = "b"#c``) is refused, because the intent is unclear.
* Trailing spaces are ignored. A missing final line end is fine.
* Repeated names are kept, in order; a property may have both a value and children.
* Abuse limits: at most ``MAX_INPUT_CHARS`` characters and ``MAX_DEPTH`` levels of nesting. Both
  parse and dump are iterative, so no input reaches Python's recursion limit.

The writer uses LF, 4-space indentation, ``name = value`` with one space around ``=``, and a
final line end (an empty list writes the empty string). It leaves a value unquoted when it can,
quotes with ``"`` unless the value holds one, then with ``'``, and refuses what ZPL cannot hold:
a value with both quote kinds, a line break or another non-printable character, an invalid name,
nesting beyond ``MAX_DEPTH`` (which also stops cycles) and output beyond ``MAX_INPUT_CHARS``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

from scale0.config.errors import ConfigError

__all__ = ["MAX_DEPTH", "MAX_INPUT_CHARS", "ZplNode", "dump", "parse"]

MAX_DEPTH = 64
"""Most levels of nesting accepted: top-level properties are level 1."""

MAX_INPUT_CHARS = 1 << 20
"""Largest document, in characters, that parse reads and dump writes."""

_INDENT = 4
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "$-_@.&+/")
_NAME = re.compile(r"[A-Za-z0-9$\-_@.&+/]*")
_LINE_END = re.compile(r"\r\n|\r|\n")
_QUOTES = "\"'"
_NOT_IN_UNQUOTED = frozenset("#='\"")
_NEEDS_QUOTES = frozenset(" #='\"")
_SNIPPET = 24


@dataclass(slots=True)
class ZplNode:
    """One ZPL property: a name, an optional value and child properties, in order."""

    name: str
    value: str | None = None
    children: list[ZplNode] = field(default_factory=list)
    line: int = 0


class _LineError(Exception):
    """A syntax error inside one line; ``name`` is the property's name once it is known."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.name = name


def parse(text: str, *, source: str | None = None) -> list[ZplNode]:
    """Parse a ZPL document into its top-level properties; ``source`` names the file in errors."""
    given: object = text
    if not isinstance(given, str):
        raise ConfigError.single(
            f"ZPL input must be text (str), not {type(given).__name__}", file=source
        )
    if len(text) > MAX_INPUT_CHARS:
        raise ConfigError.single(
            f"document of {len(text)} characters exceeds the limit of {MAX_INPUT_CHARS}",
            file=source,
        )
    roots: list[ZplNode] = []
    open_nodes: list[ZplNode] = []  # open_nodes[k]: the latest property at indentation level k
    for number, line in enumerate(_LINE_END.split(text), start=1):
        bad = _first_unprintable(line)
        if bad is not None:
            raise _error(_describe_unprintable(line, bad), source, number)
        content = line.lstrip(" ")
        if not content or content.startswith("#"):
            continue
        indent = len(line) - len(content)
        if indent % _INDENT:
            raise _error(
                f"indentation of {indent} spaces is not a multiple of {_INDENT}", source, number
            )
        level = indent // _INDENT
        if level > len(open_nodes):
            if not open_nodes:
                raise _error(
                    f"the first property is indented {indent} spaces; "
                    "top-level properties start in column 1",
                    source,
                    number,
                )
            raise _error(
                f"indented {level - len(open_nodes) + 1} levels deeper than the previous property;"
                f" a child is indented exactly {_INDENT} spaces more than its parent",
                source,
                number,
            )
        if level >= MAX_DEPTH:
            raise _error(f"nesting deeper than {MAX_DEPTH} levels", source, number)
        try:
            name, value = _parse_content(content.rstrip(" "))
        except _LineError as exc:
            path = "/".join([*(node.name for node in open_nodes[:level]), exc.name])
            raise _error(exc.message, source, number, path if exc.name else "") from None
        node = ZplNode(name, value, [], number)
        (open_nodes[level - 1].children if level else roots).append(node)
        del open_nodes[level:]
        open_nodes.append(node)
    return roots


def _error(message: str, source: str | None, line: int, path: str = "") -> ConfigError:
    return ConfigError.single(message, path=path, file=source, line=line)


def _parse_content(content: str) -> tuple[str, str | None]:
    """Read ``name [= value] [# comment]`` from a line without indentation or trailing spaces."""
    match = _NAME.match(content)
    end = match.end() if match else 0
    name = content[:end]
    if end == len(content):
        return name, None
    char = content[end]
    if not name:
        if char == "=":
            raise _LineError("missing name before '='")
        raise _LineError(f"invalid character {_show(char)} in name")
    if char == "#":
        raise _LineError("a comment must be separated from the name by a space", name)
    if char not in " =":
        token = re.split("[ =]", content, maxsplit=1)[0]
        raise _LineError(f"invalid character {_show(char)} in name {_snippet(token)}")
    pos = _skip_spaces(content, end)
    if content[pos] == "#":
        return name, None
    if content[pos] != "=":
        raise _LineError(
            f"expected '=' after name {name!r}, found {_snippet(content[pos:])}"
            " (a value must follow '=')",
            name,
        )
    pos = _skip_spaces(content, pos + 1)
    if pos == len(content):
        raise _LineError("missing value after '='; write \"\" for an empty value", name)
    first = content[pos]
    if first == "#":
        raise _LineError(
            "missing value after '=' (a '#' starts a comment; quote a value that holds '#')", name
        )
    if first in _QUOTES:
        close = content.find(first, pos + 1)
        if close < 0:
            raise _LineError(f"unterminated quoted value (no closing {first})", name)
        value = content[pos + 1 : close]
        pos = close + 1
    else:
        stop = content.find(" ", pos)
        stop = len(content) if stop < 0 else stop
        value = content[pos:stop]
        for char in value:
            if char == "#":
                raise _LineError(
                    "'#' inside an unquoted value: quote the value, "
                    "or put a space before the comment",
                    name,
                )
            if char in _NOT_IN_UNQUOTED:
                raise _LineError(f"{_show(char)} inside an unquoted value: quote the value", name)
        pos = stop
    rest = _skip_spaces(content, pos)
    if rest == len(content):
        return name, value
    if content[rest] == "#":
        if rest > pos:
            return name, value
        raise _LineError("a comment must be separated from the value by a space", name)
    hint = " (a value holding spaces must be quoted)" if first not in _QUOTES else ""
    raise _LineError(f"unexpected text {_snippet(content[rest:])} after the value{hint}", name)


def dump(nodes: Sequence[ZplNode]) -> str:
    """Write properties as a ZPL document: LF line ends, 4-space indentation, final line end."""
    given: object = nodes
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise ConfigError.single(f"dump() takes a sequence of ZplNode, not {type(given).__name__}")
    lines: list[str] = []
    size = 0
    # Depth-first with an explicit stack: (node, level, path of its parent).
    stack: list[tuple[object, int, str]] = [(node, 0, "") for node in reversed(given)]
    while stack:
        item, level, parent = stack.pop()
        if not isinstance(item, ZplNode):
            raise ConfigError.single(f"expected a ZplNode, got {type(item).__name__}", path=parent)
        name: object = item.name
        shown = name if isinstance(name, str) else f"<{type(name).__name__}>"
        path = f"{parent}/{shown}" if parent else shown
        valid_name = _check_name(name, path)
        if level >= MAX_DEPTH:
            raise ConfigError.single(f"nesting deeper than {MAX_DEPTH} levels", path=path)
        text = " " * (_INDENT * level) + valid_name
        if item.value is not None:
            text += " = " + _quote(item.value, path)
        size += len(text) + 1
        if size > MAX_INPUT_CHARS:
            raise ConfigError.single(
                f"document would exceed the limit of {MAX_INPUT_CHARS} characters", path=path
            )
        lines.append(text)
        children: object = item.children
        if not isinstance(children, list):
            raise ConfigError.single(
                f"children must be a list, not {type(children).__name__}", path=path
            )
        stack.extend((child, level + 1, path) for child in reversed(children))
    return "".join(line + "\n" for line in lines)


def _check_name(name: object, path: str) -> str:
    if not isinstance(name, str):
        raise ConfigError.single(f"name must be a string, not {type(name).__name__}", path=path)
    if not name:
        raise ConfigError.single("empty name", path=path)
    for char in name:
        if char not in _NAME_CHARS:
            raise ConfigError.single(
                f"invalid character {_show(char)} in name {name!r}: a ZPL name holds only"
                " letters, digits and $-_@.&+/",
                path=path,
            )
    return name


def _quote(value: object, path: str) -> str:
    """The value as ZPL writes it, quoted exactly when needed; refuse what ZPL cannot hold."""
    if not isinstance(value, str):
        raise ConfigError.single(f"value must be a string, not {type(value).__name__}", path=path)
    bad = _first_unprintable(value)
    if bad is not None:
        char = value[bad]
        what = "a line break" if char in "\r\n" else f"character {_show(char)}"
        raise ConfigError.single(f"value holds {what}, which ZPL cannot represent", path=path)
    if value and _NEEDS_QUOTES.isdisjoint(value):
        return value
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    raise ConfigError.single(
        "value holds both ' and \", which ZPL cannot represent (it has no escapes)", path=path
    )


def _first_unprintable(text: str) -> int | None:
    if text.isprintable():
        return None
    return next(i for i, char in enumerate(text) if not char.isprintable())


def _describe_unprintable(line: str, index: int) -> str:
    char, column = line[index], index + 1
    if char == "\t":
        return f"tab character at column {column}; ZPL indents and separates with spaces only"
    if char == "\ufeff":
        return "byte-order mark (U+FEFF); decode the file with encoding 'utf-8-sig'"
    return f"invalid character {_show(char)} at column {column}; only printable text is allowed"


def _skip_spaces(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    return pos


def _show(char: str) -> str:
    return repr(char) if char.isprintable() else f"U+{ord(char):04X}"


def _snippet(text: str) -> str:
    return repr(text if len(text) <= _SNIPPET else text[:_SNIPPET] + "...")
