"""Signing keys, config signatures and password hashes, on the cryptography package."""
