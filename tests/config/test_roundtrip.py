"""Every format carries every valid config exactly: load(dump(c, fmt), fmt) == c, same sha256."""

from __future__ import annotations

from hypothesis import given, settings

from scale0.config.canonical import canonical_json, config_sha256
from scale0.config.formats import FORMATS
from scale0.config.loader import dumps, loads
from scale0.config.model import BrokerConfig, NetworkConfig
from tests.config.strategies import broker_configs, network_configs


@settings(max_examples=60, deadline=None)
@given(network_configs())
def test_network_config_round_trips_through_every_format(config: NetworkConfig) -> None:
    for fmt in FORMATS:
        again = loads(dumps(config, fmt), fmt, kind="network")
        assert again == config, fmt
        assert config_sha256(again) == config_sha256(config)


@settings(max_examples=60, deadline=None)
@given(broker_configs())
def test_broker_config_round_trips_through_every_format(config: BrokerConfig) -> None:
    for fmt in FORMATS:
        assert loads(dumps(config, fmt), fmt, kind="broker") == config, fmt


@settings(max_examples=30, deadline=None)
@given(network_configs())
def test_a_chain_of_conversions_keeps_the_hash(config: NetworkConfig) -> None:
    current = config
    for fmt in (*FORMATS, *reversed(FORMATS)):
        current = loads(dumps(current, fmt), fmt, kind="network")
    assert canonical_json(current) == canonical_json(config)


def test_canonical_json_is_sorted_and_compact() -> None:
    from scale0.config.loader import load
    from tests.config.conftest import CONF

    text = canonical_json(load(CONF / "network.yaml")).decode()
    assert ", " not in text and ": " not in text
    assert text.startswith('{"admins":[')
    # Defaults are spelled out, so omitting a default-valued key does not change the identity.
    assert '"max_retries":2' in text
