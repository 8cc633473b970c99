"""Candidate filtering: which of a provider's matches may be decided at all.

One rule, used wherever candidates meet the donor table (the decision process,
:mod:`engine_hooks.core.decider`, and the in-process registry, :mod:`engine_hooks.core.donors`):
a match counts only if it names a registered donor of exactly the recipient's scope. It imports
nothing of semgov, so every module that filters can use it without importing another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["candidate_entries"]


def candidate_entries(
    donors: Mapping[str, Any], scope: str, matches: Sequence[Any]
) -> list[tuple[Any, float]]:
    """The provider's matches that are registered donors of exactly this scope, in order."""
    out = []
    for m in matches:
        entry = donors.get(m.donor_id)
        # NOTE: scope is checked here too: isolation never rests on the provider alone.
        if entry is not None and entry.scope == scope:
            out.append((entry, m.similarity))
    return out
