"""Facts: what typed code establishes about a donor candidate before any policy decides
(signed provenance, token verification and spans, PII, bindings)."""
