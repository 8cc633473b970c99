"""Shared helpers for the audit log tests: real signed records, real logs, and frame surgery.

Records are real: decisions from the evaluator over the default policy and engine events signed
with :func:`semgov.signing.engine_events.sign_engine_event`, by the test asset key or by keys made with
``semgov keys generate``. Frames are split by hand from the documented format (docs/formats.md),
so a test can copy, move or forge one exactly as someone with write access to the directory can.
"""

from __future__ import annotations

import hashlib
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from semgov import Evaluator, SigningKey, load_policy, load_signing_key
from semgov.audit.frames import FRAME_HEADER, LOG_FILE
from semgov.audit.store import AuditLog
from semgov.signing.engine_events import engine_event, sign_engine_event
from semgov.signing.keys import load_public_key
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR, candidate, parse, request

KEY = load_signing_key(ASSETS / "decision-signing-key.pem")
PUB = load_public_key(ASSETS / "decision-signing-key.pub.pem")
PUB_PEM = str(ASSETS / "decision-signing-key.pub.pem")
ORIGIN = "semgov/test"
#: The top bit of a frame's index field marks a seal frame (docs/formats.md, "Audit log").
SEAL_FLAG = 1 << 63
AT = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


def decisions(keys: Any, signer: SigningKey, n: int, start: int = 0) -> list[bytes]:
    """``n`` real signed decision records, allow and deny mixed (every third is denied)."""
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, signer)
    out: list[bytes] = []
    for i in range(start, start + n):
        cand = candidate(keys, f"d-{i}", similarity=0.2 if i % 3 == 0 else 0.9)
        out += [d.canonical for d in ev.evaluate(parse(request([cand], request_id=f"r-{i}")))]
    return out


def realization(decision: bytes, signer: SigningKey) -> bytes:
    """A real signed ``realization`` engine event for an allow decision record."""
    import json

    dec = json.loads(decision)
    # NOTE: an event lists realized spans, which carry no plan: the decision's minus `recompute`.
    spans = [{k: v for k, v in s.items() if k != "recompute"} for s in dec["approved_spans"]]
    tokens = sum(s["length"] for s in spans)
    unsigned = engine_event(
        "realization",
        engine="sglang 0.5.23",
        at=AT,
        request_id=dec["request_id"],
        decision_id=dec["decision_id"],
        donor_id=dec["donor_id"],
        materialized_tokens=tokens,
        slots=range(tokens),
        spans=spans,
    )
    return sign_engine_event(unsigned, signer).canonical


def write_log(d: Path, records: list[bytes], signer: SigningKey = KEY, **kw: Any) -> None:
    """Append ``records`` with the real writer, one batch each, and close it (final checkpoint)."""
    kw.setdefault("commit_interval", 0.0)
    with AuditLog.open(d, signing_key=signer, origin=kw.pop("origin", ORIGIN), **kw) as log:
        for r in records:
            log.append(r).wait(10)


def split_frames(data: bytes) -> list[tuple[int, bytes]]:
    """``(index field, whole frame)`` for every frame of a records.log (assumed well formed)."""
    out, off = [], 0
    while off < len(data):
        index, length, _ = FRAME_HEADER.unpack_from(data, off)
        end = off + FRAME_HEADER.size + length
        out.append((index, data[off:end]))
        off = end
    return out


def record_payloads(d: Path) -> list[bytes]:
    """The record bytes of every record frame (seal frames skipped), in order."""
    frames = split_frames((d / LOG_FILE).read_bytes())
    return [f[FRAME_HEADER.size :] for i, f in frames if not i & SEAL_FLAG]


def reframe(index: int, record: bytes) -> bytes:
    """A well-formed record frame for ``record`` at ``index``, as anyone can compute it."""
    digest = hashlib.sha256(struct.pack(">Q", index) + record).digest()
    return FRAME_HEADER.pack(index, len(record), digest) + record
