"""Rollout: whether a policy accepts the donors of the one it replaces, asked of its own engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from semgov.cli.main import main
from semgov.policy.engine import EngineResult, GateOutcome
from semgov.policy.rollout import Replacement, accepts_version, probe
from semgov.policy.source import load_policy_source, make_engine
from semgov.wire.policy_input import PolicyInput, to_json_dict
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

REGO_DIR = ROOT / "policies" / "rego" / "default"


def test_the_probe_is_a_valid_policy_input() -> None:
    """The probe document validates as a policy input (round trip through its JSON form)."""
    doc = probe("default@1")
    assert TypeAdapter(PolicyInput).validate_python(to_json_dict(doc)) == doc


@pytest.mark.parametrize("directory", [DEFAULT_POLICY_DIR, REGO_DIR], ids=["yaml", "rego"])
def test_default_policy_accepts_its_own_version_only(directory: Path) -> None:
    """YAML and Rego default policies pass their own name@version and fail any other."""
    engine = make_engine(load_policy_source(directory))
    assert accepts_version(engine, "default@1") is True
    assert accepts_version(engine, "default@0") is False
    assert accepts_version(engine, "other@1") is False


def test_an_engine_that_cannot_answer_gives_none() -> None:
    """An engine that raises, or reports no pass/fail at policy_version, cannot tell (None)."""

    class Raises:
        name = "raises"

        def evaluate(self, doc: PolicyInput) -> EngineResult:
            raise RuntimeError("boom")

    class Errors:
        name = "errors"

        def evaluate(self, doc: PolicyInput) -> EngineResult:
            return EngineResult([GateOutcome("policy_version", "error", "x")], [])

    assert accepts_version(Raises(), "a@1") is None and accepts_version(Errors(), "a@1") is None
    assert Replacement("a@1", "a@2", None).warning() is not None  # NOTE: doubt is reported
    assert (
        Replacement("a@1", "a@1", False).warning() is None
        and Replacement("a@1", "a@2", True).warning() is None
    )


def test_policy_check_replaces_warns_until_the_old_version_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bumped policy warns (exit 0) that it drops the old donors; listing the old version clears it."""
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text().replace('version: "1"', 'version: "2"', 1)
    (tmp_path / "policy.yaml").write_text(text)
    assert main(["policy", "check", str(tmp_path), "--replaces", str(DEFAULT_POLICY_DIR)]) == 0
    out = capsys.readouterr().out
    assert "warning: default@2 does not accept donors produced under default@1" in out
    assert "0 problem(s), 1 warning(s)" in out
    (tmp_path / "policy.yaml").write_text(
        text.replace("accepted_policy_versions: []", 'accepted_policy_versions: ["default@1"]')
    )
    assert main(["policy", "check", str(tmp_path), "--replaces", str(DEFAULT_POLICY_DIR)]) == 0
    assert "0 problem(s), 0 warning(s)" in capsys.readouterr().out
    assert main(["policy", "check", str(REGO_DIR), "--replaces", str(tmp_path)]) == 0
    assert "warning: default@1 does not accept donors produced under default@2" in capsys.readouterr().out
