"""Signed policy bundles in OPA's bundle format: build (``semgov bundle build``), verify
(``semgov bundle verify``) and unpack for a worker (docs/bundles.md).

Modules: :mod:`~semgov.bundle.canonical` (OPA's file digests, revision order),
:mod:`~semgov.bundle.archive` (bounded tar.gz reading), :mod:`~semgov.bundle.jws` (ES256 JWS,
trusted keys), :mod:`~semgov.bundle.bundle` (build and verify, pure),
:mod:`~semgov.bundle.files` (collecting and unpacking files).
"""
