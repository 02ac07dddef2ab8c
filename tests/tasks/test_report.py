"""The coordinator's operator numbers (scale0.tasks.report) and their two renderings: the
Prometheus text of /metrics and the read-only page (scale0/mgmt/taskpage.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scale0.mgmt.taskpage import METRIC_NAMES, render_task_metrics, render_task_page
from scale0.tasks.book import Book
from scale0.tasks.errors import Refused
from scale0.tasks.model import Severity
from scale0.tasks.report import report
from tests.tasks.helpers import add_node, new_book, vespid

REPO = Path(__file__).resolve().parents[2]


def busy_book() -> Book:
    book = new_book(node_timeout_s=1.0)
    add_node(book, "big", 8000, 4)
    add_node(book, "small", 1000, 1)
    book.create_vespid(vespid("a", memory=3000, cores=2), None, 0.0)
    book.create_vespid(vespid("b", memory=500), None, 0.0)
    book.create_vespid(vespid("never", memory=99999), None, 0.0)
    book.create_vespid(vespid("child", parent="never"), None, 0.0)
    book.client_connect("c", 0.0)
    book.create_zerotask("c", "square", [2], "z", 0.0)
    return book


def test_counts_totals_and_per_node_load() -> None:
    book = busy_book()
    numbers = report(book)
    assert numbers["tasks"] == {"waiting": 1, "pending": 2, "running": 2, "complete": 0}
    assert numbers["queue"] == {"zerotask": 1, "vespid": 1}
    assert numbers["created"] == 5 and numbers["nodes_connected"] == 2
    by_node = {n["node"]: n for n in numbers["nodes"]}
    assert by_node["big"] == {
        "node": "big",
        "connected": True,
        "running": 2,
        "memory": 8000,
        "memory_reserved": 3500,
        "cores": 4,
        "cores_reserved": 3,
    }
    assert (by_node["small"]["running"], by_node["small"]["memory_reserved"]) == (0, 0)

    book.finish("a", "big", 1, Severity.OK, 1.0)
    book.finish("b", "big", 1, Severity.ERROR, 1.0)
    book.cancel("never", 1.0)  # and its waiting child is terminated with it
    numbers = report(book)
    assert numbers["completed"] == {
        "ok": 1,
        "warning": 0,
        "error": 1,
        "fatal": 0,
        "terminated": 2,
    }
    assert numbers["failed"] == 3
    assert all(n["running"] == 0 and n["memory_reserved"] == 0 for n in numbers["nodes"])
    book.tick(10.0)  # both nodes silent: lost
    assert report(book)["nodes_connected"] == 0


def test_reruns_and_refusals_are_counted() -> None:
    book = new_book(node_timeout_s=1.0)
    add_node(book, "n1", 1000, 1, now=0.0)
    book.create_vespid(vespid("t"), None, 0.0)
    book.tick(5.0)  # n1 lost: t is re-queued (a re-run)
    add_node(book, "n2", 1000, 1, now=5.0)
    with pytest.raises(Refused):  # the stale result is refused (F3)
        book.finish("t", "n1", 1, Severity.OK, 5.5)
    numbers = report(book)
    assert (numbers["reruns"], numbers["refused"]) == (1, 1)


def test_metrics_text_is_prometheus_exposition() -> None:
    text = render_task_metrics(report(busy_book()))
    types = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
    assert [name for name, _ in types] == list(METRIC_NAMES)
    for name, kind in types:
        assert kind == ("counter" if name.endswith("_total") else "gauge"), name
    assert 'scale0_tasks{state="running"} 2\n' in text
    assert 'scale0_tasks_queue_depth{protocol="vespid"} 1\n' in text
    assert 'scale0_task_node_memory_reserved_mb{node="big"} 3500\n' in text
    sample = re.compile(r'^[a-z0-9_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), line


def test_page_shows_the_numbers_and_escapes_node_names() -> None:
    numbers = report(busy_book())
    # Node ids cannot hold markup (B1), but the renderer escapes whatever it is given.
    odd = {**numbers["nodes"][0], "node": "x<b>"}
    page = render_task_page({**numbers, "nodes": [*numbers["nodes"], odd]})
    assert '<td class="num" id="queue-depth">2</td>' in page
    assert '<td class="num" id="running">2</td>' in page
    assert '<td class="num">3500 / 8000</td>' in page
    assert "<td>x&lt;b&gt;</td>" in page and "x<b>" not in page
    assert "<script" not in page


def test_docs_name_every_metric() -> None:
    docs = (REPO / "docs/tasks.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(scale0_tasks?_[a-z_]+|scale0_tasks)`", docs))
    assert documented == set(METRIC_NAMES)
