"""What the benchmarks' ``--smoke`` modes share (``tests/test_benchmarks_smoke.py`` runs them).

A smoke run proves that a script still runs end to end on today's code and prints its figures;
its sizes are tiny, so the figures themselves mean nothing.
"""

from __future__ import annotations

from typing import Any

from semgov.facts.pii import PiiScanner


class NoPii(PiiScanner):
    """A PII scanner that finds nothing and never loads Presidio (whose load alone takes about 10 s
    on the project's machine): a smoke run's facts are computed without the PII scan."""

    def scan(self, text: str, **kw: Any) -> frozenset[str]:
        return frozenset()
