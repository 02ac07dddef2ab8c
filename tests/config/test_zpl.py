"""Tests of the ZPL codec (spec 4/ZPL): a named test per edge case, the spec example, properties."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.errors import ConfigError
from scale0.config.zpl import MAX_DEPTH, MAX_INPUT_CHARS, ZplNode, dump, parse

N = ZplNode


def _strip(nodes: list[ZplNode]) -> list[ZplNode]:
    """The same trees with every ``line`` set to 0, for comparing parsed with built nodes."""
    return [N(n.name, n.value, _strip(n.children)) for n in nodes]


def _parsed(text: str) -> list[ZplNode]:
    return _strip(parse(text))


def _refused(text: str, *, source: str | None = None) -> tuple[str, int | None, str]:
    """Parse text that must fail; return (message, line, path) of its single problem."""
    with pytest.raises(ConfigError) as info:
        parse(text, source=source)
    (problem,) = info.value.problems
    return problem.message, problem.line, problem.path


def _dump_refused(nodes: list[ZplNode]) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        dump(nodes)
    (problem,) = info.value.problems
    return problem.message, problem.path


# The example of spec 4/ZPL. The published page shows the first comment lines as "1. ..." because
# the wiki turned "#" at line start into a numbered list; the original lines are comments.
SPEC_EXAMPLE = """\
#   ZPL configuration file example
#   This format is designed to be trivial to write and parse
#
context
    iothreads = 1
    verbose = 1      #   Ask for a trace

main
    type = zmq_queue
    frontend
        option
            hwm = 1000
            swap = 25000000
            subscribe = "#2"
        bind = tcp://eth0:5555
    backend
        bind = tcp://eth0:5556
"""

SPEC_TREE = [
    N("context", None, [N("iothreads", "1"), N("verbose", "1")]),
    N(
        "main",
        None,
        [
            N("type", "zmq_queue"),
            N(
                "frontend",
                None,
                [
                    N(
                        "option",
                        None,
                        [N("hwm", "1000"), N("swap", "25000000"), N("subscribe", "#2")],
                    ),
                    N("bind", "tcp://eth0:5555"),
                ],
            ),
            N("backend", None, [N("bind", "tcp://eth0:5556")]),
        ],
    ),
]


# --- the spec's own example ---------------------------------------------------------------------


def test_spec_example_parses_to_exact_tree() -> None:
    assert _parsed(SPEC_EXAMPLE) == SPEC_TREE


def test_spec_example_records_source_lines() -> None:
    context, main = parse(SPEC_EXAMPLE)
    assert (context.line, context.children[1].line, main.line) == (4, 6, 8)
    assert main.children[2].children[0].line == 17


def test_spec_example_round_trips_through_dump() -> None:
    assert _parsed(dump(SPEC_TREE)) == SPEC_TREE


# --- documents with no properties --------------------------------------------------------------


def test_empty_file_has_no_properties() -> None:
    assert parse("") == []


def test_blank_lines_only_file_has_no_properties() -> None:
    assert parse("\n   \n\r\n        \r") == []


def test_comment_only_file_has_no_properties() -> None:
    assert parse("# one\n#two\n    # indented comment\n  # oddly indented comment\n#\n") == []


# --- names and values ----------------------------------------------------------------------------


def test_bare_name_has_no_value() -> None:
    assert _parsed("name\n") == [N("name")]


def test_name_with_unquoted_value() -> None:
    assert _parsed("bind = tcp://*:5555\n") == [N("bind", "tcp://*:5555")]


def test_spaces_around_equals_are_optional() -> None:
    assert _parsed("a=1\nb =2\nc= 3\nd    =    4\n") == [
        N("a", "1"),
        N("b", "2"),
        N("c", "3"),
        N("d", "4"),
    ]


def test_every_name_character_of_the_grammar_is_accepted() -> None:
    name = string.ascii_letters + string.digits + "$-_@.&+/"
    assert _parsed(f"{name} = x\n/leading\n$5\n") == [N(name, "x"), N("/leading"), N("$5")]


def test_empty_quoted_value_is_empty_string_not_none() -> None:
    assert _parsed("a = \"\"\nb = ''\nc\n") == [N("a", ""), N("b", ""), N("c")]


def test_non_ascii_printable_value_is_accepted() -> None:
    assert _parsed("motd = café→ok\nq = 'naïve ünïcode'\n") == [
        N("motd", "café→ok"),
        N("q", "naïve ünïcode"),
    ]


def test_trailing_whitespace_is_ignored() -> None:
    assert _parsed("a   \nb = 1    \nc = 'x y'   \n    \n") == [N("a"), N("b", "1"), N("c", "x y")]


def test_missing_final_line_end_is_accepted() -> None:
    assert _parsed("a\n    b = 2") == [N("a", None, [N("b", "2")])]


# --- quotes --------------------------------------------------------------------------------------


def test_double_quoted_value() -> None:
    assert _parsed('a = "two words"\n') == [N("a", "two words")]


def test_single_quoted_value() -> None:
    assert _parsed("a = 'two words'\n") == [N("a", "two words")]


def test_double_quoted_value_may_hold_single_quote() -> None:
    assert _parsed('a = "it\'s"\n') == [N("a", "it's")]


def test_single_quoted_value_may_hold_double_quote() -> None:
    assert _parsed("a = 'say \"hi\"'\n") == [N("a", 'say "hi"')]


def test_quoted_value_keeps_leading_and_trailing_spaces() -> None:
    assert _parsed('a = "  padded  "\n') == [N("a", "  padded  ")]


def test_quoted_value_may_hold_equals() -> None:
    assert _parsed("a = 'x=1'\n") == [N("a", "x=1")]


# --- comments ------------------------------------------------------------------------------------


def test_whole_line_comment_is_ignored() -> None:
    assert _parsed("# comment\na\n#another = 1\n") == [N("a")]


def test_indented_comment_line_is_ignored_whatever_its_indentation() -> None:
    assert _parsed("a\n      # six spaces\n    b\n") == [N("a", None, [N("b")])]


def test_trailing_comment_after_unquoted_value() -> None:
    assert _parsed("verbose = 1      #   Ask for a trace\n") == [N("verbose", "1")]


def test_trailing_comment_after_bare_name() -> None:
    assert _parsed("section # the section\n") == [N("section")]


def test_trailing_comment_after_quoted_value() -> None:
    assert _parsed("a = 'x' # note 'quoted' \"stuff\"\n") == [N("a", "x")]


def test_hash_inside_double_quotes_is_part_of_value() -> None:
    assert _parsed('subscribe = "#2"\n') == [N("subscribe", "#2")]


def test_hash_inside_single_quotes_is_part_of_value() -> None:
    assert _parsed("a = 'x # not a comment' # a comment\n") == [N("a", "x # not a comment")]


# --- line ends -----------------------------------------------------------------------------------


def test_lf_line_ends() -> None:
    assert _parsed("a\n    b = 1\nc\n") == [N("a", None, [N("b", "1")]), N("c")]


def test_crlf_line_ends() -> None:
    assert _parsed("a\r\n    b = 1\r\nc\r\n") == [N("a", None, [N("b", "1")]), N("c")]


def test_cr_line_ends() -> None:
    assert _parsed("a\r    b = 1\rc\r") == [N("a", None, [N("b", "1")]), N("c")]


def test_mixed_line_ends_each_count_as_one_line() -> None:
    nodes = parse("a\r\nb\rc\nd")
    assert [(n.name, n.line) for n in nodes] == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]


def test_error_line_number_counts_cr_line_ends() -> None:
    assert _refused("a\rb\r\rc d\r")[1] == 4


def test_unicode_line_separator_is_not_a_line_end() -> None:
    message, line, _ = _refused("a\u2028b\n")
    assert line == 1
    assert "U+2028" in message


# --- structure -----------------------------------------------------------------------------------


def test_repeated_names_are_kept_in_order() -> None:
    text = "bind = tcp://a\nbind = tcp://b\nbind\n    bind = c\n"
    assert _parsed(text) == [
        N("bind", "tcp://a"),
        N("bind", "tcp://b"),
        N("bind", None, [N("bind", "c")]),
    ]


def test_property_may_have_value_and_children() -> None:
    assert _parsed("broker = main\n    port = 5555\n") == [N("broker", "main", [N("port", "5555")])]


def test_dedent_by_several_levels_returns_to_that_parent() -> None:
    text = "a\n    b\n        c\n            d\n    e\nf\n"
    assert _parsed(text) == [
        N("a", None, [N("b", None, [N("c", None, [N("d")])]), N("e")]),
        N("f"),
    ]


def test_blank_and_comment_lines_do_not_break_nesting() -> None:
    assert _parsed("a\n\n# note\n    b\n\n        c\n") == [N("a", None, [N("b", None, [N("c")])])]


def test_nesting_up_to_the_limit_is_accepted() -> None:
    text = "".join(" " * (4 * level) + f"n{level}\n" for level in range(MAX_DEPTH))
    node = parse(text)[0]
    depth = 1
    while node.children:
        (node,) = node.children
        depth += 1
    assert depth == MAX_DEPTH


# --- indentation errors --------------------------------------------------------------------------


def test_indentation_not_multiple_of_four_is_refused() -> None:
    message, line, _ = _refused("a\n      b\n")
    assert message == "indentation of 6 spaces is not a multiple of 4"
    assert line == 2


def test_tab_indentation_is_refused() -> None:
    message, line, _ = _refused("a\n\tb = 1\n")
    assert line == 2
    assert "tab" in message


def test_tab_after_value_is_refused() -> None:
    message, line, _ = _refused("a = 1\t# comment\n")
    assert line == 1
    assert "tab character at column 6" in message


def test_tab_inside_comment_is_refused() -> None:
    assert "tab" in _refused("#\tcomment\n")[0]


def test_child_two_levels_deeper_than_parent_is_refused() -> None:
    message, line, _ = _refused("a\n    b\n            c\n")
    assert line == 3
    assert "2 levels deeper" in message


def test_first_property_indented_is_refused() -> None:
    message, line, _ = _refused("# header\n    a = 1\n")
    assert line == 2
    assert "first property is indented 4 spaces" in message


def test_nesting_beyond_the_limit_is_refused() -> None:
    text = "".join(" " * (4 * level) + "n\n" for level in range(MAX_DEPTH + 1))
    message, line, _ = _refused(text)
    assert line == MAX_DEPTH + 1
    assert f"deeper than {MAX_DEPTH}" in message


def test_very_deep_input_gives_config_error_not_recursion_error() -> None:
    text = "".join(" " * (4 * level) + "n\n" for level in range(500))
    assert _refused(text)[1] == MAX_DEPTH + 1


# --- name errors ---------------------------------------------------------------------------------


def test_invalid_character_in_name_is_refused() -> None:
    message, line, _ = _refused("ok\nbad!name = 1\n")
    assert line == 2
    assert message == "invalid character '!' in name 'bad!name'"


def test_invalid_first_character_of_name_is_refused() -> None:
    assert _refused("!name\n")[0] == "invalid character '!' in name"


def test_non_ascii_letter_in_name_is_refused() -> None:
    assert "invalid character 'é' in name" in _refused("café = 1\n")[0]


def test_quoted_name_is_refused() -> None:
    assert "invalid character '\"' in name" in _refused('"name" = 1\n')[0]


def test_missing_name_before_equals_is_refused() -> None:
    assert _refused("= value\n")[0] == "missing name before '='"


def test_two_words_without_equals_are_refused() -> None:
    message, _, path = _refused("name value\n")
    assert message.startswith("expected '=' after name 'name', found 'value'")
    assert path == "name"


def test_comment_stuck_to_name_is_refused() -> None:
    assert "separated from the name by a space" in _refused("name#comment\n")[0]


# --- value errors --------------------------------------------------------------------------------


def test_missing_value_after_equals_is_refused() -> None:
    message, line, path = _refused("a\n    b =   \n")
    assert (line, path) == (2, "a/b")
    assert message.startswith("missing value after '='")


def test_value_that_starts_a_comment_is_refused() -> None:
    assert _refused("color = #fff\n")[0].startswith("missing value after '='")


def test_unterminated_double_quote_is_refused() -> None:
    message, line, path = _refused('ok\nidentity = "abc\n')
    assert (message, line, path) == ('unterminated quoted value (no closing ")', 2, "identity")


def test_unterminated_single_quote_is_refused() -> None:
    assert _refused("a = 'abc\"\n")[0] == "unterminated quoted value (no closing ')"


def test_quote_of_the_other_kind_does_not_close_a_value() -> None:
    assert _refused("a = \"abc'\n")[0].startswith("unterminated quoted value")


def test_text_after_quoted_value_is_refused() -> None:
    assert _refused("a = 'x' y\n")[0] == "unexpected text 'y' after the value"
    assert _refused('a = ""x\n')[0] == "unexpected text 'x' after the value"


def test_unquoted_value_with_spaces_is_refused() -> None:
    message, _, path = _refused("a = two words\n")
    assert path == "a"
    assert message.startswith("unexpected text 'words' after the value")


def test_hash_stuck_to_unquoted_value_is_refused() -> None:
    assert _refused("a = b#c\n")[0].startswith("'#' inside an unquoted value")


def test_comment_stuck_to_quoted_value_is_refused() -> None:
    assert "separated from the value by a space" in _refused("a = 'b'#c\n")[0]


def test_quote_inside_unquoted_value_is_refused() -> None:
    assert _refused("a = it's\n")[0] == '"\'" inside an unquoted value: quote the value'


def test_equals_inside_unquoted_value_is_refused() -> None:
    assert _refused("a = x=1\n")[0] == "'=' inside an unquoted value: quote the value"


def test_second_equals_is_refused() -> None:
    assert _refused("a = = b\n")[0] == "'=' inside an unquoted value: quote the value"


# --- other input errors --------------------------------------------------------------------------


def test_control_character_is_refused() -> None:
    message, line, _ = _refused("a\nb = x\x00y\n")
    assert line == 2
    assert message.startswith("invalid character U+0000 at column 6")


def test_non_breaking_space_is_refused() -> None:
    assert "U+00A0" in _refused("a =\u00a0b\n")[0]


def test_byte_order_mark_is_refused() -> None:
    message, line, _ = _refused("\ufeffa = 1\n")
    assert line == 1
    assert "byte-order mark" in message


def test_error_names_the_source_file() -> None:
    with pytest.raises(ConfigError) as info:
        parse("a\n  b\n", source="broker.zpl")
    assert info.value.problems[0].file == "broker.zpl"
    assert str(info.value).startswith("broker.zpl:2:")


def test_error_names_the_node_path() -> None:
    text = "brokers\n    item\n        identity = 'a\n"
    assert _refused(text)[2] == "brokers/item/identity"


def test_oversized_input_is_refused() -> None:
    message, line, _ = _refused("#" * (MAX_INPUT_CHARS + 1))
    assert line is None
    assert "exceeds the limit" in message


def test_bytes_input_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be text"):
        parse(b"a = 1\n")  # type: ignore[arg-type]


# --- writer layout and quoting -------------------------------------------------------------------


def test_dump_of_nothing_is_empty_text() -> None:
    assert dump([]) == ""


def test_dump_layout_uses_lf_four_spaces_and_final_newline() -> None:
    tree = [N("a", "1", [N("b", None, [N("c", "x")])]), N("d")]
    assert dump(tree) == "a = 1\n    b\n        c = x\nd\n"


def test_dump_leaves_plain_value_unquoted() -> None:
    assert dump([N("bind", "tcp://eth0:5555")]) == "bind = tcp://eth0:5555\n"


def test_dump_leaves_non_ascii_value_unquoted() -> None:
    assert dump([N("a", "café")]) == "a = café\n"


def test_dump_quotes_empty_value() -> None:
    assert dump([N("a", "")]) == 'a = ""\n'


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("two words", '"two words"'),
        (" lead", '" lead"'),
        ("#2", '"#2"'),
        ("x=1", '"x=1"'),
        ("it's", '"it\'s"'),
        ('say "hi"', "'say \"hi\"'"),
        ('"', "'\"'"),
        ("'", '"\'"'),
    ],
    ids=[
        "space",
        "leading-space",
        "hash",
        "equals",
        "apostrophe",
        "double-quote",
        "lone-dq",
        "lone-sq",
    ],
)
def test_dump_quotes_value_exactly_when_needed(value: str, written: str) -> None:
    text = dump([N("a", value)])
    assert text == f"a = {written}\n"
    assert _parsed(text) == [N("a", value)]


# --- writer refusals -----------------------------------------------------------------------------


def test_dump_refuses_value_with_both_quote_kinds() -> None:
    tree = [N("brokers", None, [N("item", None, [N("identity", 'it\'s "x"')])])]
    message, path = _dump_refused(tree)
    assert path == "brokers/item/identity"
    assert "both ' and \"" in message


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "end\r\n"], ids=["lf", "cr", "crlf"])
def test_dump_refuses_value_with_line_break(value: str) -> None:
    message, path = _dump_refused([N("a", None, [N("b", value)])])
    assert path == "a/b"
    assert "line break" in message


def test_dump_refuses_value_with_tab() -> None:
    assert "U+0009" in _dump_refused([N("a", "x\ty")])[0]


def test_dump_refuses_value_with_control_character() -> None:
    assert "U+0000" in _dump_refused([N("a", "x\x00")])[0]


def test_dump_refuses_name_with_invalid_character() -> None:
    message, path = _dump_refused([N("ok", None, [N("bad name", "1")])])
    assert path == "ok/bad name"
    assert message.startswith("invalid character ' ' in name 'bad name'")


def test_dump_refuses_empty_name() -> None:
    assert _dump_refused([N("")])[0] == "empty name"


def test_dump_refuses_non_string_value() -> None:
    assert _dump_refused([N("port", 5555)])[0] == "value must be a string, not int"  # type: ignore[arg-type]


def test_dump_refuses_non_node_child() -> None:
    message, path = _dump_refused([N("a", None, ["b"])])  # type: ignore[list-item]
    assert (message, path) == ("expected a ZplNode, got str", "a")


def test_dump_refuses_a_single_node_instead_of_a_list() -> None:
    with pytest.raises(ConfigError, match="sequence of ZplNode"):
        dump(N("a"))  # type: ignore[arg-type]


def test_dump_refuses_nesting_beyond_the_limit() -> None:
    root = node = N("n0")
    for level in range(1, MAX_DEPTH + 1):
        child = N(f"n{level}")
        node.children.append(child)
        node = child
    assert f"deeper than {MAX_DEPTH}" in _dump_refused([root])[0]


def test_dump_refuses_a_cycle() -> None:
    node = N("loop")
    node.children.append(node)
    assert f"deeper than {MAX_DEPTH}" in _dump_refused([node])[0]


def test_dump_refuses_output_beyond_the_size_limit() -> None:
    shared = N("leaf", "x" * 1000)
    for _ in range(20):  # 2**20 leaves by sharing: far beyond the limit if written out
        shared = N("pair", None, [shared, shared])
    assert "exceed the limit" in _dump_refused([shared])[0]


# --- properties ----------------------------------------------------------------------------------

NAMES = st.text(alphabet=string.ascii_letters + string.digits + "$-_@.&+/", min_size=1, max_size=8)

# Printable characters (what str.isprintable accepts), with ZPL's special ones made frequent.
PRINTABLE = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
VALUE_CHARS = st.one_of(PRINTABLE, st.sampled_from(list(" #='\"=x")))
VALUES = (
    st.text(alphabet=VALUE_CHARS, max_size=12)
    .filter(str.isprintable)
    .filter(lambda v: not ("'" in v and '"' in v))
)

TREES = st.recursive(
    st.builds(N, NAMES, st.none() | VALUES),
    lambda kids: st.builds(N, NAMES, st.none() | VALUES, st.lists(kids, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(TREES, max_size=4))
def test_round_trip_parse_of_dump_gives_the_same_trees(nodes: list[ZplNode]) -> None:
    assert _parsed(dump(nodes)) == nodes


# Text from ZPL's own alphabet and its troublemakers, so that fuzzing reaches every branch.
ZPLISH = st.text(
    alphabet=st.sampled_from(list("    \n\n\r\t#='\"=ab/!é\x00\u2028\ufeff")), max_size=80
)


# Lines of plausible ZPL: indentation (sometimes wrong; none on the first line), a name, then
# ZPL-ish text and a line end.
ZPL_LINES = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 4, 4, 8, 12, 2, 6]),
        st.text(alphabet="ab/", min_size=1, max_size=3),
        st.one_of(
            st.sampled_from(["", "", " = 1", "=x", " = 'a b'", ' = "#"', " # c", " = ''"]),
            st.text(alphabet=st.sampled_from(list("ab   ==#'\"/!é")), max_size=10),
        ),
        st.sampled_from(["\n", "\r", "\r\n"]),
    ),
    max_size=10,
).map(lambda lines: "".join(" " * i * (n > 0) + a + b + c for n, (i, a, b, c) in enumerate(lines)))


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.text(max_size=200), ZPLISH, ZPL_LINES))
def test_fuzz_parse_raises_only_config_error(text: str) -> None:
    try:
        nodes = parse(text)
    except ConfigError:
        return
    # Whatever parses is written back to text that parses to the same trees.
    assert _parsed(dump(nodes)) == _strip(nodes)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.recursive(
            st.builds(N, st.text(max_size=6), st.none() | st.text(max_size=8)),
            lambda kids: st.builds(
                N, st.text(max_size=6), st.none() | st.text(max_size=8), st.lists(kids, max_size=3)
            ),
            max_leaves=12,
        ),
        max_size=3,
    )
)
def test_fuzz_dump_refuses_with_config_error_or_round_trips(nodes: list[ZplNode]) -> None:
    try:
        text = dump(nodes)
    except ConfigError:
        return
    assert _parsed(text) == nodes
