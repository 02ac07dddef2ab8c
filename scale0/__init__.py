"""Scale0: a family of ZeroMQ brokers that route by service, share liveness and one signed config."""

__version__ = "0.1.0"
