"""The work of ``semgov check`` (:mod:`semgov.cli.check` registers the command and imports
this only when it runs, so its ``--help`` loads none of it)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import log
from semgov.cli.limit_flags import limits_from_args
from semgov.cli.report import CheckReport, Finding, render_github, render_json, render_junit, render_sarif
from semgov.decide import Evaluator, SignedDecision, refused_input
from semgov.errors import InputError
from semgov.facts.compute import NOT_COMPARED
from semgov.intake.capture import MalformedLine, read_captured_at
from semgov.policy.engine import PolicyEngine, PolicySource
from semgov.policy.source import OpaServer, load_policy_source, make_engine
from semgov.signing.keys import Keyring, SigningKey, load_signing_key
from semgov.typing import AuditSink
from semgov.wire.models import GATES
from semgov.wire.timefmt import parse_rfc3339


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
