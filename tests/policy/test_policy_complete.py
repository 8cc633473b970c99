"""A YAML policy is complete or refused: the end marker (issue 31, section 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from semgov import PolicyError, parse_policy
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

SHIPPED = [DEFAULT_POLICY_DIR / "policy.yaml", ROOT / "tests" / "sglang_server" / "policy" / "policy.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name)
def test_every_prefix_of_a_shipped_policy_is_refused(path: Path) -> None:
    """Cut anywhere (every line end, and every 5th byte), a shipped policy never loads: before the
    end marker, omitted keys would take their defaults (quality.allow_shifted: true) and cut
    numbers would be smaller bars."""
    content = path.read_bytes()
    parse_policy(content, "whole")
    cuts = {i + 1 for i, b in enumerate(content) if b == 0x0A} | set(range(1, len(content), 5))
    end = content.rindex(b"\n...")
    loaded = []
    for n in sorted(c for c in cuts if c <= end):
        try:
            parse_policy(content[:n], "cut")
            loaded.append(n)
        except PolicyError:
            pass
    assert loaded == []


TAILS = ["...\n", "...", "... # end\n", "...\n# trailing comment\n\n"]


@pytest.mark.parametrize("tail", TAILS, ids=["nl", "bare", "comment", "after"])
def test_the_end_marker_forms_that_load(tail: str) -> None:
    """The marker may end the file, carry a comment, or be followed by comments and blank lines."""
    assert parse_policy(f"name: p\nversion: '1'\n{tail}".encode(), "x").ref == "p@1"


def test_a_policy_without_the_end_marker_is_refused_naming_it() -> None:
    """A complete-looking policy without ``...`` is refused, the message naming the marker."""
    with pytest.raises(PolicyError, match=r"end marker '\.\.\.'") as e:
        parse_policy(b"name: p\nversion: '1'\n", "p.yaml")
    assert e.value.line == 2
