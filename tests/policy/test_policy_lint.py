"""`semgov policy check` reports every problem of a policy at once (issue 17): all YAML errors in
file order with "did you mean" for a misspelt key, and the Rego convention's settings by type
(`allow_shifted := "false"` is a defined, non-false value in Rego: it would allow shifted spans)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.errors import PolicyError
from semgov.policy.rego.loader import load_rego_policy
from semgov.policy.yaml.model import load_policy

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "policies" / "default" / "policy.yaml"
REGO = ROOT / "policies" / "rego" / "default"


def broken_yaml(tmp_path: Path) -> Path:
    d = tmp_path / "yaml"
    d.mkdir()
    text = YAML.read_text()
    for old, new in (
        ("similarity:", "similarty:"),
        ("min_span_tokens: 32", 'min_span_tokens: "32"'),
        ("allow_shifted: true", 'allow_shifted: "false"'),
    ):
        assert old in text
        text = text.replace(old, new, 1)
    (d / "policy.yaml").write_text(text)
    return d


def test_yaml_problems_are_all_reported_in_file_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three mistakes: three file:line diagnostics, sorted by line, a misspelt key with its fix."""
    d = broken_yaml(tmp_path)
    assert main(["policy", "check", str(d)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith("3 problem(s), 0 warning(s)")
    assert "similarty: unknown key (did you mean 'similarity'?)" in lines[0]
    assert "min_span_tokens" in lines[1] and "allow_shifted" in lines[2]
    numbers = [int(x.split(":")[1]) for x in lines[:3]]
    assert numbers == sorted(numbers)


def test_loading_names_the_first_and_counts_the_rest(tmp_path: Path) -> None:
    """Loading still raises one PolicyError; it says how many more there are and carries them."""
    with pytest.raises(PolicyError) as e:
        load_policy(broken_yaml(tmp_path))
    assert "[and 2 more problems]" in e.value.message and len(e.value.all_diagnostics()) == 3


def test_an_unknown_key_far_from_any_known_one_gets_no_guess(tmp_path: Path) -> None:
    """No "did you mean" when nothing is close."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "policy.yaml").write_text("zzzz_qqqq: 1\n" + YAML.read_text())
    with pytest.raises(PolicyError, match="unknown key$"):
        load_policy(d)


def test_rego_settings_of_the_wrong_type_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`allow_shifted := "false"` and `similarity_min := "0.6"`: both named, the policy refused."""
    d = tmp_path / "rego"
    shutil.copytree(REGO, d)
    text = (d / "policy.rego").read_text()
    text = text.replace("\nallow_shifted := true", '\nallow_shifted := "false"')
    text = text.replace("similarity_min := 0.6", 'similarity_min := "0.6"')
    (d / "policy.rego").write_text(text)
    with pytest.raises(PolicyError, match="`allow_shifted` must be a boolean"):
        load_rego_policy(d)
    assert main(["policy", "check", str(d)]) == 2
    out = capsys.readouterr().out
    assert "`similarity_min` must be a number" in out and "2 problem(s)" in out


def test_the_shipped_rego_settings_have_their_types() -> None:
    """The default Rego policy passes the type check (every setting it defines is checked)."""
    assert load_rego_policy(REGO).name == "default"
