"""Numbers and messages the pure session tests share: a network config rendered as a broker does."""

from __future__ import annotations

import json
from collections.abc import Sequence

from scale0.config.formats import Format, render
from scale0.config.model import DEFAULT_CLIENT_VIEW, BrokerEntry, NetworkConfig
from scale0.config.schema import to_tree
from scale0.wire.client import Config
from scale0.wire.frames import ConfigType

#: The UNIX time the tests hand the sessions (it only goes into HEARTBEAT and READY).
WALL = 1_700_000_000.0
FORMATS: dict[ConfigType, Format] = {
    ConfigType.JSON: "json",
    ConfigType.XML: "xml",
    ConfigType.ZFL: "zfl",
}


def entry(number: int, **more: object) -> BrokerEntry:
    return BrokerEntry(
        identity=f"b{number}",
        frontend=f"tcp://127.0.0.1:{7000 + number}",
        backend=f"tcp://127.0.0.1:{7100 + number}",
        peer=f"tcp://127.0.0.1:{7200 + number}",
        config_pub=f"tcp://127.0.0.1:{7300 + number}",
        **more,  # type: ignore[arg-type]
    )


def network(count: int = 2, **more: object) -> NetworkConfig:
    brokers = tuple(entry(number) for number in range(count))
    return NetworkConfig(family="f", config_version=1, brokers=brokers, **more)  # type: ignore[arg-type]


def view_document(
    config: NetworkConfig, config_type: ConfigType, keys: Sequence[str] = DEFAULT_CLIENT_VIEW
) -> bytes:
    """The client view in ``config_type``, rendered the way the broker renders it (§3.2)."""
    tree = to_tree(config, typed=config_type is ConfigType.JSON)
    return render(
        {key: tree[key] for key in keys if key in tree}, FORMATS[config_type], kind="network"
    )


def config_frames(
    config: NetworkConfig,
    config_type: ConfigType,
    protocol: bytes,
    client_id: str = "c.1",
) -> list[bytes]:
    """A CONFIG message carrying ``config``'s view."""
    return Config(
        config_type,
        config.config_version,
        "0" * 64,
        client_id,
        view_document(config, config_type),
        protocol=protocol,
    ).to_frames()


def json_frames(
    document: dict[str, object], protocol: bytes, client_id: str = "c.1"
) -> list[bytes]:
    """A JSON CONFIG with any document (also ones no broker would send)."""
    return Config(
        ConfigType.JSON, 1, "0" * 64, client_id, json.dumps(document).encode(), protocol=protocol
    ).to_frames()
