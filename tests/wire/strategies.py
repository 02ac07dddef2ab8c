"""Hypothesis strategies producing valid S0P/1 and Majordomo messages, one per message class."""

from __future__ import annotations

from hypothesis import strategies as st

from scale0.wire import mdp
from scale0.wire.admin import ManagementReply, ManagementRequest
from scale0.wire.client import (
    CheckConfig,
    ClientPartial,
    ClientReply,
    ClientRequest,
    Config,
    ConfigAck,
    Disconnect,
    DisconnectError,
    ForceNegotiate,
    Heartbeat,
)
from scale0.wire.configsync import PublishedConfig
from scale0.wire.frames import (
    INT64_MAX,
    SIG_BROKER,
    SIG_CLIENT,
    SIG_WORKER,
    ConfigType,
    JsonValue,
    Message,
    is_reserved_service,
    name_problem,
)
from scale0.wire.gossip import Ack, MemberRow, MemberStatus, Ping, PingReq
from scale0.wire.peer import (
    BrokerState,
    Forward,
    ForwardPartial,
    ForwardReply,
    Hello,
    PeerHeartbeat,
    Table,
    TableMode,
    TableReq,
    TableService,
    TableWorker,
)
from scale0.wire.worker import Ready, WorkerIdRequest, WorkerPartial, WorkerReply, WorkerRequest

# Printable characters (letters, marks, numbers, punctuation, symbols) plus the ASCII space.
_name_chars = st.characters(categories=["L", "M", "N", "P", "S"]) | st.just(" ")
names = st.text(_name_chars, min_size=1, max_size=24).filter(lambda s: name_problem(s) is None)
services = names.filter(lambda s: not is_reserved_service(s))
ids = st.binary(min_size=1, max_size=255)
bodies = st.lists(st.binary(max_size=64), max_size=4).map(tuple)
statuses = st.integers(100, 599)
versions = st.integers(1, INT64_MAX)
versions0 = st.integers(0, INT64_MAX)
times = st.floats(min_value=0.0, max_value=1e10, allow_nan=False, allow_infinity=False)
intervals = st.integers(1, 2**31 - 1)
texts = st.text(max_size=40)  # any text without lone surrogates
hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)
signatures = st.binary(min_size=64, max_size=64).map(bytes.hex)
families = names.filter(lambda s: "|" not in s)
config_types = st.sampled_from(ConfigType)

json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)

client_or_worker = st.sampled_from([SIG_CLIENT, SIG_WORKER])
any_s0 = st.sampled_from([SIG_CLIENT, SIG_WORKER, SIG_BROKER])


def _disconnect_errors() -> st.SearchStrategy[DisconnectError]:
    @st.composite
    def build(draw: st.DrawFn) -> DisconnectError:
        code = draw(statuses)
        endpoint = draw(names) if code == 301 else draw(st.none() | names)
        return DisconnectError(code, draw(texts), endpoint, protocol=draw(any_s0))

    return build()


member_rows = st.lists(
    st.builds(
        MemberRow,
        names,
        st.sampled_from(MemberStatus),
        versions0,
        st.sampled_from(BrokerState),
        versions0,
        st.dictionaries(services, st.integers(0, 10_000), max_size=3).map(
            lambda d: tuple(d.items())
        ),
    ),
    max_size=4,
).map(tuple)
table_services = st.lists(
    st.builds(
        TableService,
        services,
        st.lists(st.builds(TableWorker, names, st.integers(0, 1000), times), max_size=3).map(tuple),
    ),
    max_size=4,
    unique_by=lambda row: row.service,
).map(tuple)

MESSAGES: dict[type[Message], st.SearchStrategy[Message]] = {
    # shared control commands
    CheckConfig: st.builds(
        CheckConfig,
        config_types,
        st.none() | versions0,
        st.none() | names,
        st.booleans(),
        protocol=any_s0,
    ),
    ConfigAck: st.builds(ConfigAck, versions, names, protocol=any_s0),
    Config: st.builds(
        Config,
        config_types,
        versions,
        hex64,
        names,
        st.binary(max_size=200),
        st.none() | signatures,
        st.none() | signatures,
        st.none() | hex64,
        protocol=any_s0,
    ),
    Heartbeat: st.builds(
        Heartbeat, times, versions0, st.none() | intervals, protocol=client_or_worker
    ),
    Disconnect: st.builds(Disconnect, protocol=any_s0),
    ForceNegotiate: st.builds(ForceNegotiate, texts, protocol=client_or_worker),
    DisconnectError: _disconnect_errors(),
    # client
    ClientRequest: st.builds(ClientRequest, services, ids, bodies),
    ClientPartial: st.builds(ClientPartial, services, ids, bodies),
    ClientReply: st.builds(ClientReply, services, ids, statuses, bodies),
    ManagementRequest: st.builds(
        ManagementRequest,
        names,
        texts,
        st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
        names,
        json_objects,
    ),
    ManagementReply: st.builds(ManagementReply, names, statuses, json_values, st.none() | texts),
    # worker
    Ready: st.builds(
        Ready,
        st.lists(services, max_size=5, unique=True).map(tuple),
        st.booleans(),
        intervals,
        times,
        versions0,
        st.integers(1, 65535),
        st.booleans(),
    ),
    WorkerRequest: st.builds(WorkerRequest, ids, services, bodies),
    WorkerIdRequest: st.builds(
        WorkerIdRequest, ids, services, st.text(max_size=40), st.binary(max_size=64), bodies
    ),
    WorkerPartial: st.builds(WorkerPartial, ids, bodies),
    WorkerReply: st.builds(WorkerReply, ids, statuses, bodies),
    # peer
    Hello: st.builds(
        Hello,
        names,
        families,
        st.sampled_from(BrokerState),
        versions0,
        st.dictionaries(names, names, max_size=4),
        st.sampled_from(TableMode),
        st.frozensets(st.from_regex(r"[A-Z]{1,32}", fullmatch=True), max_size=4),
    ),
    PeerHeartbeat: st.builds(
        PeerHeartbeat, names, times, st.sampled_from(BrokerState), versions0, versions0
    ),
    Table: st.builds(
        Table,
        names,
        versions0,
        st.booleans(),
        table_services,
        # F16's slots: absent (an older sender), or a count per service, negative allowed.
        st.none()
        | st.dictionaries(services, st.integers(-(1 << 31), 1 << 31), max_size=3).map(
            lambda d: tuple(d.items())
        ),
    ),
    TableReq: st.builds(TableReq, names, st.none() | versions0),
    Forward: st.builds(Forward, ids, services, names, bodies)
    | st.builds(  # FORWARDWITH (§5.4): ids both or neither, a deadline, maybe a caller
        lambda head, who, deadline_ms, caller: Forward(
            *head,
            caller=caller,
            client_id=who[0] if who else "",
            request_id=who[1] if who else b"",
            deadline_ms=deadline_ms,
        ),
        st.tuples(ids, services, names, bodies),
        st.none() | st.tuples(names, ids),
        st.integers(0, 2**40),
        st.just("") | st.just("rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"),
    ),
    ForwardPartial: st.builds(ForwardPartial, ids, bodies),
    ForwardReply: st.builds(ForwardReply, ids, statuses, bodies),
    # gossip (§5.6)
    Ping: st.builds(Ping, names, versions0, names, times, member_rows),
    PingReq: st.builds(PingReq, names, versions0, names, times, member_rows),
    Ack: st.builds(Ack, names, versions0, names, times, member_rows),
    # Majordomo
    mdp.MdpClientRequest: st.builds(
        mdp.MdpClientRequest, services, bodies, protocol=st.sampled_from([mdp.MDPC01, mdp.MDPC02])
    ),
    mdp.MdpClientReply: st.builds(
        mdp.MdpClientReply, services, bodies, protocol=st.sampled_from([mdp.MDPC01, mdp.MDPC02])
    ),
    mdp.MdpClientPartial: st.builds(mdp.MdpClientPartial, services, bodies),
    mdp.MdpWorkerReady: st.builds(
        mdp.MdpWorkerReady, services, protocol=st.sampled_from([mdp.MDPW01, mdp.MDPW02])
    ),
    mdp.MdpWorkerRequest: st.builds(
        mdp.MdpWorkerRequest, ids, bodies, protocol=st.sampled_from([mdp.MDPW01, mdp.MDPW02])
    ),
    mdp.MdpWorkerPartial: st.builds(mdp.MdpWorkerPartial, ids, bodies),
    mdp.MdpWorkerReply: st.builds(
        mdp.MdpWorkerReply, ids, bodies, protocol=st.sampled_from([mdp.MDPW01, mdp.MDPW02])
    ),
    mdp.MdpWorkerHeartbeat: st.builds(
        mdp.MdpWorkerHeartbeat, protocol=st.sampled_from([mdp.MDPW01, mdp.MDPW02])
    ),
    mdp.MdpWorkerDisconnect: st.builds(
        mdp.MdpWorkerDisconnect, protocol=st.sampled_from([mdp.MDPW01, mdp.MDPW02])
    ),
}

published_configs = st.builds(
    PublishedConfig,
    families,
    versions,
    config_types,
    hex64,
    names,
    signatures,
    st.binary(max_size=200),
    st.none() | signatures,
)

any_message: st.SearchStrategy[Message] = st.one_of(list(MESSAGES.values()))
