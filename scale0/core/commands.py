"""The management commands (docs/protocol.md §7): what each does, who may run it, its arguments.

The command table (COMMANDS: one ``Command`` entry and its handler per command), the checks of
a request's arguments (M5), the credential check (M1, run off the loop by the net layer), and
``Managed``: what a command sees of a broker. How a request reaches a command (rules M1-M6:
credentials, lookup, role, state, arguments, family fan-out) is scale0/core/admin.py.

Adding a command is one ``Command`` entry in COMMANDS plus its handler.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from scale0.config.model import Admin, AdminRole, NetworkConfig
from scale0.config.schema import to_tree
from scale0.core.effects import (
    Channel,
    Effect,
)
from scale0.core.replica import Applied, Conflict, Offer, Unchanged, Verdict
from scale0.core.states import BrokerInput, Change
from scale0.crypto.passwords import dummy_verify, verify_password
from scale0.wire.frames import ConfigType, JsonValue
from scale0.wire.peer import BrokerState

__all__ = [
    "COMMANDS",
    "DEFAULT_FAMILY_TIMEOUT_MS",
    "MAX_FAMILY_TIMEOUT_MS",
    "MIN_FAMILY_TIMEOUT_MS",
    "REDACTED",
    "ROLE_RANK",
    "Arg",
    "Call",
    "Command",
    "Managed",
    "Outcome",
    "check_credentials",
    "config_outcome",
    "validate_args",
]

#: How long a family-wide request waits for the other brokers (``timeout_ms``), and its bounds.
DEFAULT_FAMILY_TIMEOUT_MS: Final = 2000
MIN_FAMILY_TIMEOUT_MS: Final = 100
MAX_FAMILY_TIMEOUT_MS: Final = 60_000

REDACTED: Final = "(redacted)"

ROLE_RANK: Final[dict[str, int]] = {"read": 0, "admin": 1}


def check_credentials(admins: tuple[Admin, ...], auth_id: str, password: str) -> Admin | None:
    """The admin these credentials belong to, or None. Blocking (one scrypt): not on the loop.

    Every configured id is compared (constant time, no early exit), and an unknown id costs one
    scrypt at the default parameters (``dummy_verify``), the same as a wrong password for a
    hash made by ``scale0ctl passwd``: the time taken does not tell which part was wrong.
    """
    wanted = auth_id.encode("utf-8", "surrogatepass")
    found: Admin | None = None
    for admin in admins:
        if hmac.compare_digest(admin.auth_id.encode("utf-8"), wanted):
            found = admin
    if found is None:
        dummy_verify(password)
        return None
    return found if verify_password(password, found.password_hash) else None


# ---- what management sees of a broker ----------------------------------------------------------


class Managed(Protocol):
    """What management reads of a broker and asks of it: scale0.core.broker.Broker is one.

    Management depends on this and nothing else of the broker (it does not import it), so a
    command is written against what it may touch, and a test can hold a command to it.
    """

    @property
    def identity(self) -> str: ...

    @property
    def network(self) -> NetworkConfig: ...

    @property
    def state(self) -> BrokerState: ...

    @property
    def sha256(self) -> str: ...

    @property
    def signature(self) -> str | None: ...

    @property
    def config_source(self) -> bool: ...

    @property
    def config_version(self) -> int: ...

    def status(self, now: float, wall: float) -> dict[str, JsonValue]: ...

    def client_table(self, now: float) -> list[JsonValue]: ...

    def worker_table(self, now: float) -> list[JsonValue]: ...

    def service_table(self) -> list[JsonValue]: ...

    def peers_view(self) -> list[JsonValue]: ...

    def config_view(self) -> dict[str, JsonValue]: ...

    def change_state(
        self, change: BrokerInput, now: float, by: str, out: list[Effect]
    ) -> Change: ...

    def fetch_config(self, wall: float, out: list[Effect]) -> list[str]: ...

    def offer_config(
        self, offer: Offer, source: str, now: float, wall: float
    ) -> tuple[Verdict, list[Effect]]: ...

    def is_banned(self, routing_id: bytes, now: float) -> bool: ...

    def count_error(
        self, channel: Channel, sender: bytes, reply_to: bytes, now: float, out: list[Effect]
    ) -> bool: ...

    def auth_wait_s(self, auth_id: str, sender: bytes, now: float) -> float: ...

    def auth_done(self, auth_id: str, sender: bytes, ok: bool, now: float) -> None: ...


# ---- the command table -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a command answers: ``code`` 200 and a ``result``, or an error code and ``message``."""

    code: int
    result: JsonValue = None
    message: str | None = None


@dataclass(slots=True)
class Call:
    """What a handler gets: the broker, validated args, the clock and who is asking."""

    broker: Managed
    args: dict[str, JsonValue]
    now: float
    wall: float
    auth_id: str
    role: AdminRole
    out: list[Effect]
    channel: Channel = Channel.FRONTEND  # where a deferred answer goes (reload_config)
    routing_id: bytes = b""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class Arg:
    """One accepted argument: its JSON type and, for integers, the allowed range."""

    kind: type[bool] | type[int] | type[str]
    doc: str
    minimum: int | None = None
    maximum: int | None = None


#: A handler answers at once, or returns None when its answer comes later (reload_config).
Handler = Callable[[Call], Outcome | None]


@dataclass(frozen=True, slots=True)
class Command:
    """One management command: who may run it, what it accepts, and its handler."""

    name: str
    role: AdminRole
    summary: str
    run: Handler
    args: Mapping[str, Arg] = field(default_factory=dict)
    family: bool = False  # accepts {"family": true} (and "timeout_ms"): ask every broker
    targeted: bool = False  # accepts {"broker": ID}: run on that broker of the family
    when_disabled: bool = False  # runs on a disabled broker (§6.4)
    required: tuple[str, ...] = ()  # arguments that must be given

    def accepted(self) -> dict[str, Arg]:
        """Every argument this command accepts, the family and target ones included."""
        return {
            **self.args,
            **(FAMILY_ARGS if self.family else {}),
            **(TARGET_ARGS if self.targeted else {}),
        }


FAMILY_ARGS: Final[Mapping[str, Arg]] = {
    "family": Arg(bool, "Ask every broker of the family, not only this one."),
    "timeout_ms": Arg(
        int,
        "With family: how long to wait for the other brokers.",
        MIN_FAMILY_TIMEOUT_MS,
        MAX_FAMILY_TIMEOUT_MS,
    ),
}


TARGET_ARGS: Final[Mapping[str, Arg]] = {
    "broker": Arg(str, "Run the command on this broker of the family (default: this one)."),
    "timeout_ms": FAMILY_ARGS["timeout_ms"],
}


def validate_args(command: Command, args: Mapping[str, JsonValue]) -> str | None:
    """Why ``args`` do not fit ``command`` (one line naming the argument), or None (M5)."""
    accepted = command.accepted()
    for name in command.required:
        if args.get(name) is None:
            return f"argument {name!r} is required for {command.name}"
    for name, value in args.items():
        spec = accepted.get(name)
        if spec is None:
            names = ", ".join(sorted(accepted)) or "none"
            return f"unknown argument {name!r} for {command.name} (accepted: {names})"
        if value is None:
            continue
        # bool is an int in Python; on the wire they are different things (§2.2 rule 7).
        if type(value) is not spec.kind:
            return f"argument {name!r} must be {_KIND_NAMES[spec.kind]}, got {_json_type(value)}"
        if isinstance(value, int) and not isinstance(value, bool):
            if spec.minimum is not None and value < spec.minimum:
                return f"argument {name!r} must be at least {spec.minimum}, got {value}"
            if spec.maximum is not None and value > spec.maximum:
                return f"argument {name!r} must be at most {spec.maximum}, got {value}"
    return None


_KIND_NAMES: Final[dict[type, str]] = {bool: "a boolean", int: "an integer", str: "a string"}


def _json_type(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# ---- handlers ----------------------------------------------------------------------------------


def _whoami(call: Call) -> Outcome:
    broker = call.broker
    return Outcome(
        200,
        {
            "auth_id": call.auth_id,
            "role": call.role,
            "broker": broker.identity,
            "family": broker.network.family,
        },
    )


def _status(call: Call) -> Outcome:
    return Outcome(200, call.broker.status(call.now, call.wall))


def _list_clients(call: Call) -> Outcome:
    return Outcome(200, {"clients": call.broker.client_table(call.now)})


def _list_workers(call: Call) -> Outcome:
    return Outcome(200, {"workers": call.broker.worker_table(call.now)})


def _list_services(call: Call) -> Outcome:
    return Outcome(200, {"services": call.broker.service_table()})


def _get_config(call: Call) -> Outcome:
    broker = call.broker
    tree = to_tree(broker.network, typed=True)
    for admin in tree.get("admins", []):
        admin["password_hash"] = REDACTED  # never hand out hashes to crack offline
    return Outcome(
        200,
        {
            "family": broker.network.family,
            "config_version": broker.network.config_version,
            "sha256": broker.sha256,
            "signed": broker.signature is not None,
            "config": tree,
        },
    )


def _list_peers(call: Call) -> Outcome:
    broker = call.broker
    return Outcome(
        200,
        {"broker": broker.identity, "peers": broker.peers_view(), **broker.config_view()},
    )


def _set_config(call: Call) -> Outcome:
    """A signed network config from an admin: judged like any other offer (§6.3 rule 1)."""
    args = call.args
    try:
        config_type = ConfigType(str(args.get("config_type", "json")))
    except ValueError:
        return Outcome(400, None, "argument 'config_type' must be json, xml or zfl")
    view = args.get("view_signature")
    offer = Offer(
        config_type=config_type,
        document=str(args["document"]).encode("utf-8"),
        sha256=str(args["sha256"]),
        signature=str(args["signature"]),
        origin=f"admin:{call.auth_id}",
        view_signature=None if view is None else str(view),
    )
    return config_outcome(call.broker, offer, "admin", call.now, call.wall, call.out)


def _reload_config(call: Call) -> Outcome | None:
    """A config source reads its file again (answered when it is read: ``ConfigRead``); any
    other broker asks its peers for their config at once (§6.3 rule 2)."""
    broker = call.broker
    if broker.config_source:
        return None  # the broker emits ReadConfig; the answer follows ConfigRead
    asked = broker.fetch_config(call.wall, call.out)
    return Outcome(
        200,
        {
            "applied": False,
            "config_version": broker.config_version,
            "asked": list[JsonValue](asked),
            "note": "not a config source: it asked its peers; a newer config applies when it "
            "arrives (config_applied in its log, and get_config)",
        },
    )


def config_outcome(
    broker: Managed, offer: Offer, source: str, now: float, wall: float, out: list[Effect]
) -> Outcome:
    """Offer a config and say what happened: applied (with what changed and what needs a
    restart), unchanged, refused with the reason, or lost a conflict."""
    outcome, effects = broker.offer_config(offer, source, now, wall)
    out.extend(effects)
    if isinstance(outcome, Applied):
        return Outcome(
            200,
            {
                "applied": True,
                "config_version": outcome.config.version,
                "previous_version": outcome.previous_version,
                "sha256": outcome.config.sha256,
                "changed": list(outcome.plan.changed),
                "restart_needed": list(outcome.plan.restart_needed),
                "conflict": outcome.conflict,
                # K6: the running config only gained its client view's signature.
                "view_signed": outcome.view_signed,
            },
        )
    if isinstance(outcome, Unchanged):
        return Outcome(
            200,
            {"applied": False, "config_version": broker.config_version, "reason": outcome.reason},
        )
    if isinstance(outcome, Conflict):
        return Outcome(
            409,
            {"kept": outcome.kept, "dropped": outcome.dropped, "version": outcome.version},
            f"config_version {outcome.version} conflicts with the running one, whose sha256 is "
            "smaller: it stays (publish a higher version)",
        )
    return Outcome(400, {"applied": False}, f"config refused: {outcome.reason}")


def _change_state(call: Call, change: BrokerInput) -> Outcome:
    done = call.broker.change_state(change, call.now, call.auth_id, call.out)
    if done.code != 200:
        return Outcome(done.code, None, done.why)
    return Outcome(200, done.view(call.broker.identity))


def _disable(call: Call) -> Outcome:
    return _change_state(call, BrokerInput.DISABLE)


def _enable(call: Call) -> Outcome:
    return _change_state(call, BrokerInput.ENABLE)


COMMANDS: Final[dict[str, Command]] = {
    command.name: command
    for command in (
        Command(
            "whoami",
            "read",
            "Who the credentials belong to, and their role.",
            _whoami,
            when_disabled=True,
        ),
        Command(
            "status",
            "read",
            "State, config version, counters, services and recent history of the broker.",
            _status,
            family=True,
            when_disabled=True,
        ),
        Command(
            "list_clients", "read", "The client sessions of the broker.", _list_clients, family=True
        ),
        Command(
            "list_workers",
            "read",
            "The workers connected to the broker.",
            _list_workers,
            family=True,
        ),
        Command(
            "list_services",
            "read",
            "Services with workers, ready and busy workers, and queue depth.",
            _list_services,
            family=True,
        ),
        Command(
            "get_config",
            "read",
            "The running network config (password hashes redacted).",
            _get_config,
            family=True,
        ),
        Command(
            "list_peers",
            "read",
            "The other brokers as this one sees them: link, state, config version, table.",
            _list_peers,
            family=True,
        ),
        Command(
            "set_config",
            "admin",
            "Apply a signed network config (then published and replicated to the family).",
            _set_config,
            args={
                "document": Arg(str, "The network config, serialised in config_type."),
                "config_type": Arg(str, "json (default), xml or zfl."),
                "sha256": Arg(str, "sha256 of the config's canonical JSON (§6.2)."),
                "signature": Arg(str, "Ed25519 signature over family|config_version|sha256."),
                "view_signature": Arg(
                    str,
                    "Ed25519 signature over the client view (§6.2), by the same key; without "
                    "it, clients that check signatures refuse the config.",
                ),
            },
            required=("document", "sha256", "signature"),
        ),
        Command(
            "reload_config",
            "admin",
            "A config source reads its network config file again, signs and applies it; "
            "any other broker asks its peers for a newer config.",
            _reload_config,
            targeted=True,
        ),
        Command(
            "disable",
            "admin",
            "Stop accepting clients and requests; waiting requests get 503.",
            _disable,
            targeted=True,
        ),
        Command(
            "enable",
            "admin",
            "Accept clients and requests again.",
            _enable,
            targeted=True,
            when_disabled=True,
        ),
    )
}
