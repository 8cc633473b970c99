"""Hashes that bind a donor's text and segments into its signed provenance payload.

NOTE: every field of a candidate that can change a decision is either signed or can only
tighten one: the token ids (``token_ids_sha256``), the segment layout (``segments_sha256``:
relabelling an ``instruction`` segment as ``evidence`` would get instruction tokens approved as
a shifted span) and the text (``text_sha256``: an empty or clean text would pass the PII gate as
"scanned"). Both hashes are over unambiguous encodings: RFC 8785 JSON of the segment list, and
the text's UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from semgov.signing.canonical import canonicalize


def segments_sha256(segments: Iterable[Any]) -> str:
    """SHA-256 of the RFC 8785 JSON list of ``{"role", "start", "end"}`` objects, in prompt order.

    Accepts :class:`~semgov.wire.models.Segment` objects, mappings, or ``(role, start, end)`` triples.
    """
    out: list[dict[str, object]] = []
    for s in segments:
        if isinstance(s, Mapping):
            role, start, end = s["role"], s["start"], s["end"]
        elif isinstance(s, tuple):
            role, start, end = s
        else:
            role, start, end = s.role, s.start, s.end
        out.append({"role": str(role), "start": int(start), "end": int(end)})
    return hashlib.sha256(canonicalize(out)).hexdigest()


def text_sha256(text: str) -> str:
    """SHA-256 of the text's UTF-8 bytes (lone surrogates kept as is, so any str hashes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
