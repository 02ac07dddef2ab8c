"""The broker's event log (docs/trend.md "In the broker"): what the core reports, as records.

:class:`BrokerEventLog` owns one :class:`~scale0.trend.eventlog.EventLogWriter` for the node
and translates: ``RequestDone`` effects into ``request`` records (the hot path: one call that
appends one tuple), the ``Log`` effects the core already emits (worker_ready, worker_lost,
heartbeat_gap, peer_up, peer_lost, broker_state, config_applied, config_refused,
config_conflict) into lifecycle records, and management requests with their answers into
``mgmt_command`` records. It decides nothing the core decides; it only renames and converts.

Times: the core's ``now`` is monotonic seconds; records want wall-clock milliseconds. The
offset between the two is fixed once, at construction, so a record costs no clock read and
records of one run are ordered as the core saw them.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from scale0.core.commands import COMMANDS
from scale0.core.effects import Channel, Log, RequestDone
from scale0.trend.eventlog import EventLogWriter, request_templates
from scale0.wire.admin import ManagementReply, ManagementRequest

__all__ = ["BrokerEventLog", "WriterStats", "mgmt_result"]

#: Management requests remembered until their answer (the oldest is forgotten beyond this).
MAX_ASKED: Final = 256
_quote: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
#: Silences shorter than this are not reported as gap_ms on peer_down (a DISCONNECT: none).
MIN_GAP_MS: Final = 1


def mgmt_result(code: int) -> str:
    """A MANAGEMENTREP code as the record's ``result``: ok, denied (401, 403) or error <code>."""
    if code == 200:
        return "ok"
    if code in (401, 403):
        return "denied"
    return f"error {code}"


class WriterStats(Mapping[str, int]):
    """The writer's counters, read when looked at: what the core puts in ``status``."""

    __slots__ = ("_writer",)

    def __init__(self, writer: EventLogWriter) -> None:
        self._writer = writer

    def __getitem__(self, key: str) -> int:
        return self._writer.stats()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._writer.stats())

    def __len__(self) -> int:
        return len(self._writer.stats())


class BrokerEventLog:
    """One broker's event log: the writer plus the translation of what the core reports.

    Call everything on the loop thread (the writer's counters are plain integers).
    """

    def __init__(
        self,
        writer: EventLogWriter,
        *,
        wall_ms: int | None = None,
        monotonic: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``wall_ms`` and ``monotonic``: the same instant on both clocks (default: now)."""
        self.writer = writer
        self._templates = request_templates(writer.broker)
        writer.convert = self.convert
        #: The hot path: one call per finished request, which appends the RequestDone as it is
        #: to the writer's buffer (``EventLogWriter.request_raw``); ``convert`` makes the record
        #: on the writer's thread.
        self.request: Callable[[RequestDone], bool] = writer.request_raw
        self.stats = WriterStats(writer)
        mono = clock() if monotonic is None else monotonic
        wall = time.time_ns() // 1_000_000 if wall_ms is None else wall_ms
        self._base_ms = wall - mono * 1000.0  # ts_ms = int(base + now * 1000)
        self._clock = clock
        #: Workers joined and not gone: each gets worker_leave "shutdown" at a clean stop.
        self.workers: dict[str, None] = {}
        #: Management requests waiting for their answer: (channel, routing id, request id) ->
        #: (user, command). Empty most of the time: the node checks it before looking closer.
        self.asked: OrderedDict[tuple[Channel, bytes, str], tuple[str, str]] = OrderedDict()
        self._translate: dict[str, Callable[[int, Mapping[str, Any]], None]] = {
            "worker_ready": self._worker_ready,
            "worker_lost": self._worker_lost,
            "heartbeat_gap": self._heartbeat_gap,
            "peer_up": self._peer_up,
            "peer_lost": self._peer_lost,
            "broker_state": self._broker_state,
            "config_applied": self._config_applied,
            "config_refused": self._config_refused,
            "config_conflict": self._config_conflict,
        }

    def ts_ms(self, now: float) -> int:
        """A monotonic time of the core as ms since the epoch."""
        return int(self._base_ms + now * 1000.0)

    # ---- life cycle ------------------------------------------------------------------------

    def started(self) -> None:
        """The sockets are bound: broker_start."""
        self.writer.event("broker_start", self.ts_ms(self._clock()))

    def stopped(self, timeout_s: float = 5.0) -> bool:
        """A clean stop: worker_leave (shutdown) for every worker still here, broker_stop, and
        the writer closed (its last file renamed). False if the writer did not finish in time."""
        ts = self.ts_ms(self._clock())
        for worker in self.workers:
            self.writer.event("worker_leave", ts, worker=worker, reason="shutdown")
        self.workers.clear()
        self.writer.event("broker_stop", ts)
        return self.writer.close(timeout_s)

    # ---- the hot path ----------------------------------------------------------------------

    def convert(self, done: RequestDone) -> tuple[int, str]:
        """A RequestDone as (ts_ms, its request line): run by the writer thread, one
        %-format per line (``request_templates``). Reads only the fixed clock offset and the
        templates, so it is safe off the loop thread."""
        (service, worker, client, forwarded, started, finished, bytes_in, bytes_out, status,
         attempts) = done  # fmt: skip
        base = self._base_ms
        ts_ms = int(base + finished * 1000.0)
        args: list[object] = [ts_ms, _quote(service)]
        if worker is not None:
            args.append(worker.hex())
        if client is not None:
            args.append(client.hex())
        if forwarded is not None:
            args.append(_quote(forwarded))
        args += (
            int(base + started * 1000.0),
            (finished - started) * 1000.0,
            bytes_in,
            bytes_out,
            status,
            attempts,
        )
        template = self._templates[worker is not None, client is not None, forwarded is not None]
        return ts_ms, template % tuple(args)

    # ---- what the core logs ----------------------------------------------------------------

    def log(self, effect: Log) -> None:
        """Record what a Log effect of the core means for the event log, if anything."""
        translate = self._translate.get(effect.event)
        if translate is not None:
            translate(self.ts_ms(self._clock()), effect.fields)

    def _worker_ready(self, ts: int, fields: Mapping[str, Any]) -> None:
        worker = str(fields["worker"])
        self.workers[worker] = None
        services = [str(s) for s in fields.get("services", ())]
        self.writer.event("worker_join", ts, worker=worker, services=services)

    def _worker_lost(self, ts: int, fields: Mapping[str, Any]) -> None:
        worker = str(fields["worker"])
        self.workers.pop(worker, None)
        reason = str(fields.get("reason", "unknown"))
        # Only an expiry is a silence that the worker was down for (heartbeats stopped).
        gap = int(fields.get("silent_ms", 0)) if reason == "expired" else None
        self.writer.event("worker_leave", ts, worker=worker, reason=reason, gap_ms=gap)

    def _heartbeat_gap(self, ts: int, fields: Mapping[str, Any]) -> None:
        self.writer.event(
            "heartbeat_gap", ts, worker=str(fields["worker"]), gap_ms=int(fields["gap_ms"])
        )

    def _peer_up(self, ts: int, fields: Mapping[str, Any]) -> None:
        self.writer.event("peer_up", ts, peer=str(fields["peer"]))

    def _peer_lost(self, ts: int, fields: Mapping[str, Any]) -> None:
        silent = int(fields.get("silent_ms", 0))
        self.writer.event(
            "peer_down",
            ts,
            peer=str(fields["peer"]),
            reason=str(fields.get("reason", "unknown")),
            gap_ms=silent if silent >= MIN_GAP_MS else None,
        )

    def _broker_state(self, ts: int, fields: Mapping[str, Any]) -> None:
        self.writer.event(
            "state_change",
            ts,
            state=str(fields["to"]),
            prev_state=str(fields["from"]),
            reason=str(fields.get("by", "unknown")),
        )

    def _config_applied(self, ts: int, fields: Mapping[str, Any]) -> None:
        self.writer.event(
            "config_applied",
            ts,
            config_version=int(fields["version"]),
            sha256=str(fields["sha256"]),
        )

    def _config_refused(self, ts: int, fields: Mapping[str, Any]) -> None:
        version = fields.get("version")
        self.writer.event(
            "config_refused",
            ts,
            # An offer whose version could not be read (not a config at all) is version 0.
            config_version=int(version) if isinstance(version, int) else 0,
            sha256=str(fields["sha256"]) if fields.get("sha256") else None,
            reason=str(fields.get("reason", "unknown")),
        )

    def _config_conflict(self, ts: int, fields: Mapping[str, Any]) -> None:
        # An equal-version rival that lost (K4): refused in favour of the smaller sha256.
        self.writer.event(
            "config_refused",
            ts,
            config_version=int(fields["version"]),
            sha256=str(fields["dropped"]),
            reason=f"conflict: kept {fields['kept']}",
        )

    # ---- management ------------------------------------------------------------------------

    def management_asked(
        self, channel: Channel, routing_id: bytes, request: ManagementRequest
    ) -> None:
        """A management request reached the core (its credentials are being checked, or its
        HTTP session is live): remember who asked what until its answer goes out."""
        asked = self.asked
        asked[(channel, routing_id, request.request_id)] = (request.auth_id, request.command)
        while len(asked) > MAX_ASKED:
            asked.popitem(last=False)

    def management_answered(
        self, channel: Channel, routing_id: bytes, reply: ManagementReply
    ) -> None:
        """Its MANAGEMENTREP goes out: an ``mgmt_command`` record, except for read commands
        that succeeded (the management page asks ``status`` every few seconds)."""
        key = (channel, routing_id, reply.request_id)
        asked = self.asked.pop(key, None)
        if asked is None:
            return
        user, command = asked
        known = COMMANDS.get(command)
        if reply.code == 200 and known is not None and known.role == "read":
            return
        self.writer.event(
            "mgmt_command",
            self.ts_ms(self._clock()),
            user=user,
            command=command,
            result=mgmt_result(reply.code),
        )
