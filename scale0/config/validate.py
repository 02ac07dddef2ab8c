"""Semantic checks a schema cannot express: names, endpoints, ports, references, secrets.

Each check yields (field path, message); the loader attaches file and line. All problems are
reported together, and a config with any problem is never returned.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterator

from scale0.config.model import BrokerConfig, KeyGrant, NetworkConfig
from scale0.crypto.curve import curve_key_problem
from scale0.crypto.passwords import is_password_hash
from scale0.wire.frames import is_reserved_service

Finding = tuple[str, str]

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
NAME_RULE = "1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
SERVICE_RE = re.compile(r"[\x21-\x7e]{1,255}\Z")
ENDPOINT_RE = re.compile(
    r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})\Z"
)
MIN_FRAME_BYTES = 1024
MAX_FRAME_BYTES = 256 << 20


def check_name(path: str, value: str, what: str) -> Iterator[Finding]:
    if not NAME_RE.match(value):
        yield path, f"{what} {value!r} is not a valid name ({NAME_RULE})"


def check_endpoint(path: str, value: str) -> Iterator[Finding]:
    m = ENDPOINT_RE.match(value)
    if not m:
        yield path, f"{value!r} is not an endpoint of the form tcp://host:port"
    elif not 1 <= int(m["port"]) <= 65535:
        yield path, f"port {m['port']} of {value!r} is out of range 1-65535"


def endpoint_key(value: str) -> str:
    """host:port of an endpoint, lower-cased, for spotting reuse."""
    return value.removeprefix("tcp://").lower()


def check_service(path: str, value: str) -> Iterator[Finding]:
    if not SERVICE_RE.match(value):
        yield path, f"service {value!r} must be 1-255 printable ASCII characters without spaces"
    elif is_reserved_service(value):
        yield path, f"service {value!r} uses a reserved prefix (docs/protocol.md)"


#: A service pattern of a key grant: a service name in which ``*`` stands for any characters.
SERVICE_PATTERN_RE = re.compile(r"[\x21-\x7e]{1,255}\Z")


def check_grants(path: str, grants: tuple[KeyGrant, ...]) -> Iterator[Finding]:
    """``workers`` / ``clients``: each key a CURVE key or ``*``, each service a name or pattern."""
    for i, grant in enumerate(grants):
        at = f"{path}[{i}]"
        if grant.key != "*":
            problem = curve_key_problem(grant.key)
            if problem is not None:
                yield f"{at}.key", problem
        if grant.services != "all":
            if not grant.services:
                yield f"{at}.services", "an empty list grants nothing: remove the entry instead"
            for j, pattern in enumerate(grant.services):
                if not SERVICE_PATTERN_RE.match(pattern):
                    yield (
                        f"{at}.services[{j}]",
                        f"{pattern!r} must be 1-255 printable ASCII characters without spaces "
                        "(* matches any characters)",
                    )
        if grant.until is not None and grant.until < 0:
            yield f"{at}.until", f"must be a UNIX time (0 or more), got {grant.until}"


def _positive(path: str, value: float, what: str = "must be greater than 0") -> Iterator[Finding]:
    if value <= 0:
        yield path, f"{what}, got {value}"


def check_strings(obj: object, path: str = "") -> Iterator[Finding]:
    """Every string must survive all four formats: XML strips edge whitespace, and ZPL (spec
    4/ZPL) has no escapes and only printable characters, so not both quote kinds in one value."""
    if isinstance(obj, str):
        if not obj.isprintable():
            bad = next(ch for ch in obj if not ch.isprintable())
            yield path, f"must hold only printable characters, found U+{ord(bad):04X}"
        elif "'" in obj and '"' in obj:
            yield path, "must not contain both kinds of quote (' and \")"
        elif obj != obj.strip():
            yield path, "must not start or end with white space"
    elif isinstance(obj, tuple):
        for i, item in enumerate(obj):
            yield from check_strings(item, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from check_strings(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)


def check_network(config: NetworkConfig) -> list[Finding]:
    return [*check_strings(config), *_network(config)]


def _network(c: NetworkConfig) -> Iterator[Finding]:
    yield from check_name("family", c.family, "family")
    if c.config_version < 1:
        yield "config_version", f"must be 1 or more, got {c.config_version}"
    if not c.brokers:
        yield "brokers", "a family needs at least one broker"
    identities: dict[str, int] = {}
    endpoints: dict[str, str] = {}
    for i, b in enumerate(c.brokers):
        at = f"brokers[{i}]"
        yield from check_name(f"{at}.identity", b.identity, "identity")
        if b.identity in identities:
            yield (
                f"{at}.identity",
                f"duplicate identity {b.identity!r} (also brokers[{identities[b.identity]}])",
            )
        identities.setdefault(b.identity, i)
        for channel in ("frontend", "backend", "peer", "config_pub"):
            value = getattr(b, channel)
            found = list(check_endpoint(f"{at}.{channel}", value))
            yield from found
            if found:
                continue
            key = endpoint_key(value)
            if key in endpoints:
                yield f"{at}.{channel}", f"endpoint {value} is already used by {endpoints[key]}"
            else:
                endpoints[key] = f"{at}.{channel}"
        if b.curve_public_key is not None:
            problem = curve_key_problem(b.curve_public_key)
            if problem is not None:
                yield f"{at}.curve_public_key", problem
        elif c.curve:
            yield (
                f"{at}.curve_public_key",
                "curve is on for the family: every broker needs its CURVE public key "
                "(`scale0ctl keys generate --type curve`)",
            )
        elif b.curve_off:
            yield f"{at}.curve_off", "names no curve_public_key to identify the broker by"
        if c.curve and b.curve_off:
            yield f"{at}.curve_off", "curve is on for the family: every broker serves CURVE"
        if b.services != "all":
            for j, s in enumerate(b.services):
                yield from check_service(f"{at}.services[{j}]", s)
                if c.services != "all" and s not in c.services:
                    yield f"{at}.services[{j}]", f"service {s!r} is not in the family's services"
    if c.brokers and not any(b.config_source for b in c.brokers):
        yield "brokers", "the family has no config source (set config_source: true on one broker)"
    links: set[tuple[str, str]] = set()
    for i, link in enumerate(c.peers):
        at = f"peers[{i}]"
        for end in ("source", "target"):
            name = getattr(link, end)
            if name not in identities:
                yield f"{at}.{end}", f"{name!r} is not a broker of this family"
        if link.source == link.target:
            yield at, f"a broker cannot be its own peer ({link.source!r})"
        if (link.source, link.target) in links:
            yield at, f"duplicate link {link.source} -> {link.target}"
        links.add((link.source, link.target))
    if c.services != "all":
        for j, s in enumerate(c.services):
            yield from check_service(f"services[{j}]", s)
    yield from _positive("default_heartbeat_interval_ms", c.default_heartbeat_interval_ms)
    yield from _positive("liveness", c.liveness)
    idle = c.idle_heartbeat_interval_ms
    if idle != 0 and idle < c.default_heartbeat_interval_ms:
        yield (
            "idle_heartbeat_interval_ms",
            f"must be 0 (off) or at least default_heartbeat_interval_ms "
            f"({c.default_heartbeat_interval_ms}), got {idle}",
        )
    yield from _positive("max_clock_skew_s", c.max_clock_skew_s)
    yield from _positive("error_threshold", c.error_threshold)
    yield from _positive("error_window_s", c.error_window_s)
    yield from _positive("error_ban_s", c.error_ban_s)
    yield from _positive("config_republish_s", c.config_republish_s)
    yield from _positive("request_timeout_ms", c.request_timeout_ms)
    if not MIN_FRAME_BYTES <= c.max_frame_bytes <= MAX_FRAME_BYTES:
        yield (
            "max_frame_bytes",
            f"must be between {MIN_FRAME_BYTES} and {MAX_FRAME_BYTES}, got {c.max_frame_bytes}",
        )
    if c.max_retries < 0:
        yield "max_retries", f"must be 0 or more, got {c.max_retries}"
    if c.max_queued_requests < 0:
        yield "max_queued_requests", f"must be 0 or more, got {c.max_queued_requests}"
    yield from _positive("max_sessions", c.max_sessions)
    yield from _positive("max_requests_per_client", c.max_requests_per_client)
    yield from _positive("max_unnegotiated", c.max_unnegotiated)
    yield from _positive("negotiate_timeout_ms", c.negotiate_timeout_ms)
    admins: set[str] = set()
    for i, a in enumerate(c.admins):
        at = f"admins[{i}]"
        yield from check_name(f"{at}.auth_id", a.auth_id, "auth_id")
        if a.auth_id in admins:
            yield f"{at}.auth_id", f"duplicate auth_id {a.auth_id!r}"
        admins.add(a.auth_id)
        if not is_password_hash(a.password_hash):
            yield (
                f"{at}.password_hash",
                "is not a scrypt hash (a plain-text password?); make one with `scale0ctl passwd`",
            )
    yield from check_grants("workers", c.workers)
    yield from check_grants("clients", c.clients)
    keys = {f.name for f in dataclasses.fields(NetworkConfig)}
    for i, key in enumerate(c.client_view):
        if key == "admins":
            yield f"client_view[{i}]", "admins are never shown to clients and workers"
        elif key not in keys:
            yield f"client_view[{i}]", f"{key!r} is not a key of the network config"
    for needed in ("family", "config_version"):
        if needed not in c.client_view:
            yield "client_view", f"must include {needed!r}: clients track it"


#: The longest a stopping broker waits for its requests in flight (10 minutes).
MAX_SHUTDOWN_GRACE_MS = 600_000


def check_broker(config: BrokerConfig) -> list[Finding]:
    return [*check_strings(config), *_broker(config)]


def _broker(c: BrokerConfig) -> Iterator[Finding]:
    yield from check_name("identity", c.identity, "identity")
    if not c.bind_address:
        yield "bind_address", "must not be empty"
    used: dict[int, str] = {}
    for name in ("frontend_port", "backend_port", "peer_port", "config_pub_port"):
        port = getattr(c, name)
        if not 0 <= port <= 65535:
            yield name, f"port {port} is out of range 0-65535"
        elif port in used:
            yield name, f"port {port} is already used by {used[port]}"
        elif port != 0:  # 0 asks the OS for a free port, so it may repeat
            used[port] = name
    for i, endpoint in enumerate(c.config_sub_ports):
        yield from check_endpoint(f"config_sub_ports[{i}]", endpoint)
    for i, endpoint in enumerate(c.seeds):
        yield from check_endpoint(f"seeds[{i}]", endpoint)
    if c.seed_curve_keys and len(c.seed_curve_keys) != len(c.seeds):
        yield (
            "seed_curve_keys",
            f"names {len(c.seed_curve_keys)} keys for {len(c.seeds)} seeds: one per seed, "
            "in the order of seeds",
        )
    for i, key in enumerate(c.seed_curve_keys):
        problem = curve_key_problem(key)
        if problem is not None:
            yield f"seed_curve_keys[{i}]", problem
    for name in ("network_config", "signing_key", "event_log_dir", "curve_secret_key"):
        if getattr(c, name) == "":
            yield name, "must not be empty (leave it out instead)"
    if c.config_source:
        if not c.network_config:
            yield "network_config", "a config source needs the path of its network config"
        if not c.signing_key:
            yield "signing_key", "a config source needs a signing key to sign the network config"
    if c.family is not None:
        yield from check_name("family", c.family, "family")
    elif not c.config_source:
        yield "family", "a broker that joins from seeds must name the family it joins"
    if not c.config_source and not c.seeds and not c.config_sub_ports:
        yield "seeds", "a broker that is not a config source needs seeds or config_sub_ports"
    if not c.trusted_keys:
        yield "trusted_keys", "at least one trusted public key is needed to accept any config"
    if not 0 <= c.management.http_port <= 65535:
        yield "management.http_port", f"port {c.management.http_port} is out of range 0-65535"
    if not c.management.http_address:
        yield "management.http_address", "must not be empty"
    if c.management.trend_summary == "":
        yield "management.trend_summary", "must not be empty (leave it out instead)"
    yield from _management_tls(c)
    yield from check_service("management.tasks_service", c.management.tasks_service)
    if not 100 <= c.management.tasks_timeout_ms <= 30_000:
        yield (
            "management.tasks_timeout_ms",
            f"{c.management.tasks_timeout_ms} is out of range 100-30000",
        )
    if not 0 <= c.shutdown_grace_ms <= MAX_SHUTDOWN_GRACE_MS:
        yield (
            "shutdown_grace_ms",
            f"must be between 0 and {MAX_SHUTDOWN_GRACE_MS}, got {c.shutdown_grace_ms}",
        )


def is_loopback(address: str) -> bool:
    """Whether a bind address is loopback only (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _management_tls(c: BrokerConfig) -> Iterator[Finding]:
    """docs/management.md "TLS": a management server reachable from other hosts speaks HTTPS."""
    m = c.management
    if m.tls_cert == "":
        yield "management.tls_cert", "must not be empty (leave it out instead)"
    if m.tls_key is not None and not m.tls_key:
        yield "management.tls_key", "must not be empty (leave it out instead)"
    if m.tls_key and not m.tls_cert:
        yield (
            "management.tls_key",
            "is set but management.tls_cert is not (a key needs its certificate)",
        )
    if m.tls_cert and m.insecure:
        yield "management.insecure", "contradicts management.tls_cert (TLS is on): leave one out"
    if m.enabled and not m.tls_cert and not m.insecure and not is_loopback(m.http_address):
        yield (
            "management.tls_cert",
            f"required: management.http_address {m.http_address!r} is not loopback, so "
            "passwords and session cookies would cross the network in clear text; give "
            "tls_cert (and tls_key) for HTTPS, or set management.insecure: true if a TLS proxy "
            "of your own fronts it",
        )
