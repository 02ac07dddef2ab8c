"""tools/bench's client: every request it sends, warm-up and timed phase together, carries a
request id it never used before, so no broker answers one from its reply cache.

The client runs against a real ROUTER on 127.0.0.1 (in a thread of this process) that records
every request id and answers in the framing the client speaks: S0P/1, and each Majordomo one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from tools import bench
from tools.mdp import DIALECTS, Dialect, reply_header, request_header

REQUESTS = 1500  # plus the client's 1000 warm-up requests


@contextmanager
def recording_echo(dialect: Dialect | None) -> Iterator[tuple[str, list[bytes]]]:
    """A ROUTER answering each request at once; yields its endpoint and the ids it saw."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen: list[bytes] = []
    stop = threading.Event()
    if dialect is None:
        skip, head = 4, [b"", b"S0C1", b"REPLY", bench.SERVICE]
    else:
        skip, head = (
            len(request_header(dialect, bench.SERVICE)),
            reply_header(dialect, bench.SERVICE),
        )

    def serve() -> None:
        while not stop.is_set():
            if not router.poll(50):
                continue
            identity, *frames = router.recv_multipart()
            request_id, payload = frames[skip], frames[skip + 1]
            seen.append(request_id)
            status = [b"200"] if dialect is None else []
            router.send_multipart([identity, *head, request_id, *status, payload])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", seen
    finally:
        stop.set()
        thread.join(5)
        router.close()
        ctx.term()
    assert not thread.is_alive()


@pytest.mark.parametrize("framing", ["s0p", *sorted(DIALECTS)])
def test_bench_sends_a_fresh_request_id_every_time(framing: str) -> None:
    dialect = None if framing == "s0p" else DIALECTS[framing]
    with recording_echo(dialect) as (endpoint, seen):
        result = bench.run_client(
            [endpoint],
            dialect=dialect,
            requests=REQUESTS,
            window=50,
            payload=b"x" * 100,
            middle_pid=None,
        )
    assert len(seen) == REQUESTS + 1000
    assert len(set(seen)) == len(seen), "a request id was sent twice"
    assert result["throughput"] > 0
