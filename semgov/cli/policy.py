"""``semgov policy check`` (lint) and ``semgov policy test`` (unit tests)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from semgov.cli.check import add_limit_flags, limits_from_args
from semgov.errors import PolicyError
from semgov.intake.limits import Limits
from semgov.policy.rego.loader import RegoPolicy, lint, rego_files
from semgov.policy.rollout import replacement
from semgov.policy.source import load_policy_source, make_engine
from semgov.policy.testing import TestOutcome, case_files, run_case_file, run_rego_tests
from semgov.policy.yaml.model import POLICY_FILE, load_policy

TEST_HELP = """\
Run a policy directory's unit tests and report each as PASS, FAIL or ERROR:
- Rego: every `test_*` rule in `*_test.rego` modules must evaluate to true
  (the `opa test` convention);
- YAML case files: `*_test.yaml` files of policy input documents with the
  expected decision (and optionally gate outcomes), run through the directory's
  policy and engine. See docs/rego.md for both formats.
Exit status: 0 all passed, 1 a test failed or errored, 2 nothing to run or the
policy does not load."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "policy", help="lint and test policies", description="Lint and test policy directories."
    )
    ps = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    c = ps.add_parser(
        "check",
        help="lint a policy directory",
        description="Lint a policy directory: YAML (syntax, unknown keys, types, values) or Rego "
        "(syntax, package semgov.reuse, required rules, forbidden non-deterministic builtins), "
        "and the structure of its *_test.yaml case files. Prints file:line diagnostics; exit 1 on any. "
        "With --replaces OLD, also warns (exit 0) when the policy does not accept donors produced "
        "under OLD's name@version.",
    )
    c.add_argument("directory", type=Path, metavar="DIR")
    c.add_argument(
        "--replaces",
        type=Path,
        metavar="OLD",
        help="the policy directory DIR replaces: warn when DIR does not accept donors produced under "
        "OLD's name@version (they would all be denied until they expire)",
    )
    add_limit_flags(c, ("max_policy_bytes",))
    c.set_defaults(func=run_check)
    t = ps.add_parser(
        "test", help="run a policy directory's unit tests", description=TEST_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    t.add_argument("directory", type=Path, metavar="DIR")
    t.add_argument(
        "--run", metavar="REGEX", help="only tests whose name (data.pkg.test_x, or case name) matches"
    )
    t.add_argument(
        "--engine", choices=("auto", "yaml", "regorus", "opa-inprocess"), default="auto",
        help="engine for Rego tests and case files (default: the policy's own)",
    )  # fmt: skip
    t.add_argument("-v", "--verbose", action="store_true", help="list passing tests too")
    add_limit_flags(t, ("max_policy_bytes",))
    t.set_defaults(func=run_test)


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
            problems.append(e.diagnostic())
    if not problems:
        try:
            policy = load_policy_source(d, limits=limits)
            engine = make_engine(policy)
            for f in case_files(d):
                run_case_file(f, engine, run=re.compile(r"(?!)"))  # structure only, runs nothing
        except PolicyError as e:
            problems.append(e.diagnostic())
    warnings = _rollout_warnings(args, limits) if not problems and args.replaces is not None else []
    for line in problems:
        print(line)
    for line in warnings:
        print(f"{d}: warning: {line}")
    kind = "Rego" if modules else "YAML"
    print(f"{d}: {kind} policy, {len(problems)} problem(s), {len(warnings)} warning(s)")
    return 1 if problems else 0


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
    outcomes: list[TestOutcome] = []
    if isinstance(policy, RegoPolicy):
        rego_engine = "opa-inprocess" if args.engine == "opa-inprocess" else "regorus"
        outcomes += run_rego_tests(d, run=run, engine=rego_engine)
    engine = make_engine(policy, args.engine)
    for f in case_files(d) if d.is_dir() else []:
        outcomes += run_case_file(f, engine, run=run)
    if not outcomes:
        where = "*_test.rego or *_test.yaml" if d.is_dir() else POLICY_FILE
        print(f"{d}: no tests found ({where}){' matching --run' if run else ''}")
        return 2
    for o in outcomes:
        if o.status != "PASS" or args.verbose:
            msg = f": {o.message}" if o.message else ""
            print(f"{o.status} {o.name} ({o.location}, {o.seconds * 1e3:.1f} ms){msg}")
    passed = sum(o.status == "PASS" for o in outcomes)
    failed = sum(o.status == "FAIL" for o in outcomes)
    errors = len(outcomes) - passed - failed
    print("-" * 72)
    print(f"{engine.name}: PASS {passed}/{len(outcomes)}" + (f", FAIL {failed}" if failed else "")
          + (f", ERROR {errors}" if errors else ""))  # fmt: skip
    return 0 if passed == len(outcomes) else 1
