"""The scale simulator: N pure broker cores on the in-memory fabric, with traffic and faults.

``tools/scale`` runs it for several N and prints one table (docs/scaling.md). Every broker gets
``workers`` workers (capacity 1, service ``s<i>``, heartbeating) and ``clients`` clients
(heartbeating, sending ``rate`` requests per second per broker, half to their own broker's
service, half to another broker's, so they are forwarded). Time is the fabric's fake clock:
nothing sleeps, and a run of N = 200 is bound by the CPU the cores spend.

What it measures (:class:`Result`): peer messages and bytes (``scale0.wire`` frames of each Send
on a link or the peer ROUTER) per simulated second in a steady window, by kind; the CPU the
cores spent (process time around each ``Broker.handle``) per simulated second; the memory of
the peer tables (the deep size of each broker's ``family.peers``, sampled); then, one after the
other, the faults: a new config published (and published with every publication lost, so
heartbeats carry it), a new worker's service reaching every broker's peer tables, a broker
killed (how long until every live broker logs ``peer_lost`` for it), a broker paused longer
than liveness and resumed, a link cut and healed. A ``peer_lost`` for a broker that is none of
these is a false suspicion.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scale0.config.model import NetworkConfig
from scale0.core.effects import (
    Channel,
    ConfigOffered,
    Effect,
    Event,
    Log,
    Publish,
    Received,
    Send,
)
from scale0.sim.fabric import Fabric, family_config, offer_of
from scale0.wire.client import ClientReply, ClientRequest, Heartbeat
from scale0.wire.configsync import PublishedConfig
from scale0.wire.frames import SIG_CLIENT, SIG_WORKER
from scale0.wire.worker import WorkerReply, WorkerRequest

__all__ = ["KINDS", "Options", "Result", "ScaleFabric", "run"]

#: Peer message kinds as the table reports them, by message class name.
KINDS: dict[str, str] = {
    "Hello": "heartbeat",
    "PeerHeartbeat": "heartbeat",
    "Table": "table",
    "TableReq": "table",
    "Forward": "forward",
    "ForwardPartial": "forward",
    "ForwardReply": "forward",
    "Ping": "gossip",
    "PingReq": "gossip",
    "Ack": "gossip",
}


@dataclass(frozen=True)
class Options:
    brokers: int = 10
    workers: int = 50  # per broker
    clients: int = 100  # per broker
    rate: float = 10.0  # requests per simulated second per broker
    warmup_s: float = 3.0
    measure_s: float = 5.0
    step_s: float = 0.05
    memory_sample: int = 5  # brokers whose peer tables are measured (deep size)
    seed: int = 1
    fault_limit_s: float = 15.0  # how long a fault phase waits for what it expects
    topology: str = "mesh"  # the network config's family_topology: mesh or gossip


@dataclass
class Result:
    """One run's figures; times are simulated seconds, rates per simulated second."""

    brokers: int
    workers: int
    clients: int
    topology: str = "mesh"
    sim_s: float = 0.0
    converged_s: float | None = None  # start: until every broker knows every service and
    # (gossip) has no row left to spread, so the window measures the steady state
    run_s: float = 0.0  # wall time of the whole run
    msgs: dict[str, float] = field(default_factory=dict)  # kind -> family msgs/s (window)
    bytes: dict[str, float] = field(default_factory=dict)  # kind -> family bytes/s (window)
    local_msgs: float = 0.0  # client and worker messages per second, both ways (window)
    cpu_s: float = 0.0  # core CPU per simulated second, whole family (window)
    table_bytes: float = 0.0  # peer tables' deep size per broker
    requests: int = 0  # requests answered in the window
    failed: int = 0  # of those, answered with another status than 200 (503, 504...)
    forwarded_to_worker_s: float = 0.0  # worst time a forwarded request took to a worker
    config_s: float | None = None  # new config: until every broker runs it (publication)
    config_lost_pub_s: float | None = None  # the same with every publication lost
    config_msgs: int = 0  # peer messages (all kinds) from publishing until every broker ran it
    config_bytes: int = 0  # their bytes (CONFIG documents, HELLO/HEARTBEAT bursts, CHECKCONFIG)
    config_cpu_s: float = 0.0  # core CPU the family spent meanwhile (judging, applying)
    phases_s: dict[str, float] = field(default_factory=dict)  # wall time of each phase
    table_s: float | None = None  # a new worker's service: until every peer table has it
    dead_s: float | None = None  # a killed broker: until every live broker logs peer_lost
    pause_down_s: float | None = None  # a paused broker: until every other logs peer_lost
    pause_up_s: float | None = None  # after resume: until every other logs peer_up
    queued_at_resume: int = 0  # events waiting for the paused broker when it resumed
    cut_down_s: float | None = None  # a cut link: until its two ends see each other down
    cut_up_s: float | None = None  # after the heal: until they see each other up
    false_suspicions: int = 0  # peer_lost for a broker that was not killed, paused or cut

    def per_broker(self, value: float) -> float:
        return value / self.brokers

    def row(self) -> dict[str, Any]:
        """The table's fields, by name (tools/scale prints them, docs/scaling.md explains them)."""
        n = self.brokers
        return {
            "N": n,
            "topology": self.topology,
            "peer msg/s/broker": sum(self.msgs.values()) / n,
            "peer B/s/broker": sum(self.bytes.values()) / n,
            "gossip msg/s/broker": self.msgs.get("gossip", 0.0) / n,
            "gossip B/s/broker": self.bytes.get("gossip", 0.0) / n,
            "hb msg/s/broker": self.msgs.get("heartbeat", 0.0) / n,
            "hb B/s/broker": self.bytes.get("heartbeat", 0.0) / n,
            "table msg/s/broker": self.msgs.get("table", 0.0) / n,
            "table B/s/broker": self.bytes.get("table", 0.0) / n,
            "peer B/s family": sum(self.bytes.values()),
            "cpu ms/s/broker": 1000 * self.cpu_s / n,
            "cpu s/s family": self.cpu_s,
            "tables KiB/broker": self.table_bytes / 1024,
            "config s": self.config_s,
            "config lost-pub s": self.config_lost_pub_s,
            "config msgs family": self.config_msgs,
            "config KiB family": self.config_bytes / 1024,
            "config cpu s family": self.config_cpu_s,
            "start s": self.converged_s,
            "new table s": self.table_s,
            "dead seen s": self.dead_s,
            "pause down/up s": (self.pause_down_s, self.pause_up_s),
            "cut down/up s": (self.cut_down_s, self.cut_up_s),
            "false susp.": self.false_suspicions,
            "requests": self.requests,
            "failed": self.failed,
            "fwd to worker s": self.forwarded_to_worker_s,
            "run s": self.run_s,
        }


def name_of(i: int) -> str:
    return f"b{i:03d}"


class ScaleFabric(Fabric):
    """The fabric, metered: peer messages and bytes by kind, core CPU, peer_lost/peer_up logs."""

    def __init__(self, network: NetworkConfig) -> None:
        super().__init__(network, keep_effects=False)
        n = len(network.brokers)
        self.settle_limit = max(self.settle_limit, 20 * n * n)  # a full mesh says HELLO n² times
        self.msgs: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.local = 0
        self.cpu = 0.0
        # (time, broker that logged, the peer it names): who saw whom go and come back.
        self.lost: list[tuple[float, str, str]] = []
        self.up: list[tuple[float, str, str]] = []
        self.on_effects: list[Callable[[str, list[Effect]], None]] = []

    def _handle(self, name: str, event: Event) -> list[Effect]:
        start = time.process_time()
        out = self.brokers[name].handle(event, self.now, self.wall)
        self.cpu += time.process_time() - start
        return out

    def _perform(self, name: str, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                if effect.channel is Channel.LINK or effect.channel is Channel.PEER:
                    kind = KINDS.get(type(effect.message).__name__, "config")
                    self.msgs[kind] += 1
                    self.bytes[kind] += len(effect.routing_id) + sum(
                        map(len, effect.message.to_frames())
                    )
                else:
                    self.local += 1
            elif isinstance(effect, Publish):
                self.msgs["config"] += 1
                self.bytes["config"] += len(effect.config.document)
            elif isinstance(effect, Log) and effect.event in ("peer_lost", "peer_up"):
                peer = str(effect.fields.get("peer"))
                record = self.lost if effect.event == "peer_lost" else self.up
                record.append((self.now, name, peer))
        for hook in self.on_effects:
            hook(name, effects)
        super()._perform(name, effects)


def deep_size(root: object) -> int:
    """Bytes of ``root`` and everything it holds (each object once)."""
    seen: set[int] = set()
    total = 0
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    return total


class Simulation:
    """One family of ``options.brokers`` brokers with its workers, clients and traffic."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(options.seed)  # noqa: S311 (traffic, not secrets)
        n = options.brokers
        self.names = tuple(name_of(i) for i in range(n))
        topology: dict[str, Any] = {}
        if options.topology == "gossip":
            topology["family_topology"] = "gossip"
        self.network = family_config(self.names, sources=self.names[:2], version=1, **topology)
        self.fabric = ScaleFabric(self.network)
        self.clients: dict[str, list[bytes]] = {}
        self.entered: dict[bytes, float] = {}  # request tag -> when it entered its broker
        self.entry_broker: dict[bytes, str] = {}
        self.answered = 0
        self.failed: Counter[int] = Counter()  # replies other than 200, by status
        self.to_worker_max = 0.0
        self._tag = 0
        self._credit = 0.0
        self._step = 0
        self.config_cost: tuple[int, int, float] = (0, 0, 0.0)
        self.excused: set[str] = set()  # brokers whose peer_lost is expected (faults)
        self.fabric.on_effects.append(self._watch)

    # ---- set up -------------------------------------------------------------------------------

    def start(self) -> None:
        fabric, options = self.fabric, self.options
        fabric.start()
        for i, name in enumerate(self.names):
            for w in range(options.workers):
                fabric.worker(name, b"w%d" % w, (f"s{i}",))
            self.clients[name] = [b"c%d" % c for c in range(options.clients)]
            for rid in self.clients[name]:
                fabric.client(name, rid)

    def _watch(self, name: str, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send) and isinstance(effect.message, WorkerRequest):
                tag = effect.message.body[0] if effect.message.body else b""
                entered = self.entered.get(tag)
                if entered is not None and self.entry_broker.get(tag) != name:
                    self.to_worker_max = max(self.to_worker_max, self.fabric.now - entered)

    # ---- one step of simulated time -----------------------------------------------------------

    def step(self) -> None:
        """Clients heartbeat and send requests, workers answer, time moves one step."""
        fabric, options = self.fabric, self.options
        step_s = options.step_s
        per_interval = max(1, round(1.0 / step_s))  # steps per heartbeat interval (1 s)
        slot = self._step % per_interval
        live = [n for n in self.names if n not in fabric.down]
        for name in live:
            version = fabric.brokers[name].network.config_version
            for k, rid in enumerate(self.clients[name]):
                if k % per_interval == slot:
                    beat = Heartbeat(time=fabric.wall, config_version=version, protocol=SIG_CLIENT)
                    fabric.feed(name, Received(Channel.FRONTEND, rid, beat))
            for w in range(slot, options.workers, per_interval):
                beat = Heartbeat(time=fabric.wall, config_version=version, protocol=SIG_WORKER)
                fabric.feed(name, Received(Channel.BACKEND, b"w%d" % w, beat))
        self._credit += options.rate * step_s * len(live)
        while self._credit >= 1.0 and live and options.clients:
            self._credit -= 1.0
            origin = self.rng.choice(live)
            target = origin
            if self.rng.random() < 0.5 and len(self.names) > 1:
                target = self.rng.choice(self.names)
            service = f"s{self.names.index(target)}"
            self._tag += 1
            tag = b"r%d" % self._tag
            self.entered[tag] = fabric.now
            self.entry_broker[tag] = origin
            rid = self.rng.choice(self.clients[origin])
            request = ClientRequest(service=service, request_id=tag, body=(tag,))
            fabric.feed(origin, Received(Channel.FRONTEND, rid, request))
        fabric.settle()
        # Workers answer everything they were given, including what a freed worker is given
        # next (bounded: each round answers at least one request or ends the loop).
        for _ in range(1 + options.workers * len(live)):
            served = 0
            for name in live:
                for rid, message in fabric.take(name, WorkerRequest):
                    reply = WorkerReply(ticket=message.ticket, status=200, body=(b"done",))
                    fabric.feed(name, Received(Channel.BACKEND, rid, reply))
                    served += 1
            if not served:
                break
            fabric.settle()
        for name in live:
            for _, reply in fabric.take(name, ClientReply, Channel.FRONTEND):
                self.answered += 1
                if reply.status != 200:
                    self.failed[reply.status] += 1
                self.entered.pop(reply.request_id, None)
                self.entry_broker.pop(reply.request_id, None)
            # Heartbeats, acks: nothing the clients act on here. What the next tick dispatches
            # to a worker stays for the next step's answers.
            fabric.outbox[name] = [
                s for s in fabric.outbox[name] if isinstance(s.message, WorkerRequest)
            ]
        fabric.advance(step_s, step_s)
        self._step += 1

    def run_for(self, seconds: float, until: Callable[[], bool] | None = None) -> float | None:
        """Step for ``seconds``, or until ``until()`` holds: returns when it did (else None)."""
        start = self.fabric.now
        steps = max(1, round(seconds / self.options.step_s))
        for _ in range(steps):
            if until is not None and until():
                return self.fabric.now - start
            self.step()
        if until is not None and until():
            return self.fabric.now - start
        return None

    # ---- faults -------------------------------------------------------------------------------

    def live(self) -> list[str]:
        return [n for n in self.names if n not in self.fabric.down]

    def seen(self, log: list[tuple[float, str, str]], peer: str, since: float) -> set[str]:
        return {who for at, who, about in log if about == peer and at >= since}

    def publish(self, version: int, *, lose_publications: bool) -> float | None:
        """An admin offers config ``version`` to the first source; until every broker runs it.
        ``self.config_cost`` is what the family said meanwhile (messages, bytes)."""
        fabric = self.fabric
        msgs0, bytes0, cpu0 = fabric.msgs.total(), fabric.bytes.total(), fabric.cpu
        network = dataclasses.replace(self.fabric.network, config_version=version)

        def rule(src: str, dst: str, message: object) -> bool:
            return isinstance(message, PublishedConfig)  # what the config PUB carries

        if lose_publications:
            fabric.drops.append(rule)
        fabric.feed(self.names[0], ConfigOffered(offer_of(network), "admin"))
        fabric.settle()
        took = self.run_for(
            self.options.fault_limit_s,
            lambda: all(fabric.brokers[n].network.config_version >= version for n in self.live()),
        )
        if lose_publications:
            fabric.drops.remove(rule)
        self.config_cost = (
            fabric.msgs.total() - msgs0,
            fabric.bytes.total() - bytes0,
            fabric.cpu - cpu0,
        )
        return took

    def new_service(self) -> float | None:
        fabric = self.fabric
        origin = self.names[-1]
        fabric.worker(origin, b"fresh", ("fresh",))
        others = [n for n in self.live() if n != origin]
        return self.run_for(
            self.options.fault_limit_s,
            lambda: all("fresh" in fabric.brokers[n].family.peers[origin].table for n in others),
        )

    def kill(self, victim: str) -> float | None:
        fabric = self.fabric
        since = fabric.now
        self.excused.add(victim)
        fabric.kill(victim)
        return self.run_for(
            self.options.fault_limit_s,
            lambda: self.seen(fabric.lost, victim, since) >= set(self.live()),
        )

    def pause(self, victim: str) -> tuple[float | None, float | None, int]:
        fabric = self.fabric
        limit = self.network.liveness * self.network.default_heartbeat_interval_ms / 1000
        since = fabric.now
        self.excused.add(victim)
        fabric.pause(victim)
        others = set(self.live()) - {victim}
        down = self.run_for(
            self.options.fault_limit_s, lambda: self.seen(fabric.lost, victim, since) >= others
        )
        self.run_for(max(0.0, limit + 1.0 - (fabric.now - since)))
        queued = len(fabric.paused.get(victim, ()))
        resumed = fabric.now
        fabric.resume(victim)
        up = self.run_for(
            self.options.fault_limit_s, lambda: self.seen(fabric.up, victim, resumed) >= others
        )
        return down, up, queued

    def cut(self, a: str, b: str) -> tuple[float | None, float | None]:
        fabric = self.fabric
        ends = {a, b}

        def rule(src: str, dst: str, message: object) -> bool:
            return {src, dst} == ends

        since = fabric.now
        self.excused.update(ends)
        fabric.drops.append(rule)
        # Gossip: the two ends reach each other through others (PINGREQ, G4), so neither is
        # expected to see the other down; wait one suspicion timeout and more, not the limit.
        limit = self.options.fault_limit_s
        if self.options.topology == "gossip":
            limit = min(limit, 2 * fabric.brokers[a].family.gossip.suspicion_s() + 2.0)
        down = self.run_for(
            limit,
            lambda: a in self.seen(fabric.lost, b, since) and b in self.seen(fabric.lost, a, since),
        )
        healed = fabric.now
        fabric.drops.remove(rule)
        if down is None:
            self.run_for(1.0)
            return None, None
        up = self.run_for(
            self.options.fault_limit_s,
            lambda: a in self.seen(fabric.up, b, healed) and b in self.seen(fabric.up, a, healed),
        )
        return down, up

    def converged(self) -> bool:
        """Every broker's peer tables show every other broker's service (s<i>), and no broker
        has a gossip row left to send (G8: the start-up spread is over)."""
        brokers = self.fabric.brokers
        if any(b.family.gossip.rows for b in brokers.values()):
            return False
        return all(
            f"s{i}" in brokers[other].family.peers[name].table
            for i, name in enumerate(self.names)
            for other in self.names
            if other != name
        )

    def false_suspicions(self) -> int:
        return sum(1 for _, _, peer in self.fabric.lost if peer not in self.excused)


def table_bytes(sim: Simulation, sample: int) -> float:
    names = sim.live()[: max(1, sample)]
    sizes = [deep_size(sim.fabric.brokers[n].family.peers) for n in names]
    return sum(sizes) / len(sizes)


def run(options: Options, progress: Callable[[str], None] | None = None) -> Result:
    """One simulated family from start to the last fault; see the module's docstring."""
    began = time.perf_counter()
    say_text = progress or (lambda text: None)

    phase: list[tuple[str, float]] = [("setup", began)]

    def say(text: str) -> None:
        at = time.perf_counter()
        name, start = phase[-1]
        result.phases_s[name] = at - start
        phase.append((text.split(": ", 1)[-1], at))
        say_text(f"{text} (at {at - began:.1f} s wall)")

    sim = Simulation(options)
    fabric = sim.fabric
    n = options.brokers
    result = Result(n, options.workers, options.clients, options.topology)
    say(f"{options.topology} N={n}: start")
    sim.start()
    result.converged_s = sim.run_for(4 * options.fault_limit_s, sim.converged)
    sim.run_for(options.warmup_s)
    say(f"{options.topology} N={n}: measure {options.measure_s:g} s")
    msgs0, bytes0 = Counter(fabric.msgs), Counter(fabric.bytes)
    local0, cpu0 = fabric.local, fabric.cpu
    answered0, failed0 = sim.answered, sim.failed.total()
    sim.to_worker_max = 0.0
    sim.run_for(options.measure_s)
    seconds = options.measure_s
    result.msgs = {k: (fabric.msgs[k] - msgs0[k]) / seconds for k in fabric.msgs}
    result.bytes = {k: (fabric.bytes[k] - bytes0[k]) / seconds for k in fabric.bytes}
    result.local_msgs = (fabric.local - local0) / seconds
    result.cpu_s = (fabric.cpu - cpu0) / seconds
    result.requests = sim.answered - answered0
    result.failed = sim.failed.total() - failed0
    result.table_bytes = table_bytes(sim, options.memory_sample)
    result.forwarded_to_worker_s = sim.to_worker_max
    say(f"{options.topology} N={n}: config published")
    result.config_s = sim.publish(2, lose_publications=False)
    result.config_msgs, result.config_bytes, result.config_cpu_s = sim.config_cost
    say(f"{options.topology} N={n}: config published, publications lost")
    result.config_lost_pub_s = sim.publish(3, lose_publications=True)
    say(f"{options.topology} N={n}: a new worker's service")
    result.table_s = sim.new_service()
    say(f"{options.topology} N={n}: a broker killed")
    result.dead_s = sim.kill(sim.names[1 % n])
    if n >= 4:
        say(f"{options.topology} N={n}: a broker paused")
        result.pause_down_s, result.pause_up_s, result.queued_at_resume = sim.pause(sim.names[2])
        say(f"{options.topology} N={n}: a link cut")
        result.cut_down_s, result.cut_up_s = sim.cut(sim.names[3], sim.names[0])
    result.false_suspicions = sim.false_suspicions()
    say(f"{options.topology} N={n}: done")
    result.sim_s = fabric.now - 1000.0
    result.run_s = time.perf_counter() - began
    return result
