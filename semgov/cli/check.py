"""``semgov check``: replay captured requests offline against a policy."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import log
from semgov.cli.report import CheckReport, Finding, render_github, render_json, render_junit, render_sarif
from semgov.decide import Evaluator, SignedDecision, refused_input
from semgov.errors import InputError
from semgov.facts.compute import NOT_COMPARED
from semgov.intake.capture import MalformedLine, read_captured_at
from semgov.intake.limits import SETTINGS, Limits, positive_int_arg
from semgov.policy.engine import PolicyEngine, PolicySource
from semgov.policy.source import ENGINES, OpaServer, load_policy_source, make_engine
from semgov.signing.keys import Keyring, SigningKey, load_signing_key
from semgov.typing import AuditSink
from semgov.wire.models import GATES
from semgov.wire.timefmt import parse_rfc3339

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


def add_limit_flags(p: argparse.ArgumentParser, fields: tuple[str, ...] | None = None) -> None:
    """``--max-*`` flags for the limits in ``fields`` (every limit that has a flag when None)."""
    g = p.add_argument_group("resource limits (flag > environment variable > default)")
    default = Limits()
    for s in SETTINGS:
        if s.flag is None or (fields is not None and s.field not in fields):
            continue
        g.add_argument(
            s.flag,
            dest=s.field,
            type=positive_int_arg,
            metavar="N",
            help=f"{s.help} (default {getattr(default, s.field)} {s.unit}; environment {s.env})",
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The environment's limits, overridden by the ``--max-*`` flags given."""
    return Limits.from_env().with_overrides(
        **{s.field: getattr(args, s.field, None) for s in SETTINGS if s.flag is not None}
    )


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


@dataclass
class _Tally:
    requests: int = 0
    malformed: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    gate_fail: Counter[str] = field(default_factory=Counter)
    gate_error: Counter[str] = field(default_factory=Counter)
    approved_tokens: int = 0
    checked: int = 0
    unexpected: int = 0
    mismatches: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    not_compared: int = 0  # token_verification errors: another tenant's private donor, never compared
    where: tuple[str, int] = ("", 0)  # the captured file and line of the request being decided
    cases: list[list[Any]] = field(default_factory=list)  # [request_id, donor_id, warned] per decision

    def add(self, d: SignedDecision) -> None:
        self.decisions[d.decision] += 1
        self.cases.append([str(d.record["request_id"]), d.donor_id, False])
        self.approved_tokens += int(d.record["approved_tokens"])
        results = set()
        for g in d.record["gates"]:
            results.add(g["result"])
            if g["result"] == "fail":
                self.gate_fail[g["gate"]] += 1
            elif g["result"] == "error":
                self.gate_error[g["gate"]] += 1
                self.not_compared += NOT_COMPARED in str(g["detail"])
        # NOTE: a deny for the input (over the limits, malformed) is not an error of the policy
        # engine: the table counts its gate errors, the exit status does not (malformed lines: 2).
        if "error" in results and "fail" not in results and not refused_input(d.record):
            self.findings.append(
                Finding(
                    "error",
                    f"decided by errors alone: {_why(d)}",
                    str(d.record["request_id"]),
                    d.donor_id,
                    self.where[1],
                    self.where[0],
                )
            )

    def report(self, captured: str, ev: Evaluator) -> CheckReport:
        p = ev.policy
        policy = {"name": p.name, "version": p.version, "revision": p.revision, "engine": ev.engine.name}
        return CheckReport(
            captured,
            policy,
            decisions=sum(self.decisions.values()),
            allow=self.decisions["allow"],
            approved_tokens=self.approved_tokens,
            warnings=self.unexpected,
            cases=[(c[0], c[1], c[2]) for c in self.cases],
            findings=self.findings,
            gates={g: {"fail": self.gate_fail[g], "error": self.gate_error[g]} for g in GATES},
        )


def _why(d: SignedDecision) -> str:
    bad = [f"{g['gate']} {g['result']}: {g['detail']}" for g in d.record["gates"] if g["result"] != "pass"]
    return "; ".join(bad) if bad else "all gates pass"


def _summary(t: _Tally, args: argparse.Namespace, ev: Evaluator, out: IO[str]) -> None:
    total = sum(t.decisions.values())
    p = ev.policy
    w = out.write
    w(f"semgov check {args.captured}\n")
    w(f"policy   {p.name}@{p.version} ({p.revision[:19]}..., engine {ev.engine.name})\n")
    w(f"requests {t.requests} ({t.malformed} malformed)\n")
    w(
        f"decisions {total}: allow {t.decisions['allow']}, deny {t.decisions['deny']}; "
        f"approved tokens {t.approved_tokens}\n"
    )
    w("deny reasons by gate (a candidate can fail several):\n")
    w(f"  {'gate':<20}{'fail':>8}{'error':>8}\n")
    for g in GATES:
        w(f"  {g:<20}{t.gate_fail[g]:>8}{t.gate_error[g]:>8}\n")
    if t.not_compared:
        w(
            f"  ({t.not_compared} token_verification error(s): another tenant's private donor, "
            'deliberately not compared;\n   its tenant gate denies it: docs/policy.md "Token verification")\n'
        )
    if args.expect:
        w(
            f"expectations: {t.checked} checked, {len(t.mismatches)} mismatches, "
            f"{t.unexpected} without an expectation\n"
        )
    else:
        w(
            "expectations: not compared (no --expect): a test fails only when its decision was made "
            "by errors alone\n"
        )


def _engine(policy: PolicySource, args: argparse.Namespace) -> PolicyEngine:
    opa = None if args.opa_url is None else OpaServer(args.opa_url, args.opa_timeout, not args.opa_no_upload)
    return make_engine(policy, args.engine, opa=opa)


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
    logger = log.get_logger()
    limits = limits_from_args(args)
    policy = load_policy_source(args.policy, limits=limits)
    keyring = Keyring.load(args.trust)
    signer = _signer(args)
    now = parse_rfc3339(args.now, what="--now") if args.now else None
    ev = Evaluator(policy, keyring, signer, engine=_engine(policy, args), limits=limits)
    tally = _Tally()
    out_file: IO[bytes] | None = None
    if args.out is not None:
        try:
            out_file = open(args.out, "wb")  # noqa: SIM115
        except OSError as e:
            raise InputError(f"cannot write: {e.strerror}", source=str(args.out)) from e
    stdout = sys.stdout.buffer
    audit = None
    if args.audit is not None:
        from semgov.audit.keyring import AuditKeyring
        from semgov.audit.store import AuditLog

        origin = args.audit_origin or None  # NOTE: None: the log's own (semgov.audit.origin)
        audit_keyring = AuditKeyring.load(args.audit_keyring) if args.audit_keyring is not None else None
        audit = AuditLog.open(args.audit, signing_key=signer, origin=origin, keyring=audit_keyring)
        ev.sink = AuditSink(audit)

    def emit(d: SignedDecision) -> None:
        tally.add(d)
        if args.format == "jsonl":
            stdout.write(d.canonical + b"\n")
        if out_file is not None:
            out_file.write(d.canonical + b"\n")

    try:
        for file, line, item in read_captured_at(args.captured, limits=limits):
            tally.requests += 1
            tally.where = (file, line)
            if isinstance(item, MalformedLine):
                tally.malformed += 1
                logger.error(f"{file}:{line}: skipped malformed request: {item.reason}")
                tally.findings.append(
                    Finding(
                        "malformed", f"malformed request: {item.reason}", item.request_id, None, line, file
                    )
                )
                clock = now if now is not None else datetime.now(UTC)
                for d in ev.deny_malformed(item, clock):
                    emit(d)
                continue
            for d in ev.evaluate(item, now):
                emit(d)
                if args.expect:
                    _expect(tally, item.expect, d)
    finally:
        if out_file is not None:
            out_file.close()
        stdout.flush()
        if audit is not None:
            audit.close()  # NOTE: flushes (fsync) and signs a final checkpoint
            logger.info(
                f"audit log {args.audit}: {audit.size} records, checkpoint at {audit.checkpoint_size}"
            )

    return _finish(tally, args, ev)


def _signer(args: argparse.Namespace) -> SigningKey:
    """The --signing-key, or a throwaway key when no signed record is written anywhere."""
    if args.signing_key is not None:
        return load_signing_key(args.signing_key)
    if args.out is not None or args.audit is not None or args.format == "jsonl":
        raise InputError(
            "--signing-key KEY is needed: --out, --audit and --format jsonl write signed records"
        )
    # NOTE: nothing leaves this process signed: the decisions are counted and dropped.
    return SigningKey.from_private(Ed25519PrivateKey.generate())


def _expect(tally: _Tally, expect: Mapping[str, str] | None, d: SignedDecision) -> None:
    """Compare one decision with its request's expectation (``--expect``)."""
    want = (expect or {}).get(d.donor_id)
    if want is None:
        tally.unexpected += 1
        tally.cases[-1][2] = True  # NOTE: a warning: no expectation to compare with
        return
    tally.checked += 1
    if want != d.decision:
        file, line = tally.where
        why = f"expected {want}, got {d.decision} ({_why(d)})"
        request_id = str(d.record["request_id"])
        tally.mismatches.append(f"{file}:{line}: request {request_id} donor {d.donor_id}: {why}")
        tally.findings.append(Finding("mismatch", why, request_id, d.donor_id, line, file))


def _finish(tally: _Tally, args: argparse.Namespace, ev: Evaluator) -> int:
    """Write the chosen format's summary; the exit status."""
    from semgov import __version__

    if args.max_errors < 0:
        raise InputError(f"--max-errors must be 0 or more, not {args.max_errors}")
    report = tally.report(str(args.captured), ev)
    errors = report.count("error")
    if errors <= args.max_errors:  # NOTE: tolerated errors are not failures
        report.findings = [f for f in report.findings if f.kind != "error"]
    fmt = args.format
    if fmt in ("table", "jsonl"):
        if fmt == "table":
            _summary(tally, args, ev, sys.stdout)
        for m in tally.mismatches:
            print(f"MISMATCH {m}", file=sys.stderr if fmt == "jsonl" else sys.stdout)
        for f in (f for f in report.findings if f.kind == "error"):
            print(f"ERROR request {f.request_id} donor {f.donor_id}: {f.message}", file=sys.stderr)
        print(report.closing_line(), file=sys.stderr if fmt == "jsonl" else sys.stdout)
    else:
        renders = {"json": render_json, "junit": render_junit, "github": render_github}
        sys.stdout.write(render_sarif(report, __version__) if fmt == "sarif" else renders[fmt](report))
    if errors:
        log.get_logger().error(
            f"{errors} decision(s) made by errors alone (tolerated: {args.max_errors}): the policy "
            "engine failed, timed out or answered something invalid"
        )
    if tally.malformed:
        log.get_logger().error(f"{tally.malformed} malformed line(s) in {args.captured}")
        return 2
    return 1 if report.failures else 0
