"""Kept for the tests written against it: the harness now lives in scale0.testing."""

from scale0.testing import BrokerProcess, broker_command, running_broker, write_configs

__all__ = ["BrokerProcess", "broker_command", "running_broker", "write_configs"]
