"""Presidio offline: real recognizers, the phone-region choice, and the per-donor cache."""

from __future__ import annotations

import pytest

from semgov.facts.pii import PiiScanner

FINANCIAL = "Revenue rose to $1,164.3 million; 164.2 million diluted shares; margin 18.3% on 2026-09-30."


def test_pattern_recognizers_work_offline(pii_scanner: PiiScanner) -> None:
    """Email, phone, card (Luhn), IBAN, SSN and IP are found without any model download."""
    text = (
        "Write to jane.roe@example.com or call +1 212-555-0147. Card 4111 1111 1111 1111, "
        "IBAN DE89370400440532013000, SSN 536-22-1234, host 10.1.2.3."
    )
    found = pii_scanner.scan(text, donor_token_hash="t1", min_score=0.4)
    assert {"EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "US_SSN", "IP_ADDRESS"} <= found


def test_financial_figures_are_not_phone_numbers_by_default(pii_scanner: PiiScanner) -> None:
    """Decimals like 164.2 are not read as German short numbers under the default regions."""
    assert "PHONE_NUMBER" not in pii_scanner.scan(FINANCIAL, donor_token_hash="t2", min_score=0.4)


def test_de_region_is_opt_in(pii_scanner: PiiScanner) -> None:
    """With DE listed, Presidio flags those decimals (why the default leaves DE out)."""
    found = pii_scanner.scan(FINANCIAL, donor_token_hash="t2", min_score=0.4, phone_regions=("US", "DE"))
    assert "PHONE_NUMBER" in found


def test_international_numbers_found_whatever_the_regions(pii_scanner: PiiScanner) -> None:
    """A +49 number is found even though DE is not among the regions."""
    found = pii_scanner.scan("Berlin desk: +49 30 901820.", donor_token_hash="t3", min_score=0.4)
    assert "PHONE_NUMBER" in found


def test_cache_is_keyed_by_donor_text_and_settings() -> None:
    """Same donor and text scan once; other text or threshold scans again."""
    s = PiiScanner()
    for _ in range(3):
        s.scan("plain words", donor_token_hash="a", min_score=0.4)
    assert s.scans == 1
    s.scan("plain words!", donor_token_hash="a", min_score=0.4)
    s.scan("plain words", donor_token_hash="a", min_score=0.5)
    assert s.scans == 3


def test_email_validation_never_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with a suffix-list URL in the environment, emails are validated without any lookup."""
    monkeypatch.setenv("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "http://192.0.2.1/unreachable.dat")
    lookups: list[object] = []

    def no_network(*a: object, **k: object) -> None:
        lookups.append(a)
        raise OSError("network disabled in this test")

    monkeypatch.setattr("socket.getaddrinfo", no_network)
    monkeypatch.setattr("socket.create_connection", no_network)
    found = PiiScanner().scan("reach me at ops@example.co.uk", donor_token_hash="t4", min_score=0.4)
    assert "EMAIL_ADDRESS" in found
    assert lookups == []
