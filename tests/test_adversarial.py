"""Adversarial inputs through the real data path, on the YAML engine and on regorus alike.

Each case is a captured request line -> ``parse_line`` -> ``Evaluator`` -> signed decision records
(verified), decided by the default YAML policy and by the default Rego policy under regorus; the
two must agree gate for gate. A case ends in a deny naming the gate and the reason, or in a
refused input (a malformed line, or a policy that does not load) with a clear error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import Evaluator, Keyring, SigningKey, sign_provenance
from semgov.errors import PolicyError
from semgov.facts.pii import PiiScanner
from semgov.intake.capture import MalformedLine, parse_line
from semgov.policy.rego.loader import load_rego_policy
from semgov.policy.yaml.model import load_policy, parse_policy
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import TrustedKey
from semgov.signing.records import verify_record
from semgov.wire.models import GATES, CapturedRequest
from tests.conftest import (
    DEFAULT_POLICY_DIR,
    ROOT,
    Keys,
    candidate,
    payload_for,
    policy_with,
    request,
    segs,
    with_text,
)

REGO_DIR = ROOT / "policies" / "rego" / "default"
NOW = datetime(2026, 11, 29, 10, tzinfo=UTC)  # the requests' received_at
US = timedelta(microseconds=1)
Rec = dict[str, Any]


# ---- the data path, twice ------------------------------------------------------------------------


def rego_with_sharing(directory: Path, sharing: str) -> Path:
    """The default Rego policy with ``namespace_sharing := <sharing>`` written into ``directory``."""
    src = (REGO_DIR / "policy.rego").read_text()
    assert "namespace_sharing := []" in src
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policy.rego").write_text(
        src.replace("namespace_sharing := []", f"namespace_sharing := {sharing}")
    )
    return directory


class Policies:
    """The default YAML and Rego policies, with a given list of sharing rules (loaded once each)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._loaded: dict[str, tuple[Any, Any]] = {}

    def __call__(self, sharing: str) -> tuple[Any, Any]:
        if sharing not in self._loaded:
            if sharing == "[]":
                pair = (load_policy(DEFAULT_POLICY_DIR), load_rego_policy(REGO_DIR))
            else:
                d = rego_with_sharing(self.base / str(len(self._loaded)), sharing)
                pair = (policy_with(f"namespace: {{sharing: {sharing}}}"), load_rego_policy(d))
            self._loaded[sharing] = pair
        return self._loaded[sharing]


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Policies:
    return Policies(tmp_path_factory.mktemp("adversarial-policies"))


def replay(ev: Evaluator, line: bytes, now: datetime | None) -> list[Rec]:
    """What `semgov check` does with one line: decide it (or deny a malformed one), verify each record."""
    item = parse_line(line, 1)
    if isinstance(item, MalformedLine):
        ds = ev.deny_malformed(item, now or NOW)
    else:
        ds = ev.evaluate(item, now)
    recs = [d.record for d in ds]
    for r in recs:
        verify_record(r, ev.signing_key.public_key)
    return recs


def outcomes(recs: list[Rec]) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return [(r["donor_id"], r["decision"], tuple((g["gate"], g["result"]) for g in r["gates"])) for r in recs]


class Both:
    """Runs a line through the YAML and the Rego default policy and checks that they agree."""

    def __init__(self, keys: Keys, scanner: PiiScanner, policies: Policies) -> None:
        self.keys = keys
        self.scanner = scanner
        self.policies = policies

    def __call__(
        self,
        req: dict[str, Any] | bytes,
        *,
        sharing: list[dict[str, Any]] | None = None,
        keyring: Keyring | None = None,
        now: datetime | None = None,
    ) -> tuple[list[Rec], list[Rec]]:
        line = req if isinstance(req, bytes) else json.dumps(req).encode()
        yaml_policy, rego_policy = self.policies(json.dumps(sharing or []))
        kr = keyring or self.keys.keyring
        y = replay(Evaluator(yaml_policy, kr, self.keys.decision, pii_scanner=self.scanner), line, now)
        r = replay(Evaluator(rego_policy, kr, self.keys.decision, pii_scanner=self.scanner), line, now)
        assert outcomes(y) == outcomes(r), f"YAML and Rego disagree:\n{outcomes(y)}\n{outcomes(r)}"
        assert all(x["policy"]["engine"] == "yaml" for x in y) and all(
            x["policy"]["engine"] == "regorus" for x in r
        )
        return y, r


@pytest.fixture
def both(keys: Keys, pii_scanner: PiiScanner, policies: Policies) -> Both:
    return Both(keys, pii_scanner, policies)


def the_gate(rec: Rec, name: str) -> Rec:
    return next(g for g in rec["gates"] if g["gate"] == name)


def assert_denied_by(
    pair: tuple[list[Rec], list[Rec]], gate: str, result: str, reason: str | None = None
) -> None:
    """Every record of both engines is a deny in which ``gate`` has ``result`` and names ``reason``."""
    for recs in pair:
        assert recs, "no decision at all"
        for rec in recs:
            assert rec["decision"] == "deny" and rec["approved_spans"] == []
            g = the_gate(rec, gate)
            assert g["result"] == result, rec["gates"]
            assert g["detail"] and (reason is None or reason in g["detail"]), g["detail"]


def assert_allowed(pair: tuple[list[Rec], list[Rec]]) -> None:
    for recs in pair:
        assert recs and all(r["decision"] == "allow" for r in recs), [r["gates"] for r in recs]


def assert_refused_line(pair: tuple[list[Rec], list[Rec]], needle: str) -> None:
    """A malformed line: every candidate named gets a deny with every gate `error` giving the reason."""
    for recs in pair:
        assert recs, "a malformed line whose donors were known got no decision"
        for rec in recs:
            assert rec["decision"] == "deny"
            assert {g["result"] for g in rec["gates"]} == {"error"}
            assert all("malformed request" in g["detail"] and needle in g["detail"] for g in rec["gates"]), (
                rec["gates"][0]
            )


# ---- ids: confusables, whitespace, case, normalisation ---------------------------------------------

CONFUSED_TENANTS = [
    "\u0430cme",  # Cyrillic a
    "acm\u0435",  # Cyrillic e
    "ACME",
    "Acme",
    "acme ",
    " acme",
    "acme\t",
    "acme\u200b",  # zero-width space
    "acme\u00a0",  # no-break space
    "\uff41\uff43\uff4d\uff45",  # fullwidth
    "acme\u0301",  # combining accent
]


@pytest.mark.parametrize("tenant", CONFUSED_TENANTS, ids=ascii)
def test_confusable_donor_tenant_is_another_tenant(both: Both, keys: Keys, tenant: str) -> None:
    """A donor tenant that only looks like the request's (homoglyph, blank, case) is another tenant."""
    pair = both(request([candidate(keys, tenant=tenant)]))
    assert_denied_by(pair, "tenant", "fail", "another tenant")
    assert all(r["decision"] == "deny" for r in pair[1])


@pytest.mark.parametrize("tenant", CONFUSED_TENANTS, ids=ascii)
def test_confusable_request_tenant_is_another_tenant(both: Both, keys: Keys, tenant: str) -> None:
    """The same from the request side: the request's tenant is never normalised to match a donor's."""
    assert_denied_by(both(request([candidate(keys)], tenant=tenant)), "tenant", "fail", "another tenant")


def test_nfc_and_nfd_spellings_are_different_tenants(both: Both, keys: Keys) -> None:
    """'café' precomposed (NFC) and decomposed (NFD) are different ids: no Unicode normalisation."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert_denied_by(both(request([candidate(keys, tenant=nfd)], tenant=nfc)), "tenant", "fail")
    assert_allowed(both(request([candidate(keys, tenant=nfc)], tenant=nfc)))


def test_json_escapes_are_the_same_id(both: Both, keys: Keys) -> None:
    """A JSON escape is spelling, not normalisation: "\\u0061cme" is the id "acme"."""
    line = json.dumps(request([candidate(keys)])).replace('"tenant": "acme"', '"tenant": "\\u0061cme"', 1)
    assert '"\\u0061cme"' in line
    assert_allowed(both(line.encode()))


@pytest.mark.parametrize(
    "namespace",
    ["Research/entity-042", "research/entity\u2011042", "research/entity-042/", "research//entity-042",
     "research/entity-042 ", "research/./entity-042", "research/entity-042\u200d"],
    ids=ascii,
)  # fmt: skip
def test_confusable_namespaces_differ(both: Both, keys: Keys, namespace: str) -> None:
    """Namespaces are compared byte for byte: case, look-alike hyphens, slashes and dot segments differ."""
    assert_denied_by(
        both(request([candidate(keys, namespace=namespace)])), "namespace", "fail", "no sharing rule"
    )


def test_key_id_is_case_and_blank_sensitive(both: Both, keys: Keys) -> None:
    """`K1` and `k1 ` are not key `k1`: the provenance key is unknown."""
    for kid in ("K1", "k1 ", "\u006b\u0031\u200b"):
        c = candidate(keys)
        c["provenance"]["key_id"] = kid
        assert_denied_by(both(request([c])), "provenance", "fail", "is not in the keyring")


def test_policy_version_and_task_are_case_sensitive(both: Both, keys: Keys) -> None:
    """Policy version and task ids are compared exactly too."""
    assert_denied_by(both(request([candidate(keys, policy_version="DEFAULT@1")])), "policy_version", "fail")
    task = {"id": "Extract_financials", "version": "1"}
    assert_denied_by(both(request([candidate(keys, task=task)])), "task", "fail")


# ---- namespace sharing rules: `..`, globs, malformed namespaces ----------------------------------

BAD_PATTERNS = [
    "*", "**", "*/*", "research/**", "research/*/x", "research/*x", "research/x*", "../x", "research/../x",
    "research/.", "research/./*", "/research", "research/", "research//x", "research/ x", "research/\u0430",
    "research/x\n", "research/?", "research/[ab]", "",
]  # fmt: skip


@pytest.mark.parametrize("pattern", BAD_PATTERNS, ids=ascii)
def test_bad_sharing_patterns_are_refused_by_both_loaders(pattern: str, tmp_path: Path) -> None:
    """A sharing pattern that is not an exact namespace or `prefix/*` does not load, in YAML or Rego."""
    for field in ("donor", "recipients"):
        rule = {"donor": pattern if field == "donor" else "research/common",
                "recipients": [pattern] if field == "recipients" else ["research/*"]}  # fmt: skip
        with pytest.raises(PolicyError) as e:
            policy_with(f"namespace: {{sharing: [{json.dumps(rule)}]}}")
        assert e.value.field is not None and e.value.field.startswith(f"namespace.sharing.0.{field}")
        assert "bad namespace pattern" in str(e.value)
        with pytest.raises(PolicyError) as e:
            load_rego_policy(rego_with_sharing(tmp_path / field, f"[{json.dumps(rule)}]"))
        assert "namespace_sharing[0]" in str(e.value) and "bad namespace pattern" in str(e.value)


def test_rego_sharing_must_be_a_list_of_rules(tmp_path: Path) -> None:
    """A Rego `namespace_sharing` that is not a list of {donor, recipients} does not load."""
    for bad in ('"research/*"', '[{"donor": "a", "recipients": ["b"], "extra": 1}]', '[{"donor": "a"}]'):
        with pytest.raises(PolicyError, match="namespace_sharing"):
            load_rego_policy(rego_with_sharing(tmp_path, bad))


SHARE = [{"donor": "research/common", "recipients": ["research/*"]}]


@pytest.mark.parametrize(
    "recipient_ns",
    ["research/../legal", "research/./x", "research//x", "research/x/", "research/x/..", "research/*",
     "research/\u0430", "research/x\n", "research/ x", "research/.."],
    ids=ascii,
)  # fmt: skip
def test_malformed_recipient_namespace_is_not_below_prefix(both: Both, keys: Keys, recipient_ns: str) -> None:
    """`research/*` never covers a path-like trick (`..`, `.`, empty segments) or a foreign alphabet."""
    req = request([candidate(keys, namespace="research/common")], namespace=recipient_ns)
    assert_denied_by(both(req, sharing=SHARE), "namespace", "fail", "no sharing rule")


def test_well_formed_recipient_below_prefix_is_shared(both: Both, keys: Keys) -> None:
    """The control: a well-formed namespace below `research/` is covered by the rule, in both engines."""
    for ns in ("research/x", "research/a/b", "research/x-1_2.3:4@5"):
        req = request([candidate(keys, namespace="research/common")], namespace=ns)
        assert_allowed(both(req, sharing=SHARE))


def test_dot_dot_in_donor_namespace_is_not_below_prefix(both: Both, keys: Keys) -> None:
    """A signed donor namespace `research/../secret` is not covered by a `research/*` donor pattern."""
    rule = [{"donor": "research/*", "recipients": ["legal/desk"]}]
    req = request([candidate(keys, namespace="research/../secret")], namespace="legal/desk")
    assert_denied_by(both(req, sharing=rule), "namespace", "fail")
    ok = request([candidate(keys, namespace="research/secret")], namespace="legal/desk")
    assert_allowed(both(ok, sharing=rule))


# ---- very long ids ----------------------------------------------------------------------------


def test_ids_at_512_characters_are_accepted(both: Both, keys: Keys) -> None:
    """Ids of exactly 512 characters are valid and decided normally."""
    t = "t" * 512
    assert_allowed(both(request([candidate(keys, "d" * 512, tenant=t)], tenant=t, request_id="r" * 512)))


@pytest.mark.parametrize("field", ["tenant", "namespace", "request_id"])
def test_request_id_over_512_characters_refuses_the_line(both: Both, keys: Keys, field: str) -> None:
    """A request id field of 513 characters (or a megabyte) makes the line malformed; donors are denied."""
    for n in (513, 1 << 20):
        req = request([candidate(keys)], **{field: "x" * n})
        pair = both(req)
        if field == "request_id":  # no valid request id: nothing to sign a deny for, nothing decided
            assert pair == ([], [])
        else:
            assert_refused_line(pair, field)


def test_long_donor_tenant_invalidates_the_payload(both: Both, keys: Keys) -> None:
    """A 513-character tenant in the signed payload: payload invalid, provenance fails, claims unknown."""
    pair = both(request([candidate(keys, tenant="a" * 513)]))
    assert_denied_by(pair, "provenance", "fail", "payload invalid")
    assert_denied_by(pair, "tenant", "fail", "no valid provenance payload")


def test_long_donor_and_key_ids_refuse_the_line(both: Both, keys: Keys) -> None:
    """A 513-character donor id or key id makes the line malformed."""
    c = candidate(keys, "long")
    c["donor_id"] = "d" * 513
    assert_refused_line(both(request([candidate(keys, "ok"), c])), "donor_id")
    c = candidate(keys)
    c["provenance"]["key_id"] = "k" * 513
    assert_refused_line(both(request([c])), "key_id")


# ---- duplicate JSON keys, non-canonical signatures --------------------------------------------------


def test_duplicate_key_in_request_refuses_the_line(both: Both, keys: Keys) -> None:
    """`{"tenant": "globex", "tenant": "acme"}`: another reader would see the other tenant. Refused."""
    line = json.dumps(request([candidate(keys)]))
    for dup in ('"tenant": "globex", "tenant": "acme"', '"tenant": "acme", "t\\u0065nant": "acme"'):
        bad = line.replace('"tenant": "acme"', dup, 1)
        assert_refused_line(both(bad.encode()), "duplicate key 'tenant'")


def test_duplicate_key_in_signed_payload_refuses_the_line(both: Both, keys: Keys) -> None:
    """A payload with a duplicate key, signed over the last-wins reading, is still refused."""
    c = candidate(keys, tenant="acme")
    line = json.dumps(request([c]))
    payload_json = json.dumps(c["provenance"]["payload"])
    assert payload_json in line
    bad = line.replace(
        payload_json, payload_json.replace('"tenant": "acme"', '"tenant": "globex", "tenant": "acme"')
    )
    assert_refused_line(both(bad.encode()), "duplicate key 'tenant'")


def test_duplicate_keys_are_found_beside_token_arrays(both: Both, keys: Keys) -> None:
    """The duplicate-key pass skips token digits but not keys around them."""
    line = json.dumps(request([candidate(keys)]))
    bad = line.replace('"token_ids": [', '"token_ids": [], "token_ids": [', 1)
    assert_refused_line(both(bad.encode()), "duplicate key 'token_ids'")


def test_signature_over_non_canonical_json_fails(both: Both, keys: Keys) -> None:
    """A producer that signs its own serialisation (not RFC 8785) fails provenance."""
    c = candidate(keys)
    payload = c["provenance"]["payload"]
    for blob in (json.dumps(payload), json.dumps(payload, sort_keys=True), json.dumps(payload, indent=1)):
        assert blob.encode() != canonicalize(payload)
        c["provenance"]["signature"] = keys.k1.sign(blob.encode())
        assert_denied_by(both(request([c])), "provenance", "fail", "signature does not verify")


def test_non_canonical_transport_of_a_canonically_signed_payload_verifies(both: Both, keys: Keys) -> None:
    """A payload re-spelled in transit (order, blanks, escapes) verifies: the signature is over RFC 8785."""
    c = candidate(keys)
    payload = c["provenance"]["payload"]
    line = json.dumps(request([c]))
    respelled = json.dumps(dict(reversed(list(payload.items()))), separators=(" , ", " :\t")).replace(
        '"acme"', '"\\u0061cme"'
    )
    assert json.dumps(payload) in line and '"\\u0061cme"' in respelled
    line = line.replace(json.dumps(payload), respelled)
    assert_allowed(both(line.encode()))


@pytest.mark.parametrize(
    "mangle",
    [lambda s: s[:40] + "\n" + s[40:], lambda s: s.rstrip("="), lambda s: " " + s, lambda s: s + "AAAA",
     lambda s: s.replace("+", "-").replace("/", "_") + " "],
)  # fmt: skip
def test_non_canonical_signature_encoding_fails(both: Both, keys: Keys, mangle: Callable[[str], str]) -> None:
    """A signature in anything but strict base64 of exactly 64 bytes does not verify."""
    c = candidate(keys)
    c["provenance"]["signature"] = mangle(c["provenance"]["signature"])
    assert_denied_by(both(request([c])), "provenance", "fail", "signature does not verify")


# ---- key-id confusion, replayed provenance -----------------------------------------------------------


def test_right_key_id_wrong_key(both: Both, keys: Keys) -> None:
    """Signed by an untrusted key but labelled with a trusted key's id: the signature fails."""
    c = candidate(keys, signer="k9")
    c["provenance"]["key_id"] = "k1"
    assert_denied_by(both(request([c])), "provenance", "fail", "signature does not verify")


def test_relabelled_revoked_signature_stays_revoked(both: Both, keys: Keys) -> None:
    """A revoked key's signature is `revoked` under its id and fails under a trusted key's id."""
    c = candidate(keys, signer="k2")
    assert_denied_by(both(request([c])), "provenance", "fail", "is revoked")
    c["provenance"]["key_id"] = "k1"
    assert_denied_by(both(request([c])), "provenance", "fail", "signature does not verify")


def test_revocation_follows_the_key_not_the_id(both: Both, keys: Keys) -> None:
    """One public key trusted as `k1` and revoked as `k1-old`: its signatures are revoked under both ids."""
    kr = Keyring(
        [TrustedKey("k1", keys.k1.public_key, False), TrustedKey("k1-old", keys.k1.public_key, True)]
    )
    assert kr.get("k1") is not None and kr.get("k1").revoked  # type: ignore[union-attr]
    assert_denied_by(both(request([candidate(keys)]), keyring=kr), "provenance", "fail", "is revoked")


def test_provenance_replayed_for_another_donor(both: Both, keys: Keys) -> None:
    """A valid provenance (signature and all) attached to another donor id fails the donor-id check."""
    good = candidate(keys, "r-03")
    other = dict(good, donor_id="r-04")
    assert_denied_by(both(request([other])), "provenance", "fail", "donor_id differs")


def test_provenance_replayed_over_other_tokens(both: Both, keys: Keys) -> None:
    """The same provenance and donor id over different tokens fails the token-hash check."""
    good = candidate(keys)
    prompt = segs(("system", list(range(100, 120))), ("evidence", list(range(2000, 2350))))
    swapped = dict(good, prompt=prompt)
    assert_denied_by(both(request([swapped], prompt=prompt)), "provenance", "fail", "token hash differs")


def test_provenance_replayed_into_another_tenants_request(both: Both, keys: Keys) -> None:
    """A donor's valid provenance in another tenant's request fails the tenant gate."""
    assert_denied_by(both(request([candidate(keys)], tenant="globex")), "tenant", "fail", "another tenant")


# ---- clocks: skew, boundaries, spellings ----------------------------------------------------------


def _at(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_expiry_exactly_at_now_is_expired(both: Both, keys: Keys) -> None:
    """expires_at == now: expired (the window is half-open); one microsecond later: valid."""
    assert_denied_by(both(request([candidate(keys, expires_at=_at(NOW))])), "expiry", "fail", "expired at")
    assert_allowed(both(request([candidate(keys, expires_at=_at(NOW + US))])))


def test_created_exactly_at_now_is_valid_a_microsecond_later_is_not(both: Both, keys: Keys) -> None:
    """created_at == now passes; a producer clock one microsecond ahead is denied (no skew allowance)."""
    assert_allowed(both(request([candidate(keys, created_at=_at(NOW))])))
    pair = both(request([candidate(keys, created_at=_at(NOW + US))]))
    assert_denied_by(pair, "expiry", "fail", "created in the future")


def test_max_age_boundary(both: Both, keys: Keys) -> None:
    """now - created_at == max_age (30 d) is too old; one microsecond younger passes."""
    age = timedelta(days=30)
    old = candidate(keys, created_at=_at(NOW - age), expires_at=_at(NOW + age))
    assert_denied_by(both(request([old])), "expiry", "fail", "max age")
    young = candidate(keys, created_at=_at(NOW - age + US), expires_at=_at(NOW + age))
    assert_allowed(both(request([young])))


def test_offsets_are_compared_as_instants(both: Both, keys: Keys) -> None:
    """`12:00:00.000001+02:00` is one microsecond after `10:00:00Z`: a producer ahead, denied."""
    pair = both(request([candidate(keys, created_at="2026-11-29T12:00:00.000001+02:00")]))
    assert_denied_by(pair, "expiry", "fail", "created in the future")
    assert_allowed(both(request([candidate(keys, created_at="2026-11-29T12:00:00+02:00")])))
    assert_denied_by(
        both(request([candidate(keys, expires_at="2026-11-29T11:00:00+01:00")])), "expiry", "fail"
    )


def _shifted(base: str, delta_ns: int) -> str:
    """``base`` (whole seconds, UTC) shifted by ``delta_ns``, written with nine fractional digits."""
    t = datetime.fromisoformat(base.replace("Z", "+00:00"))
    whole, ns = divmod(delta_ns, 1_000_000_000)
    t += timedelta(seconds=whole)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns:09d}Z"


NOW_TEXT = "2026-11-29T10:00:00Z"  # the request's received_at: the decision clock
MAX_AGE_START = "2026-10-30T10:00:00Z"  # exactly the default policy's 30-day max age before it
DELTAS = [1, 1_000, 1_000_000_000]  # 1 ns, 1 us, 1 s


@pytest.mark.parametrize("delta", DELTAS, ids=["1ns", "1us", "1s"])
def test_times_compare_exactly_in_nanoseconds(both: Both, keys: Keys, delta: int) -> None:
    """Every time boundary at 1 ns, 1 us and 1 s, in YAML and Rego: nothing rounds toward allow."""
    expired = {"expires_at": _shifted(NOW_TEXT, 0)}
    assert_denied_by(both(request([candidate(keys, **expired)])), "expiry", "fail", "expired at")
    assert_allowed(both(request([candidate(keys, expires_at=_shifted(NOW_TEXT, delta))])))
    future = {"created_at": _shifted(NOW_TEXT, delta)}
    assert_denied_by(both(request([candidate(keys, **future)])), "expiry", "fail", "created in the future")
    assert_allowed(both(request([candidate(keys, created_at=_shifted(NOW_TEXT, 0))])))
    for too_old in (0, -delta):  # an age of exactly max_age, or more, is too old
        old = {"created_at": _shifted(MAX_AGE_START, too_old)}
        assert_denied_by(both(request([candidate(keys, **old)])), "expiry", "fail", "max age")
    assert_allowed(both(request([candidate(keys, created_at=_shifted(MAX_AGE_START, delta))])))
    # The clock's own nanoseconds count too: 1 ns past a donor's expiry is past it.
    clock = {"received_at": _shifted(NOW_TEXT, delta)}
    edge = {"expires_at": _shifted(NOW_TEXT, delta)}
    assert_denied_by(both(request([candidate(keys, **edge)], **clock)), "expiry", "fail", "expired at")
    # ... and an age of exactly max_age with both ends off the second is too old (rounding the
    # start up and the clock down used to make it max_age - 1 us: allowed).
    aged = {"created_at": _shifted(MAX_AGE_START, delta)}
    assert_denied_by(both(request([candidate(keys, **aged)], **clock)), "expiry", "fail", "max age")


def test_times_finer_than_a_nanosecond_are_refused_not_rounded(both: Both, keys: Keys) -> None:
    """Ten fractional digits: an invalid payload (a deny); in the request clock, a malformed line."""
    pair = both(request([candidate(keys, created_at="2026-11-28T10:00:00.0000000001Z")]))
    assert_denied_by(pair, "provenance", "fail", "payload invalid")
    assert "at most 9 (nanoseconds)" in the_gate(pair[0][0], "provenance")["detail"]
    fine_clock = "2026-11-29T10:00:00.0000000001Z"
    assert_refused_line(both(request([candidate(keys)], received_at=fine_clock)), "received_at")


NOT_RFC3339 = [
    1764324000, "1764324000", 1764324000000, "2026-11-28T10:00Z", "2026-11-28", "2026-11-28 10:00:00Z",
    "2026-11-28T10:00:60Z", "2026-11-28T10:00:00+24:00", "2026-11-28T10:00:00", "2026-02-30T10:00:00Z",
]  # fmt: skip


@pytest.mark.parametrize("value", NOT_RFC3339, ids=str)
def test_timestamps_that_are_not_rfc3339_invalidate_the_payload(
    both: Both, keys: Keys, value: object
) -> None:
    """Unix times, missing seconds or zone, leap seconds: the payload is invalid and the donor denied."""
    pair = both(request([candidate(keys, created_at=value)]))
    assert_denied_by(pair, "provenance", "fail", "payload invalid")
    assert "created_at" in the_gate(pair[0][0], "provenance")["detail"]
    assert_denied_by(pair, "expiry", "fail", "no valid provenance payload")


@pytest.mark.parametrize("value", [1764410400, "1764410400", "2026-11-29T10:00Z"], ids=str)
def test_request_clock_that_is_not_rfc3339_refuses_the_line(both: Both, keys: Keys, value: object) -> None:
    """A received_at that is not an RFC 3339 date-time with seconds and zone makes the line malformed."""
    assert_refused_line(both(request([candidate(keys)], received_at=value)), "received_at")


# ---- NaN, infinity, token ids out of range ------------------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_similarity_refuses_the_line(both: Both, keys: Keys, literal: str) -> None:
    """NaN or infinite similarity is not a number semgov compares: the line is malformed."""
    line = json.dumps(request([candidate(keys)])).replace('"similarity": 0.9', f'"similarity": {literal}')
    assert_refused_line(both(line.encode()), "similarity")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_anywhere_refuses_the_line(both: Both, keys: Keys, literal: str) -> None:
    """A NaN/Infinity literal inside the (unmodelled) signed payload is not JSON: the line is refused."""
    c = candidate(keys)
    line = json.dumps(request([c])).replace('"scanned": true', f'"scanned": true, "x": {literal}', 1)
    assert_refused_line(both(line.encode()), literal)


def test_nan_in_payload_from_python_fails_closed(
    keys: Keys, pii_scanner: PiiScanner, policies: Policies
) -> None:
    """The hook path (Python objects, no JSON): a NaN inside a payload is a provenance error, a deny."""
    c = candidate(keys)
    c["provenance"]["payload"]["x"] = float("nan")
    req = CapturedRequest.model_validate(request([c]))
    for policy in policies("[]"):
        [d] = Evaluator(policy, keys.keyring, keys.decision, pii_scanner=pii_scanner).evaluate(req)
        assert d.decision == "deny" and the_gate(d.record, "provenance")["result"] == "error"
    bad = request([candidate(keys)])
    bad["candidates"][0]["similarity"] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        CapturedRequest.model_validate(bad)


NON_FINITE_POLICIES = [
    "similarity: {min: .nan}", "similarity: {min: .inf}", "similarity: {min: -.inf}",
    "pii: {min_score: .nan}", "token_verification: {min_approved_fraction: .nan}", "expiry: {max_age: .inf}",
    "token_verification: {min_span_tokens: .nan}",
]  # fmt: skip


@pytest.mark.parametrize("policy_text", NON_FINITE_POLICIES)
def test_nan_and_infinity_in_policies_are_refused(policy_text: str) -> None:
    """A NaN or infinite policy number does not load (it would compare false everywhere)."""
    with pytest.raises(PolicyError) as e:
        policy_with(policy_text)
    assert e.value.line is not None and e.value.field


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64, 10**100, 1.5, 7.0, True, "7", None, "NaN"], ids=repr)
@pytest.mark.parametrize("side", ["recipient", "donor"])
def test_token_ids_out_of_range_refuse_the_line(both: Both, keys: Keys, bad: object, side: str) -> None:
    """Token ids are integers in 0..2^32-1, in every prompt; anything else makes the line malformed."""
    req = request([candidate(keys)])
    prompt = req["prompt"] if side == "recipient" else req["candidates"][0]["prompt"]
    prompt["token_ids"][5] = bad
    line = json.dumps(req).replace('"NaN"', "NaN")
    assert_refused_line(both(line.encode()), "token_ids")


def test_largest_token_id_is_accepted(both: Both, keys: Keys) -> None:
    """2^32-1 is a valid token id: hashed, matched and decided like any other."""
    toks = [0xFFFFFFFF] * 40 + list(range(1000, 1100))
    p = segs(("system", toks[:40]), ("evidence", toks[40:]))
    assert_allowed(both(request([candidate(keys, prompt=p)], prompt=p)))


def test_every_gate_is_reported_in_every_refusal(both: Both, keys: Keys) -> None:
    """A refused line's denies list all ten gates, in order (nothing is silently skipped)."""
    line = json.dumps(request([candidate(keys, "a"), candidate(keys, "b")])).replace(
        '"similarity": 0.9', '"similarity": NaN', 1
    )
    for recs in both(line.encode()):
        assert [r["donor_id"] for r in recs] == ["a", "b"]
        assert all([g["gate"] for g in r["gates"]] == list(GATES) for r in recs)


def test_a_fresh_key_has_no_trust(both: Both, keys: Keys) -> None:
    """A candidate signed with a brand-new key named like no keyring entry: unknown key, denied."""
    stranger = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1\u0000")
    c = candidate(keys)
    c["provenance"] = sign_provenance(payload_for("r-03", c["prompt"]), stranger)
    assert_denied_by(both(request([c])), "provenance", "fail", "is not in the keyring")


def test_yaml_policy_bomb_does_not_load() -> None:
    """A policy.yaml alias bomb in the sharing rules is refused with file:line before expansion."""
    bomb = "a: &a [research/x, research/x, research/x, research/x, research/x, research/x, research/x]\n"
    for i in range(1, 8):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 7)}]\n"
    with pytest.raises(PolicyError, match="alias bomb") as e:
        parse_policy(("name: p\nversion: '1'\n" + bomb).encode(), "bomb.yaml")
    assert e.value.source == "bomb.yaml" and e.value.line == 8


# ---- well-formed input that means something else (issue 12) -----------------------------------


def test_task_ids_joined_alike_are_different_tasks(both: Both, keys: Keys) -> None:
    """Request task {qa, 1@2} and donor task {qa@1, 2} join to the same "qa@1@2": still another task."""
    req = request([candidate(keys, task={"id": "qa@1", "version": "2"})], task={"id": "qa", "version": "1@2"})
    assert_denied_by(both(req), "task", "fail")


def test_relabelled_donor_segments_fail_provenance(both: Both, keys: Keys) -> None:
    """An instruction segment relabelled evidence after signing: the signed segments differ, a deny."""
    cand = candidate(keys)
    for seg in cand["prompt"]["segments"]:
        if seg["role"] == "instruction":
            seg["role"] = "evidence"
    assert_denied_by(both(request([cand])), "provenance", "fail", "segments hash differs")


def test_unsigned_donor_text_loosens_nothing(both: Both, keys: Keys) -> None:
    """An unscanned donor offered with an empty, unsigned text: provenance fails and PII is unscanned."""
    cand = candidate(keys, pii={"scanned": False, "entities": []})
    cand["prompt"]["text"] = ""
    pair = both(request([cand]))
    assert_denied_by(pair, "provenance", "fail", "text is not the text signed")
    assert_denied_by(pair, "pii", "fail", "never scanned")


def test_clean_text_swapped_for_the_signed_one_fails_provenance(both: Both, keys: Keys) -> None:
    """Signed with a PII-bearing text, offered with a clean one: the text hash differs, a deny."""
    cand = with_text(keys, candidate(keys), "Call Jane at jane.roe@example.com about Q3.")
    cand["prompt"]["text"] = "Quarterly revenue rose."
    assert_denied_by(both(request([cand])), "provenance", "fail", "text is not the text signed")


def test_signed_empty_text_does_not_count_as_a_scan(both: Both, keys: Keys) -> None:
    """Even signed, an empty text for a prompt with tokens is no PII scan of it: unscanned donor denied."""
    cand = with_text(keys, candidate(keys, pii={"scanned": False, "entities": []}), "")
    assert_denied_by(both(request([cand])), "pii", "fail", "never scanned")
    signed = with_text(keys, candidate(keys, pii={"scanned": False, "entities": []}), "Revenue rose 4%.")
    assert_allowed(both(request([signed])))
