"""Internals: no stability promise. Public API lives in ``semgov``."""
