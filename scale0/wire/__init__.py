"""Bytes: S0P/1 frames to typed messages and back; pure, validates every untrusted frame."""
