"""``tools/bench soak``: does the broker's memory stay flat under steady load? (issue 14)

One real ``scale0-broker`` and the S0P/1 echo workers and client of tools/bench (fresh request
id every request). First a short burst at full speed (window 100) measures the peak rate on
this machine, now; then the client holds half of that rate for ``--warmup`` seconds and then
``--duration`` seconds more (10 minutes by default), a bounded window of requests outstanding,
while the broker's resident set size (VmRSS, /proc) is sampled every ``--sample`` seconds. It
reports RSS at the start of the soak (the end of the warm-up), its peak and its end, the growth
from start to end in %, the same from the warm-up's first sample, and what the run did
(requests answered, achieved rate, p50/p99 round trip). The command exits 1 when the growth is
5 % or more, or when a request went unanswered.

The warm-up (30 s by default) lets the broker's bounded working set fill before "start" is
read: every request leaves a deadline entry in the timer heap until its request timeout
(10 s by default) has passed, and the reply cache fills to its 10 000 entries; a soak that
started counting at once would call that one-time fill growth (the first 10-minute run, in
docs/performance.md, shows it).

    tools/bench soak                         # 10 minutes at half of the peak rate
    tools/bench soak --duration 60           # a shorter look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale0.testing import running_broker
from tools.bench import SERVICE, run_client, s0p_worker, start

#: The issue's bound on memory growth over the soak.
GROWTH_LIMIT_PCT = 5.0


def rss_kib(pid: int) -> int:
    """The process's resident set size in KiB (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def paced(
    endpoint: str,
    *,
    rate: float,
    duration_s: float,
    window: int,
    payload: bytes,
    first_id: int,
    on_sample: Any,
    sample_s: float,
) -> dict[str, float]:
    """Send ``rate`` requests a second (never more than ``window`` outstanding) for
    ``duration_s``, each with a fresh id; call ``on_sample()`` every ``sample_s``."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    head = [b"", b"S0C1", b"REQUEST", SERVICE]
    sent_at: dict[bytes, float] = {}
    rtts: list[float] = []
    sent = answered = 0
    clock = time.perf_counter
    try:
        sock.send_multipart([b"", b"S0C1", b"CHECKCONFIG", b'{"config_type":"json"}'])
        if not sock.poll(10_000):
            raise RuntimeError("no CONFIG from the broker within 10 s")
        version = json.loads(sock.recv_multipart()[3] or b"{}").get("config_version", 0)
        started = clock()
        next_sample = started
        next_beat = started
        end = started + duration_s
        while True:
            now = clock()
            if now >= next_sample:
                on_sample()
                next_sample += sample_s
            if now >= next_beat:  # the session must not expire while the rate is low
                beat = {"time": time.time(), "config_version": version}
                sock.send_multipart([b"", b"S0C1", b"HEARTBEAT", json.dumps(beat).encode()])
                next_beat = now + 1.0
            if now >= end:
                break
            due = min(int((now - started) * rate), int(duration_s * rate))
            while sent < due and sent - answered < window:
                request_id = (first_id + sent).to_bytes(8, "big")
                sent_at[request_id] = clock()
                sock.send_multipart([*head, request_id, payload])
                sent += 1
            if sock.poll(5):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if frames[2] != b"REPLY":
                        continue  # the broker's answers to our HEARTBEATs
                    t0 = sent_at.pop(frames[4], None)
                    if t0 is not None:
                        rtts.append(clock() - t0)
                        answered += 1
        deadline = clock() + 10
        while sent_at and clock() < deadline:  # the last ones still on their way
            if sock.poll(100):
                frames = sock.recv_multipart()
                if frames[2] == b"REPLY" and sent_at.pop(frames[4], None) is not None:
                    answered += 1
        elapsed = clock() - started
    finally:
        sock.close()
        ctx.term()
    rtts.sort()
    return {
        "sent": sent,
        "answered": answered,
        "rate": answered / elapsed,
        "p50_us": rtts[len(rtts) // 2] * 1e6 if rtts else float("nan"),
        "p99_us": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1e6 if rtts else float("nan"),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of soak")
    parser.add_argument(
        "--warmup", type=float, default=30.0, help="seconds at the soak rate before 'start'"
    )
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--payload", type=int, default=100, help="body bytes")
    parser.add_argument("--window", type=int, default=100, help="most requests outstanding")
    parser.add_argument(
        "--peak-requests", type=int, default=20_000, help="requests of the full-speed burst"
    )
    parser.add_argument(
        "--fraction", type=float, default=0.5, help="share of the peak rate to hold"
    )
    args = parser.parse_args(argv)
    payload = b"x" * args.payload
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_broker(Path(tmp), max_queued_requests=100_000) as broker,
    ):
        backend, frontend = broker.endpoints["backend"], broker.endpoints["frontend"]
        procs = [start(s0p_worker, backend, 1) for _ in range(args.workers)]
        try:
            time.sleep(0.2)
            peak = run_client(
                [frontend],
                negotiate=True,
                requests=args.peak_requests,
                window=args.window,
                payload=payload,
                middle_pid=broker.pid,
            )
            rate = peak["throughput"] * args.fraction
            print(
                f"peak: {peak['throughput']:.0f} req/s ({args.workers} workers, capacity 1, "
                f"{args.payload}-byte bodies, window {args.window}); soak at {rate:.0f} req/s "
                f"for {args.warmup:g} + {args.duration:g} s, RSS every {args.sample:g} s; "
                f"{os.cpu_count()} cores, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            samples: list[tuple[float, int]] = []
            t0 = time.monotonic()

            def sample() -> None:
                samples.append((time.monotonic() - t0, rss_kib(broker.pid)))

            soak = paced(
                frontend,
                rate=rate,
                duration_s=args.warmup + args.duration,
                window=args.window,
                payload=payload,
                first_id=10**12,  # past the burst's ids: every request is new to the broker
                on_sample=sample,
                sample_s=args.sample,
            )
            sample()
        finally:
            for p in procs:
                p.kill()
        broker.stop()
    # "start": the last sample of the warm-up (the first one when there is none).
    start_at, start_kib = [(t, kib) for t, kib in samples if t <= args.warmup + 1e-6][-1]
    end_kib = samples[-1][1]
    peak_kib = max(kib for t, kib in samples if t >= start_at)
    growth = (end_kib - start_kib) / start_kib * 100
    first_kib = samples[0][1]
    print("RSS samples (s: KiB): " + ", ".join(f"{t:.0f}: {kib}" for t, kib in samples))
    print(
        f"soak: {soak['answered']:.0f} of {soak['sent']:.0f} requests answered, "
        f"{soak['rate']:.0f} req/s, p50 {soak['p50_us']:.0f} µs, p99 {soak['p99_us']:.0f} µs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"broker RSS: start {start_kib} KiB, peak {peak_kib} KiB, end {end_kib} KiB, "
        f"growth {growth:+.2f} % (target: under {GROWTH_LIMIT_PCT:g} %)"
    )
    print(
        f"from the warm-up's first sample ({first_kib} KiB, at 0 s): "
        f"{(end_kib - first_kib) / first_kib * 100:+.2f} %"
    )
    ok = growth < GROWTH_LIMIT_PCT and soak["answered"] == soak["sent"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
