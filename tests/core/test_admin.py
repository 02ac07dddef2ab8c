"""Management in the pure core: credentials, the command table, roles, bans, state, fan-out (M1-M6).

Driven with numbers through tests/core/harness.py: the ``Authenticate`` effect's real check
(``check_credentials``, scrypt) is run here by the test, as the net layer would in its pool.
"""

from __future__ import annotations

from typing import Any

import pytest

from scale0.config.model import Admin, BrokerEntry
from scale0.core.admin import MAX_AUTHENTICATING_PER_SENDER
from scale0.core.commands import (
    COMMANDS,
    REDACTED,
    Outcome,
    check_credentials,
    validate_args,
)
from scale0.core.effects import (
    Authenticate,
    Channel,
    Effect,
    FamilyAnswer,
    FanOut,
    FanOutDone,
    ManagementCall,
    ManagementSubmit,
    Send,
)
from scale0.crypto import passwords
from scale0.crypto.passwords import hash_password
from scale0.wire.admin import COMMAND_NAME, ManagementReply, ManagementRequest
from scale0.wire.client import DisconnectError
from scale0.wire.worker import WorkerReply
from tests.core.harness import BACK, FRONT, NETWORK, Harness, dispatched, only, replies, sends

# Cheap hashes keep the table tests fast; the timing test uses the default cost.
ADMINS = (
    Admin("root", hash_password("root-pw", n=16, r=1, p=1), "admin"),
    Admin("eve", hash_password("eve-pw", n=16, r=1, p=1), "read"),
)
PASSWORDS = {"root": "root-pw", "eve": "eve-pw"}
A1 = b"\x00\x00\x00\x00\x01"
A2 = b"\x00\x00\x00\x00\x02"
C1 = b"\x00\x00\x00\x00\x11"
W1 = b"\x00\x00\x00\x00\x21"
W2 = b"\x00\x00\x00\x00\x22"


def _entry(identity: str, port: int) -> BrokerEntry:
    return BrokerEntry(
        identity=identity,
        frontend=f"tcp://127.0.0.1:{port}",
        backend=f"tcp://127.0.0.1:{port + 1}",
        peer=f"tcp://127.0.0.1:{port + 2}",
        config_pub=f"tcp://127.0.0.1:{port + 3}",
    )


def harness(**network: Any) -> Harness:
    return Harness(admins=ADMINS, **network)


def ask(
    h: Harness,
    command: str,
    *,
    auth_id: str = "root",
    password: str | None = None,
    args: dict[str, Any] | None = None,
    rid: bytes = A1,
) -> list[Effect]:
    """MANAGEMENTREQ in, the credential check done as the net layer does it, effects out."""
    request = ManagementRequest(
        auth_id=auth_id,
        auth_password=PASSWORDS.get(auth_id, "x") if password is None else password,
        command=command,
        request_id="m1",
        args=args or {},
    )
    effects = h.send(FRONT, rid, request)
    checks = [e for e in effects if isinstance(e, Authenticate)]
    if not checks:
        return effects
    check = only(checks)
    ok = check_credentials(h.broker.network.admins, request.auth_id, request.auth_password)
    event = ManagementCall(
        check.channel, check.routing_id, check.sender, check.request, ok is not None
    )
    return h.broker.handle(event, h.now, h.wall)


def fanned(effects: list[Effect]) -> FanOut:
    fan = only([e for e in effects if isinstance(e, FanOut)])
    assert isinstance(fan, FanOut)
    return fan


def answer(effects: list[Effect]) -> ManagementReply:
    message = only(sends(effects))[1]
    assert isinstance(message, ManagementReply), message
    return message


# ---- M1: credentials ---------------------------------------------------------------------------


def test_m1_managementreq_asks_for_a_credential_check_before_anything_else() -> None:
    h = harness()
    effects = h.send(
        FRONT, A1, ManagementRequest("root", "root-pw", "no_such_command", "m1", {"x": 1})
    )
    check = only(effects)
    assert isinstance(check, Authenticate)
    assert (check.channel, check.routing_id, check.sender) == (FRONT, A1, A1)


def test_m1_right_password_runs_the_command() -> None:
    reply = answer(ask(harness(), "whoami"))
    assert reply.code == 200
    assert reply.result == {"auth_id": "root", "role": "admin", "broker": "b1", "family": "test"}


@pytest.mark.parametrize(
    ("auth_id", "password"), [("root", "wrong"), ("nobody", "root-pw"), ("root", "")]
)
def test_m1_wrong_password_or_unknown_id_is_401_alike(auth_id: str, password: str) -> None:
    reply = answer(ask(harness(), "status", auth_id=auth_id, password=password))
    assert (reply.code, reply.message, reply.result) == (401, "bad credentials", None)


def test_m1_bad_credentials_ban_after_the_threshold_then_silence() -> None:
    h = harness(error_threshold=3, error_ban_s=60.0)
    for _ in range(3):
        assert answer(ask(h, "status", password="wrong")).code == 401
    banning = only(sends(ask(h, "status", password="wrong")))[1]
    assert isinstance(banning, DisconnectError) and banning.code == 429
    assert h.broker.is_banned(A1, h.now)
    # Even the right password gets nothing while the ban lasts (the node drops it unread; a
    # check that was already under way when the ban fell is dropped by the core).
    late = ManagementCall(FRONT, A1, A1, ManagementRequest("root", "root-pw", "status", "m2"), True)
    assert h.broker.handle(late, h.now, h.wall) == []
    assert answer(ask(h, "status", rid=A2)).code == 200  # another sender is not affected
    h.advance(60.0)
    assert not h.broker.is_banned(A1, h.now)
    assert answer(ask(h, "status")).code == 200


def test_m1_good_credentials_do_not_count_towards_the_ban() -> None:
    h = harness(error_threshold=2)
    for _ in range(10):
        assert answer(ask(h, "status")).code == 200
    assert not h.broker.is_banned(A1, h.now)


def test_m1_credential_checks_per_sender_are_bounded() -> None:
    h = harness()
    request = ManagementRequest("root", "root-pw", "status", "m1")
    for _ in range(MAX_AUTHENTICATING_PER_SENDER):
        assert isinstance(only(h.send(FRONT, A1, request)), Authenticate)
    reply = answer(h.send(FRONT, A1, request))
    assert reply.code == 503
    assert isinstance(only(h.send(FRONT, A2, request)), Authenticate)


def test_m1_admin_removed_since_the_check_is_401() -> None:
    h = harness()
    call = ManagementCall(FRONT, A1, A1, ManagementRequest("gone", "pw", "status", "m1"), True)
    assert answer(h.broker.handle(call, h.now, h.wall)).code == 401


def test_check_credentials_compares_against_the_stored_hash() -> None:
    assert check_credentials(ADMINS, "root", "root-pw") == ADMINS[0]
    assert check_credentials(ADMINS, "eve", "eve-pw") == ADMINS[1]
    assert check_credentials(ADMINS, "root", "eve-pw") is None
    assert check_credentials(ADMINS, "eve", "root-pw") is None
    assert check_credentials(ADMINS, "nobody", "root-pw") is None
    assert check_credentials((), "root", "root-pw") is None
    assert check_credentials(ADMINS, "root\ud800", "x") is None  # lone surrogate: no crash


def test_a_failed_check_does_the_same_work_whether_the_id_or_the_password_was_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unknown id, wrong password and a near-miss id cost one default-cost scrypt each.

    Counted, not timed (a timed assertion fails on a loaded machine): every derivation
    check_credentials runs is recorded with its cost parameters."""
    admins = (Admin("admin", hash_password("secret-one"), "admin"),)
    cases = {
        "unknown_id": ("zzzzz", "secret-one"),
        "wrong_password": ("admin", "secret-two"),
        "id_prefix": ("admi", "secret-one"),
        "right": ("admin", "secret-one"),
    }
    real = passwords._scrypt
    calls: list[tuple[int, int, int]] = []

    def counted(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
        calls.append((n, r, p))
        return real(password, salt, n, r, p)

    monkeypatch.setattr(passwords, "_scrypt", counted)
    default = (passwords.DEFAULT_N, passwords.DEFAULT_R, passwords.DEFAULT_P)
    for name, (auth_id, password) in cases.items():
        calls.clear()
        found = check_credentials(admins, auth_id, password)
        assert (found is not None) is (name == "right"), name
        assert calls == [default], (name, calls)


# ---- M2-M5: table, role, state, args -----------------------------------------------------------


def test_m2_the_table_has_the_required_commands_each_with_a_valid_name() -> None:
    required = {
        "status",
        "list_clients",
        "list_workers",
        "list_services",
        "get_config",
        "disable",
        "enable",
        "list_peers",
        "set_config",
        "reload_config",
    }
    assert required <= set(COMMANDS)
    for name, command in COMMANDS.items():
        assert command.name == name
        assert COMMAND_NAME.fullmatch(name)
        assert command.role in ("read", "admin")
        assert command.summary
    assert {n for n, c in COMMANDS.items() if c.role == "admin"} == {
        "disable",
        "enable",
        "set_config",
        "reload_config",
    }
    assert {n for n, c in COMMANDS.items() if c.family} == {
        "status",
        "list_peers",
        "list_clients",
        "list_workers",
        "list_services",
        "get_config",
    }


def test_m2_unknown_command_is_501_after_the_credentials() -> None:
    h = harness()
    reply = answer(ask(h, "__class__"))
    assert reply.code == 501 and "'__class__'" in (reply.message or "")
    assert answer(ask(h, "__class__", password="wrong")).code == 401


@pytest.mark.parametrize("command", ["disable", "enable"])
def test_m3_read_user_may_not_change_anything(command: str) -> None:
    h = harness()
    reply = answer(ask(h, command, auth_id="eve"))
    assert reply.code == 403 and "needs role admin" in (reply.message or "")
    assert h.broker.state == "active"


@pytest.mark.parametrize("command", ["status", "list_clients", "list_workers", "list_services"])
def test_m3_read_user_may_look(command: str) -> None:
    assert answer(ask(harness(), command, auth_id="eve")).code == 200


def test_m4_disabled_broker_runs_only_enable_status_and_whoami() -> None:
    h = harness()
    assert answer(ask(h, "disable")).result == {
        "broker": "b1",
        "state": "disabled",
        "changed": True,
    }
    for command in ("list_clients", "list_workers", "list_services", "get_config", "disable"):
        reply = answer(ask(h, command))
        assert reply.code == 503, command
        assert reply.result == {"broker": "b1", "state": "disabled"}
    status = answer(ask(h, "status"))
    assert status.code == 200 and isinstance(status.result, dict)
    assert status.result["state"] == "disabled"
    assert answer(ask(h, "enable")).result == {"broker": "b1", "state": "active", "changed": True}
    assert answer(ask(h, "enable")).result == {"broker": "b1", "state": "active", "changed": False}


def test_m4_joining_broker_cannot_be_enabled() -> None:
    h = Harness(state="joining", admins=ADMINS)
    assert answer(ask(h, "enable")).code == 503
    assert h.broker.state == "joining"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"bogus": 1}, "unknown argument 'bogus' for status"),
        ({"family": 1}, "argument 'family' must be a boolean, got an integer"),
        ({"family": "yes"}, "must be a boolean, got a string"),
        ({"family": True, "timeout_ms": 5}, "'timeout_ms' must be at least 100, got 5"),
        ({"family": True, "timeout_ms": True}, "must be an integer, got a boolean"),
        ({"timeout_ms": 10**9}, "at most 60000"),
    ],
)
def test_m5_bad_args_are_400_naming_the_argument(args: dict[str, Any], words: str) -> None:
    reply = answer(ask(harness(), "status", args=args))
    assert reply.code == 400 and words in (reply.message or ""), reply.message


def test_m5_change_commands_take_no_family_argument() -> None:
    reply = answer(ask(harness(), "disable", args={"family": True}))
    assert reply.code == 400 and "unknown argument 'family' for disable" in (reply.message or "")


def test_validate_args_accepts_null_as_absent() -> None:
    assert validate_args(COMMANDS["status"], {"family": None}) is None


# ---- M6: what the commands do ------------------------------------------------------------------


def test_disable_moves_a_waiting_requests_client_and_refuses_new_ones() -> None:
    """R18: nothing will run the waiting request here, so its client is told to move (503: no
    active peer to name) and resends it there; the request gets no answer here."""
    h = harness()
    h.client(C1)
    h.request(C1, b"r1")  # no worker: it waits
    effects = ask(h, "disable")
    assert replies(effects) == []
    moved = [m for rid, m in sends(effects, FRONT) if rid == C1]
    assert len(moved) == 1 and isinstance(moved[0], DisconnectError) and moved[0].code == 503
    refused = only(sends(h.client(C1)))[1]
    assert isinstance(refused, DisconnectError) and refused.code == 503
    ask(h, "enable")
    h.client(C1)
    h.worker(W1)
    assert dispatched(h.request(C1, b"r3"))


def test_disable_moves_idle_workers_at_once_and_busy_ones_after_their_reply() -> None:
    h = harness()
    h.client(C1)
    h.worker(W1)
    h.worker(W2)
    (worker, job), *_ = dispatched(h.request(C1, b"r1"))
    effects = ask(h, "disable")
    idle = W2 if worker == W1 else W1
    told = [m for rid, m in sends(effects, BACK) if rid == idle]
    assert len(told) == 1 and isinstance(told[0], DisconnectError) and told[0].code == 503
    assert h.broker.stats()["workers"] == 1
    effects = h.send(BACK, worker, WorkerReply(ticket=job.ticket, status=200, body=(b"ok",)))
    assert only(replies(effects))[1].body == (b"ok",)
    told = [m for rid, m in sends(effects, BACK) if rid == worker]
    assert len(told) == 1 and isinstance(told[0], DisconnectError)
    assert h.broker.stats()["workers"] == 0


def test_lists_and_status_describe_live_state() -> None:
    h = harness()
    h.client(C1, client_id="alice")
    h.worker(W1, ("echo",), capacity=2)
    (_, job), *_ = dispatched(h.request(C1, b"r1"))
    h.advance(0.25)
    clients = answer(ask(h, "list_clients")).result
    assert clients == {
        "clients": [
            {
                "client_id": "alice",
                "routing_id": C1.hex(),
                "config_version": 3,
                "idle_s": 0.25,
                "requests": 1,
                "promise_ms": 0,
            }
        ]
    }
    workers = answer(ask(h, "list_workers")).result
    assert isinstance(workers, dict)
    (worker,) = workers["workers"]
    assert worker["services"] == ["echo"] and worker["capacity"] == 2
    assert worker["in_flight"] == 1
    services = answer(ask(h, "list_services")).result
    assert isinstance(services, dict)
    (echo,) = services["services"]
    assert (echo["workers"], echo["ready"], echo["busy"], echo["queued"]) == (1, 1, 1, 0)
    h.reply(W1, job.ticket)
    status = answer(ask(h, "status")).result
    assert isinstance(status, dict)
    assert (status["requests"], status["replies"], status["replies_by_status"]) == (
        1,
        1,
        {"200": 1},
    )
    assert status["latency_count"] == 1 and status["latency_sum_s"] == pytest.approx(0.25)
    (echo,) = status["services"]
    assert echo["replies"] == {"200": 1} and echo["latency_p50_s"] == 0.25


def test_status_history_samples_every_five_seconds() -> None:
    h = harness()
    for _ in range(12):
        h.advance(1.0)
    status = answer(ask(h, "status")).result
    assert isinstance(status, dict)
    history = status["history"]
    assert isinstance(history, list) and len(history) == 3
    assert {"time", "requests", "replies", "errors", "latency_sum_s", "clients"} <= set(history[0])


def test_get_config_never_shows_password_hashes() -> None:
    result = answer(ask(harness(), "get_config", auth_id="eve")).result
    assert isinstance(result, dict)
    config = result["config"]
    assert isinstance(config, dict)
    assert [a["password_hash"] for a in config["admins"]] == [REDACTED, REDACTED]
    assert "scrypt$" not in repr(result)
    assert (result["config_version"], result["family"]) == (3, "test")


# ---- M6: family-wide ---------------------------------------------------------------------------


def family_harness() -> Harness:
    brokers = (_entry("b0", 7100), NETWORK.brokers[0], _entry("b2", 7200))
    return harness(brokers=brokers)


def test_family_request_asks_every_other_broker_with_the_same_credentials() -> None:
    h = family_harness()
    fan = fanned(ask(h, "list_services", args={"family": True, "timeout_ms": 700}))
    assert fan.targets == (("b0", "tcp://127.0.0.1:7100"), ("b2", "tcp://127.0.0.1:7200"))
    assert fan.timeout_s == 0.7
    assert fan.request == ManagementRequest("root", "root-pw", "list_services", "m1", {})


def test_family_answer_names_the_brokers_that_did_not_answer() -> None:
    h = family_harness()
    fan = fanned(ask(h, "status", args={"family": True}))
    done = FanOutDone(
        fan.token,
        (
            FamilyAnswer("b0", ManagementReply("m1", 200, {"state": "active"})),
            FamilyAnswer("b2", None),
        ),
    )
    reply = answer(h.broker.handle(done, h.now, h.wall))
    assert reply.code == 200 and reply.request_id == "m1"
    result = reply.result
    assert isinstance(result, dict)
    assert [b["broker"] for b in result["brokers"]] == ["b0", "b1", "b2"]
    assert [b["code"] for b in result["brokers"]] == [200, 200, None]
    assert result["not_answering"] == ["b2"] and result["complete"] is False
    assert result["brokers"][1]["result"]["broker"] == "b1"
    # A FanOutDone for a token nobody waits for is ignored.
    assert h.broker.handle(done, h.now, h.wall) == []


def test_family_answer_lists_refusals_as_failed() -> None:
    h = family_harness()
    fan = fanned(ask(h, "list_clients", args={"family": True}))
    done = FanOutDone(
        fan.token,
        (
            FamilyAnswer("b0", ManagementReply("m1", 503, {"state": "disabled"}, "disabled")),
            FamilyAnswer("b2", ManagementReply("m1", 200, {"clients": []})),
        ),
    )
    result = answer(h.broker.handle(done, h.now, h.wall)).result
    assert isinstance(result, dict)
    assert (result["failed"], result["not_answering"], result["complete"]) == (["b0"], [], False)


def test_family_of_one_answers_at_once() -> None:
    result = answer(ask(harness(), "status", args={"family": True})).result
    assert isinstance(result, dict)
    assert result["complete"] is True and [b["broker"] for b in result["brokers"]] == ["b1"]


# ---- the HTTP route: ManagementSubmit ----------------------------------------------------------

HTTP = Channel.HTTP
ADDRESS = b"\x00addr:127.0.0.1"


def test_http_login_goes_through_the_same_check_and_ban_keyed_by_address() -> None:
    h = harness(error_threshold=1)
    request = ManagementRequest("root", "bad", "whoami", "login")
    for n, rid in enumerate((b"\x00r1", b"\x00r2")):
        check = only(
            h.broker.handle(ManagementSubmit(HTTP, rid, ADDRESS, request, False), h.now, h.wall)
        )
        assert isinstance(check, Authenticate) and check.sender == ADDRESS
        call = ManagementCall(HTTP, rid, ADDRESS, request, False)
        effects = h.broker.handle(call, h.now, h.wall)
        effect = only([e for e in effects if isinstance(e, Send)])
        assert effect.routing_id == rid and effect.channel is HTTP
        assert effect.message.code == (401 if n == 0 else 429)
    assert h.broker.is_banned(ADDRESS, h.now)


def test_http_session_call_skips_the_check_but_not_role_or_state() -> None:
    h = harness()
    request = ManagementRequest("eve", "eve-pw", "disable", "x")
    effect = only(
        h.broker.handle(ManagementSubmit(HTTP, b"\x00r", ADDRESS, request, True), h.now, h.wall)
    )
    assert isinstance(effect, Send) and isinstance(effect.message, ManagementReply)
    assert effect.message.code == 403


def test_outcome_defaults() -> None:
    assert Outcome(200) == Outcome(200, None, None)


# ---- M6: one other broker ----------------------------------------------------------------------


def test_disable_with_broker_forwards_to_that_broker_and_returns_its_answer() -> None:
    h = family_harness()
    fan = fanned(ask(h, "disable", args={"broker": "b2"}))
    assert fan.targets == (("b2", "tcp://127.0.0.1:7200"),)
    assert fan.request.args == {} and fan.request.command == "disable"
    assert h.broker.state == "active"  # this broker is not the one disabled
    theirs = ManagementReply("m1", 200, {"broker": "b2", "state": "disabled", "changed": True})
    reply = answer(
        h.broker.handle(FanOutDone(fan.token, (FamilyAnswer("b2", theirs),)), h.now, h.wall)
    )
    assert (reply.code, reply.result) == (200, theirs.result)


def test_forward_to_a_silent_broker_is_504_and_to_an_unknown_one_400() -> None:
    h = family_harness()
    fan = fanned(ask(h, "enable", args={"broker": "b0"}))
    reply = answer(
        h.broker.handle(FanOutDone(fan.token, (FamilyAnswer("b0", None),)), h.now, h.wall)
    )
    assert reply.code == 504 and "b0" in (reply.message or "")
    reply = answer(ask(h, "enable", args={"broker": "nope"}))
    assert reply.code == 400 and "no broker 'nope'" in (reply.message or "")


def test_disable_naming_this_broker_runs_here() -> None:
    h = family_harness()
    assert answer(ask(h, "disable", args={"broker": "b1"})).code == 200
    assert h.broker.state == "disabled"


def test_read_user_cannot_forward_a_change_either() -> None:
    h = family_harness()
    assert answer(ask(h, "disable", auth_id="eve", args={"broker": "b2"})).code == 403


# ---- docs ---------------------------------------------------------------------------------------


def test_protocol_md_lists_every_command_with_its_role_and_args() -> None:
    """docs/protocol.md §7.1.1 is normative: one row per command of the table, and no more."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    section = text.split("### 7.1.1 Commands", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = (cells[1], set(re.findall(r"`(\w+)`", cells[2])))
    assert rows == {
        name: (command.role, set(command.accepted())) for name, command in COMMANDS.items()
    }
