"""Loading and linting Rego policies: convention, forbidden builtins, file:line diagnostics."""

from __future__ import annotations

from pathlib import Path

import pytest

from semgov import PolicyError
from semgov.facts.config import FactConfig
from semgov.policy.rego.loader import RegoPolicy, lint, load_rego_policy
from semgov.policy.source import load_policy_source, make_engine

MINIMAL = """package semgov.reuse
import rego.v1

metadata := {"name": "mini", "version": "2"}

deny contains {"gate": "similarity", "detail": "too low"} if input.candidate.similarity < 0.6

default allow := false
allow if count(deny) == 0

approved_spans := [{"recipient_start": s.recipient_start, "donor_start": s.donor_start,
                    "length": s.length, "kind": s.kind} |
                    some s in input.facts.tokens.spans; s.kind == "prefix"]
"""


def write(tmp_path: Path, text: str, name: str = "policy.rego") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path


def test_minimal_policy_loads_with_identity_and_defaults(tmp_path: Path) -> None:
    """metadata names the policy; the revision hashes the modules; facts_config defaults apply."""
    pol = load_rego_policy(write(tmp_path, MINIMAL))
    assert (pol.name, pol.version) == ("mini", "2")
    assert pol.revision.startswith("sha256:")
    assert pol.fact_config == FactConfig()
    write(tmp_path, MINIMAL + "\n# edited\n")
    assert load_rego_policy(tmp_path).revision != pol.revision


def test_test_modules_do_not_change_the_revision(tmp_path: Path) -> None:
    """*_test.rego files are tests, not policy: adding one keeps the revision."""
    before = load_rego_policy(write(tmp_path, MINIMAL)).revision
    write(tmp_path, "package semgov.reuse_test\nimport rego.v1\ntest_x if true\n", "policy_test.rego")
    assert load_rego_policy(tmp_path).revision == before


@pytest.mark.parametrize(
    ("call", "name"),
    [
        ("time.now_ns()", "time.now_ns"),
        ('http.send({"method": "get", "url": "x"})', "http.send"),
        ('rand.intn("k", 10)', "rand.intn"),
        ('uuid.rfc4122("k")', "uuid.rfc4122"),
    ],
)
def test_non_deterministic_builtins_refused_with_line(tmp_path: Path, call: str, name: str) -> None:
    """Policies calling clock, network, random or uuid builtins are refused at load, naming file:line."""
    text = MINIMAL + f"\nextra := x if {{\n  x := {call}\n}}\n"
    with pytest.raises(PolicyError) as e:
        load_rego_policy(write(tmp_path, text))
    assert e.value.source == str(tmp_path / "policy.rego")
    assert e.value.line == MINIMAL.count("\n") + 3
    assert f"{name}()" in e.value.message and "input.now" in e.value.message


def test_builtin_names_in_comments_and_strings_are_fine(tmp_path: Path) -> None:
    """Only real calls are refused: mentioning time.now_ns() in a comment or string is allowed."""
    text = MINIMAL + '\n# do not use time.now_ns()\nnote := "http.send(x)"\n'
    assert load_rego_policy(write(tmp_path, text)).name == "mini"


@pytest.mark.parametrize("rule", ["metadata", "deny", "allow", "approved_spans"])
def test_missing_required_rule(tmp_path: Path, rule: str) -> None:
    """A policy without one of the required rules is rejected, naming the rule."""
    lines = MINIMAL.split("\n\n")
    kept = "\n\n".join(b for b in lines if not b.lstrip().startswith((rule, f"default {rule}")))
    if rule == "deny":
        kept = kept.replace("count(deny) == 0", "true")
    with pytest.raises(PolicyError, match=f"`{rule}`"):
        load_rego_policy(write(tmp_path, kept))


def test_syntax_error_has_file_and_line(tmp_path: Path) -> None:
    """A parse error names the file and line."""
    with pytest.raises(PolicyError) as e:
        load_rego_policy(write(tmp_path, MINIMAL + "\nbroken if {\n  x := \n}\n"))
    assert e.value.line == MINIMAL.count("\n") + 3 and "syntax error" in e.value.message


def test_wrong_package_and_empty_dir(tmp_path: Path) -> None:
    """No module in package semgov.reuse, or no modules at all, is an error."""
    with pytest.raises(PolicyError, match="package semgov.reuse"):
        load_rego_policy(write(tmp_path, MINIMAL.replace("package semgov.reuse", "package other")))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no policy modules" in str(lint(empty)[0])


def test_metadata_must_be_constant_and_well_formed(tmp_path: Path) -> None:
    """metadata that depends on input, or lacks version, is refused."""
    with pytest.raises(PolicyError, match="metadata"):
        load_rego_policy(write(tmp_path, MINIMAL.replace('"version": "2"', '"version": input.x')))
    with pytest.raises(PolicyError, match="metadata"):
        load_rego_policy(write(tmp_path, MINIMAL.replace(', "version": "2"', "")))


def test_facts_config_is_read_and_validated(tmp_path: Path) -> None:
    """facts_config sets fact parameters; unknown keys are refused."""
    pol = load_rego_policy(write(tmp_path, MINIMAL + '\nfacts_config := {"min_span_tokens": 16}\n'))
    assert pol.fact_config.min_span_tokens == 16
    with pytest.raises(PolicyError, match="facts_config"):
        load_rego_policy(write(tmp_path, MINIMAL + '\nfacts_config := {"min_span": 16}\n'))


def test_policy_source_picks_the_language(tmp_path: Path) -> None:
    """A directory of .rego modules loads as Rego with regorus by default; mixing languages is refused."""
    pol = load_policy_source(write(tmp_path, MINIMAL))
    assert isinstance(pol, RegoPolicy) and make_engine(pol).name == "regorus"
    assert make_engine(pol, "opa-inprocess").name == "opa-inprocess"
    with pytest.raises(PolicyError, match="YAML policy"):
        make_engine(pol, "yaml")
    (tmp_path / "policy.yaml").write_text("name: x\nversion: '1'\n")
    with pytest.raises(PolicyError, match="both"):
        load_policy_source(tmp_path)


def _default_with(tmp_path: Path, old: str, new: str) -> Path:
    import shutil

    src = Path(__file__).resolve().parents[2] / "policies" / "rego" / "default"
    d = tmp_path / "pol"
    shutil.copytree(src, d)
    text = (d / "policy.rego").read_text()
    assert old in text
    (d / "policy.rego").write_text(text.replace(old, new))
    return d


@pytest.mark.parametrize("entry", ["qa", "qa@1@2", "@1", "qa@"])
def test_task_group_entry_without_exactly_one_at_is_refused(tmp_path: Path, entry: str) -> None:
    """compatible_task_groups entries are "id@version" pairs: anything else is a load error naming it."""
    d = _default_with(
        tmp_path, "compatible_task_groups := []", f'compatible_task_groups := [["qa@1", "{entry}"]]'
    )
    with pytest.raises(PolicyError, match=r"compatible_task_groups\[0\]\[1\].*exactly one '@'"):
        load_rego_policy(d)


def test_task_groups_match_pairs_not_joined_strings(tmp_path: Path) -> None:
    """A group ["qa@1@2"...] cannot exist, and a group ["qa@1", "qa@2"] admits exactly those pairs."""
    from pydantic import TypeAdapter

    from semgov.policy.rego.engines import RegorusEngine
    from semgov.policy.testing import deep_merge
    from semgov.wire.policy_input import PolicyInput
    from tests.policy.test_differential import _base

    d = _default_with(
        tmp_path, "compatible_task_groups := []", 'compatible_task_groups := [["qa@1", "qa@2"]]'
    )
    eng = RegorusEngine(load_rego_policy(d))

    def task_gate(mine: dict[str, str], theirs: dict[str, str]) -> str:
        doc = TypeAdapter(PolicyInput).validate_python(
            deep_merge(_base(), {"request": {"task": mine}, "facts": {"donor": {"task": theirs}}})
        )
        return {g.gate: g.result for g in eng.evaluate(doc).gates}["task"]

    assert task_gate({"id": "qa", "version": "1"}, {"id": "qa", "version": "2"}) == "pass"
    assert task_gate({"id": "qa", "version": "1@2"}, {"id": "qa@1", "version": "2"}) == "fail"
    assert task_gate({"id": "qa@1", "version": "2"}, {"id": "qa", "version": "2"}) == "fail"


def test_rego_revision_is_an_injective_encoding() -> None:
    """A module text holding NUL and a file name cannot pose as two modules: the revisions differ."""
    from semgov.policy.rego.loader import rego_revision

    one = rego_revision({"a.rego": "x\0b.rego\0y"})
    two = rego_revision({"a.rego": "x", "b.rego": "y"})
    assert one != two
