"""Names the command line offers before it loads anything heavy (the policy engines)."""

from __future__ import annotations

ENGINES = ("auto", "yaml", "regorus", "opa-inprocess")
# `semgov diff --fail-on`: which changes fail the run (semgov.cli.diff_report.FAIL_ON says what each means).
DIFF_FAIL_ON = ("any", "flip", "deny-to-allow", "allow-to-deny")
