"""Negotiation over real sockets in every config_type: one typed view for clients and workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scale0.net.client import Client
from scale0.net.worker import Worker, echo_handler
from scale0.testing import running_broker
from scale0.wire.frames import ConfigType

pytestmark = pytest.mark.usefixtures("broker_io")  # loop and lane (tests/conftest.py)

WAIT_S = 10.0


@pytest.mark.parametrize("config_type", list(ConfigType))
def test_client_negotiates_and_is_served_in_every_format(
    tmp_path: Path, config_type: ConfigType
) -> None:
    with running_broker(tmp_path, liveness=5) as broker:
        worker = Worker(broker.endpoints["backend"], {"echo": echo_handler}).start_in_thread()
        try:
            with Client(
                broker.endpoints["frontend"], config_type=config_type, timeout=WAIT_S
            ) as client:
                config = client.connect()
                assert config.family == "test" and config.version == 1
                # Typed through the schema whatever the format: XML and ZFL carry text.
                assert config.document["liveness"] == 5
                assert "admins" not in config.document
                assert [b["identity"] for b in config.brokers] == ["solo"]
                assert client.request("echo", b"hi") == [b"hi"]
        finally:
            worker.stop()


def test_json_xml_and_zfl_give_clients_and_workers_the_same_typed_view(tmp_path: Path) -> None:
    documents: dict[tuple[str, ConfigType], dict[str, Any]] = {}
    with running_broker(
        tmp_path, liveness=4, max_clock_skew_s=12.5, services=["echo", "upper"]
    ) as broker:
        for config_type in ConfigType:
            with Client(
                broker.endpoints["frontend"], config_type=config_type, timeout=WAIT_S
            ) as client:
                documents["client", config_type] = dict(client.connect().document)
            worker = Worker(
                broker.endpoints["backend"], {"echo": echo_handler}, config_type=config_type
            )
            handle = worker.start_in_thread()
            try:
                assert handle.wait_registered(WAIT_S), "worker did not register"
                assert worker.config is not None
                documents["worker", config_type] = dict(worker.config.document)
            finally:
                handle.stop(WAIT_S)
    reference = documents["client", ConfigType.JSON]
    assert reference["liveness"] == 4 and type(reference["liveness"]) is int
    assert reference["max_clock_skew_s"] == 12.5
    assert reference["services"] == ["echo", "upper"]
    [entry] = reference["brokers"]
    assert entry["identity"] == "solo" and entry["config_source"] is True
    for key, document in documents.items():
        assert document == reference, key
