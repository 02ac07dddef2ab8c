"""scale0.session.view: the config view typed by the schema, the same in JSON, XML and ZFL."""

from __future__ import annotations

import dataclasses
import logging
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.model import DEFAULT_CLIENT_VIEW, BrokerEntry, NetworkConfig
from scale0.session.view import ClientConfig, parse_config_document
from scale0.wire.frames import ConfigType
from tests.session.helpers import network, view_document

NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=8)
#: Every network config key a view may carry (admins never: validation refuses it).
VIEW_KEYS = [f.name for f in dataclasses.fields(NetworkConfig) if f.name != "admins"]


@st.composite
def networks(draw: st.DrawFn) -> NetworkConfig:
    count = draw(st.integers(1, 4))
    brokers = tuple(
        BrokerEntry(
            identity=f"b{number}",
            frontend=f"tcp://127.0.0.1:{draw(st.integers(1, 65535))}",
            backend=f"tcp://h{number}.example:{draw(st.integers(1, 65535))}",
            peer=f"tcp://127.0.0.1:{7200 + number}",
            config_pub=f"tcp://127.0.0.1:{7300 + number}",
            config_source=draw(st.booleans()),
            role=draw(st.sampled_from(["active", "standby"])),
            services=draw(st.just("all") | st.lists(NAMES, min_size=1, max_size=3).map(tuple)),
        )
        for number in range(count)
    )
    return NetworkConfig(
        family=draw(NAMES),
        config_version=draw(st.integers(1, 2**40)),
        brokers=brokers,
        family_topology=draw(st.sampled_from([None, "mesh", "gossip"])),
        default_heartbeat_interval_ms=draw(st.integers(1, 10**6)),
        liveness=draw(st.integers(1, 100)),
        max_clock_skew_s=draw(st.floats(0.001, 1e6, allow_nan=False, allow_infinity=False)),
        services=draw(st.just("all") | st.lists(NAMES, max_size=4).map(tuple)),
        error_window_s=draw(st.floats(0.5, 1e4)),
        max_frame_bytes=draw(st.integers(1, 2**31)),
    )


@settings(max_examples=60, deadline=None)
@given(networks(), st.lists(st.sampled_from(VIEW_KEYS), unique=True))
def test_every_format_gives_the_json_tree(config: NetworkConfig, keys: list[str]) -> None:
    keys = keys or list(DEFAULT_CLIENT_VIEW)
    reference = parse_config_document(ConfigType.JSON, view_document(config, ConfigType.JSON, keys))
    # A field that is absent (None: family_topology for a mesh) is absent from the view too.
    assert set(reference) == {key for key in keys if getattr(config, key) is not None}
    for config_type in (ConfigType.XML, ConfigType.ZFL):
        document = parse_config_document(config_type, view_document(config, config_type, keys))
        assert document == reference, config_type


def test_numbers_booleans_and_lists_are_typed_in_a_text_view() -> None:
    config = network(3, liveness=7, max_clock_skew_s=2.5, services=("echo", "upper"))
    for config_type in ConfigType:
        view = ClientConfig(
            1,
            "c",
            config_type,
            document=parse_config_document(config_type, view_document(config, config_type)),
        )
        document = view.document
        assert document["liveness"] == 7 and type(document["liveness"]) is int
        assert document["max_clock_skew_s"] == 2.5
        assert document["default_heartbeat_interval_ms"] == 1000
        assert document["services"] == ["echo", "upper"]
        assert [broker["config_source"] for broker in view.brokers] == [False] * 3
        assert view.number("liveness") == 7.0
        assert view.family == "f"


def test_a_value_the_schema_refuses_is_kept_as_text_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "scale0.client")
    xml = (
        b"<network><family>f</family><liveness>many</liveness>"
        b"<max_clock_skew_s>1.5</max_clock_skew_s><later_key>9</later_key></network>"
    )
    document = parse_config_document(ConfigType.XML, xml)
    assert document == {
        "family": "f",
        "liveness": "many",  # not an integer: as it came
        "max_clock_skew_s": 1.5,
        "later_key": "9",  # a key this schema does not know (a newer broker's): as it came
    }
    [record] = caplog.records
    assert "liveness" in record.message and "kept as text" in record.message
    assert ClientConfig(1, "c", ConfigType.XML, document=document).number("liveness") is None


def test_a_lone_broker_in_zfl_is_a_list_of_one() -> None:
    document = parse_config_document(ConfigType.ZFL, view_document(network(1), ConfigType.ZFL))
    assert isinstance(document["brokers"], list) and len(document["brokers"]) == 1
    assert document["brokers"][0]["identity"] == "b0"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(ConfigType)), st.binary(max_size=300))
def test_garbage_documents_give_a_mapping_and_never_raise(
    config_type: ConfigType, garbage: bytes
) -> None:
    assert isinstance(parse_config_document(config_type, garbage), dict)


def test_a_one_key_xml_view_keeps_its_key() -> None:
    # The XML codec takes the root element off; taking another level off lost the only key.
    for keys in (["brokers"], ["family"]):
        document = parse_config_document(
            ConfigType.XML, view_document(network(1), ConfigType.XML, keys)
        )
        assert list(document) == keys
