"""What fact computation needs from a policy, whatever language the policy is in."""

from __future__ import annotations

from dataclasses import dataclass

from semgov.facts.pii import DEFAULT_PHONE_REGIONS

DEFAULT_FORBIDDEN_PII: tuple[str, ...] = (
    "CREDIT_CARD",
    "EMAIL_ADDRESS",
    "IBAN_CODE",
    "IP_ADDRESS",
    "PHONE_NUMBER",
    "US_SSN",
)


@dataclass(frozen=True, slots=True)
class FactConfig:
    """Parameters of the fact computations (span finder and PII scan).

    The YAML engine derives it from ``policy.yaml``; a Rego policy declares it in
    its ``facts_config`` rule. It decides what is *measured*, never what is allowed.
    """

    min_span_tokens: int = 32
    scan_donor_text: bool = True
    pii_min_score: float = 0.4
    phone_regions: tuple[str, ...] = DEFAULT_PHONE_REGIONS
    pii_entities: tuple[str, ...] = DEFAULT_FORBIDDEN_PII
