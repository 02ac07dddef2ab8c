"""Placement P1-P6: fit, hard filters, preferences, reservations, explanations."""

from __future__ import annotations

import re

import pytest

from scale0.tasks import placement
from scale0.tasks.model import NodeRecord
from scale0.tasks.placement import (
    NodeLoad,
    Placed,
    SpecError,
    Unplaced,
    parse_capabilities,
    parse_node_repositories,
    parse_requirements,
    place,
)


def node(name: str, memory: int = 1000, cores: int = 4, **kw: object) -> NodeRecord:
    return NodeRecord(name, memory, cores, **kw)  # type: ignore[arg-type]


def test_rules_header_lists_p1_to_p6() -> None:
    found = re.findall(r"^(P\d+)\s", placement.__doc__ or "", re.MULTILINE)
    assert found == [f"P{i}" for i in range(1, 7)]


def test_p1_memory_and_cores_must_be_free() -> None:
    req = parse_requirements({"memory": 600, "cores": 2})
    loads = [NodeLoad(node("a"), used_memory=500), NodeLoad(node("b"), used_cores=3)]
    decision = place(req, loads)
    assert isinstance(decision, Unplaced)
    assert not decision.never
    assert "needs 600 MB memory, 500 free of 1000" in decision.reason
    assert "needs 2 cores, 1 free of 4" in decision.reason
    assert place(req, [*loads, NodeLoad(node("c"))]) == Placed("c", 600, 2)


def test_p1_disconnected_nodes_are_skipped() -> None:
    decision = place(parse_requirements({}), [NodeLoad(node("a"), alive=False)])
    assert isinstance(decision, Unplaced)
    assert "node a: not connected" in decision.reason


def test_p2_usage_require_is_a_hard_filter() -> None:
    req = parse_requirements({"usage_require_astro": True})
    plain = NodeLoad(node("a", memory=9000))
    astro = NodeLoad(node("b", prefer={"astro": 1.0}))
    assert place(req, [plain, astro]) == Placed("b", 0, 1)
    decision = place(req, [plain])
    assert isinstance(decision, Unplaced)
    assert decision.never
    assert "lacks usage_prefer_astro" in decision.reason


def test_p3_local_repositories_are_a_hard_filter() -> None:
    req = parse_requirements({}, {"env": {"request": "conda", "local": True}})
    has = NodeLoad(node("b", repositories={"/srv/envs/x": {"type": "conda", "persist": True}}))
    lacks = NodeLoad(node("a", repositories={"/srv/git": {"type": "git", "persist": True}}))
    assert place(req, [lacks, has]) == Placed("b", 0, 1)
    by_name = parse_requirements({}, {"data": {"local": True}})
    holder = NodeLoad(node("c", repositories={"/mnt/data/": {"type": None, "persist": False}}))
    assert place(by_name, [lacks, holder]) == Placed("c", 0, 1)
    decision = place(by_name, [lacks])
    assert isinstance(decision, Unplaced)
    assert "does not hold local repository 'data'" in decision.reason


def test_p4_preferences_order_the_fitting_nodes() -> None:
    big = NodeLoad(node("a", memory=9000))
    preferred = NodeLoad(node("z", prefer={"astro": 2.0}))
    assert place(parse_requirements({"usage_prefer_astro": 1}), [big, preferred]).node == "z"  # type: ignore[union-attr]
    # without a preference the most free memory wins; ephemeral nodes come last
    assert place(parse_requirements({}), [big, preferred]).node == "a"  # type: ignore[union-attr]
    eph = NodeLoad(node("e", memory=9000, ephemeral=True))
    assert place(parse_requirements({}), [eph, preferred]).node == "z"  # type: ignore[union-attr]
    repo = parse_requirements({}, {"env": {"request": "conda"}})
    holder = NodeLoad(node("h", repositories={"/e": {"type": "conda", "persist": True}}))
    assert place(repo, [big, holder]).node == "h"  # type: ignore[union-attr]


def test_p5_cores_max_takes_free_cores_up_to_the_cap() -> None:
    req = parse_requirements({"cores": 1, "cores_max": 3})
    assert place(req, [NodeLoad(node("a", cores=8))]) == Placed("a", 0, 3)
    assert place(req, [NodeLoad(node("a", cores=8), used_cores=6)]) == Placed("a", 0, 2)


def test_p6_never_when_no_idle_node_would_fit() -> None:
    req = parse_requirements({"memory": 5000})
    decision = place(req, [NodeLoad(node("a")), NodeLoad(node("b"), alive=False)])
    assert isinstance(decision, Unplaced)
    assert decision.never
    assert decision.reason.startswith("no node could ever run it")
    assert place(req, []) == Unplaced("no node is connected", never=False)


@pytest.mark.parametrize(
    ("raw", "repos", "field"),
    [
        ("x", None, "requirements"),
        ({"memory": -1}, None, "requirements.memory"),
        ({"memory": 1.5}, None, "requirements.memory"),
        ({"cores": True}, None, "requirements.cores"),
        ({"cores": 4, "cores_max": 2}, None, "requirements.cores_max"),
        ({"gpu": 1}, None, "requirements.gpu"),
        ({"usage_require_x": "yes"}, None, "requirements.usage_require_x"),
        ({}, [], "repositories"),
        ({}, {"env": 3}, "repositories.env"),
        ({}, {"env": {"local": "yes"}}, "repositories.env.local"),
        ({}, {"env": {"request": ""}}, "repositories.env.request"),
        ({}, {"env": {"colour": 1}}, "repositories.env.colour"),
    ],
)
def test_bad_requirements_name_the_field(raw: object, repos: object, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_requirements(raw, repos)
    assert caught.value.field == field


def test_capabilities_and_node_repositories() -> None:
    assert parse_capabilities(
        {"memory": 10, "cores": 2, "usage_prefer_a": True, "usage_ephemeral": True}
    ) == (10, 2, {"a": 1.0}, True)
    for bad, field in [
        ([], "capabilities"),
        ({"usage_ephemeral": 1}, "capabilities.usage_ephemeral"),
        ({"speed": 1}, "capabilities.speed"),
        ({"usage_prefer_a": "x"}, "capabilities.usage_prefer_a"),
    ]:
        with pytest.raises(SpecError) as caught:
            parse_capabilities(bad)
        assert caught.value.field == field
    assert parse_node_repositories({"/r": {"type": "git"}}) == {
        "/r": {"type": "git", "persist": False}
    }
    with pytest.raises(SpecError):
        parse_node_repositories({"/r": {"persist": "no"}})
