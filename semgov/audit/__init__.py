"""Tamper-evident audit log: RFC 6962 Merkle tree, C2SP signed checkpoints, proofs, durable storage."""
