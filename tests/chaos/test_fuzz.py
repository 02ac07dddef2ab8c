"""The socket fuzzer: its seeds are real messages, its mutations corrupt them, and a short run
against a real broker finds it alive, answering an honest client, with RSS bounded (issue 15 #7).
The long run is ``tools/fuzz --minutes N``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scale0.chaos.fuzz import CHANNELS, MUTATIONS, fuzz, mutate, seeds
from scale0.wire.configsync import decode_config_publication
from scale0.wire.registry import (
    BACKEND_SIGNATURES,
    FRONTEND_SIGNATURES,
    PEER_SIGNATURES,
    decode_to_broker,
)

SIGNATURES = {
    "frontend": FRONTEND_SIGNATURES,
    "backend": BACKEND_SIGNATURES,
    "peer": PEER_SIGNATURES,
    "link": PEER_SIGNATURES,  # what the broker's link DEALER reads is decoded as peer input
}


def test_every_seed_is_a_message_its_socket_accepts() -> None:
    grammar = seeds()
    assert set(grammar) == set(CHANNELS)
    for channel, messages in grammar.items():
        for frames in messages:
            if channel == "config":
                decode_config_publication(frames, max_frame_bytes=1 << 20)
            else:
                decode_to_broker(frames, max_frame_bytes=1 << 20, signatures=SIGNATURES[channel])


@given(st.integers(min_value=0, max_value=2**32), st.sampled_from(CHANNELS))
@settings(max_examples=300, deadline=None)
def test_a_mutation_always_yields_frames(seed: int, channel: str) -> None:
    r = random.Random(seed)
    frames, names = mutate(r, list(r.choice(seeds()[channel])))
    assert frames and all(isinstance(f, bytes) for f in frames)
    assert 1 <= len(names) <= 3 and set(names) <= set(MUTATIONS)


@pytest.mark.system
@pytest.mark.timeout(120)
def test_a_short_fuzz_run_leaves_the_broker_up_and_serving(tmp_path: Path) -> None:
    report = fuzz(tmp_path, seconds=6.0, seed=15, per_round=300)
    print(report.as_dict())
    assert report.problems == []
    assert set(report.sent) == set(CHANNELS) and min(report.sent.values()) > 100
    assert set(report.mutations) == set(MUTATIONS)
    assert report.honest_ok == report.rounds >= 2
    # The broker answered the garbage it could route an answer to, with well-formed errors.
    assert any("DisconnectError 400" in kind for kind in report.answers)
    # Garbage reached every socket and was judged there: the peer ROUTER and the link DEALER
    # (peer_malformed), the config SUB (config_dropped / config_refused), the workers' side.
    # Which of the config SUB's two verdicts a time-bounded run meets depends on how many
    # mutations it gets through: one of them must be there.
    assert report.logged["config_dropped"] + report.logged["config_refused"] > 0, report.logged
    for event in ("peer_malformed", "broker_stopped"):
        assert report.logged[event] > 0, (event, report.logged)
