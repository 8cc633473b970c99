"""Synthetic requests at a chosen prompt length, for the decision-latency benchmark.

Token ids are random (seeded), so every cohort's spans are exactly as designed:
a cohort here is the token-level shape of a (recipient, donor) pair. Requests are put together
as every workload does (:mod:`engine_hooks.reference.workload`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine_hooks.reference.workload import VOCAB_SIZE, candidate, captured_json, donor_payload, token_prompt
from semgov import Keyring, SigningKey, sign_provenance
from semgov.signing.keys import TrustedKey

CONTRACT = {"id": "financials", "schema_sha256": "ab" * 32}
TASK_ID = "extract_financials"
NAMESPACE = "research/entity-001"
CREATED = datetime(2026, 11, 28, 10, tzinfo=UTC)  # every donor; its provenance expires 7 days later
RECEIVED = datetime(2026, 11, 29, 10, tzinfo=UTC)  # every request
COHORTS = ("exact", "question_variant", "shifted", "unrelated", "other_tenant", "tampered")


class Workload:
    """Keys and a request factory: ``request(cohort, n_tokens)``."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.prov = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1")
        self.decision_key = SigningKey.from_private(Ed25519PrivateKey.generate())
        self.keyring = Keyring([TrustedKey("k1", self.prov.public_key, False)])
        self.n = 0

    def _toks(self, n: int) -> np.ndarray:
        return self.rng.integers(0, VOCAB_SIZE, n, dtype=np.int64)

    def request(self, cohort: str, n_tokens: int) -> dict[str, Any]:
        self.n += 1
        sys_, instr, q = self._toks(24), self._toks(40), self._toks(30)
        evidence = self._toks(n_tokens - 94)
        donor = token_prompt(
            [("system", sys_), ("instruction", instr), ("evidence", evidence), ("question", q)]
        )
        if cohort == "exact":
            recip = donor
        elif cohort == "question_variant":
            recip = token_prompt(
                [
                    ("system", sys_),
                    ("instruction", instr),
                    ("evidence", evidence),
                    ("question", self._toks(30)),
                ]
            )
        elif cohort == "shifted":
            recip = token_prompt(
                [("system", sys_), ("instruction", self._toks(52)), ("evidence", evidence), ("question", q)]
            )
        elif cohort == "unrelated":
            recip = token_prompt(
                [
                    ("system", sys_),
                    ("instruction", instr),
                    ("evidence", self._toks(len(evidence))),
                    ("question", q),
                ]
            )
        else:
            recip = donor
        payload = donor_payload(
            donor_id=f"d-{self.n}",
            tenant="globex" if cohort == "other_tenant" else "acme",
            namespace=NAMESPACE,
            task_id=TASK_ID,
            contract=CONTRACT,
            created_at=CREATED,
            prompt=donor,
        )
        provenance = sign_provenance(payload, self.prov)
        if cohort == "tampered":  # edited after signing
            provenance["payload"] = {**payload, "expires_at": "2027-12-05T10:00:00Z"}
        return captured_json(
            request_id=f"r-{self.n}",
            received_at=RECEIVED,
            tenant="acme",
            namespace=NAMESPACE,
            task_id=TASK_ID,
            contract=CONTRACT,
            prompt=recip,
            candidates=[candidate(f"d-{self.n}", 0.9, donor, provenance)],
        )
