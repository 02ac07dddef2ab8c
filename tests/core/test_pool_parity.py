"""The worker pool in C (scale0.core._pool.Pool) against the Python one (WorkerPool).

Issue 14's phase 2 holds the C structures of the lane to the Python ones they replace by a
state machine: the same random operations go to both, every answer and the whole observable
state must be equal after every step. The Python side goes through ``PyPool``, a tiny adapter
that gives WorkerPool the C type's operation names, with ``Worker`` records made and used as
``scale0.core.ledger.Ledger`` makes and uses them (``enroll``, ``dispatched``, ``release``).

The extension is optional (setup.py): without a C compiler it is not built and these tests
skip, saying so; ``tools/test-fallback`` runs the suite that way. Where gcc is there, the build
test compiles the source afresh with -Werror and imports that build.

Memory errors pass these tests quietly in a plain build. To check the C side for them, build it
with AddressSanitizer and UndefinedBehaviorSanitizer and run this module on that build (pytest
captures fd 2, so ASan's report goes to its log_path; exit status 1 and no summary mean read
the log):

    inc=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    mkdir -p /tmp/asan-pool && gcc -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
      -shared -fPIC -I"$inc" -o /tmp/asan-pool/_pool.so scale0/core/_pool.c
    SCALE0_POOL_SO=/tmp/asan-pool/_pool.so ASAN_OPTIONS=detect_leaks=0:log_path=/tmp/asan-pool/log \
      LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
      .venv/bin/python -m pytest -p no:cacheprovider tests/core/test_pool_parity.py
"""

from __future__ import annotations

import contextlib
import gc
import importlib.machinery
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from scale0.core.workers import Worker, WorkerPool
from tests.extensions import load_extension

SOURCE = Path(__file__).resolve().parents[2] / "scale0" / "core" / "_pool.c"
C_BUILT = importlib.util.find_spec("scale0.core._pool") is not None
STRICT_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
NOT_BUILT = "scale0.core._pool was not built here (no C compiler at install; setup.py: optional)"

# Few of each, so that workers share services, READYs replace known workers, tickets collide.
RIDS = [b"\x00w0", b"w1", b""]
UNKNOWN_RID = b"\x00nobody"
NAMES = ["echo", "é", "", "\udc80x"]  # "" and a lone surrogate: any str WorkerPool keys by
UNKNOWN_NAME = "nothing"
TICKETS = [b"t0", b"t1", b"\x00t2"]


@pytest.fixture(autouse=True)
def ledger_pool() -> str:
    """Once, not once per pool (tests/core/conftest.py): this drives Pool and WorkerPool
    directly, no ledger."""
    return "-"


def _load_so(path: str) -> None:
    """Put the build at ``path`` in sys.modules as scale0.core._pool (SCALE0_POOL_SO)."""
    load_extension("scale0.core._pool", path)


if os.environ.get("SCALE0_POOL_SO"):  # a sanitizer build instead of the installed one
    _load_so(os.environ["SCALE0_POOL_SO"])
    C_BUILT = True


def c_pool() -> Any:
    if not C_BUILT:
        pytest.skip(NOT_BUILT)
    from scale0.core._pool import Pool

    return Pool()


class PyPool:
    """WorkerPool under Pool's operation names: routing ids in, routing ids and tickets out."""

    def __init__(self) -> None:
        self.pool = WorkerPool()

    def add(self, routing_id: bytes, services: tuple[str, ...], capacity: int) -> bool:
        replaced = routing_id in self.pool.workers
        worker = Worker(routing_id, services, capacity, heartbeat=False, interval_s=0.0)
        self.pool.add(worker)  # (Ledger.enroll)
        return replaced

    def remove(self, routing_id: bytes) -> list[bytes] | None:
        worker = self.pool.remove(routing_id)  # (Ledger.dismiss)
        return None if worker is None else sorted(worker.in_flight)

    def offers(self, service: str) -> bool:
        return self.pool.offers(service)

    def offered_count(self, service: str) -> int:  # (Ledger.workers_of)
        return sum(1 for w in self.pool.workers.values() if service in w.services)

    def services(self) -> list[str]:
        return self.pool.services()

    def ready_count(self, service: str) -> int:
        return self.pool.ready_count(service)

    def queue(self, service: str) -> list[bytes]:
        return list(self.pool._ready.get(service, ()))

    def take(self, service: str) -> bytes | None:
        worker = self.pool.take(service)
        return None if worker is None else worker.routing_id

    def hold(self, routing_id: bytes, ticket: bytes) -> None:
        self.pool.workers[routing_id].in_flight.add(ticket)  # (Ledger.dispatched)

    def release(self, routing_id: bytes, ticket: bytes) -> bool:
        worker = self.pool.workers.get(routing_id)  # (Ledger.answer, Ledger.release)
        if worker is None or ticket not in worker.in_flight:
            return False
        worker.in_flight.discard(ticket)
        return True

    def list_ready(self, routing_id: bytes) -> None:
        worker = self.pool.workers.get(routing_id)
        if worker is not None:
            self.pool.list_ready(worker)

    def tickets(self, routing_id: bytes) -> list[bytes]:
        return sorted(self.pool.workers[routing_id].in_flight)  # (Ledger.tickets_of)

    def spare(self, routing_id: bytes) -> int:
        worker = self.pool.workers[routing_id]  # (Ledger.spare)
        return worker.capacity - len(worker.in_flight)

    def used(self, routing_id: bytes) -> int:
        worker = self.pool.workers.get(routing_id)  # (Ledger.used, Ledger.spare)
        return 0 if worker is None else len(worker.in_flight)

    def worker_count(self) -> int:
        return len(self.pool.workers)


def outcome(pool: Any, op: str, *args: Any) -> tuple[str, Any]:
    """What ``pool.op(*args)`` answered, or the type of what it raised."""
    try:
        return ("ok", getattr(pool, op)(*args))
    except (KeyError, TypeError, ValueError) as e:
        return ("raised", type(e))


def state(pool: Any) -> dict[str, Any]:
    """Everything a caller can observe, as plain data."""
    return {
        "worker_count": pool.worker_count(),
        "services": pool.services(),
        **{
            f"{op}({name!r})": getattr(pool, op)(name)
            for name in [*NAMES, UNKNOWN_NAME]
            for op in ("offers", "offered_count", "ready_count", "queue")
        },
        **{
            f"{op}({rid!r})": outcome(pool, op, rid)
            for rid in [*RIDS, UNKNOWN_RID]
            for op in ("tickets", "spare", "used")
        },
    }


class PoolParity(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = c_pool()
        self.py = PyPool()
        self.fresh = 0

    def both(self, op: str, *args: Any) -> Any:
        c, py = outcome(self.c, op, *args), outcome(self.py, op, *args)
        assert c == py, f"{op}{args!r}: C {c!r}, Python {py!r}"
        return c[1]

    def new_ticket(self) -> bytes:
        self.fresh += 1
        return b"n%d" % self.fresh

    @rule(
        rid=st.sampled_from(RIDS),
        services=st.lists(st.sampled_from(NAMES), max_size=4).map(tuple),  # duplicates too
        capacity=st.integers(1, 3),
    )
    def ready(self, rid: bytes, services: tuple[str, ...], capacity: int) -> None:
        """A READY (a replacing one keeps the tickets), then listed as the ledger does."""
        self.both("add", rid, services, capacity)
        self.both("list_ready", rid)

    @rule(
        rid=st.sampled_from(RIDS),
        services=st.lists(st.sampled_from(NAMES), max_size=4).map(tuple),
        capacity=st.integers(1, 3),
    )
    def add_unlisted(self, rid: bytes, services: tuple[str, ...], capacity: int) -> None:
        self.both("add", rid, services, capacity)

    @rule(rid=st.sampled_from([*RIDS, UNKNOWN_RID]))
    def remove(self, rid: bytes) -> None:
        self.both("remove", rid)

    @rule(service=st.sampled_from([*NAMES, UNKNOWN_NAME]))
    def take(self, service: str) -> None:
        self.both("take", service)

    @rule(service=st.sampled_from([*NAMES, UNKNOWN_NAME]))
    def dispatch(self, service: str) -> None:
        """take and hold under a new ticket: what Dispatch does per request."""
        rid = self.both("take", service)
        if rid is not None:
            self.both("hold", rid, self.new_ticket())

    @rule(service=st.sampled_from(NAMES))
    def dispatch_until_empty(self, service: str) -> None:
        for _ in range(len(RIDS) * 3 + 1):  # more than every slot of every worker
            rid = self.both("take", service)
            if rid is None:
                break
            self.both("hold", rid, self.new_ticket())
        else:
            raise AssertionError(f"{service!r} never ran out of free slots")
        assert self.c.ready_count(service) == 0

    @rule(rid=st.sampled_from([*RIDS, UNKNOWN_RID]), ticket=st.sampled_from(TICKETS))
    def hold(self, rid: bytes, ticket: bytes) -> None:
        self.both("hold", rid, ticket)

    @rule(rid=st.sampled_from([*RIDS, UNKNOWN_RID]), ticket=st.sampled_from(TICKETS))
    def release(self, rid: bytes, ticket: bytes) -> None:
        self.both("release", rid, ticket)

    @rule(rid=st.sampled_from([*RIDS, UNKNOWN_RID]), data=st.data())
    def reply(self, rid: bytes, data: st.DataObject) -> None:
        """A REPLY: the worker's ticket (or one it does not hold) released, then listed."""
        held = self.c.tickets(rid) if rid in self.py.pool.workers else []
        ticket = data.draw(st.sampled_from([*held, b"never-held"]))
        self.both("release", rid, ticket)
        self.both("list_ready", rid)

    @rule(rid=st.sampled_from([*RIDS, UNKNOWN_RID]))
    def list_ready(self, rid: bytes) -> None:
        self.both("list_ready", rid)

    @invariant()
    def same_state(self) -> None:
        c, py = state(self.c), state(self.py)
        assert c == py


def test_pool_parity() -> None:
    run_state_machine_as_test(
        PoolParity, settings=settings(max_examples=300, stateful_step_count=50)
    )


def test_many_workers_and_tickets_in_parity() -> None:
    """Thousands of workers and tickets, added and removed in random order: the C tables grow
    and delete under load (backward shift) and still agree with WorkerPool at every check."""
    c, py = c_pool(), PyPool()
    rng = random.Random(14)
    rids = [b"w%d" % i for i in range(3000)]
    names = [f"s{i}" for i in range(40)]
    live: set[bytes] = set()
    for step in range(30_000):
        rid = rng.choice(rids)
        op = rng.random()
        if op < 0.3:
            args: tuple[Any, ...] = (rid, tuple(rng.sample(names, rng.randint(0, 4))), 3)
            assert c.add(*args) == py.add(*args)
            c.list_ready(rid)
            py.list_ready(rid)
            live.add(rid)
        elif op < 0.45:
            assert c.remove(rid) == py.remove(rid)
            live.discard(rid)
        elif op < 0.75:
            service = rng.choice(names)
            taken = c.take(service)
            assert taken == py.take(service)
            if taken is not None:
                ticket = b"t%d" % step
                c.hold(taken, ticket)
                py.hold(taken, ticket)
        elif rid in live:
            tickets = c.tickets(rid)
            assert tickets == py.tickets(rid)
            ticket = rng.choice(tickets) if tickets else b"none"
            assert c.release(rid, ticket) == py.release(rid, ticket)
            c.list_ready(rid)
            py.list_ready(rid)
        if step % 3000 == 0:
            assert c.worker_count() == py.worker_count() == len(live)
            assert c.services() == py.services()
            for name in names:
                assert c.queue(name) == py.queue(name)
                assert c.offered_count(name) == py.offered_count(name)
    for rid in list(live):
        assert c.remove(rid) == py.remove(rid)
    assert c.worker_count() == 0
    assert c.services() == []


def test_take_hold_release_by_hand() -> None:
    """The rules read plainly: LRU order, room left to the back, full out of every queue."""
    pool = c_pool()
    assert pool.add(b"a", ("s", "t"), 2) is False
    assert pool.add(b"b", ("s",), 1) is False
    assert pool.queue("s") == []  # not listed until list_ready
    pool.list_ready(b"a")
    pool.list_ready(b"b")
    assert pool.queue("s") == [b"a", b"b"]
    assert pool.take("s") == b"a"  # room left: to the back of "s" only
    pool.hold(b"a", b"1")
    assert pool.queue("s") == [b"b", b"a"]
    assert pool.queue("t") == [b"a"]
    assert pool.take("s") == b"b"  # full after this: out of every queue
    pool.hold(b"b", b"2")
    assert pool.take("t") == b"a"  # its last slot: out of "s" and "t"
    pool.hold(b"a", b"3")
    assert (pool.queue("s"), pool.queue("t"), pool.take("s")) == ([], [], None)
    assert pool.spare(b"a") == 0
    pool.list_ready(b"a")  # full: stays out
    assert pool.queue("s") == []
    pool.add(b"c", ("s",), 1)
    pool.list_ready(b"c")
    pool.hold(b"c", b"4")  # given a request outside take, as R5 gives a freed worker one
    assert pool.queue("s") == [b"c"]
    pool.list_ready(b"c")  # full: leaves the queues (else take would overfill it)
    assert (pool.queue("s"), pool.take("s")) == ([], None)
    assert pool.remove(b"c") == [b"4"]
    assert pool.release(b"a", b"1") is True
    assert pool.release(b"a", b"1") is False
    pool.list_ready(b"a")
    assert pool.queue("s") == [b"a"]
    assert pool.add(b"a", ("u",), 1) is True  # a new READY: keeps "3", listed nowhere
    assert pool.tickets(b"a") == [b"3"]
    assert (pool.queue("s"), pool.services()) == ([], ["s", "u"])
    assert pool.offered_count("s") == 1
    assert pool.remove(b"a") == [b"3"]
    assert pool.remove(b"a") is None
    assert pool.services() == ["s"]


@pytest.mark.parametrize(
    ("op", "args", "named"),
    [
        ("add", ("w", ("s",), 1), "routing_id must be bytes, not str"),
        ("add", (bytearray(b"w"), ("s",), 1), "routing_id must be bytes, not bytearray"),
        ("add", (b"w", "s", 1), "services must be a tuple of str, not str"),
        ("add", (b"w", {"s"}, 1), "services must be a tuple of str, not set"),
        ("add", (b"w", ("s", b"t"), 1), "services[1] must be str, not bytes"),
        ("add", (b"w", ("s",), 1.0), "capacity must be int, not float"),
        ("add", (b"w", ("s",), True), "capacity must be int, not bool"),
        ("add", (b"w", ("s",), None), "capacity must be int, not NoneType"),
        ("add", (b"w", ("s",)), "Pool.add takes 3 arguments (2 given)"),
        ("remove", ("w",), "routing_id must be bytes, not str"),
        ("offers", (b"s",), "service must be str, not bytes"),
        ("offered_count", (1,), "service must be str, not int"),
        ("ready_count", (None,), "service must be str, not NoneType"),
        ("queue", (b"s",), "service must be str, not bytes"),
        ("take", (b"s",), "service must be str, not bytes"),
        ("hold", (b"w", "t"), "ticket must be bytes, not str"),
        ("hold", ("w", b"t"), "routing_id must be bytes, not str"),
        ("hold", (b"w",), "Pool.hold takes 2 arguments (1 given)"),
        ("release", (b"w", 1), "ticket must be bytes, not int"),
        ("release", (None, b"t"), "routing_id must be bytes, not NoneType"),
        ("list_ready", ("w",), "routing_id must be bytes, not str"),
        ("tickets", (memoryview(b"w"),), "routing_id must be bytes, not memoryview"),
        ("spare", (1,), "routing_id must be bytes, not int"),
        ("used", ("w",), "routing_id must be bytes, not str"),
    ],
)
def test_wrong_types_name_the_argument_and_change_nothing(
    op: str, args: tuple[Any, ...], named: str
) -> None:
    pool = c_pool()
    pool.add(b"w", ("s",), 2)
    pool.list_ready(b"w")
    pool.hold(b"w", b"t")
    before = state_of(pool)
    with pytest.raises(TypeError) as raised:
        getattr(pool, op)(*args)
    assert named in str(raised.value)
    assert state_of(pool) == before


@pytest.mark.parametrize("capacity", [0, -1, 2**62 + 1, 2**70, -(2**70)])
def test_capacity_out_of_range_is_a_value_error(capacity: int) -> None:
    pool = c_pool()
    pool.add(b"w", ("s",), 2)
    pool.list_ready(b"w")
    before = state_of(pool)
    with pytest.raises(ValueError, match=r"capacity must be at least 1"):
        pool.add(b"w", ("other",), capacity)
    assert state_of(pool) == before  # the known worker keeps its services and place


def test_unknown_worker_is_a_key_error_where_it_must_exist() -> None:
    pool = c_pool()
    for op, args in [("hold", (b"x", b"t")), ("tickets", (b"x",)), ("spare", (b"x",))]:
        with pytest.raises(KeyError, match=r"no worker b'x'"):
            getattr(pool, op)(*args)
    assert pool.release(b"x", b"t") is False
    assert pool.used(b"x") == 0  # a worker the pool does not know holds no slot
    assert pool.remove(b"x") is None
    assert pool.list_ready(b"x") is None
    assert pool.worker_count() == 0


def test_pool_takes_no_arguments() -> None:
    c_pool()
    from scale0.core._pool import Pool

    with pytest.raises(TypeError, match=r"Pool\(\) takes no arguments"):
        Pool(1)  # type: ignore[call-arg]


def state_of(pool: Any) -> dict[str, Any]:
    return {
        "services": pool.services(),
        "count": pool.worker_count(),
        "queues": {s: pool.queue(s) for s in ("s", "other")},
        "tickets": outcome(pool, "tickets", b"w"),
        "spare": outcome(pool, "spare", b"w"),
        "used": pool.used(b"w"),
    }


def test_source_builds_warning_free_and_imports(tmp_path: Path) -> None:
    """The source compiles with -Wall -Wextra -Werror (setup.py builds it with the first two)
    and the fresh build loads and works: the installed .so is not all that was tested."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: scale0/core/_pool.c cannot be built")
    include = sysconfig.get_paths()["include"]
    module = tmp_path / ("_pool" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    build = subprocess.run(
        [gcc, *STRICT_FLAGS, f"-I{include}", "-o", str(module), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    loader = importlib.machinery.ExtensionFileLoader("scale0.core._pool", str(module))
    spec = importlib.util.spec_from_file_location("scale0.core._pool", module, loader=loader)
    assert spec is not None
    installed = sys.modules.get("scale0.core._pool")
    try:
        fresh = importlib.util.module_from_spec(spec)
        loader.exec_module(fresh)
    finally:  # (loading a single-phase extension puts it in sys.modules: put back what was)
        if installed is None:
            sys.modules.pop("scale0.core._pool", None)
        else:
            sys.modules["scale0.core._pool"] = installed
    pool = fresh.Pool()
    assert pool.add(b"w", ("s",), 1) is False
    pool.list_ready(b"w")
    assert pool.take("s") == b"w"
    assert pool.take("s") is None


def test_a_finalizer_changing_the_pool_inside_a_call_breaks_nothing() -> None:
    """Building an answer allocates a list, which may run the collector, so finalizers, so any
    Python code: here one that removes and adds workers from inside tickets(), queue(),
    services() and remove(). The C side must not use a record freed meanwhile, nor fill a list
    sized before the change (the first cut did, and only the ASan build in this module's
    docstring showed it: a plain build read freed memory quietly); every answer is well formed."""
    pool = c_pool()
    names = ["s", "t"]
    for i in range(40):
        rid = b"w%d" % i
        pool.add(rid, (names[i % 2],), 3)
        pool.hold(rid, b"x%d" % i)
        pool.list_ready(rid)
    turns = iter(range(10**6))

    class Trap:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            i = next(turns)
            pool.remove(b"w%d" % (i % 40))
            pool.add(b"w%d" % ((i + 7) % 40), (names[i % 2], f"n{i % 3}"), 2)
            pool.hold(b"w%d" % ((i + 7) % 40), b"y%d" % i)
            pool.list_ready(b"w%d" % ((i + 7) % 40))

    def armed(call: Any, *args: Any) -> Any:
        """``call(*args)`` with garbage waiting and the collector due at its next allocation,
        which is the list the call builds (no other allocation the collector counts comes
        between gc.enable() and it)."""
        gc.disable()
        Trap()
        gc.enable()
        return call(*args)

    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)
    try:
        for i in range(500):
            rid = b"w%d" % (i % 40)
            with contextlib.suppress(KeyError):  # gone by the time the call looks: allowed
                tickets = armed(pool.tickets, rid)
                assert tickets == sorted(set(tickets))
                assert all(type(t) is bytes for t in tickets)
            removed = armed(pool.remove, rid)
            assert removed is None or all(type(t) is bytes for t in removed)
            for name in [*names, "n0"]:
                queue = armed(pool.queue, name)
                assert len(set(queue)) == len(queue)
            services = armed(pool.services)
            assert services == sorted(set(services))
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
    assert next(turns) > 1000, "the finalizers did not run"
