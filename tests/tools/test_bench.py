"""tools/bench's client: every request it sends, warm-up and timed phase together, carries a
request id it never used before, so no broker answers one from its reply cache. And each
Majordomo case of the bench runs end to end.

The client runs against a real ROUTER on 127.0.0.1 (in a thread of this process) that records
every request id and answers in the framing the client speaks: S0P/1, and each Majordomo one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from tests.tools.cbuild import built
from tools import (
    bench,
    bench_idle,
    bench_idle_core,
    bench_mdp_core,
    bench_node_core,
    bench_soak,
)
from tools.mdp import DIALECTS, Dialect, reply_header, request_header
from tools.mdp_brokers import (
    IDLE_SOURCE,
    build_c_broker,
    build_c_loop_module,
    running_idle_floor,
)

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


@pytest.mark.parametrize("case", ["proxy", "c-lru", *bench.LOOP_CASES, "majortomo", "scale0-mdp"])
def test_bench_majordomo_cases_run_on_the_same_drivers(case: str, tmp_path: Path) -> None:
    """Each Majordomo case of tools/bench, end to end and small: its broker process, MDP worker
    processes and the MDP client; every request answered, the broker's CPU measured."""
    run = bench.CASES[case]
    if case == "c-lru":
        run = functools.partial(run, binary=built(build_c_broker, tmp_path))
    elif case in bench.LOOP_CASES:
        run = functools.partial(run, module=built(build_c_loop_module, tmp_path))
    result = run(1, 1, dialect_key="majortomo", requests=300, window=20, payload=b"x" * 100)
    assert result["throughput"] > 0
    # /proc counts CPU in clock ticks (10 ms): 300 requests through zmq.proxy may cost none.
    assert result["cpu_us_per_request"] >= 0
    assert result["drivers_us_per_request"] > 0  # includes this process, timed finely
    if case not in ("proxy", "majortomo"):  # the C routing's hosts and Scale0 count them
        assert result["wakeups_per_request"] > 0


def test_bench_soak_runs_end_to_end_and_reports_rss(capsys: pytest.CaptureFixture[str]) -> None:
    """``tools/bench soak``, a few seconds of it (the real run is 10 minutes, by hand): a real
    broker and workers, the paced client, RSS sampled and the growth reported."""
    code = bench_soak.main(
        [
            "--duration",
            "3",
            "--warmup",
            "1",
            "--sample",
            "1",
            "--workers",
            "1",
            "--peak-requests",
            "500",
        ]
    )
    out = capsys.readouterr().out
    assert "soak at" in out and "broker RSS: start" in out, out
    samples = out.split("RSS samples (s: KiB): ")[1].splitlines()[0].split(", ")
    assert len(samples) >= 3 and all(int(s.split(": ")[1]) > 0 for s in samples), samples
    run = re.search(r"soak: (\d+) of (\d+) requests answered", out)
    assert run is not None and 0 < int(run[1]) == int(run[2]), out  # every request answered
    assert code in (0, 1)  # 1: RSS grew 5 % in 3 s, which a young broker may do


def test_bench_mdp_core_times_every_tree_and_names_a_bad_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``tools/bench_mdp_core.py``: the core's CPU per Majordomo request, in-process, for each
    tree (it exits if a request went unanswered); a tree with no scale0/ is named."""
    tree = str(Path(__file__).resolve().parents[2])
    bench_mdp_core.main(["--requests", "300", "--tree", tree])
    out = capsys.readouterr().out
    figures = re.search(r": µs CPU per request, rounds 1-3: ([0-9.]+) / ([0-9.]+) / ([0-9.]+)", out)
    assert figures is not None and all(float(f) > 0 for f in figures.groups()), out
    with pytest.raises(SystemExit):
        bench_mdp_core.main(["--tree", str(tmp_path)])
    assert "no scale0/ in it" in capsys.readouterr().err


def test_bench_node_core_times_every_tree_and_names_a_bad_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``tools/bench_node_core.py``: the node's and core's Python per S0P request at capacity
    25, in-process, for each tree (it exits if a request went unanswered: every REQUEST of a
    batch must reach a worker and every REPLY its client); a tree with no scale0/ is named."""
    tree = str(Path(__file__).resolve().parents[2])
    bench_node_core.main(["--requests", "400", "--tree", tree])
    out = capsys.readouterr().out
    figures = re.search(r": µs CPU per request, rounds 1-3: ([0-9.]+) / ([0-9.]+) / ([0-9.]+)", out)
    assert figures is not None and all(float(f) > 0 for f in figures.groups()), out
    with pytest.raises(SystemExit):
        bench_node_core.main(["--tree", str(tmp_path)])
    assert "no scale0/ in it" in capsys.readouterr().err


def test_bench_base_tree_cases_run_their_brokers_from_that_tree(tmp_path: Path) -> None:
    """``--base-tree``'s ``base-solo``, ``base-solo-curve``, ``base-family``,
    ``base-family-curve``: the same case with its brokers importing scale0 from that tree (one
    whose scale0 cannot be imported stops them), PYTHONPATH restored afterwards."""
    assert {f"base-{name}" for name in bench.TREE_CASES} <= set(bench.DRIVERS)
    broken = tmp_path / "broken"
    (broken / "scale0").mkdir(parents=True)
    (broken / "scale0" / "__init__.py").write_text('raise ImportError("the base tree")\n')
    saved = os.environ.get("PYTHONPATH")
    small = {"requests": 200, "window": 20, "payload": b"x" * 100}
    with pytest.raises(RuntimeError):
        bench.case_solo(1, 1, curve=True, tree=broken, **small)
    assert os.environ.get("PYTHONPATH") == saved
    here = Path(bench.__file__).resolve().parents[1]
    result = bench.case_solo(1, 1, curve=True, tree=here, **small)
    assert result["throughput"] > 0
    assert os.environ.get("PYTHONPATH") == saved


def test_bench_family_both_splits_round_trips_into_local_and_forwarded() -> None:
    """``family-both``: each worker tags its replies with its broker, so the case reports the
    p50/p99 of the requests the first broker's own workers ran and of those it forwarded
    (docs/performance.md "Forwarded requests"). Window 20 with one worker at each broker:
    the first broker cannot run them all itself, and the second's slot is free at first."""
    result = bench.case_family_both(1, 1, requests=400, window=20, payload=b"x" * 100)
    assert 0 < result["forwarded_share"] < 1
    for kind in ("local", "forwarded"):
        assert 0 < result[f"p50_{kind}_us"] <= result[f"p99_{kind}_us"]
    assert min(result["p50_local_us"], result["p50_forwarded_us"]) <= result["p50_us"]
    lines = bench.table(
        [
            {
                "case": "family-both",
                "driver": "S0P",
                "workers": 1,
                "payload": 100,
                "wakeups_per_request": 1.0,
                "main_thread_us_per_request": 1.0,
                **result,
            }
        ]
    )
    assert re.search(r"workers 1: [\d.]+%; local \d+ / \d+ forwarded \d+ / \d+", lines)


def test_bench_idle_core_times_every_tree_and_names_a_bad_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``tools/bench_idle_core.py``: the broker's Python CPU per HEARTBEAT, in-process, for each
    tree (it exits if a session was lost); a tree with no scale0/ is named."""
    tree = str(Path(__file__).resolve().parents[2])
    bench_idle_core.main(["--seconds", "0.8", "--tree", tree])
    out = capsys.readouterr().out
    figures = re.findall(
        r"([0-9.]+) \(heartbeat_items \+ handle_heartbeats, (\d+) HEARTBEATs/s\)", out
    )
    assert len(figures) == 3, out  # this tree reads a batch's HEARTBEATs in one call
    assert all(float(cost) > 0 and int(rate) > 0 for cost, rate in figures), out
    with pytest.raises(SystemExit):
        bench_idle_core.main(["--tree", str(tmp_path)])
    assert "no scale0/ in it" in capsys.readouterr().err


@pytest.fixture(scope="module")
def idle_floor_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tools/idle_floor.c built as tools/bench idle builds it (gcc, -Werror, pyzmq's libzmq)."""
    return built(build_c_broker, tmp_path_factory.mktemp("idle-floor"), IDLE_SOURCE)


def test_idle_floor_answers_what_the_idle_drivers_wait_for(
    idle_floor_binary: Path, tmp_path: Path
) -> None:
    """The C liveness floor: CONFIG for CHECKCONFIG, a HEARTBEAT for each client HEARTBEAT,
    FORCENEGOTIATE for a HEARTBEAT from a peer it does not know, a HEARTBEAT every interval to
    a worker after READY, and a peer silent past liveness forgotten (its stats line). Liveness
    here is 1 s, so a starved test process is not what forgets the worker."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socks: list[zmq.Socket[bytes]] = []

    def dealer(endpoint: str) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.rcvtimeo = 2000
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    beat = b'{"time":1.5,"config_version":0}'
    try:
        with running_idle_floor(
            idle_floor_binary, tmp_path, heartbeat_ms=200, liveness=5, promise_ms=200
        ) as floor:
            client, stranger = dealer(floor.frontend), dealer(floor.frontend)
            worker = dealer(floor.backend)
            client.send_multipart([b"", b"S0C1", b"CHECKCONFIG", bench_idle.CHECKCONFIG])
            assert client.recv_multipart()[2:] == [b"CONFIG", b'{"config_version":0}']
            client.send_multipart([b"", b"S0C1", b"HEARTBEAT", beat])
            answer = client.recv_multipart()
            assert answer[:3] == [b"", b"S0C1", b"HEARTBEAT"]
            assert json.loads(answer[3]) == {
                "time": json.loads(answer[3])["time"],
                "config_version": 0,
                "interval_ms": 200,  # -p: idle beating's promise (§3.4)
            }
            stranger.send_multipart([b"", b"S0C1", b"HEARTBEAT", beat])
            assert stranger.recv_multipart()[2] == b"FORCENEGOTIATE"
            worker.send_multipart([b"", b"S0W1", b"CHECKCONFIG", bench_idle.CHECKCONFIG])
            assert worker.recv_multipart()[2] == b"CONFIG"
            worker.send_multipart([b"", b"S0W1", b"READY", b"{}"])
            beats = 0
            deadline = time.monotonic() + 5
            while beats < 3 and time.monotonic() < deadline:  # 3 beats, then it falls silent
                frames = worker.recv_multipart()
                assert frames[2] == b"HEARTBEAT", frames
                assert json.loads(frames[3])["interval_ms"] == 200
                beats += 1
                worker.send_multipart([b"", b"S0W1", b"HEARTBEAT", beat])
            assert beats == 3
            time.sleep(2.5)  # liveness 5 x 200 ms, and more: both peers forgotten
            worker.send_multipart([b"", b"S0W1", b"HEARTBEAT", beat])
            frames = worker.recv_multipart()
            while frames[2] == b"HEARTBEAT":  # beats sent before it was forgotten
                frames = worker.recv_multipart()
            assert frames[2] == b"FORCENEGOTIATE"
            floor.stop()
            stats = floor.stats()
        assert stats["forgotten"] == 2 and stats["forced"] == 2, stats
        # In: 2 CHECKCONFIG, READY, 6 HEARTBEAT; out: 2 CONFIG, an answer, 2 FORCENEGOTIATE and
        # the worker's beats (3 answered, then more until it was forgotten).
        assert stats["received"] == 9 and stats["sent"] >= 8, stats
    finally:
        for sock in socks:
            sock.close()
        ctx.term()


def test_bench_idle_measures_scale0_and_the_c_floor_in_one_invocation(
    idle_floor_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tools/bench idle --cases scale0 scale0-1s c-idle``, small and short: the brokers under
    the same drivers, with idle beating and without, each one's share of a core printed, and
    scale0's ratios to the floor and to itself without idle beating."""
    code = bench_idle.main(
        [
            *("--workers", "20", "--clients", "20", "--seconds", "2", "--drivers", "1"),
            *("--cases", "scale0", "scale0-1s", "c-idle", "--idle-interval", "1500"),
        ]
    )
    out = capsys.readouterr().out
    assert "idle beating every 1.5 s" in out, out
    assert "each connection beats every 1 of its period, each on its own clock" in out, out
    assert "found after liveness x idle = 4.5 s" in out, out
    assert re.search(r"broker CPU, median run: scale0-1s [0-9.]+ %, scale0 [0-9.]+ %", out), out
    for case in ("scale0", "scale0-1s", "c-idle"):
        run = re.search(rf"{case}: broker CPU ([0-9.]+) % of one core, ([0-9.]+) µs", out)
        assert run is not None, out
        assert float(run[2]) >= 0 and re.search(rf"^{case} CPU: [0-9.]+ % of one core", out, re.M)
    # /proc counts CPU in 10 ms ticks: 40 idle connections for 2 s may cost the floor none.
    ratio = r"broker CPU, median run: c-idle [0-9.]+ %, scale0 [0-9.]+ % \((x [0-9.]+ of|no ratio)"
    assert re.search(ratio, out), out
    assert "connections a broker forgot or hung up: 0 (should be 0)" in out, out
    assert "... and in the comparison runs, not judged (scale0-1s): 0" in out, out
    assert code == 0, out


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--period", "0"], "--period: a fraction of the interval from 0.1 to 1"),
        (["--period", "1.5"], "--period: a fraction of the interval from 0.1 to 1"),
        (["--groups", "-1"], "--groups: 0 (one per connection) or more"),
    ],
)
def test_bench_idle_refuses_a_schedule_it_cannot_keep(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--period`` is a fraction of the interval (a connection beating later than its
    interval is not a schedule the protocol allows), ``--groups`` a count: anything else is
    refused before a broker starts, naming the option."""
    with pytest.raises(SystemExit) as exit_info:
        bench_idle.main(argv)
    assert exit_info.value.code == 2
    assert complaint in capsys.readouterr().err


def test_bench_idle_measures_liveness_by_zmtp_heartbeats_beside_the_c_floor(
    idle_floor_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cases c-idle c-zmtp``: the same connections kept alive by libzmq's own ZMTP
    heartbeats (no HEARTBEAT message from either side) are measured beside the app-level C
    floor in one invocation, with a ratio between the two, and nobody is forgotten."""
    code = bench_idle.main(
        [
            *("--workers", "20", "--clients", "20", "--seconds", "2", "--drivers", "1"),
            *("--cases", "c-idle", "c-zmtp", "--idle-interval", "1500"),
        ]
    )
    out = capsys.readouterr().out
    zmtp = re.search(r"c-zmtp: broker CPU ([0-9.]+) % of one core, (nan|[0-9.]+) µs", out)
    assert zmtp is not None, out
    # No HEARTBEAT crosses in the c-zmtp case: its per-HEARTBEAT cost has nothing to divide.
    assert zmtp[2] == "nan", out
    ratio = r"broker CPU, median run: c-idle [0-9.]+ %, c-zmtp [0-9.]+ % \((x [0-9.]+ of|no ratio)"
    assert re.search(ratio, out), out
    assert "connections a broker forgot or hung up: 0 (should be 0)" in out, out
    assert code == 0, out
