"""Signing: canonical JSON, Ed25519 keys and keyrings, signed decision records, donor
provenance, and engine events."""
