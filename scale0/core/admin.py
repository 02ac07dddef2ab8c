"""Management requests (docs/protocol.md §7): credentials, roles, bans, state, family fan-out.

Pure, like the rest of the core: the scrypt check itself runs in the net layer's thread pool
(the core asks for it with an ``Authenticate`` effect and hears back through
``ManagementCall``), and family-wide commands ask the other brokers through a ``FanOut`` effect
whose answers come back as ``FanOutDone``. Both routes in (MANAGEMENTREQ on the frontend, the
HTTP server's ``ManagementSubmit``) meet in :meth:`Management.run`, so they share one table and
one set of checks, in this order (§7.1):

 M1  Credentials: constant-time, the same scrypt cost for an unknown auth_id. A failure is
     MANAGEMENTREP 401 and one error towards the sender's score (its address when known, §8);
     the error that crosses error_threshold bans the sender (DISCONNECTERROR 429 once, then
     silence). After AUTH_FREE_FAILURES failures as one configured auth_id, a try as it before
     its wait is over (scale0/core/guard.py AuthThrottle) is MANAGEMENTREP 429 unchecked; an
     address that logged in as that auth_id lately is not slowed down.
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

The command table, the argument checks and what a command sees of a broker (``Managed``) are
scale0/core/commands.py; adding a command is one entry there plus its handler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from scale0.config.model import BrokerEntry
from scale0.core.commands import (
    COMMANDS,
    DEFAULT_FAMILY_TIMEOUT_MS,
    ROLE_RANK,
    Call,
    Command,
    Managed,
    Outcome,
    config_outcome,
    validate_args,
)
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
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.frames import JsonValue

__all__ = ["MAX_AUTHENTICATING", "MAX_AUTHENTICATING_PER_SENDER", "MAX_FAN_OUTS", "Management"]

#: Credential checks waiting for the thread pool, for the whole broker and for one sender.
MAX_AUTHENTICATING: Final = 32
MAX_AUTHENTICATING_PER_SENDER: Final = 4
#: Family-wide requests waiting for the other brokers at once.
MAX_FAN_OUTS: Final = 16


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
        wait_s = self._broker.auth_wait_s(request.auth_id, sender, now)
        if wait_s > 0:
            why = f"too many failed logins as {request.auth_id!r}: try again in {wait_s:.0f} s"
            out.append(_reply(channel, routing_id, request, Outcome(429, None, why)))
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
        broker.auth_done(event.request.auth_id, event.sender, event.authenticated, now)
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
        if ROLE_RANK[admin.role] < ROLE_RANK[command.role]:
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
