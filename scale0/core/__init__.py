"""Decisions: the pure broker state machine, driven by events and an injected clock."""
