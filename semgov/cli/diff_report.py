"""``semgov diff``'s CI formats: SARIF 2.1.0, GitHub annotations and JUnit XML.

Changes are grouped by cause: the policy line they are attributed to (:mod:`semgov.policy.cause`),
the gate and the direction (``allow->deny``, ``deny->allow``, ``spans``, ``reasons``). SARIF and
GitHub give one result per group, located at that policy line, with its count and a few examples
(each at its captured file and line); JUnit gives one testcase per decision compared. A change
whose kind ``--fail-on`` names is a failure, any other change a warning, a malformed line a
failure. Every format ends with ``N tests, N passed, N warnings, N failures``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import escape, quoteattr

from semgov.policy.cause import Cause
from semgov.policy.choices import DIFF_FAIL_ON
from semgov.policy.diff import Change

RULES: dict[str, tuple[str, str]] = {
    "deny->allow": (
        "semgov/diff/deny-to-allow",
        "The policy change turns a deny into an allow (reuse gained)",
    ),
    "allow->deny": ("semgov/diff/allow-to-deny", "The policy change turns an allow into a deny (reuse lost)"),
    "spans": ("semgov/diff/span-change", "The policy change changes the spans an allow reuses"),
    "reasons": (
        "semgov/diff/deny-reason-change",
        "The policy change changes which gates deny a candidate (nothing served changes)",
    ),
    "malformed": ("semgov/malformed-request", "A captured request line is not a valid request"),
}
FAIL_ON: dict[str, frozenset[str]] = {
    "any": frozenset({"allow->deny", "deny->allow", "spans"}),
    "flip": frozenset({"allow->deny", "deny->allow"}),
    "deny-to-allow": frozenset({"deny->allow"}),
    "allow-to-deny": frozenset({"allow->deny"}),
}
# NOTE: the choices `semgov diff --help` offers without importing this module
assert tuple(FAIL_ON) == DIFF_FAIL_ON
_VERB = {
    "deny->allow": "flip deny->allow",
    "allow->deny": "flip allow->deny",
    "spans": "change approved spans (both allow)",
    "reasons": "change deny reasons (both deny)",
}
EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class Located:
    """A change and the captured file and line of its request."""

    change: Change
    file: str
    line: int


@dataclass
class Group:
    """The changes of one cause: policy line, gate, direction."""

    kind: str
    cause: Cause
    items: list[Located] = field(default_factory=list)

    def message(self) -> str:
        c, n = self.cause, len(self.items)
        head = f"{n} decision(s) {_VERB[self.kind]} at gate {c.gate}, attributed to {c.file}:{c.line}"
        head += f" ({c.setting})"
        shown = [
            f"{x.change.request_id}/{x.change.donor_id} ({x.file}:{x.line})" for x in self.items[:EXAMPLES]
        ]
        more = f", and {n - len(shown)} more" if n > len(shown) else ""
        return f"{head}; e.g. {', '.join(shown)}{more}"


@dataclass
class DiffReport:
    """What one ``semgov diff`` run found, for the CI formats."""

    captured: str
    policies: dict[str, Any]
    fail_on: str
    cases: list[tuple[str, str, Change | None]] = field(default_factory=list)  # every decision compared
    groups: list[Group] = field(default_factory=list)
    malformed: list[tuple[str, int, str]] = field(default_factory=list)  # file, line, reason

    def add(self, change: Change, where: Located, cause: Cause) -> None:
        for g in self.groups:
            if g.kind == change.kind and g.cause == cause:
                g.items.append(where)
                return
        self.groups.append(Group(change.kind, cause, [where]))

    def failing(self, kind: str) -> bool:
        return kind in FAIL_ON[self.fail_on]

    def ordered(self) -> list[Group]:
        """Failing groups first, deny->allow before allow->deny, then the largest."""
        order = list(RULES)
        return sorted(
            self.groups, key=lambda g: (not self.failing(g.kind), order.index(g.kind), -len(g.items))
        )

    @property
    def tests(self) -> int:
        return len(self.cases) + len(self.malformed)

    @property
    def failures(self) -> int:
        return len(self.malformed) + sum(len(g.items) for g in self.groups if self.failing(g.kind))

    @property
    def warnings(self) -> int:
        return sum(len(g.items) for g in self.groups if not self.failing(g.kind))

    def closing_line(self) -> str:
        passed = self.tests - self.failures - self.warnings
        return f"{self.tests} tests, {passed} passed, {self.warnings} warnings, {self.failures} failures"


def _uri(path: str) -> str:
    return quote(path, safe="/:")


def _loc(file: str, line: int, **extra: Any) -> dict[str, Any]:
    where = {"artifactLocation": {"uri": _uri(file)}, "region": {"startLine": max(1, line)}}
    return {"physicalLocation": where, **extra}


def render_sarif(r: DiffReport, version: str) -> str:
    """One result per group, at the policy line, then the first example's captured line."""
    ids = list(RULES)
    results = []
    for g in r.ordered():
        fail = r.failing(g.kind)
        ex = g.items[:EXAMPLES]
        results.append(
            {
                "ruleId": RULES[g.kind][0],
                "ruleIndex": ids.index(g.kind),
                "level": "error" if fail else "warning",
                "message": {"text": g.message()},
                "locations": [_loc(g.cause.file, g.cause.line), _loc(ex[0].file, ex[0].line)],
                "relatedLocations": [
                    _loc(
                        x.file,
                        x.line,
                        id=i,
                        message={
                            "text": f"request {x.change.request_id} donor "
                            f"{x.change.donor_id}: approved tokens {x.change.a_tokens} -> {x.change.b_tokens}"
                        },
                    )
                    for i, x in enumerate(ex)
                ],  # fmt: skip
                "properties": {
                    "count": len(g.items),
                    "gate": g.cause.gate,
                    "direction": g.kind,
                    "setting": g.cause.setting,
                    "examples": [
                        {"request_id": x.change.request_id, "donor_id": x.change.donor_id} for x in ex
                    ],
                },
            }
        )
    for file, line, reason in r.malformed:
        results.append(
            {
                "ruleId": RULES["malformed"][0],
                "ruleIndex": ids.index("malformed"),
                "level": "error",
                "message": {"text": f"malformed request: {reason}"},
                "locations": [_loc(file, line)],
            }
        )
    rules = [{"id": rid, "shortDescription": {"text": text}} for rid, text in RULES.values()]
    driver = {"name": "semgov", "version": version, "rules": rules}
    props = {"summary": r.closing_line(), "policies": r.policies, "fail_on": r.fail_on}
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": driver}, "results": results, "properties": props}],
    }
    return json.dumps(doc, indent=2) + "\n"


def _gh(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _gh(text).replace(",", "%2C").replace(":", "%3A")


def render_github(r: DiffReport) -> str:
    """One ``::error`` (failing) or ``::warning`` per group at its policy line; one per malformed line."""
    out = []
    for g in r.ordered():
        fail = r.failing(g.kind)
        title = _prop(f"{len(g.items)} x {g.kind} at {g.cause.gate}")
        out.append(
            f"::{'error' if fail else 'warning'} file={_prop(g.cause.file)},line={g.cause.line},"
            f"title={title}::{_gh(g.message())}"
        )
    for file, line, reason in r.malformed:
        out.append(
            f"::error file={_prop(file)},line={line},title={_prop(RULES['malformed'][1])}::{_gh(reason)}"
        )
    out += [f"::notice title=semgov diff::{_gh(r.closing_line())}", r.closing_line()]
    return "\n".join(out) + "\n"


def render_junit(r: DiffReport) -> str:
    """One testcase per decision compared (a failure, a warning as ``<skipped>``, or passed) and one
    per malformed line (a failure): the suite's counts are the testcases'."""
    msg: dict[int, tuple[str, str]] = {}
    for g in r.groups:
        for x in g.items:
            msg[id(x.change)] = (g.kind, g.message())
    name = quoteattr(f"semgov diff {r.captured}")
    counts = f'tests="{r.tests}" failures="{r.failures}" errors="0" skipped="{r.warnings}"'
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f"<testsuites name={name} {counts}>"]
    out.append(f"  <testsuite name={name} {counts}>")
    for request_id, donor_id, change in r.cases:
        head = f"    <testcase classname={quoteattr(request_id)} name={quoteattr('donor ' + donor_id)}"
        if change is None or id(change) not in msg:
            out.append(head + "/>")
            continue
        kind, text = msg[id(change)]
        tag = "failure" if r.failing(kind) else "skipped"
        typ = f" type={quoteattr(RULES[kind][0])}" if tag == "failure" else ""
        out += [head + ">", f"      <{tag}{typ} message={quoteattr(text)}/>", "    </testcase>"]
    for file, line, reason in r.malformed:
        out.append(f'    <testcase classname={quoteattr(f"{file}:{line}")} name="malformed">')
        out.append(f"      <failure type={quoteattr(RULES['malformed'][0])} message={quoteattr(reason)}/>")
        out.append("    </testcase>")
    out += [f"    <system-out>{escape(r.closing_line())}</system-out>", "  </testsuite>", "</testsuites>", ""]
    return "\n".join(out)
