"""Synthetic requests at a chosen prompt length, for the decision-latency benchmark.

Token ids are random (seeded), so every cohort's spans are exactly as designed:
a cohort here is the token-level shape of a (recipient, donor) pair.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import Keyring, SigningKey, provenance_payload, sign_provenance
from semgov.keys import TrustedKey

CONTRACT = {"id": "financials", "schema_sha256": "ab" * 32}
TASK = {"id": "extract_financials", "version": "1"}
COHORTS = ("exact", "question_variant", "shifted", "unrelated", "other_tenant", "tampered")


def _prompt(parts: list[tuple[str, np.ndarray]]) -> dict[str, Any]:
    toks: list[int] = []
    segs = []
    for role, t in parts:
        segs.append({"role": role, "start": len(toks), "end": len(toks) + len(t)})
        toks.extend(int(x) for x in t)
    return {"token_ids": toks, "segments": segs}


class Workload:
    """Keys and a request factory: ``request(cohort, n_tokens)``."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.prov = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1")
        self.decision_key = SigningKey.from_private(Ed25519PrivateKey.generate())
        self.keyring = Keyring([TrustedKey("k1", self.prov.public_key, False)])
        self.n = 0

    def _toks(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 49152, n, dtype=np.int64)

    def request(self, cohort: str, n_tokens: int) -> dict[str, Any]:
        self.n += 1
        sys_, instr, q = self._toks(24), self._toks(40), self._toks(30)
        evidence = self._toks(n_tokens - 94)
        donor = _prompt([("system", sys_), ("instruction", instr), ("evidence", evidence), ("question", q)])
        if cohort == "exact":
            recip = donor
        elif cohort == "question_variant":
            recip = _prompt(
                [
                    ("system", sys_),
                    ("instruction", instr),
                    ("evidence", evidence),
                    ("question", self._toks(30)),
                ]
            )
        elif cohort == "shifted":
            recip = _prompt(
                [("system", sys_), ("instruction", self._toks(52)), ("evidence", evidence), ("question", q)]
            )
        elif cohort == "unrelated":
            recip = _prompt(
                [
                    ("system", sys_),
                    ("instruction", instr),
                    ("evidence", self._toks(len(evidence))),
                    ("question", q),
                ]
            )
        else:
            recip = donor
        payload = provenance_payload(
            donor_id=f"d-{self.n}",
            tenant="globex" if cohort == "other_tenant" else "acme",
            namespace="research/entity-001",
            task=TASK,
            response_contract=CONTRACT,
            created_at=datetime(2026, 11, 28, 10, tzinfo=UTC),
            expires_at=datetime(2026, 12, 5, 10, tzinfo=UTC),
            policy_version="default@1",
            token_ids=donor["token_ids"],
            segments=donor["segments"],
            text=donor.get("text"),
        )
        provenance = sign_provenance(payload, self.prov)
        if cohort == "tampered":  # edited after signing
            provenance["payload"] = {**payload, "expires_at": "2027-12-05T10:00:00Z"}
        cand = {
            "donor_id": f"d-{self.n}",
            "similarity": 0.9,
            "prompt": donor,
            "provenance": provenance,
        }
        return {
            "schema": "semgov.captured_request/v1",
            "request_id": f"r-{self.n}",
            "received_at": "2026-11-29T10:00:00Z",
            "tenant": "acme",
            "namespace": "research/entity-001",
            "task": TASK,
            "response_contract": CONTRACT,
            "prompt": recip,
            "candidates": [cand],
        }
