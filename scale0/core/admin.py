"""Management commands (docs/protocol.md §7): credentials, roles, bans and the command table.

Pure, like the rest of the core: the scrypt check itself runs in the net layer's thread pool
(the core asks for it with an ``Authenticate`` effect and hears back through
``ManagementCall``), and family-wide commands ask the other brokers through a ``FanOut`` effect
whose answers come back as ``FanOutDone``. Both routes in (MANAGEMENTREQ on the frontend, the
HTTP server's ``ManagementSubmit``) meet in :meth:`Management.run`, so they share one table and
one set of checks, in this order (§7.1):

 M1  Credentials: constant-time, the same scrypt cost for an unknown auth_id. A failure is
     MANAGEMENTREP 401 and one error towards the sender's score; the error that crosses
     error_threshold bans the sender (DISCONNECTERROR 429 once, then silence, §8).
 M2  Command lookup in COMMANDS, never by attribute name: unknown is 501.
 M3  Role: a ``read`` admin may run only ``read`` commands, else 403 (§13.3).
 M4  State: a disabled broker runs only the commands marked ``when_disabled`` (``enable``,
     ``status``, ``whoami``), every other gets 503 (§6.4).
 M5  Arguments: unknown names, wrong types and out-of-range values are 400, naming the argument.
 M6  Run: 200 and the result, or the command's own code. With ``family: true`` (read commands)
     the same request goes to every other broker of the network config; the answer lists each
     broker's code and result, and names the brokers that did not answer in time. With
     ``broker: ID`` (disable, enable) the request is forwarded to that broker and its answer is
     the answer (504 if it did not answer in time).

Adding a command is one ``Command`` entry in COMMANDS plus its handler.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from scale0.config.model import Admin, AdminRole, BrokerEntry, NetworkConfig
from scale0.config.schema import to_tree
from scale0.core.effects import (
    Authenticate,
    Channel,
    ConfigRead,
    Effect,
    FanOut,
    FanOutDone,
    Log,
    ManagementCall,
    ManagementSubmit,
    ReadConfig,
    Send,
)
from scale0.core.lifecycle import Change
from scale0.core.replica import Applied, Conflict, Offer, Unchanged, Verdict
from scale0.core.states import BrokerInput
from scale0.crypto.passwords import dummy_verify, verify_password
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.frames import ConfigType, JsonValue
from scale0.wire.peer import BrokerState

__all__ = [
    "COMMANDS",
    "Arg",
    "Call",
    "Command",
    "Management",
    "Outcome",
    "check_credentials",
    "validate_args",
]

#: Credential checks waiting for the thread pool, for the whole broker and for one sender.
MAX_AUTHENTICATING: Final = 32
MAX_AUTHENTICATING_PER_SENDER: Final = 4
#: Family-wide requests waiting for the other brokers at once.
MAX_FAN_OUTS: Final = 16
#: How long a family-wide request waits for the other brokers (``timeout_ms``), and its bounds.
DEFAULT_FAMILY_TIMEOUT_MS: Final = 2000
MIN_FAMILY_TIMEOUT_MS: Final = 100
MAX_FAMILY_TIMEOUT_MS: Final = 60_000

REDACTED: Final = "(redacted)"

_ROLE_RANK: Final[dict[str, int]] = {"read": 0, "admin": 1}


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


_CONFIG_TYPES: Final = {"json": ConfigType.JSON, "xml": ConfigType.XML, "zfl": ConfigType.ZFL}


def _set_config(call: Call) -> Outcome:
    """A signed network config from an admin: judged like any other offer (§6.3 rule 1)."""
    args = call.args
    config_type = _CONFIG_TYPES.get(str(args.get("config_type", "json")))
    if config_type is None:
        return Outcome(400, None, "argument 'config_type' must be json, xml or zfl")
    offer = Offer(
        config_type=config_type,
        document=str(args["document"]).encode("utf-8"),
        sha256=str(args["sha256"]),
        signature=str(args["signature"]),
        origin=f"admin:{call.auth_id}",
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


# ---- the management path of one broker ---------------------------------------------------------


@dataclass(slots=True)
class _Waiting:
    """A family-wide request whose other brokers have not all answered yet."""

    channel: Channel
    routing_id: bytes
    request_id: str
    command: str
    local: Outcome | None  # None: forwarded to one broker, whose answer is the answer
    order: tuple[str, ...]


class Management:
    """The broker's management requests: pending credential checks and family fan-outs."""

    __slots__ = ("_authenticating", "_broker", "_fan_outs", "_token", "commands")

    def __init__(self, broker: Managed, commands: Mapping[str, Command] = COMMANDS) -> None:
        self._broker = broker
        self.commands = commands
        self._authenticating: dict[bytes, int] = {}
        self._fan_outs: dict[int, _Waiting] = {}
        self._token = 0

    @property
    def authenticating(self) -> int:
        return sum(self._authenticating.values())

    def submit(
        self,
        channel: Channel,
        routing_id: bytes,
        sender: bytes,
        request: ManagementRequest,
        *,
        session_ok: bool,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        """A request arrived: ask for its credentials to be checked (M1), or run it."""
        if session_ok:
            self.run(channel, routing_id, sender, request, now, wall, out)
            return
        mine = self._authenticating.get(sender, 0)
        if mine >= MAX_AUTHENTICATING_PER_SENDER or self.authenticating >= MAX_AUTHENTICATING:
            out.append(
                _reply(
                    channel,
                    routing_id,
                    request,
                    Outcome(503, None, "too many management requests being checked; try again"),
                )
            )
            return
        self._authenticating[sender] = mine + 1
        out.append(Authenticate(channel, routing_id, sender, request))

    def submitted(
        self, event: ManagementSubmit, now: float, wall: float, out: list[Effect]
    ) -> None:
        """A request from the HTTP server (or another non-socket route)."""
        self.submit(
            event.channel,
            event.routing_id,
            event.sender,
            event.request,
            session_ok=event.session_ok,
            now=now,
            wall=wall,
            out=out,
        )

    def checked(self, event: ManagementCall, now: float, wall: float, out: list[Effect]) -> None:
        """The credentials were checked (M1): count a failure, or run the request."""
        left = self._authenticating.get(event.sender, 0) - 1
        if left > 0:
            self._authenticating[event.sender] = left
        else:
            self._authenticating.pop(event.sender, None)
        broker = self._broker
        if broker.is_banned(event.sender, now):
            return  # banned while this one waited: silence (§8)
        if not event.authenticated:
            out.append(
                Log(
                    "warning",
                    "management_auth_failed",
                    {"auth_id": event.request.auth_id, "sender": event.sender.hex()},
                )
            )
            if broker.count_error(event.channel, event.sender, event.routing_id, now, out):
                return  # this failure banned the sender: the 429 is all it gets
            out.append(
                _reply(
                    event.channel,
                    event.routing_id,
                    event.request,
                    Outcome(401, None, "bad credentials"),
                )
            )
            return
        self.run(event.channel, event.routing_id, event.sender, event.request, now, wall, out)

    def run(
        self,
        channel: Channel,
        routing_id: bytes,
        sender: bytes,
        request: ManagementRequest,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> None:
        """M2-M6 for a request whose credentials are good."""
        outcome = self._outcome(channel, routing_id, request, now, wall, out)
        if outcome is not None:
            out.append(_reply(channel, routing_id, request, outcome))

    def _outcome(
        self,
        channel: Channel,
        routing_id: bytes,
        request: ManagementRequest,
        now: float,
        wall: float,
        out: list[Effect],
    ) -> Outcome | None:
        broker = self._broker
        admin = next((a for a in broker.network.admins if a.auth_id == request.auth_id), None)
        if admin is None:  # removed by a config change since the check
            return Outcome(401, None, "bad credentials")
        command = self.commands.get(request.command)
        if command is None:
            return Outcome(501, None, f"unknown management command {request.command!r}")
        if _ROLE_RANK[admin.role] < _ROLE_RANK[command.role]:
            return Outcome(
                403, None, f"{command.name} needs role {command.role}; {admin.auth_id} is read"
            )
        if broker.state == "disabled" and not command.when_disabled:
            return Outcome(
                503,
                {"broker": broker.identity, "state": broker.state},
                f"broker {broker.identity} is disabled: only enable and status run",
            )
        problem = validate_args(command, request.args)
        if problem is not None:
            return Outcome(400, None, problem)
        args: dict[str, JsonValue] = {k: v for k, v in request.args.items() if v is not None}
        family = args.pop("family", False) is True
        timeout = args.pop("timeout_ms", None)
        timeout_ms = timeout if isinstance(timeout, int) else DEFAULT_FAMILY_TIMEOUT_MS
        target = args.pop("broker", broker.identity)
        if target != broker.identity:
            entry = next((b for b in broker.network.brokers if b.identity == target), None)
            if entry is None:
                return Outcome(400, None, f"argument 'broker': no broker {target!r} in the family")
            return self._forward(
                channel, routing_id, request, command, args, entry, timeout_ms, out
            )
        out.append(
            Log(
                "info" if command.role == "admin" else "debug",
                "management_command",
                {"auth_id": admin.auth_id, "command": command.name, "family": family},
            )
        )
        call = Call(
            broker,
            args,
            now,
            wall,
            admin.auth_id,
            admin.role,
            out,
            channel,
            routing_id,
            request.request_id,
        )
        local = command.run(call)
        if local is None:  # answered later (reload_config on a source: ReadConfig)
            out.append(ReadConfig(channel, routing_id, request.request_id))
            return None
        if not family:
            return local
        return self._fan_out(channel, routing_id, request, command, args, local, timeout_ms, out)

    def _fan_out(
        self,
        channel: Channel,
        routing_id: bytes,
        request: ManagementRequest,
        command: Command,
        args: dict[str, JsonValue],
        local: Outcome,
        timeout_ms: int,
        out: list[Effect],
    ) -> Outcome | None:
        broker = self._broker
        order = tuple(b.identity for b in broker.network.brokers)
        if broker.identity not in order:
            order = (broker.identity, *order)
        targets = tuple(
            (b.identity, b.frontend)
            for b in broker.network.brokers
            if b.identity != broker.identity
        )
        waiting = _Waiting(channel, routing_id, request.request_id, command.name, local, order)
        if not targets:
            return _family_outcome(broker, waiting, {})
        if len(self._fan_outs) >= MAX_FAN_OUTS:
            return Outcome(503, None, "too many family-wide requests in progress; try again")
        self._token += 1
        self._fan_outs[self._token] = waiting
        forwarded = ManagementRequest(
            auth_id=request.auth_id,
            auth_password=request.auth_password,
            command=command.name,
            request_id=request.request_id,
            args=args,
        )
        out.append(FanOut(self._token, forwarded, targets, timeout_ms / 1000))
        return None

    def _forward(
        self,
        channel: Channel,
        routing_id: bytes,
        request: ManagementRequest,
        command: Command,
        args: dict[str, JsonValue],
        entry: BrokerEntry,
        timeout_ms: int,
        out: list[Effect],
    ) -> Outcome | None:
        """{"broker": ID}: the same request, run by that broker (a fan-out to one)."""
        if len(self._fan_outs) >= MAX_FAN_OUTS:
            return Outcome(503, None, "too many forwarded requests in progress; try again")
        self._token += 1
        self._fan_outs[self._token] = _Waiting(
            channel, routing_id, request.request_id, command.name, None, (entry.identity,)
        )
        forwarded = ManagementRequest(
            auth_id=request.auth_id,
            auth_password=request.auth_password,
            command=command.name,
            request_id=request.request_id,
            args=args,
        )
        out.append(
            FanOut(self._token, forwarded, ((entry.identity, entry.frontend),), timeout_ms / 1000)
        )
        return None

    def config_read(self, event: ConfigRead, now: float, wall: float, out: list[Effect]) -> None:
        """reload_config on a config source: its file was read and signed (or not)."""
        if event.offer is None:
            outcome = Outcome(
                400, {"applied": False}, f"cannot reload: {event.error or 'no network config'}"
            )
        else:
            outcome = config_outcome(self._broker, event.offer, "file", now, wall, out)
        out.append(_answer(event.channel, event.routing_id, event.request_id, outcome))

    def fanned_out(self, event: FanOutDone, out: list[Effect]) -> None:
        """The other brokers answered (or did not in time): answer the waiting request."""
        waiting = self._fan_outs.pop(event.token, None)
        if waiting is None:
            return
        answers = {a.identity: a.reply for a in event.answers}
        if waiting.local is None:
            target = waiting.order[0]
            reply = answers.get(target)
            outcome = (
                Outcome(reply.code, reply.result, reply.message)
                if reply is not None
                else Outcome(504, None, f"broker {target} did not answer in time")
            )
        else:
            outcome = _family_outcome(self._broker, waiting, answers)
        out.append(_answer(waiting.channel, waiting.routing_id, waiting.request_id, outcome))


def _family_outcome(
    broker: Managed, waiting: _Waiting, answers: Mapping[str, ManagementReply | None]
) -> Outcome:
    """One entry per broker of the network config, in its order, and who did not answer."""
    brokers: list[JsonValue] = []
    silent: list[JsonValue] = []
    for identity in waiting.order:
        if identity == broker.identity and waiting.local is not None:
            local = waiting.local
            brokers.append(_entry(identity, local.code, local.result, local.message))
            continue
        reply = answers.get(identity)
        if reply is None:
            silent.append(identity)
            brokers.append(_entry(identity, None, None, "did not answer in time"))
        else:
            brokers.append(_entry(identity, reply.code, reply.result, reply.message))
    failed = [
        b["broker"]
        for b in brokers
        if isinstance(b, dict) and b["code"] is not None and b["code"] != 200
    ]
    return Outcome(
        200,
        {
            "family": broker.network.family,
            "command": waiting.command,
            "asked_by": broker.identity,
            "complete": not silent and not failed,
            "brokers": brokers,
            "not_answering": silent,
            "failed": failed,
        },
    )


def _entry(identity: str, code: int | None, result: JsonValue, message: str | None) -> JsonValue:
    return {"broker": identity, "code": code, "message": message, "result": result}


def _reply(
    channel: Channel, routing_id: bytes, request: ManagementRequest, outcome: Outcome
) -> Send:
    return _answer(channel, routing_id, request.request_id, outcome)


def _answer(channel: Channel, routing_id: bytes, request_id: str, outcome: Outcome) -> Send:
    """MANAGEMENTREP for ``request_id``: the outcome's code, result and message."""
    return Send(
        channel,
        routing_id,
        ManagementReply(
            request_id=request_id,
            code=outcome.code,
            result=outcome.result,
            message=outcome.message,
        ),
    )
