"""Token layouts for the hook's tests: a shared system prompt, an instruction, evidence, a question.

The donor is ``[S][I][E][Q1]`` and the recipient ``[S][E][Q2]``: the recipient's exact match ends
after ``S`` (the donor's ``S`` is in the tree), and ``E`` sits in the donor ``len(I)`` positions
later, so semgov approves a *shifted* span over ``E`` that starts exactly where the exact match
ends: the case SGLang's prefix model can realize.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

S_LEN, I_LEN, E_LEN, Q_LEN = 64, 16, 400, 20


@dataclass(frozen=True)
class Layout:
    tokens: list[int]
    segments: list[tuple[str, int, int]]
    text: str


def _block(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 4000) for _ in range(n)]


def _layout(parts: list[tuple[str, list[int]]]) -> Layout:
    tokens: list[int] = []
    segs: list[tuple[str, int, int]] = []
    for role, toks in parts:
        segs.append((role, len(tokens), len(tokens) + len(toks)))
        tokens += toks
    words = " ".join(f"w{t}" for t in tokens[:200])
    return Layout(tokens, segs, f"Quarterly report. {words}")


@dataclass(frozen=True)
class Blocks:
    system: list[int]
    instruction: list[int]
    evidence: list[int]
    q1: list[int]
    q2: list[int]

    def donor(self) -> Layout:
        return _layout(
            [
                ("system", self.system),
                ("instruction", self.instruction),
                ("evidence", self.evidence),
                ("question", self.q1),
            ]
        )

    def recipient(self) -> Layout:
        return _layout([("system", self.system), ("evidence", self.evidence), ("question", self.q2)])

    def wrapped(self, wrapper: list[int]) -> Layout:
        """``[S][W'][E][Q2]``: the evidence behind a new instruction (a region past the front)."""
        return _layout(
            [
                ("system", self.system),
                ("instruction", wrapper),
                ("evidence", self.evidence),
                ("question", self.q2),
            ]
        )

    def other_evidence(self, seed: int) -> Layout:
        rng = random.Random(seed)
        return _layout([("system", self.system), ("evidence", _block(rng, E_LEN)), ("question", self.q2)])


def blocks(seed: int = 1, *, s_len: int = S_LEN, e_len: int = E_LEN) -> Blocks:
    rng = random.Random(seed)
    return Blocks(
        _block(rng, s_len), _block(rng, I_LEN), _block(rng, e_len), _block(rng, Q_LEN), _block(rng, Q_LEN)
    )


EMAIL_TOKEN = 4001
"""A token the test detokenizer renders as an e-mail address (PII)."""


def detokenizer() -> object:
    """SEMGOV_DETOKENIZER factory for the tests: words for tokens, an e-mail for EMAIL_TOKEN."""

    def detok(token_ids: object) -> str:
        ids = list(token_ids)  # type: ignore[call-overload]
        return "Quarterly report. " + " ".join(
            "alice.smith@example.com" if t == EMAIL_TOKEN else f"w{t}" for t in ids
        )

    return detok


def run_donor(
    h: object, b: Blocks, rid: str = "donor", tenant: str = "acme", namespace: str = "ns1"
) -> object:
    """Run ``b``'s donor prompt to completion on harness ``h`` (it then registers as a donor)."""
    lay = b.donor()
    req = h.new_req(rid, lay.tokens, h.context(tenant, namespace, lay.segments), text=lay.text)  # type: ignore[attr-defined]
    h.run(req)  # type: ignore[attr-defined]
    h.finish(req)  # type: ignore[attr-defined]
    return req


def new_recipient(
    h: object,
    b: Blocks,
    rid: str = "rcp",
    tenant: str = "acme",
    namespace: str = "ns1",
    lay: Layout | None = None,
) -> object:
    """A waiting request with ``b``'s recipient prompt (or ``lay``) on harness ``h``."""
    lay = lay or b.recipient()
    return h.new_req(rid, lay.tokens, h.context(tenant, namespace, lay.segments), text=lay.text)  # type: ignore[attr-defined]


LEAKY_SECRET = "Quarterly revenue of Initech was 4.2 million, contact alice@example.com"


def leaky_failing_detokenizer() -> object:
    """SEMGOV_DETOKENIZER factory: for a prompt of 640 tokens, fails with an error quoting the
    prompt and its tokens on its second line (as a careless library might): the hook must log
    neither. Other prompts get words."""

    def detok(token_ids: object) -> str:
        ids = list(token_ids)  # type: ignore[call-overload]
        if len(ids) == 640:
            raise ValueError(f"cannot decode\n{LEAKY_SECRET} {ids[:40]}")
        return " ".join(f"w{t}" for t in ids)

    return detok


# Reasons a fallback (a realization tried and failed) gives; one allow may see several (a retracted
# recipient is realized again under its one decision, regions fail one by one).
FALLBACK_REASONS = {"not_durable", "copy_failed", "donor_evicted", "canary_off"}


def assert_every_allow_has_an_outcome(records: list[dict[str, Any]]) -> Counter[str]:
    """The rule of engine_hooks.core.unrealized over an audit log: every allow decision record is
    followed by a realization or a realization_failed event naming it; every realization_failed
    event carries a reason code; an allow gets at most one event that is not a fallback's.
    Returns the not-realized events by reason."""
    from semgov.wire.names import DECISION_SCHEMA, not_realized_reason

    allows = {
        r["decision_id"] for r in records if r.get("schema") == DECISION_SCHEMA and r["decision"] == "allow"
    }
    outcomes: dict[str, list[str]] = {}
    reasons: Counter[str] = Counter()
    for r in records:
        if r.get("kind") not in ("realization", "realization_failed"):
            continue
        code = "realized" if r["kind"] == "realization" else not_realized_reason(r.get("detail"))
        assert code is not None, f"a realization_failed event without a reason code: {r.get('detail')!r}"
        outcomes.setdefault(str(r["decision_id"]), []).append(code)
        if code != "realized":
            reasons[code] += 1
    silent = sorted(allows - outcomes.keys())
    assert not silent, f"{len(silent)} allow(s) of {len(allows)} with no outcome event: {silent[:5]}"
    for decision_id, codes in outcomes.items():
        once = [c for c in codes if c != "realized" and c not in FALLBACK_REASONS]
        assert len(once) <= 1, (decision_id, codes)
    return reasons
