"""What a realization copies: the approved runs of a prompt, in SGLang's terms (pure, no SGLang).

SGLang's prefix model is contiguous: a request's KV row is the exact-match path followed by
whatever ``init_load_back`` loaded, then the extend. So the hook realizes approved positions in
two ways:

- the *front* run (:func:`plan_pieces` from the exact-match end): loaded at admission;
- *regions* further into the prompt (:func:`plan_regions`): SGLang's chunked prefill is made to
  end a chunk exactly where a region starts, and the region's K/V is written into the request's
  row before the next chunk, which then starts after it. Each region costs one more prefill
  round; a region shorter than ``min_tokens`` is not worth it and runs cold, and at most
  ``max_regions`` are realized per request (the rest of the prompt is then computed).

Every run lies inside the donor's live KV and is trimmed to whole pages.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semgov.wire.models import span_dict


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
        """The piece as a span's wire fields (``recipient_start``, ``donor_start``, ``length``, ``kind``)."""
        return span_dict(self)


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


@dataclass(frozen=True, slots=True)
class Region:
    """Approved positions realized after fresh ones: ``pieces`` contiguous from ``start``."""

    start: int
    pieces: tuple[Piece, ...]

    @property
    def length(self) -> int:
        return sum(p.length for p in self.pieces)

    @property
    def end(self) -> int:
        return self.start + self.length


def plan_regions(
    spans: Sequence[Mapping[str, Any]],
    start: int,
    limit: int,
    donor_len: int,
    page_size: int,
    *,
    max_regions: int,
    min_tokens: int,
) -> list[Region]:
    """Approved runs that begin after ``start`` (the end of what the request already has or
    loads at admission), each starting on a page boundary, in prompt order: at most
    ``max_regions``, each at least ``min_tokens`` (and one page) long, cut at ``limit`` and at the
    donor's live KV like :func:`plan_pieces`.

    Bounded: one sort, then per span at most one :func:`plan_pieces` walk of the spans.
    """
    ordered = sorted(spans, key=lambda s: int(s["recipient_start"]))
    out: list[Region] = []
    p = start
    for s in ordered:
        if len(out) >= max_regions:
            break
        rs, n = int(s["recipient_start"]), int(s["length"])
        a = -(-max(rs, p + 1) // page_size) * page_size  # NOTE: strictly after p, on a page boundary
        if a >= min(rs + n, limit):
            continue
        pieces = tuple(plan_pieces(ordered, a, limit, donor_len, page_size))
        region = Region(a, pieces)
        if region.length >= max(min_tokens, page_size):
            out.append(region)
            p = region.end
    return out


def recompute_leading(spans: Sequence[Mapping[str, Any]], share: float = 0.0) -> list[dict[str, Any]]:
    """What of the approved spans may be copied: each span less its leading ``recompute`` tokens
    (the decision record's plan, signed; recomputed by the model instead), and for a *shifted* span
    at least the leading ``ceil(share * length)`` (the operator's floor,
    ``SEMGOV_SHIFTED_RECOMPUTE_PCT``). A span without ``recompute`` (a v1 record) has none planned."""
    out: list[dict[str, Any]] = []
    for s in spans:
        rs, ds, n, kind = int(s["recipient_start"]), int(s["donor_start"]), int(s["length"]), str(s["kind"])
        floor = math.ceil(share * n) if kind == "shifted" and share > 0 else 0
        r = min(n, max(int(s.get("recompute", 0)), floor))
        if n - r > 0:
            out.append({"recipient_start": rs + r, "donor_start": ds + r, "length": n - r, "kind": kind})
    return out


def unrealizable_reason(
    approved: Sequence[Mapping[str, Any]],
    copyable: Sequence[Mapping[str, Any]],
    start: int,
    *,
    max_regions: int,
    min_region_tokens: int,
    page_size: int,
) -> str | None:
    """Why an allow realizes nothing here, given its approved spans, what of them may be copied
    (:func:`recompute_leading`, canaries applied) and where the exact match ends; None when it
    approved nothing past the exact match (SGLang's own prefix cache already has it all)."""
    if not any(int(s["recipient_start"]) + int(s["length"]) > start for s in approved):
        return None
    past = [s for s in copyable if int(s["recipient_start"]) + int(s["length"]) > start]
    if not past:
        return (
            "nothing of the approved spans past the exact match may be copied (the plan recomputes it, "
            "or canaries turned shifted reuse off for this scope, or it is on canary probation)"
        )
    first = int(min(int(s["recipient_start"]) for s in past))
    if first > start and max_regions == 0:
        return (
            f"the approved run starts at {first}, after fresh tokens past the exact match at {start}, "
            "and SEMGOV_MAX_REGIONS is 0"
        )
    return (
        f"the approved runs past the exact match at {start} (the first at {first}) are shorter than "
        f"SEMGOV_MIN_REGION_TOKENS ({min_region_tokens}) or one {page_size}-token page once aligned, beyond "
        f"SEMGOV_MAX_REGIONS ({max_regions}), or past the donor's live KV"
    )


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
