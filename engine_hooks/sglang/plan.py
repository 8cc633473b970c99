"""What a realization copies: the approved spans' run from the exact-match end (pure, no SGLang).

SGLang's prefix model is contiguous: a request's KV row is the exact-match path followed by
whatever ``init_load_back`` loaded, then the extend. So of everything a decision approved, the
hook can realize only the run of approved positions that starts exactly where the exact match
ends, inside the donor's live KV and trimmed to whole pages.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of recipient positions realized from donor positions (shift = recipient - donor)."""

    recipient_start: int
    donor_start: int
    length: int
    kind: str

    @property
    def shift(self) -> int:
        return self.recipient_start - self.donor_start

    def as_span(self) -> dict[str, Any]:
        return {
            "recipient_start": self.recipient_start,
            "donor_start": self.donor_start,
            "length": self.length,
            "kind": self.kind,
        }


def plan_pieces(
    spans: Sequence[Mapping[str, Any]], start: int, limit: int, donor_len: int, page_size: int
) -> list[Piece]:
    """The approved spans' positions contiguous from ``start``, cut at ``limit`` and at the donor's
    live KV (``donor_len``), and trimmed so that ``start + total`` stays page-aligned.

    Linear in the number of spans (one sort, one bisect per piece): the spans come from a signed
    decision, but their number is bounded by the policy's span search, not trusted here.
    """
    ordered = sorted(spans, key=lambda s: int(s["recipient_start"]))
    starts = [int(s["recipient_start"]) for s in ordered]
    pieces: list[Piece] = []
    p = start
    while p < limit:
        i = bisect.bisect_right(starts, p) - 1
        if i < 0:
            break
        s = ordered[i]
        rs, ds, n = int(s["recipient_start"]), int(s["donor_start"]), int(s["length"])
        if not rs <= p < rs + n:
            break
        d = ds + (p - rs)
        end = min(rs + n, limit, p + max(0, donor_len - d))
        if end <= p:
            break
        pieces.append(Piece(p, d, end - p, str(s["kind"])))
        p = end
    keep = ((p - start) // page_size) * page_size
    out: list[Piece] = []
    for pc in pieces:
        if keep <= 0:
            break
        n = min(pc.length, keep)
        out.append(Piece(pc.recipient_start, pc.donor_start, n, pc.kind))
        keep -= n
    return out


def planned_tokens(
    spans: Sequence[Mapping[str, Any]], start: int, limit: int, donor_len: int, page_size: int
) -> int:
    return sum(p.length for p in plan_pieces(spans, start, limit, donor_len, page_size))


_LABEL = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_label(rid: object) -> str:
    """How records name a request: the client's ``rid`` when it is a plain short label, else a
    hash of it. A label only: the hook keys nothing by it (state lives on SGLang's ``Req``, donors
    have server-generated ids), so two requests sending the same ``rid`` share nothing."""
    if isinstance(rid, str) and _LABEL.fullmatch(rid):
        return rid
    raw = repr(rid).encode("utf-8", "backslashreplace")
    return "rid-sha256:" + hashlib.sha256(raw).hexdigest()[:32]
