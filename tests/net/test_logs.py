"""The JSON log lines of broker processes (scale0.net.logs)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from scale0.net.logs import LOGGER_NAME, JsonFormatter, configure, level_number, log_event


@pytest.fixture
def scale0_logger() -> Iterator[logging.Logger]:
    """The ``scale0`` logger, restored afterwards (configure() changes process-wide state)."""
    logger = logging.getLogger(LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handlers, level, propagate = saved
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_has_ts_level_event_broker_and_fields(scale0_logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure("info", stream=stream)
    log_event(
        logging.getLogger(f"{LOGGER_NAME}.broker"),
        logging.INFO,
        "broker_ready",
        {"endpoints": {"frontend": "tcp://127.0.0.1:1"}, "sender": b"\x00\xff", "level": "x"},
        broker="solo",
    )
    (line,) = _lines(stream)
    assert isinstance(line["ts"], float)
    assert line["level"] == "info"
    assert line["event"] == "broker_ready"
    assert line["broker"] == "solo"
    assert line["endpoints"] == {"frontend": "tcp://127.0.0.1:1"}
    assert line["sender"] == "00ff"  # bytes are shown as hex
    assert line["level_"] == "x"  # a field never overwrites the line's own keys


def test_level_filters_and_configure_is_idempotent(scale0_logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure("warning", stream=stream)
    configure("warning", stream=stream)
    log_event(scale0_logger, logging.INFO, "quiet")
    log_event(scale0_logger, logging.WARNING, "loud")
    assert [line["event"] for line in _lines(stream)] == ["loud"]


def test_exceptions_carry_a_traceback(scale0_logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure("debug", stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        log_event(scale0_logger, logging.ERROR, "internal_error", exc_info=True)
    (line,) = _lines(stream)
    assert "ValueError: boom" in str(line["traceback"])


def test_unserializable_fields_still_give_a_line() -> None:
    loop: list[object] = []
    loop.append(loop)
    record = logging.LogRecord("scale0", logging.INFO, __file__, 1, "e", None, None)
    record.s0_event = "e"
    record.s0_fields = {"loop": loop}
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "e"
    assert "log_error" in line


def test_level_names() -> None:
    assert level_number("debug") == logging.DEBUG
    assert level_number("error") == logging.ERROR
    assert level_number("nonsense") == logging.WARNING
