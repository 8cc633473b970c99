"""``semgov policy input``: the policy input document of one captured candidate, as a test case.

It seeds a ``*_test.yaml`` case file from real traffic: the facts are computed exactly as
``semgov check`` computes them (the policy's fact settings, the keyring, the request's
``received_at`` or ``--now`` as the clock), and the case states what the policy decides now,
gate by gate, for the author to review before pasting it under ``cases:``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov.errors import InputError

if TYPE_CHECKING:
    from semgov.wire.models import CapturedRequest

DESCRIPTION = """\
Print the policy input document of one captured candidate (request ID, donor ID) as a case of a
`*_test.yaml` case file, the format `semgov policy test` reads: its facts computed as `semgov
check` computes them (the policy's fact settings, the keyring, the request's received_at or --now),
`expect` and `gates` what the policy decides now. Review the expectation, then paste the case under
`cases:`. Exit 2 when the request or the donor is not in the capture, or the request is malformed."""


def register(ps: Any, add_limit_flags: Any) -> None:
    """``semgov policy input`` under ``semgov policy``."""
    i = ps.add_parser(
        "input",
        help="dump one captured candidate's policy input as a test case",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("captured", metavar="CAPTURED", help="captured requests (as semgov check reads them)")
    i.add_argument("--request", required=True, metavar="ID", help="the request's request_id")
    i.add_argument("--donor", required=True, metavar="ID", help="the donor_id of one of its candidates")
    i.add_argument("--policy", required=True, type=Path, metavar="DIR", help="policy directory")
    i.add_argument(
        "--trust", required=True, type=Path, metavar="KEYRING", help="keyring of trusted provenance keys"
    )
    i.add_argument("--now", metavar="RFC3339", help="decision clock (default: the request's received_at)")
    add_limit_flags(i)
    i.set_defaults(func=run_input)


def find_candidate(captured: str, request_id: str, donor_id: str, limits: Any) -> CapturedRequest:
    """The captured request ``request_id``, checked to have a candidate ``donor_id``; an
    ``InputError`` saying what the capture holds when either is not there."""
    from semgov.intake.capture import MalformedLine, read_captured

    ids: list[str] = []
    for item in read_captured(captured, limits=limits):
        if isinstance(item, MalformedLine):
            if item.request_id == request_id:
                raise InputError(
                    f"request {request_id!r} is malformed: {item.reason}", source=f"{captured}:{item.line}"
                )
            continue
        if item.request_id != request_id:
            ids.append(item.request_id)
            continue
        donors = [c.donor_id for c in item.candidates]
        if donor_id not in donors:
            have = ", ".join(map(repr, donors)) if donors else "none"
            raise InputError(
                f"request {request_id!r} has no candidate with donor_id {donor_id!r} (its donors: {have})",
                source=captured,
            )
        return item
    some = ", ".join(map(repr, ids[:5])) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    read = f"{len(ids)} request(s) read" + (f": {some}" if ids else "")
    raise InputError(f"request {request_id!r} is not in the capture ({read})", source=captured)


def to_json(value: Any, indent: str = "") -> str:
    """``value`` as indented JSON that YAML reads as JSON does: a float always has a ``.`` (``1.0e-07``,
    never ``1e-07``, which YAML 1.1 reads as a string and case files refuse as ambiguous)."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(inner + to_json(v, inner) for v in value) + f"\n{indent}]"
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    return json.dumps(value, ensure_ascii=False)


def case_yaml(name: str, doc: dict[str, Any], expect: str, gates: dict[str, str], comment: list[str]) -> str:
    """One case of a case file, under ``cases:``; its input written as JSON (valid YAML, read as JSON)."""
    body = to_json(doc, "      ")
    gate_map = ", ".join(f"{g}: {r}" for g, r in gates.items())
    lines = [*(f"# {c}" for c in comment), "cases:", f"  - name: {json.dumps(name, ensure_ascii=False)}"]
    lines += [f"    input:\n      {body}", f"    expect: {expect}", f"    gates: {{{gate_map}}}"]
    return "\n".join(lines) + "\n"


def run_input(args: argparse.Namespace) -> int:
    """``semgov policy input``: the case, on stdout."""
    from semgov.cli.limit_flags import limits_from_args
    from semgov.facts.compute import FactContext, PreparedPrompt, compute_facts
    from semgov.facts.pii import PiiScanner
    from semgov.policy.checks import checked_result
    from semgov.policy.source import load_policy_source, make_engine
    from semgov.signing.keys import Keyring
    from semgov.wire.policy_input import to_json_dict
    from semgov.wire.timefmt import parse_rfc3339

    limits = limits_from_args(args)
    policy = load_policy_source(args.policy, limits=limits)
    keyring = Keyring.load(args.trust)
    now = parse_rfc3339(args.now, what="--now") if args.now else None
    req = find_candidate(args.captured, args.request, args.donor, limits)
    cand = next(c for c in req.candidates if c.donor_id == args.donor)
    problem = limits.request_problem(req) or limits.candidate_problem(cand)
    if problem is not None:
        raise InputError(
            f"request {args.request!r} is over the input limits: {problem}", source=args.captured
        )
    ctx = FactContext(keyring, PiiScanner())
    clock = now if now is not None else req.received_at
    doc = compute_facts(
        req, PreparedPrompt.of(req.prompt), cand, config=policy.fact_config, ctx=ctx, now=clock
    )
    engine = make_engine(policy)
    result = checked_result(engine.evaluate(doc), doc)
    allow = all(g.result == "pass" for g in result.gates) and bool(result.approved_spans)
    comment = [
        f"request {args.request}, donor {args.donor}, from {args.captured} (semgov policy input);",
        f"expect and gates: what {policy.name}@{policy.version} ({engine.name}) decides now: review them.",
    ]
    gates: dict[str, str] = {g.gate: g.result for g in result.gates}
    name = f"captured request {args.request}, donor {args.donor}"
    print(case_yaml(name, to_json_dict(doc), "allow" if allow else "deny", gates, comment), end="")
    return 0
