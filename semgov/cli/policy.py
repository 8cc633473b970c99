"""``semgov policy check`` (lint), ``semgov policy test`` (unit tests), ``semgov policy eval`` and
``semgov policy input`` (a captured candidate as a test case, semgov.cli.policy_input)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from semgov.cli.limit_flags import add_limit_flags
from semgov.policy.choices import ENGINES

TEST_HELP = """\
Run a policy directory's unit tests and report each as PASS, FAIL or ERROR:
- Rego: every `test_*` rule in `*_test.rego` modules must evaluate to true
  (the `opa test` convention);
- YAML case files: `*_test.yaml` files of policy input documents with the
  expected decision (and optionally gate outcomes), run through the directory's
  policy and engine. See docs/rego.md for both formats.
Exit status: 0 all passed, 1 a test failed or errored, 2 nothing to run, the
policy does not load or a case file is malformed (every problem is listed)."""


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
        "and the structure of its *_test.yaml case files. Then its engine decides one probe per gate, "
        "each a donor no policy may accept (another tenant, a forged signature, expired, an unaccepted "
        "version, forbidden PII, another task or response contract, similarity 0, no verified span): "
        "an engine that cannot decide one, or allows them all (an unconditional allow), is a problem; "
        "a probe allowed or passed by its gate is a warning. Prints file:line diagnostics; exit 2 when "
        "the policy does not load (invalid, as for every command), 1 on a problem of its engine. "
        "With --replaces OLD, also warns (exit 0) when the policy does not accept donors "
        "produced under OLD's name@version.",
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
    _register_test(ps)
    e = ps.add_parser(
        "eval",
        help="decide one policy input document (like `opa eval`)",
        description="Decide one policy input document (schemas/policy_input.schema.json, strict JSON) "
        "with the policy's engine and semgov's own checks of its answer (an approved span token "
        "verification did not find is an error). Prints the gates, the decision and the approved "
        "spans as JSON; exit 0 whatever the decision, 2 on bad input.",
    )
    e.add_argument("directory", type=Path, metavar="DIR", help="policy directory (YAML or Rego)")
    e.add_argument("--input", required=True, metavar="FILE", help="the input document (JSON; - for stdin)")
    e.add_argument(
        "--engine", choices=ENGINES, default="auto", help="policy engine (default: the policy's own)"
    )
    add_limit_flags(e)
    e.set_defaults(func=run_eval)
    from semgov.cli import policy_input

    policy_input.register(ps, add_limit_flags)


def _register_test(ps: Any) -> None:
    """``semgov policy test`` and its flags."""
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
    t.add_argument(
        "--coverage",
        action="store_true",
        help="after the tests: per gate, how many cases saw it pass, fail and error (a gate no case "
        "fails is named); each rule of the policy (public-donor scope, sharing rule, task group, "
        "forbidden PII entity, YAML quality rule) with its line and the cases that exercised it, and the "
        "share of gate outcomes and rules exercised; for a Rego policy also the lines of each module "
        "the Rego tests evaluated and those they never reached (measured by regorus)",
    )
    t.add_argument(
        "--threshold",
        type=float,
        metavar="PCT",
        help="with --coverage (implied): exit 1 when the share of gate outcomes and policy rules the "
        "cases exercised, or for a Rego policy the share of its modules' lines the Rego tests reached, "
        "is below PCT percent (as `opa test --threshold`)",
    )
    t.add_argument(
        "--explain",
        action="store_true",
        help="for each failed test, say why: a case's deny set, the input facts each gate read and the "
        "rule behind it (policy.yaml line, or the Rego deny rules that fired); a Rego test rule's first "
        "statement that does not hold, the local values it read and the deny set under its input",
    )
    t.add_argument(
        "--format",
        choices=("table", "text", "json", "junit", "sarif", "github"),
        default="table",
        help="table (default; `text` is the same, its old name), as in check and diff; json, junit (XML), "
        "sarif (2.1.0) or github (workflow annotations with file= and line=) for CI. Every format ends "
        "with `N tests, N passed, N warnings, N failures`",
    )
    add_limit_flags(t, ("max_policy_bytes",))
    t.set_defaults(func=run_test)


def run_check(args: argparse.Namespace) -> int:
    from semgov.cli.policy_run import run_check as impl

    return impl(args)


def run_test(args: argparse.Namespace) -> int:
    from semgov.cli.policy_run import run_test as impl

    return impl(args)


def run_eval(args: argparse.Namespace) -> int:
    from semgov.cli.policy_run import run_eval as impl

    return impl(args)
