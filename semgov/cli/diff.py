"""``semgov diff``: what a policy change does to captured traffic (the policy pull-request check)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from semgov.cli.limit_flags import add_limit_flags
from semgov.policy.choices import DIFF_FAIL_ON, ENGINES

DESCRIPTION = """\
Decide every donor candidate of every captured request (JSON Lines, '.gz' ok, '-'
for stdin, or a capture directory: its *.jsonl and *.jsonl.gz files in name order,
as one stream) under policy A and under policy B, and report what changes:

  flipped   the decision changed: allow->deny or deny->allow
  spans     both allow, but the approved spans (what the engine copies) differ
  reasons   both deny, but the failing or erroring gates differ (nothing served changes)

The table counts each kind, then groups flips and span changes by gate (every gate
whose result changed), tenant, namespace and task, with the approved tokens under A
and under B, then lists the changes. --format json gives the same as one document;
--format jsonl one line per change. Decisions are signed with a throwaway key and
never written: this command compares, it does not record.

CI formats (--format sarif|github|junit): changes are grouped by cause, the policy line of B
each is attributed to (the setting or deny rule of the gate whose result turned, preferring a
line B changed from A), the gate and the direction; SARIF and GitHub give one result per group
at that policy line, with its count and a few examples at their captured file and line; JUnit
one testcase per decision compared. Changes --fail-on names are failures (errors), every other
change (deny-reason changes always) a warning.

exit status: 0 no change --fail-on names (default any: no decision flipped and no approved
spans changed); 1 some did (for CI: a policy change that changes serving needs a reviewer;
--fail-on deny-to-allow blocks only new reuse); 2 bad input (malformed lines are counted and
skipped, and reported at the end), unreadable policy, keyring or captured file."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two policies' decisions on captured requests",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "captured",
        metavar="CAPTURED",
        help="captured requests, one JSON object per line: a .jsonl or .jsonl.gz file, '-' for stdin, or a "
        "capture directory (its *.jsonl and *.jsonl.gz files in name order, e.g. a CaptureWriter's)",
    )
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        type=Path,
        metavar="DIR",
        help="give it twice: policy A (before), then policy B (after); YAML or Rego, each its own language",
    )
    p.add_argument(
        "--engine", choices=ENGINES, default="auto", help="policy engine for both (default auto: per policy)"
    )
    p.add_argument(
        "--trust",
        required=True,
        type=Path,
        metavar="KEYRING",
        help="keyring of trusted provenance keys (JSON)",
    )
    p.add_argument(
        "--now", metavar="RFC3339", help="decision clock for every request (default: its received_at)"
    )
    p.add_argument(
        "--format",
        choices=("table", "json", "jsonl", "junit", "sarif", "github"),
        default="table",
        help="stdout format (default: table); sarif and github report changes grouped by cause (policy "
        "line, gate, direction), junit one testcase per decision: the changes --fail-on names as "
        "failures, the rest (deny-reason changes always) as warnings; table and CI formats end with "
        "`N tests, N passed, N warnings, N failures`",
    )
    p.add_argument(
        "--fail-on",
        choices=DIFF_FAIL_ON,
        default="any",
        help="which changes fail (exit 1, errors in CI formats): any (default: every flip and "
        "approved-span change), flip (either direction), deny-to-allow (reuse gained), allow-to-deny",
    )
    p.add_argument(
        "--show",
        type=int,
        default=50,
        metavar="N",
        help="the table lists at most N changes and N rows per group (default 50; 0: no changes, "
        "every row); json and jsonl list all",
    )
    add_limit_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compare (the work is in :mod:`semgov.cli.diff_run`, imported here)."""
    from semgov.cli.diff_run import run as run_diff

    return run_diff(args)
