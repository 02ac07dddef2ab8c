"""The four file formats (YAML, JSON, XML, ZFL/ZPL): bytes to plain trees with line maps, and back.

Parsers are hardened for untrusted input: a size limit checked before parsing, YAML without
object construction or aliases, XML without any DOCTYPE (so no entity expansion, internal or
external), and bounded nesting everywhere. Every failure is a ConfigError naming file and line.
"""

from __future__ import annotations

import json
import xml.parsers.expat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Final, Literal

import xmltodict
import yaml

from scale0.config import zpl
from scale0.config.errors import ConfigError
from scale0.config.schema import RawPath, line_for
from scale0.wire.frames import ConfigType

Format = Literal["yaml", "json", "xml", "zfl"]

#: The codec of each config type a CONFIG document may travel in (docs/protocol.md §3.2),
#: written once for the broker, the replica and the client libraries.
CONFIG_TYPE_FORMATS: Final[Mapping[ConfigType, Format]] = {
    ConfigType.JSON: "json",
    ConfigType.XML: "xml",
    ConfigType.ZFL: "zfl",
}
Kind = Literal["network", "broker"]
FORMATS: tuple[Format, ...] = ("yaml", "json", "xml", "zfl")
EXTENSIONS: dict[str, Format] = {
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".xml": "xml",
    ".zfl": "zfl",
    ".zpl": "zfl",
}
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32
# XML root element per document kind; JSON, YAML and ZPL have no root, the keys tell the kind.
XML_ROOTS: dict[Kind, str] = {"network": "network", "broker": "broker"}


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed file: its plain tree, where each part sat, and the kind the format itself named."""

    tree: Any
    lines: dict[RawPath, int]
    typed: bool
    kind: Kind | None = None


def format_of(path: str | PurePath) -> Format:
    suffix = PurePath(path).suffix.lower()
    fmt = EXTENSIONS.get(suffix)
    if fmt is None:
        known = ", ".join(sorted(EXTENSIONS))
        raise ConfigError.single(
            f"cannot tell the format from the extension {suffix or '(none)'!r}; use one of {known}",
            file=str(path),
        )
    return fmt


def parse(data: bytes, fmt: Format, *, source: str | None = None) -> Parsed:
    """Parse bytes of one format into a plain tree; ConfigError (with the file) on any problem."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError.single(
            f"file is {len(data)} bytes, over the {MAX_CONFIG_BYTES}-byte limit", file=source
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError.single("file is not valid UTF-8", file=source, line=line) from None
    text = text.removeprefix("\ufeff")
    try:
        return _PARSERS[fmt](text)
    except ConfigError as exc:
        raise exc.located(source) from None
    except RecursionError:
        raise ConfigError.single("nesting too deep", file=source) from None


def _parse_json(text: str) -> Parsed:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigError.single(f"duplicate key {key!r}")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ConfigError.single(f"{name} is not a number a config may hold")

    try:
        tree = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ConfigError.single(
            f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
        ) from None
    _check_depth(tree)
    return Parsed(tree, _json_lines(text), typed=True)


def _json_lines(text: str) -> dict[RawPath, int]:
    # JSON has no positions in the standard parser; YAML's composer reads JSON documents and
    # knows where each node starts. Only used to put line numbers on errors, so best effort.
    try:
        return _parse_yaml(text).lines
    except (ConfigError, RecursionError):
        return {}


def _check_depth(tree: Any) -> None:
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError.single(f"nesting deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _parse_yaml(text: str) -> Parsed:
    lines: dict[RawPath, int] = {}
    try:
        loader = yaml.SafeLoader(text)  # its reader already refuses some characters
    except yaml.YAMLError as exc:
        raise ConfigError.single(f"invalid YAML: {exc}") from None
    try:
        root = loader.get_single_node()
        tree = None if root is None else _yaml_node(loader, root, (), lines, set())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ConfigError.single(f"invalid YAML: {exc.problem or exc.context}", line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError.single(f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return Parsed(tree, lines, typed=True)


# The core schema's tags; anything else (!!python/..., !!binary, !!timestamp, custom) is refused.
_YAML_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null")
)


def _yaml_node(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    raw: RawPath,
    lines: dict[RawPath, int],
    seen: set[int],
) -> Any:
    line = node.start_mark.line + 1
    lines[raw] = line
    if len(raw) > MAX_DEPTH:
        raise ConfigError.single(f"nesting deeper than {MAX_DEPTH} levels", line=line)
    # An alias makes the composer hand out one node twice; walking it again is how "billion
    # laughs" works in YAML, and a config has no use for aliases, so they are refused.
    if id(node) in seen:
        raise ConfigError.single("YAML anchors and aliases are not supported", line=line)
    seen.add(id(node))
    if node.tag not in _YAML_TAGS:
        raise ConfigError.single(
            f"invalid YAML: tag {node.tag!r} is not allowed in a config", line=line
        )
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            if key == "<<":
                raise ConfigError.single("YAML merge keys are not supported", line=line)
            if not isinstance(key, str):
                raise ConfigError.single(
                    f"key {key!r} is not a string", line=key_node.start_mark.line + 1
                )
            if key in out:
                raise ConfigError.single(
                    f"duplicate key {key!r}", line=key_node.start_mark.line + 1
                )
            out[key] = _yaml_node(loader, value_node, (*raw, key), lines, seen)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _yaml_node(loader, item, (*raw, i), lines, seen) for i, item in enumerate(node.value)
        ]
    value = loader.construct_object(node)
    if not (value is None or isinstance(value, str | int | float | bool)):
        raise ConfigError.single(
            f"a {type(value).__name__} value is not allowed in a config", line=line
        )
    return value


def _parse_xml(text: str) -> Parsed:
    lines = _xml_lines(text)
    try:
        doc = xmltodict.parse(text, disable_entities=True)
    except (xml.parsers.expat.ExpatError, ValueError) as exc:
        raise ConfigError.single(f"invalid XML: {exc}") from None
    if not isinstance(doc, dict) or len(doc) != 1:
        raise ConfigError.single("invalid XML: expected one root element")
    ((root, tree),) = doc.items()
    kinds = {v: k for k, v in XML_ROOTS.items()}
    if root not in kinds:
        raise ConfigError.single(
            f"root element <{root}> is not one of <network>, <broker>", line=lines.get((), 1)
        )
    _reject_xml_extras(tree, (), lines)
    return Parsed(tree, lines, typed=False, kind=kinds[root])


def _xml_lines(text: str) -> dict[RawPath, int]:
    """One expat pass: refuse any DOCTYPE, bound depth, and note each element's line."""
    parser = xml.parsers.expat.ParserCreate()
    lines: dict[RawPath, int] = {}
    stack: list[tuple[RawPath, dict[str, int]]] = []

    def doctype(*_args: Any) -> None:
        raise ConfigError.single(
            "XML DOCTYPE declarations are not allowed (no DTDs, no entities)",
            line=parser.CurrentLineNumber,
        )

    def start(name: str, _attrs: Any) -> None:
        line = parser.CurrentLineNumber
        if len(stack) > MAX_DEPTH:
            raise ConfigError.single(f"nesting deeper than {MAX_DEPTH} levels", line=line)
        if not stack:
            path: RawPath = ()
        else:
            parent, counts = stack[-1]
            index = counts.get(name, 0)
            counts[name] = index + 1
            path = (*parent, name, index)  # normalized form, see schema.normalized
        lines.setdefault(path, line)
        stack.append((path, {}))

    def end(_name: str) -> None:
        stack.pop()

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = doctype
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as exc:
        raise ConfigError.single(
            f"invalid XML: {xml.parsers.expat.ErrorString(exc.code)}", line=exc.lineno
        ) from None
    return lines


def _reject_xml_extras(tree: Any, raw: RawPath, lines: dict[RawPath, int]) -> None:
    """Attributes and mixed text have no place in the schema: name them instead of ignoring them."""
    stack: list[tuple[Any, RawPath]] = [(tree, raw)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                if key.startswith("@"):
                    raise ConfigError.single(
                        f"XML attribute {key[1:]!r} is not allowed; use a child element",
                        line=line_for(lines, path),
                    )
                if key == "#text":
                    raise ConfigError.single(
                        f"text {str(value).strip()[:30]!r} mixed with child elements",
                        line=line_for(lines, path),
                    )
                stack.append((value, (*path, key)))


def _parse_zfl(text: str) -> Parsed:
    nodes = zpl.parse(text)
    lines: dict[RawPath, int] = {}
    return Parsed(_zpl_section(nodes, (), lines), lines, typed=False)


def _zpl_section(nodes: list[zpl.ZplNode], raw: RawPath, lines: dict[RawPath, int]) -> Any:
    """ZPL children to a dict like xmltodict's: repeated names become a list, in order."""
    if not nodes:
        return None
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for node in nodes:
        index = counts.get(node.name, 0)
        counts[node.name] = index + 1
        path = (*raw, node.name, index)  # normalized form, see schema.normalized
        lines[path] = node.line
        if node.value is not None and node.children:
            raise ConfigError.single(f"{node.name!r} has both a value and children", line=node.line)
        value = node.value if node.value is not None else _zpl_section(node.children, path, lines)
        if index == 0:
            out[node.name] = value
        elif index == 1:
            out[node.name] = [out[node.name], value]
        else:
            out[node.name].append(value)
    return out


_PARSERS: dict[Format, Callable[[str], Parsed]] = {
    "yaml": _parse_yaml,
    "json": _parse_json,
    "xml": _parse_xml,
    "zfl": _parse_zfl,
}


def render(tree: Any, fmt: Format, *, kind: Kind) -> bytes:
    """Serialize a plain tree (typed for JSON/YAML, text form for XML/ZPL) in one format."""
    if fmt == "json":
        return (json.dumps(tree, indent=2, ensure_ascii=False) + "\n").encode()
    if fmt == "yaml":
        text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, default_flow_style=False)
        return str(text).encode()
    if fmt == "xml":
        xml_text: str = xmltodict.unparse({XML_ROOTS[kind]: tree}, pretty=True, indent="  ")
        return (xml_text + "\n").encode()
    return zpl.dump(_zpl_nodes(tree)).encode()


def _zpl_nodes(tree: Any) -> list[zpl.ZplNode]:
    nodes: list[zpl.ZplNode] = []
    for name, value in (tree or {}).items():
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                nodes.append(zpl.ZplNode(name))
            elif isinstance(item, dict):
                nodes.append(zpl.ZplNode(name, children=_zpl_nodes(item)))
            else:
                nodes.append(zpl.ZplNode(name, str(item)))
    return nodes
