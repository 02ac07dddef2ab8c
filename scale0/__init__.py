"""Scale0: a family of ZeroMQ brokers that route by service and share liveness and one config."""

__version__ = "0.1.0"
