"""Which captured pairs a calibration run measures: decided locally with shifted spans tried
everywhere, the allowed ones sampled per scope and kind (pure: no engine, no I/O but the capture).

The captured requests are decided by a *trial* copy of the policy (:func:`trial_policy`): shifted
spans on in every scope and nothing planned (no head, no tail), so every shifted span the policy's
other settings approve is a candidate. Of the allowed (request, candidate) pairs, at most
``per_scope`` per (task id, response contract id, kind) are drawn with a seeded generator; with
``max_pairs`` the scopes take turns, so a small run still measures every scope.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semgov.decide import Evaluator
from semgov.intake.capture import read_captured
from semgov.policy.yaml.model import Policy
from semgov.wire.models import CapturedRequest


@dataclass(frozen=True)
class Case:
    """One sampled pair: the request, which of its candidates is the donor, the local decision."""

    request: CapturedRequest
    candidate: int
    record: dict[str, Any]
    kind: str  # "shifted" when any approved span is shifted, else "prefix"

    @property
    def scope(self) -> tuple[str, str]:
        return (self.request.task.id, self.request.response_contract.id)


def trial_policy(policy: Policy) -> Policy:
    """``policy`` with shifted spans on in every scope and nothing planned: what calibration tries.

    ``ValueError`` when ``token_verification.allow_shifted`` is false: shifted reuse is forbidden
    there, and no rule calibration writes could turn it on."""
    if not policy.token_verification.allow_shifted:
        raise ValueError(
            "token_verification.allow_shifted is false: shifted reuse is forbidden by this policy, and no "
            "quality rule can turn it on; there is nothing to calibrate"
        )
    q = policy.quality
    neutral = {"allow_shifted": True, "shifted_recompute_percent": 0, "min_recompute_tokens": 0,
               "shifted_recompute_tail_tokens": 0}  # fmt: skip
    rules = [r.model_copy(update=dict.fromkeys(neutral)) for r in q.rules]  # NOTE: the scope only
    return policy.model_copy(update={"quality": q.model_copy(update={**neutral, "rules": rules})})


def sample_cases(
    path: Path, ev: Evaluator, per_scope: int, seed: int, max_pairs: int | None = None
) -> tuple[list[Case], int]:
    """Allowed (request, candidate) pairs of the capture, at most ``per_scope`` per scope and kind
    (seeded), at most ``max_pairs`` in all (scopes taking turns); and how many requests were read."""
    found: dict[tuple[str, str, str], list[Case]] = {}
    n = 0
    for item in read_captured(path):
        if not isinstance(item, CapturedRequest):
            continue
        n += 1
        for i, d in enumerate(ev.evaluate(item)):
            if d.decision != "allow":
                continue
            kind = "shifted" if any(s["kind"] == "shifted" for s in d.approved_spans) else "prefix"
            key = (item.task.id, item.response_contract.id, kind)
            found.setdefault(key, []).append(Case(item, i, d.record, kind))
    rng = random.Random(seed)
    drawn = [rng.sample(found[k], min(per_scope, len(found[k]))) for k in sorted(found)]
    if max_pairs is None:
        return [c for group in drawn for c in group], n
    out: list[Case] = []
    for turn in range(max((len(g) for g in drawn), default=0)):
        out += [g[turn] for g in drawn if turn < len(g)]
    return out[:max_pairs], n
