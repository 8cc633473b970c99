"""CI formats for ``semgov check`` (a JSON document, JUnit XML, SARIF 2.1.0, GitHub annotations);
``semgov diff``'s are in :mod:`semgov.cli.diff_report`, ``semgov policy test``'s in
:mod:`semgov.cli.policy_report`.

Pure rendering of a :class:`CheckReport` (what one run found); the command fills it in. The
conventions are conftest's and OPA's: every decision is a test; a test fails when its decision
differs from the request's ``expect`` or it was decided by errors alone (a deny no gate failed:
the engine failed, timed out or answered something invalid, or a fact could not be computed);
a malformed request line is a failure too; under ``--expect`` a decision with no expectation is
a warning. The closing line of every format is ``N tests, N passed, N warnings, N failures``;
JUnit has one testcase per decision and per malformed line, so its counts are its elements'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr

if TYPE_CHECKING:
    pass

Kind = Literal["mismatch", "error", "malformed"]
RULES: dict[Kind, tuple[str, str]] = {
    "mismatch": ("semgov/decision-mismatch", "A decision differs from the request's expectation"),
    "error": ("semgov/error-decision", "A decision was made by errors alone (no gate failed)"),
    "malformed": ("semgov/malformed-request", "A captured request line is not a valid request"),
}
CHECK_REPORT_SCHEMA = "semgov.check_report/v1"
POLICY_TEST_REPORT_SCHEMA = "semgov.policy_test_report/v1"


@dataclass(frozen=True, slots=True)
class Finding:
    """One failed test: what, where (request, donor, captured line when known) and why."""

    kind: Kind
    message: str
    request_id: str | None = None
    donor_id: str | None = None
    line: int | None = None
    file: str | None = None  # the captured file holding ``line`` (a capture directory's file)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rule": RULES[self.kind][0],
            "request_id": self.request_id,
            "donor_id": self.donor_id,
            "file": self.file,
            "line": self.line,
            "message": self.message,
        }


@dataclass
class CheckReport:
    """What one ``semgov check`` run found."""

    captured: str
    policy: dict[str, Any]
    command: str = "semgov check"
    decisions: int = 0
    allow: int = 0
    approved_tokens: int = 0
    warnings: int = 0
    findings: list[Finding] = field(default_factory=list)
    gates: dict[str, dict[str, int]] = field(default_factory=dict)
    cases: list[tuple[str, str, bool]] = field(default_factory=list)  # per decision: ids, warned

    @property
    def failures(self) -> int:
        return len(self.findings)

    @property
    def tests(self) -> int:
        """Every decision, and every malformed line (whose donors get deny decisions too)."""
        return self.decisions + sum(1 for f in self.findings if f.kind == "malformed")

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.warnings

    def closing_line(self) -> str:
        return f"{self.tests} tests, {self.passed} passed, {self.warnings} warnings, {self.failures} failures"

    def count(self, kind: Kind) -> int:
        return sum(1 for f in self.findings if f.kind == kind)


def render_json(r: CheckReport) -> str:
    doc = {
        "schema": CHECK_REPORT_SCHEMA,
        "captured": r.captured,
        "policy": r.policy,
        "summary": {
            "tests": r.tests,
            "passed": r.passed,
            "warnings": r.warnings,
            "failures": r.failures,
            "decisions": r.decisions,
            "allow": r.allow,
            "deny": r.decisions - r.allow,
            "approved_tokens": r.approved_tokens,
            "mismatches": r.count("mismatch"),
            "errors": r.count("error"),
            "malformed": r.count("malformed"),
        },
        "gates": r.gates,
        "findings": [f.as_json() for f in r.findings],
    }
    return json.dumps(doc, indent=2) + "\n"


def render_junit(r: CheckReport) -> str:
    """One testcase per decision (its ``<failure>``/``<error>`` findings, ``<skipped>`` for a warning)
    and one per malformed line: the suite's counts are its testcases' and their elements'."""
    by_case: dict[tuple[str | None, str | None], list[Finding]] = {}
    for f in r.findings:
        if f.kind != "malformed":
            by_case.setdefault((f.request_id, f.donor_id), []).append(f)
    body: list[str] = []
    for request_id, donor_id, warned in r.cases:
        found = by_case.pop((request_id, donor_id), [])
        body += _junit_case(request_id, f"donor {donor_id}", found, warned)
    for f in [f for f in r.findings if f.kind == "malformed"] + [f for fs in by_case.values() for f in fs]:
        body += _junit_case(f.request_id or f"{f.file or r.captured}:{f.line}", f.kind, [f], False)
    tests = sum(x.startswith("    <testcase") for x in body)
    errors = sum(x.startswith("      <error") for x in body)
    failures = sum(x.startswith("      <failure") for x in body)
    skipped = sum(x.startswith("      <skipped") for x in body)
    name = quoteattr(f"{r.command} {r.captured}")
    counts = f'tests="{tests}" failures="{failures}" errors="{errors}" skipped="{skipped}"'
    return "\n".join(
        ['<?xml version="1.0" encoding="UTF-8"?>', f"<testsuites name={name} {counts}>"]
        + [f"  <testsuite name={name} {counts}>", *body]
        + [f"    <system-out>{escape(r.closing_line())}</system-out>", "  </testsuite>", "</testsuites>", ""]
    )


def _junit_case(classname: str | None, name: str, found: list[Finding], warned: bool) -> list[str]:
    head = f"    <testcase classname={quoteattr(classname or '')} name={quoteattr(name)}"
    if not found and not warned:
        return [head + "/>"]
    out = [head + ">"]
    for f in found:
        tag = "error" if f.kind == "error" else "failure"
        out.append(f"      <{tag} type={quoteattr(RULES[f.kind][0])} message={quoteattr(f.message)}/>")
    if warned and not found:
        out.append('      <skipped message="no expectation for this decision (--expect)"/>')
    return [*out, "    </testcase>"]


def render_sarif(r: CheckReport, version: str) -> str:
    results = []
    for f in r.findings:
        region = {"region": {"startLine": f.line}} if f.line is not None else {}
        results.append(
            {
                "ruleId": RULES[f.kind][0],
                "level": "error",
                "message": {"text": f.message},
                "locations": [
                    {"physicalLocation": {"artifactLocation": {"uri": _uri(f.file or r.captured)}, **region}}
                ],
                "properties": {"request_id": f.request_id, "donor_id": f.donor_id},
            }
        )
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "semgov",
                        "version": version,
                        "rules": [
                            {"id": rid, "shortDescription": {"text": text}} for rid, text in RULES.values()
                        ],
                    }
                },
                "results": results,
                "properties": {"summary": r.closing_line(), "policy": r.policy},
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def _uri(path: str) -> str:
    return quote(path, safe="/:")


def _gh(text: str) -> str:
    """A GitHub workflow command's message: ``%``, CR and LF escaped as the runner expects."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def render_github(r: CheckReport) -> str:
    """GitHub Actions workflow commands: one ``::error`` per finding, a ``::notice`` summary."""
    out = []
    for f in r.findings:
        where = f"file={_gh(f.file or r.captured).replace(',', '%2C')}" + (
            f",line={f.line}" if f.line else ""
        )
        title = _gh(RULES[f.kind][1]).replace(",", "%2C").replace(":", "%3A")
        out.append(f"::error {where},title={title}::{_gh(f.message)}")
    out.append(f"::notice title={_gh(r.command)}::{_gh(r.closing_line())}")
    out.append(r.closing_line())
    return "\n".join(out) + "\n"
