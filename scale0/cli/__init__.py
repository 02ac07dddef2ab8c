"""Command-line front ends (click): scale0ctl, scale0-broker, scale0-worker."""
