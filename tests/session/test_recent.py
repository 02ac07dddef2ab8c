"""W7: the worker's memory of recent requests (scale0/session/recent.py), driven with numbers."""

from __future__ import annotations

from scale0.session.recent import Decision, RecentRequests

KEY = ("echo", "alice", b"r1")


def test_a_new_request_runs_and_its_repeat_is_replayed() -> None:
    recent = RecentRequests()
    assert recent.begin(KEY, b"t1", 0.0) is Decision.RUN
    assert recent.finished(KEY, 200, (b"done",), 1.0) == [b"t1"]
    assert recent.begin(KEY, b"t2", 2.0) is Decision.REPLAY
    assert recent.reply_of(KEY) == (200, (b"done",))
    # Another client, request or service is another request.
    assert recent.begin(("echo", "bob", b"r1"), b"t3", 2.0) is Decision.RUN
    assert recent.begin(("echo", "alice", b"r2"), b"t4", 2.0) is Decision.RUN
    assert recent.begin(("other", "alice", b"r1"), b"t5", 2.0) is Decision.RUN


def test_a_repeat_while_it_runs_joins_and_every_ticket_is_answered() -> None:
    recent = RecentRequests()
    assert recent.begin(KEY, b"old", 0.0) is Decision.RUN
    assert recent.begin(KEY, b"new", 0.5) is Decision.JOIN
    assert recent.finished(KEY, 500, (b"failed",), 1.0) == [b"old", b"new"]
    assert recent.begin(KEY, b"later", 1.5) is Decision.REPLAY
    assert recent.reply_of(KEY) == (500, (b"failed",))  # it ran once: its outcome stands


def test_memory_is_bounded_by_entries_bytes_and_age() -> None:
    recent = RecentRequests(max_entries=2, max_bytes=10, max_age_s=5.0)
    for n in range(3):
        key = ("echo", "c", b"%d" % n)
        recent.begin(key, b"t", 0.0)
        recent.finished(key, 200, (b"x",), 0.0)
    assert len(recent) == 2
    assert recent.begin(("echo", "c", b"0"), b"t", 0.0) is Decision.RUN  # evicted: runs again
    big = ("echo", "c", b"big")
    recent.begin(big, b"t", 0.0)
    recent.finished(big, 200, (b"y" * 11,), 0.0)  # larger than the whole memory: not kept
    assert recent.begin(big, b"t", 0.0) is Decision.RUN
    recent.finished(big, 200, (b"",), 0.0)
    assert recent.begin(big, b"t", 4.9) is Decision.REPLAY
    assert recent.begin(big, b"t", 5.0) is Decision.RUN  # forgotten after max_age_s


def test_an_abandoned_run_is_forgotten() -> None:
    recent = RecentRequests()
    recent.begin(KEY, b"t1", 0.0)
    recent.abandoned(KEY)
    assert recent.begin(KEY, b"t2", 0.0) is Decision.RUN


def test_the_worker_rules_header_lists_w1_to_w7() -> None:
    import re

    from scale0.net import worker

    assert re.findall(r"^W(\d+) ", worker.__doc__ or "", re.M) == [str(i) for i in range(1, 8)]
