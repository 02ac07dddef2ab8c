"""Child-process side of tests/net/test_frames_io.py: the batch calls under signals and frees.

``python -m tests.net.frames_io_child storm|raising c|pyzmq``, or ``... freed c|pyzmq
iterator|buffer``, prints one JSON answer. These run
in a process of their own because they arm SIGALRM, and because, before the fixes they test,
they made the interpreter read freed memory.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import zmq

from scale0.net import frames_io

WAIT_MS = 5000
STORM_INTERVAL_S = 20e-6
STORM_CALLS = 1000
IN_FLIGHT = 20  # at most this many unread messages, far below any high-water mark


def _impl(name: str) -> tuple[Callable[[Any], Any], Any, Any]:
    if name == "c":
        from scale0.net import _zmqio

        _zmqio.setup(zmq.ZMQError)
        return frames_io._c_io_key, _zmqio.recv_batch, _zmqio.send_batch
    return frames_io._py_io_key, frames_io._py_recv_batch, frames_io._py_send_batch


def _pair(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("tcp://127.0.0.1:*")
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.setsockopt(zmq.IDENTITY, b"d1")
    dealer.connect(router.getsockopt(zmq.LAST_ENDPOINT).decode())  # type: ignore[union-attr]
    dealer.send(b"hello")
    if not router.poll(WAIT_MS) or router.recv_multipart() != [b"d1", b"hello"]:
        raise SystemExit("the DEALER did not connect")
    return router, dealer


def _verdict(got: list[list[bytes]], expected: list[list[bytes]]) -> str:
    if got == expected:
        return "in order, none missing"
    bad = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    return f"{len(got)} of {len(expected)}; first difference at {bad}"


def storm(name: str) -> dict[str, Any]:
    """Round trips while SIGALRM fires every 20 µs, with a Python handler.

    Python installs its handlers without SA_RESTART, so a signal landing while libzmq polls its
    command mailbox makes that libzmq call fail with EINTR.
    """
    io_key, recv_batch, send_batch = _impl(name)
    ctx: zmq.Context[Any] = zmq.Context()
    router, dealer = _pair(ctx)
    rkey, dkey = io_key(router), io_key(dealer)
    signals = [0]

    def count(signum: int, frame: object) -> None:
        signals[0] += 1

    def catch_up(
        sock: zmq.Socket[Any], key: Any, got: list[list[bytes]], sent: int, slack: int = IN_FLIGHT
    ) -> None:
        """Read until at most ``slack`` of the ``sent`` messages are still on their way."""
        got.extend(recv_batch(key, 100))
        for _ in range(WAIT_MS // 10):
            if sent - len(got) <= slack:
                return
            sock.poll(10)
            got.extend(recv_batch(key, 100))

    results: set[tuple[int, tuple[int, ...]]] = set()
    to_dealer: list[list[bytes]] = []
    to_router: list[list[bytes]] = []
    signal.signal(signal.SIGALRM, count)
    signal.setitimer(signal.ITIMER_REAL, STORM_INTERVAL_S, STORM_INTERVAL_S)
    for call in range(STORM_CALLS):
        sent, failed = send_batch(
            [(rkey, b"d1", [b"", b"a%d" % call]), (rkey, b"d1", [b"", b"b%d" % call])]
        )
        results.add((sent, tuple(failed)))
        sent, failed = send_batch([(dkey, b"", [b"c%d" % call])])
        results.add((sent, tuple(failed)))
        catch_up(dealer, dkey, to_dealer, 2 * call + 2)
        catch_up(router, rkey, to_router, call + 1)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    catch_up(dealer, dkey, to_dealer, 2 * STORM_CALLS, slack=0)
    catch_up(router, rkey, to_router, STORM_CALLS, slack=0)
    answer = {
        "calls": STORM_CALLS,
        "signals": signals[0],
        "send_results": sorted([sent, list(failed)] for sent, failed in results),
        "to_dealer": _verdict(
            to_dealer, [[b"", b"%s%d" % (x, i)] for i in range(STORM_CALLS) for x in (b"a", b"b")]
        ),
        "to_router": _verdict(to_router, [[b"d1", b"", b"c%d" % i] for i in range(STORM_CALLS)]),
    }
    router.close(0)
    dealer.close(0)
    ctx.term()
    return answer


class Interrupted(Exception):
    """What the signal handler of :func:`raising` raises now and then, as Ctrl-C would."""


RAISING_MESSAGES = 3000


def raising(name: str) -> dict[str, Any]:
    """Receive while SIGALRM's Python handler raises on every third signal.

    The messages wait in an inproc pipe before the storm starts, so the loop ends when the
    socket is empty. An exception may cost messages (on the C path, a batch it returned but
    Python never stored); it must never leave half a message behind, to come out later as a
    message of its own.
    """
    io_key, recv_batch, _ = _impl(name)
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
        sock.sndhwm = sock.rcvhwm = 0  # no limit: every message is in the pipe before the storm
    router.bind("inproc://raising")
    dealer.setsockopt(zmq.IDENTITY, b"d1")
    dealer.connect("inproc://raising")
    for i in range(RAISING_MESSAGES):
        tag = b"%d" % i
        dealer.send_multipart([b"", tag, tag, tag, tag])
    key = io_key(router)
    signals = [0]
    armed = [False]  # raise only inside the receive call below, never in our own bookkeeping

    def sometimes(signum: int, frame: object) -> None:
        signals[0] += 1
        if armed[0] and signals[0] % 3 == 0:
            armed[0] = False
            raise Interrupted

    got: list[list[bytes]] = []
    raised = 0
    signal.signal(signal.SIGALRM, sometimes)
    signal.setitimer(signal.ITIMER_REAL, STORM_INTERVAL_S, STORM_INTERVAL_S)
    for _ in range(100 * RAISING_MESSAGES):  # bounded; ends long before, on an empty socket
        try:
            armed[0] = True
            batch = recv_batch(key, 7)
            armed[0] = False
        except Interrupted:
            raised += 1
            continue
        if not batch:
            break
        got.extend(batch)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    whole = [
        m for m in got if len(m) == 6 and m[0] == b"d1" and m[1] == b"" and len(set(m[2:])) == 1
    ]
    tags = [int(m[2]) for m in whole]
    router.close(0)
    dealer.close(0)
    ctx.term()
    return {
        "raised": raised,
        "received": len(got),
        "not_whole": [[f.decode() for f in m] for m in got if m not in whole][:5],
        "in_order_once": tags == sorted(set(tags)),
    }


class Emptying(Sequence[bytes]):
    """The other frames of a message; iterating them empties the caller's list of items."""

    def __init__(self, items: list[Any], frames: list[bytes]) -> None:
        self.items = items
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        return self.frames[index]

    def __iter__(self) -> Iterator[bytes]:
        self.items.clear()  # the last reference to every message and its frames
        frames, self.frames = self.frames, []
        yield from frames


class Exporting:
    """A frame whose ``__buffer__`` (Python 3.12+) empties the caller's list of items."""

    def __init__(self, items: list[Any], data: bytes) -> None:
        self.items = items
        self.data = data

    def __buffer__(self, flags: int) -> memoryview:
        self.items.clear()  # the last reference to every message, and to this frame
        return memoryview(self.data)


def made(text: str) -> bytes:
    """A frame made at run time, so the items hold the only reference to it."""
    return text.encode("ascii")


def freed(name: str, how: str) -> dict[str, Any]:
    """Send a batch that, while it is being sent, frees the caller's items and frames.

    ``how``: ``iterator`` (the first message's other frames empty the list when iterated) or
    ``buffer`` (Python 3.12+: a frame's ``__buffer__`` does).
    """
    io_key, _, send_batch = _impl(name)
    ctx: zmq.Context[Any] = zmq.Context()
    router, dealer = _pair(ctx)
    key = io_key(router)
    items: list[Any] = []
    if how == "iterator":
        rest: Any = Emptying(items, [b"", made("zero"), made("0" * 1000)])
    else:
        rest = [b"", Exporting(items, made("zero")), made("0" * 1000)]
    items.append((key, made("d1"), rest))
    items.append((key, made("d1"), [b"", made("one"), made("1" * 1000)]))
    del rest
    sent, failed = send_batch(items)
    received = []
    while dealer.poll(200 if received else WAIT_MS):
        received.append([frame.decode() for frame in dealer.recv_multipart()])
    router.close(0)
    dealer.close(0)
    ctx.term()
    return {"result": [sent, failed], "received": received}


if __name__ == "__main__":
    what, impl = sys.argv[1], sys.argv[2]
    if what == "storm":
        answer = storm(impl)
    elif what == "raising":
        answer = raising(impl)
    else:
        answer = freed(impl, sys.argv[3])
    print(json.dumps(answer))
