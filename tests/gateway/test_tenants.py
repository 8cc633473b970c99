"""The tenants file: strict loading that names file, line and problem, and what a key may claim."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from semgov.errors import InputError
from semgov.gateway.tenants import Claims, Refusal, authorize, hash_api_key, load_tenants, new_api_key
from tests.gateway.fixtures import CONTRACT, KEYS, SHA, TASK, tenants_yaml

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def load(tmp_path: Path, text: str) -> object:
    p = tmp_path / "tenants.yaml"
    p.write_text(text)
    return load_tenants(p)


def refused(tmp_path: Path, text: str) -> InputError:
    with pytest.raises(InputError) as e:
        load(tmp_path, text)
    return e.value


def test_keys_are_found_by_hash_only(tmp_path: Path) -> None:
    """A loaded file finds each key by its SHA-256 and nothing else."""
    t = load(tmp_path, tenants_yaml())
    assert t.lookup(KEYS["acme"]).tenant == "acme"  # type: ignore[attr-defined]
    assert t.lookup(KEYS["acme"] + "x") is None  # type: ignore[attr-defined]
    assert t.lookup(hash_api_key(KEYS["acme"])) is None  # type: ignore[attr-defined]


def test_new_keys_are_random_and_prefixed() -> None:
    """new_api_key gives distinct sgk_ keys with 32 random bytes."""
    a, b = new_api_key(), new_api_key()
    assert a != b and a.startswith("sgk_") and len(a) == 4 + 43


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (
            tenants_yaml().replace("    tenant: acme", "    tenant: acme\n    tenat: x"),
            6,
            "tenat: unknown key",
        ),
        (tenants_yaml().replace('namespaces: ["acme/*"]', "namespaces: []"), 6, "at least 1 item"),
        (
            tenants_yaml().replace("sha256: " + hash_api_key(KEYS["globex"]), "sha256: XYZ"),
            12,
            "keys.1.sha256",
        ),
        (tenants_yaml().replace("version: 1", "version: 2"), 1, "version"),
        (tenants_yaml().replace("globex-app", "acme-app"), 11, "appears twice"),
        (tenants_yaml().replace(hash_api_key(KEYS["globex"]), hash_api_key(KEYS["acme"])), 11, "same sha256"),
        ("version: 1\nkeys: [\n", 3, "YAML syntax error"),
        ("version: 1\nkeys: []\nkeys: []\n", 3, "duplicate key"),
        ("- 1\n", 1, "a tenants file is a mapping"),
        (tenants_yaml().replace("tenant: acme", "tenant: acme corp"), 5, "tenant"),
    ],
)
def test_bad_files_are_refused_naming_file_line_and_problem(
    tmp_path: Path, text: str, line: int, needle: str
) -> None:
    """Every problem names the file and the line, in words a person can act on."""
    e = refused(tmp_path, text)
    assert e.source == str(tmp_path / "tenants.yaml")
    assert e.line == line, e.diagnostic()
    assert needle in e.diagnostic(), e.diagnostic()


def test_an_unreadable_or_binary_file_is_refused(tmp_path: Path) -> None:
    """A missing file or one that is not UTF-8 is refused naming it."""
    with pytest.raises(InputError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml")
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="not UTF-8"):
        load_tenants(p)


def key(tmp_path: Path, extra: str = "") -> object:
    text = tenants_yaml({"acme": KEYS["acme"]}).replace(
        'namespaces: ["acme/*"]', 'namespaces: ["acme/*", "shared-docs"]'
    )
    return next(iter(load(tmp_path, text + extra).by_hash.values()))  # type: ignore[attr-defined]


def test_a_grant_carries_the_keys_tenant_and_the_allowed_claims(tmp_path: Path) -> None:
    """The grant's tenant is the key's; namespace, task and contract are the claims, checked."""
    g = authorize(key(tmp_path), Claims("acme/q3/deep", TASK, CONTRACT), NOW)  # type: ignore[arg-type]
    assert (g.tenant, g.namespace, g.task, g.response_contract) == ("acme", "acme/q3/deep", TASK, CONTRACT)
    assert authorize(key(tmp_path), Claims("shared-docs", None, None), NOW).namespace == "shared-docs"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("claims", "status", "reason"),
    [
        (Claims("acme", None, None), 403, "namespace"),  # the pattern is acme/*, not acme
        (Claims("acmex/q3", None, None), 403, "namespace"),
        (Claims("globex/q3", None, None), 403, "namespace"),
        (Claims("shared-docsX", None, None), 403, "namespace"),
        (Claims(None, None, None), 400, "claim_missing"),
        (Claims("acme/q3", {"id": "qa", "version": "2"}, None), 403, "task"),
        (Claims("acme/q3", None, {"id": "answer-json", "schema_sha256": "b" * 64}), 403, "response_contract"),
    ],
)
def test_claims_the_key_does_not_allow_are_refused(
    tmp_path: Path, claims: Claims, status: int, reason: str
) -> None:
    """A namespace outside the key's patterns, a missing claim among several, another task or contract."""
    with pytest.raises(Refusal) as e:
        authorize(key(tmp_path), claims, NOW)  # type: ignore[arg-type]
    assert (e.value.status, e.value.reason) == (status, reason)


def test_an_expired_key_is_refused_at_not_after_itself(tmp_path: Path) -> None:
    """A key with not_after is refused from that instant on (time rounds toward refusal)."""
    k = key(tmp_path, "    not_after: 2026-12-07T00:00:00Z\n")
    with pytest.raises(Refusal) as e:
        authorize(k, Claims("acme/q3", None, None), NOW)  # type: ignore[arg-type]
    assert e.value.status == 401
    authorize(k, Claims("acme/q3", None, None), NOW.replace(year=2025))  # type: ignore[arg-type]


def test_a_task_version_star_allows_any_version(tmp_path: Path) -> None:
    """tasks: {id: qa, version: "*"} allows every version of qa and no other task."""
    text = tenants_yaml({"acme": KEYS["acme"]}).replace('{id: qa, version: "1"}', '{id: qa, version: "*"}')
    k = next(iter(load(tmp_path, text).by_hash.values()))  # type: ignore[attr-defined]
    assert authorize(k, Claims("acme/a", {"id": "qa", "version": "7"}, None), NOW).task["version"] == "7"
    with pytest.raises(Refusal):
        authorize(k, Claims("acme/a", {"id": "qb", "version": "7"}, None), NOW)
    with pytest.raises(Refusal, match="semgov.task is required"):
        authorize(k, Claims("acme/a", None, None), NOW)
    assert SHA
