"""The examples in conf/ load, agree with each other, and convert through every format."""

from __future__ import annotations

from pathlib import Path

import pytest

from scale0.config.canonical import config_sha256
from scale0.config.formats import FORMATS, format_of
from scale0.config.loader import dumps, kind_of, load, loads
from scale0.config.model import NetworkConfig
from tests.config.conftest import CONF

EXAMPLES = sorted(p for p in CONF.rglob("*") if p.suffix in (".yaml", ".json", ".xml", ".zfl"))


def test_there_are_examples_in_every_format() -> None:
    assert {format_of(p) for p in EXAMPLES} == set(FORMATS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(CONF)))
def test_example_converts_through_all_formats_and_back(path: Path) -> None:
    config = load(path)
    sha = config_sha256(config)
    current = config
    for fmt in (*FORMATS, format_of(path)):
        current = loads(dumps(current, fmt), fmt, kind=kind_of(config))
        assert config_sha256(current) == sha, fmt
    assert current == config


def test_the_four_network_examples_are_one_config() -> None:
    hashes = {config_sha256(load(CONF / f"network.{ext}")) for ext in FORMATS}
    assert len(hashes) == 1


def test_each_broker_example_points_at_the_network_file_of_its_format() -> None:
    for ext in FORMATS:
        broker = load(CONF / f"broker.{ext}", kind="broker")
        assert broker.network_config == f"network.{ext}"
        network = load(CONF / str(broker.network_config))
        assert isinstance(network, NetworkConfig)
        assert broker.identity in {b.identity for b in network.brokers}
