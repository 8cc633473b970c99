"""CI formats for ``semgov policy test``: a JSON document, JUnit XML, SARIF 2.1.0 and GitHub
workflow annotations, one entry per test.

A test's location is ``file:line`` (a case's line in its ``*_test.yaml``, a Rego test rule's
first line in its ``*_test.rego``), or a bare ``file`` when no line is known. SARIF and GitHub
annotations carry the file and line as fields (``physicalLocation``, ``file=,line=``) so that
code scanning and pull-request views attach each failure to its line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape, quoteattr

if TYPE_CHECKING:
    from semgov.policy.testing import TestOutcome

POLICY_TEST_REPORT_SCHEMA = "semgov.policy_test_report/v1"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# SARIF rule ids: a test whose outcome differs from its expectation, and one that could not run.
TEST_RULES = {
    "FAIL": ("semgov/policy-test-failed", "A policy test's outcome differs from its expectation"),
    "ERROR": ("semgov/policy-test-error", "A policy test could not be evaluated"),
}


def split_location(location: str) -> tuple[str, int | None]:
    """``("file", line)`` of a ``file:line`` location; ``("file", None)`` when it names no line."""
    path, sep, line = location.rpartition(":")
    if sep and line.isdigit() and path:
        return path, int(line)
    return location, None


def _gh(text: str) -> str:
    """A GitHub workflow command's message: ``%``, CR and LF escaped as the runner expects."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    """A workflow command property value (``file=``, ``title=``): also ``,`` and ``:`` escaped."""
    return _gh(text).replace(",", "%2C").replace(":", "%3A")


def render_github(outcomes: Sequence[TestOutcome], closing: str) -> str:
    """``::error file=F,line=N,title=...::message`` per failed test, then a ``::notice`` summary."""
    out = []
    for o in outcomes:
        if o.status == "PASS":
            continue
        path, line = split_location(o.location)
        where = f"file={_gh_property(path)}" + (f",line={line}" if line is not None else "")
        message = _gh(o.message or o.status) + "".join(_gh("\n" + x) for x in o.explanation)
        out.append(f"::error {where},title={_gh_property(f'{o.status} {o.name}')}::{message}")
    return "\n".join([*out, f"::notice title=semgov policy test::{_gh(closing)}", closing]) + "\n"


def render_sarif(outcomes: Sequence[TestOutcome], suite: str, engine: str, closing: str, version: str) -> str:
    """SARIF 2.1.0: one ``error`` result per failed or errored test, located at its file and line."""
    results = []
    for o in outcomes:
        if o.status == "PASS":
            continue
        path, line = split_location(o.location)
        region = {"region": {"startLine": line}} if line is not None else {}
        text = f"{o.name}: {o.message}" if o.message else o.name
        results.append(
            {
                "ruleId": TEST_RULES["FAIL" if o.status == "FAIL" else "ERROR"][0],
                "level": "error",
                "message": {"text": "\n".join([text, *o.explanation])},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": path}, **region}}],
                "properties": {"test": o.name, "status": o.status},
            }
        )
    rules = [{"id": rid, "shortDescription": {"text": text}} for rid, text in TEST_RULES.values()]
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "semgov", "version": version, "rules": rules}},
                "results": results,
                "properties": {"suite": suite, "engine": engine, "summary": closing},
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def render_json(outcomes: Sequence[TestOutcome], suite: str, engine: str, closing: str) -> str:
    """The ``semgov.policy_test_report/v1`` document."""
    doc = {
        "schema": POLICY_TEST_REPORT_SCHEMA,
        "suite": suite,
        "engine": engine,
        "summary": closing,
        "tests": [
            {"name": o.name, "location": o.location, "status": o.status, "message": o.message,
             "seconds": round(o.seconds, 6),
             **({"explanation": list(o.explanation)} if o.explanation else {})}
            for o in outcomes
        ],
    }  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


def render_junit(outcomes: Sequence[TestOutcome], suite: str, closing: str) -> str:
    """One testsuite, one testcase per test (a ``failure`` or ``error`` element when it did not pass)."""
    failures = sum(o.status == "FAIL" for o in outcomes)
    errors = sum(o.status not in ("PASS", "FAIL") for o in outcomes)
    name = quoteattr(suite)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites name={name} tests="{len(outcomes)}" failures="{failures}" errors="{errors}">',
        f'  <testsuite name={name} tests="{len(outcomes)}" failures="{failures}" errors="{errors}">',
    ]
    for o in outcomes:
        head = (
            f'    <testcase classname={quoteattr(o.location)} name={quoteattr(o.name)} time="{o.seconds:.6f}"'
        )
        if o.status == "PASS":
            lines.append(head + "/>")
            continue
        tag = "failure" if o.status == "FAIL" else "error"
        body = escape("\n".join(o.explanation))
        lines += [
            head + ">",
            f"      <{tag} message={quoteattr(o.message)}>{body}</{tag}>",
            "    </testcase>",
        ]
    lines += [f"    <system-out>{escape(closing)}</system-out>", "  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines)


def render_tests(outcomes: Sequence[TestOutcome], fmt: str, suite: str, engine: str, closing: str) -> str:
    """``semgov policy test`` as ``json``, ``junit``, ``sarif`` or ``github``."""
    if fmt == "json":
        return render_json(outcomes, suite, engine, closing)
    if fmt == "github":
        return render_github(outcomes, closing)
    if fmt == "sarif":
        from semgov import __version__

        return render_sarif(outcomes, suite, engine, closing, __version__)
    return render_junit(outcomes, suite, closing)
