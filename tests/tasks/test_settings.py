"""The coordinator's and node's config files: defaults, and errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale0.tasks.settings import ConfigFileError, load_coordinator, load_node

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_configs_load() -> None:
    coordinator = load_coordinator(REPO / "conf/tasks/coordinator.yml")
    assert coordinator.zerotask_service == "zerotask"
    assert coordinator.data_dir.is_absolute()
    assert (coordinator.http_port, coordinator.http_address) == (None, "127.0.0.1")  # off
    names = {load_node(REPO / f"conf/tasks/{n}.yml").name for n in ("node1", "node2")}
    assert names == {"node1", "node2"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[1, 2]", "must be a mapping"),
        ("endpoint: tcp://x:1\n", "data_dir: is required"),
        ("endpoint: 5\ndata_dir: d\n", "endpoint: must be a string"),
        ("endpoint: http://x\ndata_dir: d\n", "endpoint: must be a ZeroMQ endpoint"),
        ("endpoint: tcp://x:1\ndata_dir: d\nnode_timeout_s: -1\n", "node_timeout_s: must be > 0"),
        ("endpoint: tcp://x:1\ndata_dir: d\ncapacity: true\n", "capacity: must be"),
        ("endpoint: tcp://x:1\ndata_dir: d\ncolour: blue\n", "colour: unknown key"),
        ("endpoint: [unclosed\n", "not YAML/JSON"),
        ("endpoint: tcp://x:1\ndata_dir: d\nhttp_port: 70000\n", "http_port: must be 0-65535"),
        ("endpoint: tcp://x:1\ndata_dir: d\nhttp_port: '80'\n", "http_port: must be a whole"),
        ("endpoint: tcp://x:1\ndata_dir: d\nhttp_address: 1\n", "http_address: must be a str"),
    ],
)
def test_coordinator_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as caught:
        load_coordinator(path)
    assert str(path) in str(caught.value)
    assert needle in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("name: 'a b'\n", "name: 'a b' is not a valid node id"),
        ("name: n\ncapabilities: {gpu: 1}\n", "capabilities.gpu"),
        ("name: n\nrepositories: {/r: {persist: 3}}\n", "repositories./r.persist"),
        ("name: n\nmethods: {sq: nocolon}\n", "methods.sq"),
        ("name: n\npoll_wait_ms: 99999\n", "poll_wait_ms: must be at most 5000"),
        ("name: n\nmax_memory_mb: 0\n", "max_memory_mb: must be > 0"),
    ],
)
def test_node_errors(tmp_path: Path, extra: str, needle: str) -> None:
    path = tmp_path / "n.yaml"
    path.write_text("endpoint: tcp://127.0.0.1:1\npath: work\n" + extra)
    with pytest.raises(ConfigFileError, match=None) as caught:
        load_node(path)
    assert needle in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_node(tmp_path / "absent.yaml")
