"""The work of ``semgov diff`` (:mod:`semgov.cli.diff` registers the command and imports this
only when it runs, so its ``--help`` loads none of it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import log
from semgov.cli.diff_report import FAIL_ON, DiffReport, Located, render_github, render_junit, render_sarif
from semgov.cli.limit_flags import limits_from_args
from semgov.decide import Evaluator
from semgov.errors import InputError
from semgov.intake.capture import MalformedLine, read_captured_at
from semgov.intake.limits import Limits
from semgov.policy.cause import Locator
from semgov.policy.diff import GROUPS, Change, Diff, Row
from semgov.policy.source import load_policy_source, make_engine
from semgov.signing.keys import Keyring, SigningKey
from semgov.wire.timefmt import parse_rfc3339

DIFF_SCHEMA = "semgov.policy_diff/v1"


def _evaluators(args: argparse.Namespace, limits: Limits) -> tuple[Evaluator, Evaluator]:
    if len(args.policy) != 2:
        raise InputError(f"give --policy exactly twice (A, then B), not {len(args.policy)} time(s)")
    keyring = Keyring.load(args.trust)
    # NOTE: a throwaway key: these decisions are compared and dropped, never written or trusted.
    key = SigningKey.from_private(Ed25519PrivateKey.generate())
    out = []
    for path in args.policy:
        policy = load_policy_source(path, limits=limits)
        out.append(Evaluator(policy, keyring, key, engine=make_engine(policy, args.engine), limits=limits))
    return out[0], out[1]


def run(args: argparse.Namespace) -> int:
    logger = log.get_logger()
    if args.show < 0:
        raise InputError(f"--show must be 0 or more, not {args.show}")
    limits = limits_from_args(args)
    ev_a, ev_b = _evaluators(args, limits)
    now = parse_rfc3339(args.now, what="--now") if args.now else None
    diff = Diff()
    policies = {"a": _policy_json(ev_a, args.policy[0]), "b": _policy_json(ev_b, args.policy[1])}
    report = DiffReport(str(args.captured), policies, args.fail_on)
    locator = Locator(args.policy[0], args.policy[1], ev_b.policy)
    stdout = sys.stdout
    for file, line, item in read_captured_at(args.captured, limits=limits):
        diff.requests += 1
        if isinstance(item, MalformedLine):
            diff.malformed += 1  # NOTE: both policies deny a malformed line's donors alike
            report.malformed.append((file, line, item.reason))
            logger.error(f"{file}:{line}: skipped malformed request: {item.reason}")
            continue
        task = f"{item.task.id}@{item.task.version}"
        for a, b in zip(ev_a.evaluate(item, now), ev_b.evaluate(item, now), strict=True):
            change = diff.add_pair(a, b, task=task)
            report.cases.append((str(a.record["request_id"]), a.donor_id, change))
            if change is None:
                continue
            report.add(change, Located(change, file, line), locator.cause(change))
            if args.format == "jsonl":
                stdout.write(json.dumps(change.as_json(), separators=(",", ":")) + "\n")
    if args.format == "table":
        _table(diff, args, ev_a, ev_b, stdout)
        stdout.write(report.closing_line() + "\n")
    elif args.format == "json":
        json.dump(_document(diff, args, ev_a, ev_b), stdout, indent=2)
        stdout.write("\n")
    elif args.format in ("junit", "sarif", "github"):
        stdout.write(_render_ci(report, args.format))
    stdout.flush()
    if diff.malformed:
        logger.error(f"{diff.malformed} malformed line(s) in {args.captured}")
        return 2
    return 1 if any(c.kind in FAIL_ON[args.fail_on] for c in diff.changes) else 0


def _render_ci(report: DiffReport, fmt: str) -> str:
    from semgov import __version__

    if fmt == "sarif":
        return render_sarif(report, __version__)
    return render_junit(report) if fmt == "junit" else render_github(report)


def _policy_json(ev: Evaluator, path: Path) -> dict[str, str]:
    p = ev.policy
    return {
        "path": str(path),
        "name": p.name,
        "version": p.version,
        "revision": p.revision,
        "engine": ev.engine.name,
    }


def _document(diff: Diff, args: argparse.Namespace, ev_a: Evaluator, ev_b: Evaluator) -> dict[str, Any]:
    return {
        "schema": DIFF_SCHEMA,
        "captured": str(args.captured),
        "policies": {"a": _policy_json(ev_a, args.policy[0]), "b": _policy_json(ev_b, args.policy[1])},
        "summary": diff.summary_json(),
        "by": diff.groups_json(),
        "changes": [c.as_json() for c in diff.changes],
    }


def _table(diff: Diff, args: argparse.Namespace, ev_a: Evaluator, ev_b: Evaluator, out: IO[str]) -> None:
    w = out.write
    w(f"semgov diff {args.captured}\n")
    for name, ev, path in (("A", ev_a, args.policy[0]), ("B", ev_b, args.policy[1])):
        p = ev.policy
        w(f"{name}  {p.name}@{p.version} ({p.revision[:19]}..., engine {ev.engine.name})  {path}\n")
    k = diff.totals.kinds
    w(f"requests {diff.requests} ({diff.malformed} malformed); decisions compared {diff.compared}\n")
    w(f"allow: A {diff.a_allow}, B {diff.b_allow}\n")
    w(
        f"flipped {diff.flipped} decision(s): allow->deny {k['allow->deny']}, "
        f"deny->allow {k['deny->allow']}; "
        f"approved spans changed (both allow) {k['spans']}; deny reasons changed (both deny) {k['reasons']}; "
        f"unchanged {diff.compared - sum(k.values())}\n"
    )
    for group in GROUPS:
        rows = {n: r for n, r in diff.groups[group].items() if r.acted_on}
        if rows:
            _group(group, rows, w, args.show)
    listed = [c for c in diff.changes if c.kind != "reasons"]
    if args.show and listed:
        w(f"\nchanges ({min(args.show, len(listed))} of {len(listed)}; --format jsonl lists all):\n")
        for c in listed[: args.show]:
            w(_change_line(c))


def _group(group: str, rows: dict[str, Row], w: Any, show: int) -> None:
    """One group's table, most changes first, at most ``show`` rows (all when 0)."""
    ranked = sorted(rows.items(), key=lambda kv: (-kv[1].acted_on, kv[0]))
    kept = ranked[:show] if show else ranked
    what = " (every gate whose result changed)" if group == "gate" else ""
    w(f"\nby {group}{what}:\n")
    width = max(12, *(len(n) for n, _ in kept)) + 2
    w(f"  {group:<{width}}{'a->d':>7}{'d->a':>7}{'spans':>7}{'tokens A':>10}{'tokens B':>10}\n")
    for name, r in kept:
        kk = r.kinds
        w(f"  {name:<{width}}{kk['allow->deny']:>7}{kk['deny->allow']:>7}{kk['spans']:>7}")
        w(f"{r.a_tokens:>10}{r.b_tokens:>10}\n")
    if len(kept) < len(ranked):
        w(f"  ... {len(ranked) - len(kept)} more {group}s (--show, or --format json for all)\n")


def _change_line(c: Change) -> str:
    gates = "; ".join(f"{g.gate} {g.a}->{g.b}: {g.b_detail or g.a_detail}" for g in c.gates if g.a != g.b)
    return (
        f"  {c.kind:<12}{c.request_id}/{c.donor_id}  {c.tenant} {c.namespace} {c.task}  "
        f"tokens {c.a_tokens}->{c.b_tokens}" + (f"  {gates}" if gates else "") + "\n"
    )
