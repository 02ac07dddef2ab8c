"""The two state machines of scale0/core/states.py, held to a real Broker for every (state, input).

As h2 does for its connection state machine: each table has an entry for every pair, and a real
broker, driven by the events that mean each input (Hypothesis picks the paths, so every pair is
met from states reached in many ways), ends where the table says, and nowhere else.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.config.model import NetworkConfig
from scale0.core.broker import Broker
from scale0.core.effects import (
    Channel,
    ConfigOffered,
    Drain,
    Effect,
    Log,
    Received,
    Start,
    Tick,
)
from scale0.core.states import (
    BROKER_TRANSITIONS,
    PEER_TRANSITIONS,
    BrokerInput,
    PeerInput,
    PeerLink,
)
from scale0.sim.fabric import KEY, family_config, offer_of, signed
from scale0.wire.client import Disconnect, DisconnectError
from scale0.wire.frames import SIG_BROKER
from scale0.wire.peer import BrokerState, ForwardReply, Hello, TableMode

NOW = 1000.0
WALL = 1_700_000_000.0


def test_every_pair_of_each_table_has_an_entry() -> None:
    assert set(BROKER_TRANSITIONS) == set(itertools.product(BrokerState, BrokerInput))
    assert set(PEER_TRANSITIONS) == set(itertools.product(PeerLink, PeerInput))


# What docs/protocol.md (§5.2, §6.4) and docs/operations.md say, written out here apart from the
# tables, so that a change to a table fails a test until the documents are changed with it.
BROKER_SPEC = """
joining  join_active:active   join_disabled:disabled enable:refused disable:refused drain:joining
active   join_active:active   join_disabled:active   enable:active disable:disabled drain:disabled
disabled join_active:disabled join_disabled:disabled enable:active disable:disabled drain:disabled
"""
PEER_SPEC = """
down    heard:up     hello_answered:linked refused:down silent:down lost:down
up      heard:up     hello_answered:linked refused:up   silent:down lost:down
linked  heard:linked hello_answered:linked refused:up   silent:down lost:down
"""


def _spec(text: str) -> dict[tuple[str, str], str]:
    table = {}
    for line in text.strip().splitlines():
        state, *pairs = line.split()
        for pair in pairs:
            event, after = pair.split(":")
            table[state, event] = after
    return table


def test_the_broker_table_is_the_documented_one() -> None:
    table = {
        (s.value, i.value): "refused" if after is None else after.value
        for (s, i), after in BROKER_TRANSITIONS.items()
    }
    assert table == _spec(BROKER_SPEC)


def test_the_peer_table_is_the_documented_one() -> None:
    table = {(s.value, i.value): after.value for (s, i), after in PEER_TRANSITIONS.items()}
    assert table == _spec(PEER_SPEC)


# ---- the broker's state --------------------------------------------------------------------


class Life:
    """One broker and the inputs of the broker table, each driven the way the product does."""

    def __init__(self, start: BrokerState, wanted: BrokerState) -> None:
        self.version = 1
        self.now = NOW
        network = self.network(1)
        if start is BrokerState.JOINING:
            self.broker = Broker(
                "a",
                None,
                state=wanted,
                boot_id=b"A___",
                signature=None,
                now=NOW,
                trusted_keys=(KEY.public_key(),),
                family="fam",
            )
        else:
            self.broker = Broker(
                "a",
                network,
                state=start,
                boot_id=b"A___",
                signature=signed(network)[1],
                now=NOW,
                trusted_keys=(KEY.public_key(),),
                family="fam",
            )
        self.effects: list[Effect] = []

    @staticmethod
    def network(version: int) -> NetworkConfig:
        return family_config(("a", "b"), sources=("a",), version=version)

    def apply(self, change: BrokerInput) -> int:
        """Drive ``change``; returns the code management would answer (200 when not asked)."""
        broker = self.broker
        self.now += 0.01
        if change in (BrokerInput.JOIN_ACTIVE, BrokerInput.JOIN_DISABLED):
            self.version += 1
            offer = offer_of(self.network(self.version))
            self.effects = broker.handle(ConfigOffered(offer, "admin"), self.now, WALL)
            return 200
        if change is BrokerInput.DRAIN:
            self.effects = broker.handle(Drain(grace_ms=1000), self.now, WALL)
            return 200
        self.effects = []
        return broker.change_state(change, self.now, "test", self.effects).code

    def config_input(self) -> BrokerInput:
        """What a config applied means for this broker: the state its broker file wants
        (disabled once it is stopping)."""
        if self.broker.core.wanted is BrokerState.DISABLED:
            return BrokerInput.JOIN_DISABLED
        return BrokerInput.JOIN_ACTIVE


def expected(state: BrokerState, change: BrokerInput, draining: bool) -> BrokerState | None:
    if change is BrokerInput.ENABLE and draining:
        return None  # a stopping broker is not enabled again (R19)
    return BROKER_TRANSITIONS[state, change]


def check_step(life: Life, change: BrokerInput) -> None:
    broker = life.broker
    before, draining = broker.state, broker.draining
    want = expected(before, change, draining)
    code = life.apply(change)
    after = broker.state
    assert after is (before if want is None else want), (before, change, after)
    assert code == (503 if want is None else 200)
    changes = [e for e in life.effects if isinstance(e, Log) and e.event == "broker_state"]
    if after is before:
        assert changes == []
    else:
        assert [(c.fields["from"], c.fields["to"]) for c in changes] == [
            (before.value, after.value)
        ]
    assert broker.status(life.now, WALL)["state"] == after.value


@pytest.mark.parametrize(("state", "change"), sorted(BROKER_TRANSITIONS, key=str))
def test_each_broker_pair_from_a_fresh_broker(state: BrokerState, change: BrokerInput) -> None:
    wanted = BrokerState.DISABLED if change is BrokerInput.JOIN_DISABLED else BrokerState.ACTIVE
    life = Life(state, wanted)
    if change is BrokerInput.JOIN_ACTIVE and state is not BrokerState.JOINING:
        change = life.config_input()
    check_step(life, change)


STEPS = st.sampled_from(["config", "enable", "disable", "drain"])


@settings(max_examples=150, deadline=None)
@given(
    start=st.sampled_from(list(BrokerState)),
    wanted=st.sampled_from([BrokerState.ACTIVE, BrokerState.DISABLED]),
    steps=st.lists(STEPS, max_size=12),
)
def test_any_path_of_broker_inputs_follows_the_table(
    start: BrokerState, wanted: BrokerState, steps: list[str]
) -> None:
    life = Life(start, wanted)
    for step in steps:
        change = {
            "config": life.config_input(),
            "enable": BrokerInput.ENABLE,
            "disable": BrokerInput.DISABLE,
            "drain": BrokerInput.DRAIN,
        }[step]
        check_step(life, change)


# ---- a peer's link -------------------------------------------------------------------------


class PeerLife:
    """Broker "a" of family a, b; its view of peer "b" driven by what b's link says to it."""

    def __init__(self) -> None:
        network = family_config(("a", "b"), sources=("a",))
        self.broker = Broker(
            "a",
            network,
            state="active",
            boot_id=b"A___",
            signature=signed(network)[1],
            now=NOW,
            trusted_keys=(KEY.public_key(),),
            family="fam",
        )
        self.now, self.wall = NOW, WALL
        self.broker.handle(Start(), self.now, self.wall)

    @property
    def link(self) -> PeerLink:
        return self.broker.family.peers["b"].link

    def on_link(self, message: object) -> None:
        self.now += 0.01
        self.wall += 0.01
        event = Received(Channel.LINK, b"b", message)  # type: ignore[arg-type]
        self.broker.handle(event, self.now, self.wall)

    def silence(self) -> None:
        """Liveness x interval and one more round without a word from b (F3)."""
        network = self.broker.network
        limit = network.default_heartbeat_interval_ms / 1000 * (network.liveness + 2)
        for _ in range(int(limit * 10)):
            self.now += 0.1
            self.wall += 0.1
            self.broker.handle(Tick(), self.now, self.wall)


def drive(life: PeerLife, event: PeerInput) -> PeerLink:
    """Drive ``event``; returns the link state the table (and the documented guards) predict."""
    s = life.link
    heard = PEER_TRANSITIONS[s, PeerInput.HEARD]
    if event is PeerInput.HEARD:
        life.on_link(ForwardReply(b"no-such-ticket", 200, (b"x",)))  # any message counts (F3)
        return heard
    if event is PeerInput.HELLO_ANSWERED:
        hello = Hello("b", "fam", BrokerState.ACTIVE, 1, {}, TableMode.PULL)
        life.on_link(hello)
        return PEER_TRANSITIONS[heard, PeerInput.HELLO_ANSWERED]
    if event is PeerInput.REFUSED:
        life.on_link(DisconnectError(401, "not you", protocol=SIG_BROKER))
        return PEER_TRANSITIONS[s, PeerInput.REFUSED]
    if event is PeerInput.SILENT:
        life.silence()
        return PEER_TRANSITIONS[s, PeerInput.SILENT]
    # LOST: DISCONNECT on our link (F12), which counts only from a peer that answered our
    # HELLO; from any other it is ignored (F2: nothing counts before HELLO).
    life.on_link(Disconnect(protocol=SIG_BROKER))
    return PEER_TRANSITIONS[heard, PeerInput.LOST] if s is PeerLink.LINKED else s


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list(PeerInput)), max_size=10))
def test_any_path_of_peer_inputs_follows_the_table(events: list[PeerInput]) -> None:
    life = PeerLife()
    assert life.link is PeerLink.DOWN
    for event in events:
        want = drive(life, event)
        assert life.link is want, (event, want, life.link)
        peer = life.broker.family.peers["b"]
        assert peer.status == ("down" if want is PeerLink.DOWN else "up")
        assert peer.linked is (want is PeerLink.LINKED)


@pytest.mark.parametrize(("state", "event"), sorted(PEER_TRANSITIONS, key=str))
def test_each_peer_pair(state: PeerLink, event: PeerInput) -> None:
    life = PeerLife()
    reach = {
        PeerLink.DOWN: [],
        PeerLink.UP: [PeerInput.HEARD],
        PeerLink.LINKED: [PeerInput.HELLO_ANSWERED],
    }[state]
    for step in reach:
        drive(life, step)
    assert life.link is state
    want = drive(life, event)
    assert life.link is want
    direct = event in (PeerInput.REFUSED, PeerInput.SILENT)  # not "heard" first
    if direct or (event is PeerInput.LOST and state is PeerLink.LINKED):
        assert want is PEER_TRANSITIONS[state, event]
