"""Loading YAML policies: the default, and every kind of load error with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from semgov import PolicyError, load_policy, parse_policy
from tests.conftest import DEFAULT_POLICY_DIR

MIN = "name: p\nversion: '1'\n"


def err(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as e:
        parse_policy(text.encode(), "pol.yaml")
    return e.value


def test_default_policy_is_safe_for_multi_tenant_use() -> None:
    """The shipped default forbids public donors, sets similarity >= 0.5, and approves shifted spans
    nowhere until a quality rule turns them on (the ceiling allows that)."""
    p = load_policy(DEFAULT_POLICY_DIR)
    assert p.ref == "default@1"
    assert p.tenant.allow_public_donors is False
    assert p.namespace.sharing == []
    assert p.similarity.min >= 0.5
    assert p.token_verification.allow_shifted is True and p.quality.allow_shifted is False
    assert p.quality.rules == []
    assert {"EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS"} <= set(
        p.pii.forbidden_entities
    )
    assert p.revision.startswith("sha256:") and len(p.revision) == 71


def test_minimal_policy_gets_safe_defaults() -> None:
    """Only name and version are required; sections default to safe values."""
    p = parse_policy((MIN + "...\n").encode(), "x")
    assert p.token_verification.reusable_roles == ["system", "evidence"]
    assert p.pii.require_scan is True


def test_revision_tracks_content() -> None:
    """Any byte change in the policy file changes its revision."""
    a = parse_policy((MIN + "...\n").encode(), "x")
    b = parse_policy((MIN + "# comment\n...\n").encode(), "x")
    assert a.revision != b.revision


def test_unknown_key_names_file_line_and_field() -> None:
    """A misspelled key is rejected with its line and dotted path."""
    e = err(MIN + "similarity:\n  minimum: 0.7\n")
    assert (e.source, e.line, e.field) == ("pol.yaml", 4, "similarity.minimum")
    assert "unknown key" in e.diagnostic()
    assert e.diagnostic().startswith("pol.yaml:4: similarity.minimum: unknown key")


def test_wrong_type_is_rejected() -> None:
    """Strings are not silently coerced to numbers or booleans."""
    e = err(MIN + "tenant:\n  allow_public_donors: 'yes'\n")
    assert e.line == 4 and e.field == "tenant.allow_public_donors"
    e2 = err(MIN + "similarity: {min: '0.7'}\n")
    assert e2.field == "similarity.min"


def test_bad_value_is_rejected() -> None:
    """Out-of-range values name the field and the offending value."""
    e = err(MIN + "similarity:\n  min: 1.5\n")
    assert e.field == "similarity.min" and e.line == 4 and "1.5" in e.message


def test_unsafe_reusable_role_is_rejected() -> None:
    """Shifted spans may never be made reusable in question or instruction segments."""
    e = err(MIN + "token_verification:\n  reusable_roles: [evidence, question]\n")
    assert e.field == "token_verification.reusable_roles" and "question" in e.message


def test_duplicate_key_is_rejected() -> None:
    """YAML's last-one-wins on duplicate keys is refused."""
    e = err(MIN + "similarity: {min: 0.7}\nsimilarity: {min: 0.1}\n")
    assert e.line == 4 and "duplicate key" in e.message


def test_syntax_error_has_a_line() -> None:
    """Broken YAML reports the line of the problem."""
    e = err(MIN + "pii:\n  forbidden_entities: [EMAIL_ADDRESS\n")
    assert e.line is not None and e.line >= 4 and "syntax" in e.message


@pytest.mark.parametrize("pattern", ["research/../x", "research/*/x", "", "a//b", "*"])
def test_bad_namespace_patterns_are_rejected(pattern: str) -> None:
    """Sharing rules accept exact namespaces and 'prefix/*' only."""
    e = err(MIN + f"namespace:\n  sharing:\n    - donor: '{pattern}'\n      recipients: [a]\n")
    assert e.field is not None and e.field.startswith("namespace.sharing.0.donor")


def test_durations() -> None:
    """max_age accepts seconds or s/m/h/d/w suffixes and rejects anything else."""
    assert parse_policy((MIN + "expiry: {max_age: 12h}\n...\n").encode(), "x").expiry.max_age_seconds == 43200
    assert parse_policy((MIN + "expiry: {max_age: 90}\n...\n").encode(), "x").expiry.max_age_seconds == 90
    assert err(MIN + "expiry: {max_age: 3 days}\n").field == "expiry.max_age"


def test_missing_name_and_not_a_mapping() -> None:
    """A policy without name, or that is not a mapping, is rejected."""
    assert err("version: '1'\n").field == "name"
    assert "mapping" in err("- a\n- b\n").message
    assert "mapping" in err("").message


def test_numeric_version_must_be_quoted() -> None:
    """version: 1.10 would silently become 1.1; it must be a string."""
    assert "string" in err("name: p\nversion: 1.10\n").message


def test_yaml_alias_bomb_is_refused() -> None:
    """Exponential alias expansion is stopped with a clear error."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        refs = ", ".join([f"*{prev}"] * 9)
        bomb += f"{cur}: &{cur} [{refs}]\n"
    e = err(MIN + bomb)
    assert "too large" in e.message


def test_missing_policy_file_is_named(tmp_path: Path) -> None:
    """A directory without policy.yaml names the expected file."""
    with pytest.raises(PolicyError) as e:
        load_policy(tmp_path)
    assert "policy.yaml" in str(e.value)


def test_non_utf8_policy() -> None:
    """Binary junk is rejected as not UTF-8."""
    with pytest.raises(PolicyError, match="UTF-8"):
        parse_policy(b"\xff\xfe\x00", "x")


# ---- hostile YAML: tags, reader errors, JSON/YAML 1.1 ambiguity, surrogates (all with file:line) ----------


@pytest.mark.parametrize(
    "snippet",
    [
        "tenant: !!python/object:os.system\n  allow_public_donors: false\n",
        "accepted_policy_versions: !!python/tuple [a@1]\n",
        "accepted_policy_versions: !!set {a@1: null}\n",
        "description: !!str plain\n",
        "description: ! plain\n",
        "tenant: !custom {allow_public_donors: false}\n",
        "tenant: !<tag:yaml.org,2002:map> {allow_public_donors: false}\n",
    ],
)
def test_any_explicit_tag_is_refused_with_its_line(snippet: str) -> None:
    """An explicit tag on a mapping, sequence or scalar is refused at file:line (policies are plain data)."""
    e = err(MIN + snippet)
    assert e.line == 3 and e.source == "pol.yaml" and "tags are not allowed" in e.message, e


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_control_character_names_its_line(newline: str) -> None:
    """A control character (a YAML reader error, which has no mark) is a PolicyError at its line."""
    text = newline.join(["name: p", "version: '1'", "description: a", "description2: b\x01c", ""])
    e = err(text)
    assert e.line == 4 and "unacceptable character #x0001" in e.message, e
    assert e.diagnostic().startswith("pol.yaml:4: ")


@pytest.mark.parametrize(
    "bad",
    ["name: [p", "name: p\n  version: '1'", "name: 'p", "name: *nope", "? [a]\n: 1", "name: p\n\t- x",
     "%FOO bar\n---\nname: p", "name: \"\\q\"", "- a\nb: c", "name: p\n...\n---\nx: 1"],
)  # fmt: skip
def test_every_yaml_error_names_a_line(bad: str) -> None:
    """Scanner, parser, composer and constructor errors all carry file:line."""
    e = err(bad)
    assert e.line is not None and e.line >= 1 and e.diagnostic().startswith(f"pol.yaml:{e.line}: "), e


@pytest.mark.parametrize("number", ["1e5", "1e-07", "1.5e10", "-2E3"])
def test_number_json_and_yaml_1_1_read_differently_is_refused(number: str) -> None:
    """A plain 1e-07 (a number to JSON, a string to YAML 1.1) is refused as ambiguous at its line."""
    e = err(MIN + f"similarity: {{min: {number}}}\n")
    assert e.line == 3 and "ambiguous value" in e.message, e
    p = parse_policy((MIN + "description: '1e5'\nsimilarity: {min: 5.0e-1}\n...\n").encode(), "x")
    assert p.description == "1e5" and p.similarity.min == 0.5


def test_surrogate_escapes() -> None:
    """An escaped surrogate pair is one character (as in JSON); a lone surrogate is refused at its line."""
    p = parse_policy((MIN + 'description: "\\ud83d\\ude00"\n...\n').encode(), "x")
    assert p.description == "\U0001f600"
    e = err(MIN + 'description: "a\\ud800b"\n')
    assert e.line == 3 and "surrogate" in e.message, e
