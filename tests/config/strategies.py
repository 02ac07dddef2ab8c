"""Hypothesis strategies for valid configs (reused by every test that needs a config)."""

from __future__ import annotations

from hypothesis import strategies as st

from scale0.config.model import (
    DEFAULT_CLIENT_VIEW,
    Admin,
    BrokerConfig,
    BrokerEntry,
    ManagementSettings,
    NetworkConfig,
    PeerLink,
)
from scale0.crypto.passwords import hash_password

# Hashing is slow on purpose; a few real hashes made once are enough for round trips.
HASHES = [hash_password(p, n=2**10) for p in ("one", "two")]

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
services = st.from_regex(r"[a-z][a-z0-9._-]{0,15}", fullmatch=True)
# Free text (paths, addresses): anything the formats can all carry, per validate.check_strings.
text = st.text(
    alphabet=st.characters(categories=["L", "M", "N", "P", "S"], include_characters=" "),
    max_size=20,
).filter(lambda s: s == s.strip() and not ("'" in s and '"' in s))
finite = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)


def service_choice() -> st.SearchStrategy[tuple[str, ...] | str]:
    return st.one_of(st.just("all"), st.lists(services, max_size=3, unique=True).map(tuple))


@st.composite
def network_configs(draw: st.DrawFn) -> NetworkConfig:
    identities = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    ports = iter(
        draw(
            st.lists(
                st.integers(1, 65535),
                min_size=4 * len(identities),
                max_size=4 * len(identities),
                unique=True,
            )
        )
    )
    sources = draw(st.lists(st.booleans(), min_size=len(identities), max_size=len(identities)))
    sources[0] = True
    brokers = tuple(
        BrokerEntry(
            identity=ident,
            frontend=f"tcp://127.0.0.1:{next(ports)}",
            backend=f"tcp://127.0.0.1:{next(ports)}",
            peer=f"tcp://127.0.0.1:{next(ports)}",
            config_pub=f"tcp://127.0.0.1:{next(ports)}",
            config_source=src,
            role=draw(st.sampled_from(["active", "standby"])),
            services="all",
        )
        for ident, src in zip(identities, sources, strict=True)
    )
    pairs = [(a, b) for a in identities for b in identities if a != b]
    links = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=4)) if pairs else []
    admins = draw(st.lists(names, unique=True, max_size=3))
    interval_ms = draw(st.integers(1, 10**6))
    idle_ms = draw(st.one_of(st.just(0), st.integers(interval_ms, 2 * 10**6)))
    return NetworkConfig(
        family=draw(names),
        config_version=draw(st.integers(1, 2**62)),
        brokers=brokers,
        peers=tuple(PeerLink(a, b, draw(st.sampled_from(["push", "pull"]))) for a, b in links),
        default_heartbeat_interval_ms=interval_ms,
        idle_heartbeat_interval_ms=idle_ms,
        liveness=draw(st.integers(1, 100)),
        max_clock_skew_s=draw(finite),
        services=draw(service_choice()),
        error_threshold=draw(st.integers(1, 10**6)),
        error_window_s=draw(finite),
        error_ban_s=draw(finite),
        config_republish_s=draw(finite),
        max_frame_bytes=draw(st.integers(1024, 1 << 28)),
        request_timeout_ms=draw(st.integers(1, 10**7)),
        max_retries=draw(st.integers(0, 10)),
        max_queued_requests=draw(st.integers(0, 10**6)),
        admins=tuple(
            Admin(a, draw(st.sampled_from(HASHES)), draw(st.sampled_from(["read", "admin"])))
            for a in admins
        ),
        client_view=draw(
            st.sampled_from(
                [
                    DEFAULT_CLIENT_VIEW,
                    ("family", "config_version"),
                    ("config_version", "family", "peers", "liveness"),
                ]
            )
        ),
    )


@st.composite
def broker_configs(draw: st.DrawFn) -> BrokerConfig:
    ports = draw(st.lists(st.integers(1, 65535), min_size=4, max_size=4, unique=True))
    source = draw(st.booleans())
    endpoints = st.lists(
        st.integers(1, 65535).map(lambda p: f"tcp://127.0.0.1:{p}"), max_size=3
    ).map(tuple)
    seeds = draw(endpoints)
    subs = draw(endpoints)
    if not source and not seeds and not subs:
        seeds = ("tcp://127.0.0.1:5557",)  # a joining broker needs somewhere to join from
    return BrokerConfig(
        identity=draw(names),
        family=draw(names) if not source else draw(st.none() | names),
        bind_address=draw(st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "localhost"])),
        frontend_port=ports[0],
        backend_port=ports[1],
        peer_port=ports[2],
        config_pub_port=ports[3],
        config_sub_ports=subs,
        seeds=seeds,
        state=draw(st.sampled_from(["joining", "active", "disabled"])),
        config_source=source,
        network_config=draw(text.filter(bool)) if source else draw(st.none() | text.filter(bool)),
        trusted_keys=tuple(draw(st.lists(text, min_size=1, max_size=3))),
        signing_key=draw(text.filter(bool)) if source else None,
        management=ManagementSettings(
            enabled=draw(st.booleans()),
            http_address=draw(st.sampled_from(["127.0.0.1", "::1"])),
            http_port=draw(st.integers(0, 65535)),
            tasks_service=draw(st.sampled_from(["vespid", "tasks.vespid"])),
            tasks_timeout_ms=draw(st.integers(100, 30_000)),
        ),
        data_dir=draw(text),
        event_log_dir=draw(st.none() | text.filter(bool)),
        log_level=draw(st.sampled_from(["debug", "info", "warning", "error"])),
    )
