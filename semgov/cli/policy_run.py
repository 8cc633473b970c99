"""The work of ``semgov policy check|test|eval`` (:mod:`semgov.cli.policy` registers the commands
and imports this only when one runs, so their ``--help`` loads none of it)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from semgov.cli.limit_flags import limits_from_args
from semgov.cli.policy_report import render_tests
from semgov.errors import PolicyError
from semgov.intake.limits import Limits
from semgov.policy.probes import probe_findings
from semgov.policy.rego.loader import RegoPolicy, lint, rego_files
from semgov.policy.rollout import replacement
from semgov.policy.source import load_policy_source, make_engine
from semgov.policy.testing import TestOutcome, case_files, load_case_file, run_case_file, run_rego_tests
from semgov.policy.yaml.model import POLICY_FILE, load_policy


def run_check(args: argparse.Namespace) -> int:
    d: Path = args.directory
    limits = limits_from_args(args)
    problems: list[str] = []
    modules, _ = rego_files(d, limits=limits) if d.is_dir() else ({}, {})
    if modules:
        problems += [str(x) for x in lint(d, limits=limits)]
    else:
        try:
            load_policy(d, limits=limits)
        except PolicyError as e:
            problems += e.all_diagnostics()
    invalid = bool(problems)  # NOTE: a policy that does not load: exit 2, as every command
    warnings: list[str] = []
    if not problems:
        try:
            policy = load_policy_source(d, limits=limits)
            engine = make_engine(policy)
            malformed = [e.diagnostic() for e in malformed_cases(d, limits)]  # runs nothing
            invalid = invalid or bool(malformed)  # NOTE: a malformed case file is bad input: exit 2
            problems += malformed
            found, warned = probe_findings(engine, f"{policy.name}@{policy.version}")
            problems += [f"{d}: {x}" for x in found]
            warnings += warned
        except PolicyError as e:
            invalid = True
            problems += e.all_diagnostics()
    if not problems and args.replaces is not None:
        warnings += _rollout_warnings(args, limits)
    for line in problems:
        print(line)
    for line in warnings:
        print(f"{d}: warning: {line}")
    kind = "Rego" if modules else "YAML"
    print(f"{d}: {kind} policy, {len(problems)} problem(s), {len(warnings)} warning(s)")
    return 2 if invalid else 1 if problems else 0


def malformed_cases(d: Path, limits: Limits) -> list[PolicyError]:
    """Every problem of the directory's ``*_test.yaml`` case files, each at ``file:line`` and field."""
    problems: list[PolicyError] = []
    for f in case_files(d) if d.is_dir() else []:
        try:
            load_case_file(f, limits=limits)
        except PolicyError as e:
            problems += [e, *e.others]
    return problems


# NOTE: the human-readable format is `table` in every command; `text` was policy test's old name for it.
HUMAN = ("table", "text")


def _report_malformed(d: Path, problems: list[PolicyError], fmt: str) -> int:
    """Malformed case files: each problem on stderr (text), or as an ERROR test of the CI format
    (a SARIF result, a GitHub annotation at its line); exit 2, no test ran."""
    closing = f"{d}: {len(problems)} problem(s) in its case files; no test ran"
    if fmt in HUMAN:
        for e in problems:
            print(e.diagnostic(), file=sys.stderr)
        print(closing, file=sys.stderr)
        return 2
    outcomes = [
        TestOutcome("malformed case file", f"{e.source}:{e.line or 1}", "ERROR",
                    f"{e.field}: {e.message}" if e.field else e.message, 0.0)
        for e in problems
    ]  # fmt: skip
    print(render_tests(outcomes, fmt, f"semgov policy test {d}", "none", closing), end="")
    return 2


def _rollout_warnings(args: argparse.Namespace, limits: Limits) -> list[str]:
    """What replacing ``--replaces`` by the checked policy does to live donors (docs/policy.md)."""
    new = load_policy_source(args.directory, limits=limits)
    old = load_policy_source(args.replaces, limits=limits)
    warning = replacement(old, new, make_engine(new)).warning()
    return [warning] if warning is not None else []


def run_test(args: argparse.Namespace) -> int:
    d: Path = args.directory
    run = re.compile(args.run) if args.run else None
    policy = load_policy_source(d, limits=limits_from_args(args))
    malformed = malformed_cases(d, limits_from_args(args))
    if malformed:
        return _report_malformed(d, malformed, args.format)
    outcomes: list[TestOutcome] = []
    if isinstance(policy, RegoPolicy):
        rego_engine = "opa-inprocess" if args.engine == "opa-inprocess" else "regorus"
        outcomes += run_rego_tests(d, run=run, engine=rego_engine, explain=args.explain)
    engine = make_engine(policy, args.engine)
    explain = _case_explainer(policy, d) if args.explain else None
    for f in case_files(d) if d.is_dir() else []:
        outcomes += run_case_file(f, engine, run=run, explain=explain)
    if not outcomes:
        where = "*_test.rego or *_test.yaml" if d.is_dir() else POLICY_FILE
        print(f"{d}: no tests found ({where}){' matching --run' if run else ''}")
        return 2
    passed = sum(o.status == "PASS" for o in outcomes)
    failed = sum(o.status == "FAIL" for o in outcomes)
    errors = len(outcomes) - passed - failed
    closing = f"{len(outcomes)} tests, {passed} passed, 0 warnings, {failed + errors} failures"
    if args.format in HUMAN:
        for o in outcomes:
            if o.status != "PASS" or args.verbose:
                msg = f": {o.message}" if o.message else ""
                print(f"{o.status} {o.name} ({o.location}, {o.seconds * 1e3:.1f} ms){msg}")
                for line in o.explanation:
                    print(f"    {line}")
        print("-" * 72)
        print(f"{engine.name}: PASS {passed}/{len(outcomes)}" + (f", FAIL {failed}" if failed else "")
              + (f", ERROR {errors}" if errors else ""))  # fmt: skip
        print(closing)
    else:
        print(render_tests(outcomes, args.format, f"semgov policy test {d}", engine.name, closing), end="")
    below: list[str] = []
    if args.coverage or args.threshold is not None:
        measures = _print_coverage(policy, d, run, outcomes, to_stderr=args.format not in HUMAN)
        if args.threshold is not None:
            below = [f"{what} {share:.1%}" for what, share in measures if share * 100 < args.threshold]
    if below:
        print(f"{d}: coverage below --threshold {args.threshold:g}%: {'; '.join(below)}", file=sys.stderr)
    return 0 if passed == len(outcomes) and not below else 1


def _case_explainer(policy: Any, d: Path) -> Any:
    """``--explain`` for case files: :func:`semgov.policy.explain.explain_case` on this policy."""
    from semgov.policy.explain import explain_case

    return lambda doc, result, gates: explain_case(policy, d, doc, result, gates)


def _ranges(lines: tuple[int, ...]) -> str:
    """``1-3, 7, 9-10`` for lines 1, 2, 3, 7, 9, 10."""
    out: list[str] = []
    for n in sorted(lines):
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def _print_coverage(
    policy: Any, d: Path, run: re.Pattern[str] | None, outcomes: list[TestOutcome], *, to_stderr: bool
) -> list[tuple[str, float]]:
    """``--coverage``: gate outcomes and policy rules the case files exercised, and line coverage
    of a Rego policy's modules by its Rego tests. Returns each measure for ``--threshold``."""
    from semgov.policy.coverage import case_coverage
    from semgov.policy.testing import gate_coverage, rego_coverage

    out = sys.stderr if to_stderr else sys.stdout
    table = gate_coverage(outcomes)
    decided = sum(bool(o.gates) for o in outcomes)
    if decided:
        print(f"gate coverage ({decided} decided case(s)): pass/fail/error", file=out)
    else:
        print(f"{d}: gate coverage: no *_test.yaml case decided (Rego test rules decide no gates)", file=out)
    for gate, counts in table.items() if decided else ():
        gap = "" if counts["fail"] else "   <- no case fails this gate"
        print(f"  {gate:<18} {counts['pass']:>4} {counts['fail']:>4} {counts['error']:>4}{gap}", file=out)
    measures: list[tuple[str, float]] = []
    if decided or not isinstance(policy, RegoPolicy):
        cov = case_coverage(policy, d, outcomes)
        print(f"rule coverage: {cov.covered}/{len(cov.items)} gate outcomes and policy rules exercised "
              f"({cov.share:.1%})", file=out)  # fmt: skip
        rules = cov.rules()
        wide = max((len(i.name) for i in rules), default=0), max((len(i.where) for i in rules), default=0)
        for item in rules:
            gap = "" if item.cases else "   <- no case exercises this rule"
            print(f"  {item.name:<{wide[0]}}  {item.where:<{wide[1]}} {item.cases:>4} case(s){gap}", file=out)
        measures.append(("rule coverage", cov.share))
    if not isinstance(policy, RegoPolicy):
        return measures
    files = rego_coverage(d, run=run)
    for f in files:
        n = len(f.covered) + len(f.not_covered)
        print(f"coverage {f.path}: {len(f.covered)}/{n} lines ({f.share:.1%})", file=out)
        if f.not_covered:
            print(f"  not reached: {_ranges(f.not_covered)}", file=out)
    total = sum(len(f.covered) + len(f.not_covered) for f in files)
    measures.append(("line coverage", sum(len(f.covered) for f in files) / total if total else 1.0))
    return measures


def run_eval(args: argparse.Namespace) -> int:
    """``semgov policy eval``: one input document, decided, as JSON on stdout."""
    import dataclasses
    import json

    from pydantic import ValidationError

    from semgov.errors import InputError
    from semgov.policy.checks import checked_result
    from semgov.policy.testing import input_adapter
    from semgov.wire.strictjson import StrictJSONError
    from semgov.wire.strictjson import loads as strict_loads

    policy = load_policy_source(args.directory, limits=limits_from_args(args))
    engine = make_engine(policy, args.engine)
    where = "<stdin>" if args.input == "-" else args.input
    try:
        data = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
        doc = input_adapter().validate_python(strict_loads(data))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", source=where) from e
    except StrictJSONError as e:
        raise InputError(f"not strict JSON: {e}", source=where) from e
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(f"not a policy input document: {err['msg']}", source=where, field=loc) from e
    result = checked_result(engine.evaluate(doc), doc)
    allow = all(g.result == "pass" for g in result.gates)
    out = {
        "policy": {
            "name": policy.name,
            "version": policy.version,
            "revision": policy.revision,
            "engine": engine.name,
        },
        "decision": "allow" if allow else "deny",
        "gates": [dataclasses.asdict(g) for g in result.gates],
        "approved_spans": [dataclasses.asdict(s) for s in result.approved_spans],
    }
    print(json.dumps(out, indent=2))
    return 0
