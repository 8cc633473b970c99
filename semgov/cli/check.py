"""``semgov check``: replay captured requests offline against a policy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from semgov.cli.limit_flags import add_limit_flags
from semgov.policy.choices import ENGINES

DESCRIPTION = """\
Evaluate every donor candidate of every captured request (JSON Lines, '.gz' ok,
'-' for stdin, or a capture directory: its *.jsonl and *.jsonl.gz files in name
order, as one stream) against a policy, and sign each decision.

The decision clock is each request's received_at unless --now is given.
--format table prints a summary (allow/deny counts, deny reasons by gate);
--format jsonl prints the signed decision records. --out FILE also writes the
records to FILE, whatever --format says. A malformed line is reported with its
line number and skipped (its candidates, when known, get a signed deny); the
rest still runs, and the exit status is 2 at the end.

Resource limits (docs/limits.md): a line over --max-line-bytes is malformed; a
request over --max-candidates, or whose recipient prompt is over
--max-prompt-tokens or --max-text-chars, gets a signed deny for every candidate,
and a donor prompt over them denies that candidate. Each flag overrides its
SEMGOV_MAX_* environment variable; YAML and Rego nesting limits are set by
SEMGOV_MAX_YAML_DEPTH, SEMGOV_MAX_YAML_NODES and SEMGOV_MAX_REGO_DEPTH."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="replay captured requests against a policy",
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
        required=True,
        type=Path,
        metavar="DIR",
        help="policy directory: policy.yaml (YAML engine) or *.rego modules (Rego, package semgov.reuse)",
    )
    _engine_flags(p)
    p.add_argument(
        "--trust",
        required=True,
        type=Path,
        metavar="KEYRING",
        help="keyring of trusted provenance keys (JSON)",
    )
    p.add_argument(
        "--signing-key",
        type=Path,
        metavar="KEY",
        help="Ed25519 PKCS#8 PEM key that signs decisions; needed when records are written (--out, "
        "--audit, --format jsonl), otherwise a throwaway key signs them",
    )
    p.add_argument(
        "--now", metavar="RFC3339", help="decision clock for every request (default: its received_at)"
    )
    p.add_argument(
        "--format",
        choices=("table", "jsonl", "json", "junit", "sarif", "github"),
        default="table",
        help="stdout format (default: table): jsonl = the signed records; json, junit (XML), sarif "
        "(2.1.0) and github (workflow annotations) = the findings, for CI. Every format ends with "
        "`N tests, N passed, N warnings, N failures` (on stderr for jsonl)",
    )
    p.add_argument(
        "--max-errors",
        type=int,
        default=0,
        metavar="N",
        help="decisions made by errors alone (a deny no gate failed: the engine failed, timed out or "
        "answered something invalid; denies for the input itself, over the limits or malformed, do not "
        "count) tolerated before the exit status is 1 (default 0)",
    )
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="also write the signed decision records (JSONL) to FILE"
    )
    p.add_argument(
        "--expect",
        action="store_true",
        help="compare decisions with each request's `expect`; exit 1 listing every mismatch",
    )
    _audit_flags(p)
    add_limit_flags(p)
    p.set_defaults(func=run)


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """Which engine decides: ``--engine`` and the OPA server flags."""
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="policy engine (default auto: yaml for policy.yaml, regorus for .rego)",
    )
    p.add_argument(
        "--opa-url",
        metavar="URL",
        help="evaluate the Rego policy on an OPA server, e.g. http://127.0.0.1:8181 (errors deny)",
    )
    p.add_argument(
        "--opa-timeout", type=float, default=2.0, metavar="S", help="OPA server timeout (default 2 s)"
    )
    p.add_argument(
        "--opa-no-upload",
        action="store_true",
        help="use the policy the OPA server already holds instead of uploading --policy",
    )


def _audit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--audit",
        type=Path,
        metavar="DIR",
        help="also append every signed decision to the audit log in DIR (created if needed)",
    )
    p.add_argument(
        "--audit-origin",
        metavar="NAME",
        help="the audit log's checkpoint origin line, the name its proofs are bound to, unique per log "
        "(default: the log's own, from DIR/origin: a random semgov/<hex> written when the log is created; "
        "a log written before that keeps the origin its checkpoints name)",
    )
    p.add_argument(
        "--audit-keyring",
        type=Path,
        metavar="FILE",
        help="audit keyring of other keys whose seals and checkpoints the log may end in (after a key "
        "rotation: the previous signing key; docs/operations.md)",
    )


def run(args: argparse.Namespace) -> int:
    """Replay (the work is in :mod:`semgov.cli.check_run`, imported here)."""
    from semgov.cli.check_run import run as run_check

    return run_check(args)
