"""Intake: reading captured traffic (JSON Lines, plain or gzip) under resource limits."""
