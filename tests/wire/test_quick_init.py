"""quick_init: the hot path's messages keep the constructor @dataclass would give them (same
parameters, defaults, results and frozenness), only cheaper; and it refuses classes it cannot
serve exactly."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from scale0.core.effects import Channel, Send
from scale0.wire.client import ClientReply
from scale0.wire.frames import quick_init
from scale0.wire.worker import WorkerRequest


def _dataclass_twin(cls: type) -> Any:
    """The same fields under @dataclass's own __init__ (a fresh class, not decorated)."""
    fields = [
        (f.name, f.type, f.default) if f.default is not dataclasses.MISSING else (f.name, f.type)
        for f in dataclasses.fields(cls)
    ]
    return dataclasses.make_dataclass("Twin", fields, frozen=True, slots=True)


@pytest.mark.parametrize("cls", [Send, ClientReply, WorkerRequest])
def test_the_constructor_is_the_one_dataclass_writes(cls: type) -> None:
    twin = _dataclass_twin(cls)
    ours = inspect.signature(cls.__init__).parameters
    theirs = inspect.signature(twin.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]
    assert cls.__init__ is not twin.__init__


def test_it_builds_equal_frozen_objects_by_position_and_by_keyword() -> None:
    reply = ClientReply("echo", b"r1", 200, (b"a",))
    assert reply == ClientReply(service="echo", request_id=b"r1", status=200, body=(b"a",))
    assert ClientReply("echo", b"r1", 200).body == ()
    assert WorkerRequest(b"t", "echo") == WorkerRequest(ticket=b"t", service="echo", body=())
    send = Send(Channel.BACKEND, b"w", reply)
    assert (send.channel, send.routing_id, send.message) == (Channel.BACKEND, b"w", reply)
    assert hash(send) == hash(Send(Channel.BACKEND, b"w", reply))
    assert dataclasses.replace(reply, status=404).status == 404
    with pytest.raises(dataclasses.FrozenInstanceError):
        reply.status = 500  # type: ignore[misc]
    with pytest.raises(TypeError):
        ClientReply("echo", b"r1")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Send(Channel.BACKEND, b"w", reply, 1)  # type: ignore[call-arg]


def test_it_refuses_what_it_cannot_serve_exactly() -> None:
    @dataclass(frozen=True, slots=True)
    class Factory:
        items: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class Posted:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Factory, KeywordOnly, NoSlots, Posted, int):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)
