"""Reading captured-traffic JSON Lines (plain or gzip), one request per line.

A malformed line never stops the rest: it is reported with its line number and,
when enough of it parses to know which donors were asked about, those donors
still get a (deny) decision.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from semgov.errors import InputError
from semgov.models import CapturedRequest

MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A line that is not a valid captured request."""

    line: int
    reason: str
    request_id: str | None
    tenant: str
    namespace: str
    donor_ids: tuple[str, ...]


def _describe(e: ValidationError) -> str:
    errs = e.errors(include_url=False)
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = f"{loc}: {first['msg']}" if loc else first["msg"]
    if len(errs) > 1:
        msg += f" (+{len(errs) - 1} more)"
    return msg


def _salvage(raw: bytes, line: int, reason: str) -> MalformedLine:
    """Recover request id and donor ids from a malformed line, when they are there."""
    rid: str | None = None
    tenant = namespace = ""
    donors: list[str] = []
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("request_id"), str):
            rid = doc["request_id"]
        tenant = doc["tenant"] if isinstance(doc.get("tenant"), str) else ""
        namespace = doc["namespace"] if isinstance(doc.get("namespace"), str) else ""
        cands = doc.get("candidates")
        if rid is not None and isinstance(cands, list):
            for c in cands:
                if isinstance(c, dict) and isinstance(c.get("donor_id"), str) and c["donor_id"] not in donors:
                    donors.append(c["donor_id"])
    return MalformedLine(line, reason, rid, tenant, namespace, tuple(donors))


def parse_line(raw: bytes, line: int) -> CapturedRequest | MalformedLine:
    """Parse one JSONL line; never raises for bad content."""
    if len(raw) > MAX_LINE_BYTES:
        return MalformedLine(line, f"line longer than {MAX_LINE_BYTES} bytes", None, "", "", ())
    try:
        return CapturedRequest.model_validate_json(raw)
    except ValidationError as e:
        return _salvage(raw, line, _describe(e))
    except (ValueError, RecursionError) as e:
        return _salvage(raw, line, f"{type(e).__name__}: {e}")


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        f: IO[bytes] = open(path, "rb")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", source=path) from e
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    return f


def read_captured(path: str | Path) -> Iterator[CapturedRequest | MalformedLine]:
    """Yield each non-blank line of a captured JSONL file (``-`` for stdin, ``.gz`` ok)."""
    name = str(path)
    f = _open(name)
    try:
        n = 0
        try:
            for n, raw in enumerate(f, start=1):  # noqa: B007
                if raw.strip():
                    yield parse_line(raw, n)
        except (OSError, EOFError, gzip.BadGzipFile, io.UnsupportedOperation) as e:
            yield MalformedLine(n + 1, f"cannot read further: {e}", None, "", "", ())
    finally:
        if f is not sys.stdin.buffer:
            f.close()
