"""The config schema: frozen dataclasses for a broker's own file and the family network config.

Field names are the config keys in every format and the names in docs/config.md; each field's
one-line doc lives in its metadata (``doc(...)``) and docs/config.md is checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from scale0.config.schema import doc
from scale0.wire.peer import BrokerState

TableMode = Literal["push", "pull"]
FamilyTopology = Literal["mesh", "gossip"]
AdminRole = Literal["read", "admin"]
BrokerRole = Literal["active", "standby"]
LogLevel = Literal["debug", "info", "warning", "error"]

# What a client or worker is told of the network config unless `client_view` says otherwise.
# Never `admins` (validation refuses it); private keys never live in the network config at all.
DEFAULT_CLIENT_VIEW: tuple[str, ...] = (
    "family",
    "config_version",
    "brokers",
    "default_heartbeat_interval_ms",
    "idle_heartbeat_interval_ms",
    "liveness",
    "max_clock_skew_s",
    "services",
)


@dataclass(frozen=True, slots=True)
class ManagementSettings:
    """The HTTP management server of one broker (off unless enabled)."""

    enabled: bool = field(default=False, metadata=doc("Serve the HTTP management page and API."))
    http_address: str = field(
        default="127.0.0.1",
        metadata=doc("Address the management server binds; loopback unless you mean otherwise."),
    )
    http_port: int = field(default=8480, metadata=doc("TCP port of the management server."))
    tls_cert: str | None = field(
        default=None,
        metadata=doc(
            "PEM certificate (chain) file: set, the server speaks HTTPS only (relative to this "
            "file); required when http_address is not loopback, unless insecure."
        ),
    )
    tls_key: str | None = field(
        default=None,
        metadata=doc(
            "PEM private key of tls_cert (relative to this file); none: it is in tls_cert."
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=doc(
            "Serve plain HTTP on an address that is not loopback (passwords and session cookies "
            "in clear text): only behind a TLS proxy of your own."
        ),
    )
    trend_summary: str | None = field(
        default=None,
        metadata=doc(
            "The summary.json that scale0-trend writes, shown in the page's Trends panel and "
            "GET /api/trends (read per request; relative to this file); none: no panel."
        ),
    )
    tasks_service: str = field(
        default="vespid",
        metadata=doc(
            "The task coordinator's vespid service (its vespid_service), which the page's Tasks "
            "panel and GET /api/tasks ask through the family."
        ),
    )
    tasks_timeout_ms: int = field(
        default=2000,
        metadata=doc(
            "How long GET /api/tasks waits for the task coordinator's answer (100-30000 ms)."
        ),
    )


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """A broker's own bootstrap file: what `scale0-broker --config FILE` reads on its host."""

    identity: str = field(metadata=doc("This broker's unique name in the family."))
    family: str | None = field(
        default=None,
        metadata=doc(
            "The family this broker belongs to; required to join from seeds without a config."
        ),
    )
    bind_address: str = field(
        default="127.0.0.1", metadata=doc("Address the broker's ZeroMQ sockets bind to.")
    )
    frontend_port: int = field(
        default=5555, metadata=doc("Port of the frontend ROUTER (clients); 0 picks a free one.")
    )
    backend_port: int = field(
        default=5556, metadata=doc("Port of the backend ROUTER (workers); 0 picks a free one.")
    )
    peer_port: int = field(
        default=5557, metadata=doc("Port of the peer ROUTER (other brokers); 0 picks a free one.")
    )
    config_pub_port: int = field(
        default=5558, metadata=doc("Port of the config PUB socket; 0 picks a free one.")
    )
    config_sub_ports: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Endpoints of config sources to subscribe to (all of them, for redundancy).",
            item="endpoint",
        ),
    )
    seeds: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Peer endpoints of family members a joining broker fetches the config from.",
            item="endpoint",
        ),
    )
    state: BrokerState = field(
        default=BrokerState.JOINING,
        metadata=doc("Initial state: joining | active | disabled (docs/protocol.md §6.4)."),
    )
    config_source: bool = field(
        default=False, metadata=doc("This broker publishes the family's network config.")
    )
    network_config: str | None = field(
        default=None,
        metadata=doc("Path of the network config file (required for a config source)."),
    )
    trusted_keys: tuple[str, ...] = field(
        default=(),
        metadata=doc("Public key files whose signatures this broker accepts.", item="path"),
    )
    signing_key: str | None = field(
        default=None,
        metadata=doc("Private key file used to sign the network config (config sources only)."),
    )
    management: ManagementSettings = field(
        default_factory=ManagementSettings, metadata=doc("HTTP management server settings.")
    )
    data_dir: str = field(
        default="data", metadata=doc("Directory for durable state (last good config, tasks).")
    )
    event_log_dir: str | None = field(
        default=None,
        metadata=doc(
            "Directory the event log (docs/trend.md) is written to, relative to this file; "
            "absent: no event log."
        ),
    )
    log_level: LogLevel = field(
        default="info", metadata=doc("Log level: debug | info | warning | error.")
    )
    curve_secret_key: str | None = field(
        default=None,
        metadata=doc(
            "This broker's CURVE key file (NAME.curve.key from `scale0ctl keys generate --type "
            "curve`); needed when its network-config entry has a curve_public_key."
        ),
    )
    seed_curve_keys: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "CURVE public keys (Z85) of the seeds, in the order of `seeds`; needed to join "
            "seeds that serve CURVE.",
            item="key",
        ),
    )
    shutdown_grace_ms: int = field(
        default=10_000,
        metadata=doc(
            "On SIGTERM or SIGINT, how long requests in flight may take to finish before the "
            "broker exits; new work is refused at once (0: exit at once)."
        ),
    )
    lane: bool = field(
        default=True,
        metadata=doc(
            "Run the frontend and backend sockets in the lane, a C thread that answers plain "
            "HEARTBEATs and dispatches, queues and answers S0P and Majordomo clients' requests "
            "to workers of their protocol without waking the broker's loop "
            "(docs/architecture.md); false: the loop reads the sockets itself. Where the C "
            "extension is not built the broker runs without it and broker_ready says so."
        ),
    )


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    """One member of the family as the network config describes it to everyone."""

    identity: str = field(metadata=doc("The broker's unique name (matches its own file)."))
    frontend: str = field(metadata=doc("Endpoint clients connect to, tcp://host:port."))
    backend: str = field(metadata=doc("Endpoint workers connect to, tcp://host:port."))
    peer: str = field(metadata=doc("Endpoint other brokers connect to, tcp://host:port."))
    config_pub: str = field(metadata=doc("Endpoint of its config PUB socket, tcp://host:port."))
    config_source: bool = field(
        default=False, metadata=doc("Whether this broker publishes the network config.")
    )
    role: BrokerRole = field(
        default="active", metadata=doc("active, or standby (receives pushed tables, idle).")
    )
    services: tuple[str, ...] | Literal["all"] = field(
        default="all",
        metadata=doc("Services this broker routes: a list, or all.", item="service"),
    )
    curve_public_key: str | None = field(
        default=None,
        metadata=doc(
            "The broker's CURVE public key (Z85, 40 characters); present: every socket of this "
            "broker serves CURVE and everyone connects to it with CURVE (unless curve_off)."
        ),
    )
    curve_off: bool = field(
        default=False,
        metadata=doc(
            "Turning CURVE on broker by broker: this broker serves no CURVE yet, its "
            "curve_public_key only identifies it to the brokers that do."
        ),
    )

    @property
    def serves_curve(self) -> str | None:
        """The key to connect to this broker with, None when it serves no CURVE."""
        return None if self.curve_off else self.curve_public_key


@dataclass(frozen=True, slots=True)
class KeyGrant:
    """What one CURVE key (or ``*``, every key not listed) may do: serve or call services."""

    key: str = field(
        metadata=doc("A CURVE public key (Z85, 40 characters), or * for every key not listed.")
    )
    services: tuple[str, ...] | Literal["all"] = field(
        default="all",
        metadata=doc(
            "Services the key may serve (workers) or call (clients): names, patterns with *, "
            "or all.",
            item="service",
        ),
    )
    until: int | None = field(
        default=None,
        metadata=doc(
            "UNIX time (s) after which this grant ends (a rotated key's overlap); none: no end."
        ),
    )


@dataclass(frozen=True, slots=True)
class PeerLink:
    """How `target` learns `source`'s heartbeat table (docs/protocol.md §5)."""

    source: str = field(metadata=doc("Broker whose heartbeat table is shared."))
    target: str = field(metadata=doc("Broker that receives it."))
    table_mode: TableMode = field(
        default="pull",
        metadata=doc("push: source sends TABLE on change; pull: target asks with TABLEREQ."),
    )


@dataclass(frozen=True, slots=True)
class Admin:
    """An operator allowed to send MANAGEMENTREQ, identified by a scrypt password hash."""

    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {
        "password": "plain-text passwords are refused; store password_hash, made by "
        "`scale0ctl passwd`",
    }

    auth_id: str = field(metadata=doc("The admin's login name."))
    password_hash: str = field(
        metadata=doc("scrypt hash of the password, as printed by `scale0ctl passwd`.")
    )
    role: AdminRole = field(
        default="read", metadata=doc("read (list and look) or admin (may also change).")
    )


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """The family's network config: versioned, signed and distributed to every member."""

    family: str = field(metadata=doc("Name of the family; every member must agree on it."))
    config_version: int = field(
        metadata=doc("Version of this config; a broker only ever applies a higher one.")
    )
    brokers: tuple[BrokerEntry, ...] = field(
        metadata=doc("The members of the family.", item="broker")
    )
    peers: tuple[PeerLink, ...] = field(
        default=(),
        metadata=doc(
            "Heartbeat-table links between brokers; empty means every pair, pull.", item="link"
        ),
    )
    family_topology: FamilyTopology | None = field(
        default=None,
        metadata=doc(
            "mesh (absent): every broker heartbeats every peer; gossip: SWIM probes and gossip."
        ),
    )
    default_heartbeat_interval_ms: int = field(
        default=1000, metadata=doc("Heartbeat interval; peers may ask for longer, never shorter.")
    )
    liveness: int = field(
        default=3, metadata=doc("Missed heartbeat intervals after which a peer is dead.")
    )
    idle_heartbeat_interval_ms: int = field(
        default=5000,
        metadata=doc(
            "Interval an idle client or worker (and the broker to it) may heartbeat at, saying "
            "so in its HEARTBEAT; 0: off. At least default_heartbeat_interval_ms."
        ),
    )
    max_clock_skew_s: float = field(
        default=30.0, metadata=doc("Largest clock difference accepted from a peer (else 412).")
    )
    services: tuple[str, ...] | Literal["all"] = field(
        default="all",
        metadata=doc("Services the family offers: a list, or all.", item="service"),
    )
    error_threshold: int = field(
        default=20, metadata=doc("Protocol errors within error_window_s that get a sender banned.")
    )
    error_window_s: float = field(
        default=10.0, metadata=doc("Window over which protocol errors are counted.")
    )
    error_ban_s: float = field(
        default=60.0, metadata=doc("How long a banned sender is ignored (error_clients).")
    )
    config_republish_s: float = field(
        default=5.0, metadata=doc("Interval at which config sources republish the config.")
    )
    max_frame_bytes: int = field(
        default=1048576, metadata=doc("Largest frame a broker accepts; larger gets 400.")
    )
    request_timeout_ms: int = field(
        default=10000, metadata=doc("Deadline of a request that names none (503 when it passes).")
    )
    max_retries: int = field(
        default=2, metadata=doc("Times a request is re-dispatched after its worker is lost.")
    )
    max_queued_requests: int = field(
        default=10000, metadata=doc("Requests a broker holds waiting for a worker, per service.")
    )
    max_sessions: int = field(
        default=100_000,
        metadata=doc(
            "Client sessions, and worker sessions, a broker holds at most (each channel); "
            "CHECKCONFIG from a new sender past it gets DISCONNECTERROR 503."
        ),
    )
    max_requests_per_client: int = field(
        default=10_000,
        metadata=doc(
            "Requests one client may have unanswered at a broker; more get REPLY 429 at once."
        ),
    )
    max_unnegotiated: int = field(
        default=1024,
        metadata=doc(
            "Frontend plus backend connections a broker keeps that have not negotiated yet, "
            "and apart from them peer connections that have not said a valid HELLO; past it "
            "the oldest of its pool is dropped."
        ),
    )
    negotiate_timeout_ms: int = field(
        default=10_000,
        metadata=doc(
            "How long a new frontend or backend connection may take to negotiate (CHECKCONFIG, "
            "or a Majordomo message), and a peer connection to say a valid HELLO, before the "
            "broker drops it."
        ),
    )
    admins: tuple[Admin, ...] = field(
        default=(), metadata=doc("Operators allowed to manage the family.", item="admin")
    )
    curve: bool = field(
        default=False,
        metadata=doc(
            "CURVE on every socket of the family: every broker entry must carry a "
            "curve_public_key, and clients and workers connect with key pairs of their own."
        ),
    )
    workers: tuple[KeyGrant, ...] = field(
        default=(),
        metadata=doc(
            "Which worker keys may serve which services (CURVE); empty: any key, any service.",
            item="worker",
        ),
    )
    clients: tuple[KeyGrant, ...] = field(
        default=(),
        metadata=doc(
            "Which client keys may call which services (CURVE); empty: any key, any service.",
            item="client",
        ),
    )
    client_view: tuple[str, ...] = field(
        default=DEFAULT_CLIENT_VIEW,
        metadata=doc("Top-level keys clients and workers receive (never admins).", item="key"),
    )


Config = NetworkConfig | BrokerConfig
