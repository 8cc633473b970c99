"""``semgov calibrate``: measure answer regressions of governed reuse on captured traffic and write
a policy whose quality rules keep only what stayed within a regression budget.

A thin adapter: the runs happen in ``engine_hooks.reference.calibrate`` (imported only when the
command runs); the statistics and the overlay are :mod:`semgov.policy.calibration`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semgov.cli.bench import MODEL_CHOICES, MODEL_EXTRA_HINT, MODEL_HELP, positive
from semgov.errors import InputError, PolicyError


def _methods(text: str) -> list[str]:
    from semgov.policy.calibration import plan_settings

    """``--methods``: realizations a policy can plan, comma-separated, in order of preference."""
    out = [m.strip() for m in text.split(",") if m.strip()]
    if not out:
        raise argparse.ArgumentTypeError("no method given")
    for m in out:
        try:
            plan_settings(m)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return list(dict.fromkeys(out))


def _percents(text: str) -> list[str]:
    """``--percents P,P``: shorthand for ``--methods leading:P%,...`` (the first calibrate's form)."""
    try:
        out = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not out or not all(0 <= p <= 100 for p in out):
        raise argparse.ArgumentTypeError(f"percents must be integers from 0 to 100, got {text!r}")
    return [f"leading:{p}%" for p in out]


def _rate(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"a rate from 0 to 1, got {text!r}")
    return x


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure reuse's answer regressions on captured traffic; write the policy that stays in budget",
        description="Paired cold/warm runs of sampled captured requests on the CPU reference engine "
        "(--model, default SmolLM2-135M-Instruct). The requests are decided with shifted spans on in every "
        "scope (whatever the policy's quality section says; nothing else of the policy changes); for every "
        "allowed candidate sampled, the recipient's greedy answer warm is compared with cold, and shifted "
        "decisions are tried with each --methods realization. Per task id and response contract id it "
        "reports the regression rate with a 95%% Wilson interval and writes OUT/yaml/policy.yaml: the YAML "
        "policy with quality rules first that turn shifted reuse on, per scope, with the first method "
        "whose interval's upper bound is within --budget, or off (allow_shifted: false) where none is; "
        "with --rego also OUT/rego/, the Rego policy with the same rules. OUT/calibration.json holds "
        "every count. Needs the model extra: " + MODEL_EXTRA_HINT + ".",
    )
    p.add_argument("captured", type=Path, metavar="CAPTURED.jsonl", help="captured requests (.gz ok)")
    p.add_argument("--policy", required=True, type=Path, metavar="DIR", help="the YAML policy to calibrate")
    p.add_argument("--trust", required=True, type=Path, metavar="KEYRING", help="provenance keyring (JSON)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (created)")
    p.add_argument(
        "--rego",
        type=Path,
        metavar="DIR",
        help="also write this Rego policy with the calibrated quality_rules",
    )
    p.add_argument(
        "--engine",
        choices=("reference",),
        default="reference",
        help="where the paired runs happen: the CPU reference engine (the only one so far)",
    )
    p.add_argument("--model", choices=MODEL_CHOICES, default="smollm2-135m", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "--sample",
        type=positive,
        default=20,
        metavar="N",
        help="allowed candidates per scope and kind (default 20: 0 of 20 has a 95%% upper bound of 16%%)",
    )
    p.add_argument(
        "--methods",
        type=_methods,
        default=["trailing:128", "bookend:16+256", "trailing:512"],
        metavar="M,M,...",
        help="realizations of shifted spans to try, cheapest first: the first within --budget is kept "
        "(none, leading:P%%, leading:N, boundary:N, trailing:N, bookend:H+T; default "
        "trailing:128,bookend:16+256,trailing:512, cheapest first; on vLLM name head-free ones only: "
        "none, trailing:N)",
    )
    p.add_argument(
        "--percents",
        type=_percents,
        dest="methods",
        metavar="P,P,...",
        help="shorthand for --methods leading:P%%,...: each shifted span's first P%% recomputed",
    )
    p.add_argument(
        "--budget",
        type=_rate,
        default=0.2,
        metavar="RATE",
        help="largest regression rate allowed, checked against the 95%% upper bound (default 0.2)",
    )
    p.add_argument("--max-new-tokens", type=positive, default=16, metavar="N", help="answer tokens compared")
    p.add_argument("--seed", type=int, default=7, help="sampling seed (default 7)")
    p.add_argument("--threads", type=positive, default=1, metavar="T", help="torch threads (default 1)")
    p.set_defaults(func=run)


def _harness() -> Any:
    import importlib

    try:
        return importlib.import_module("engine_hooks.reference.calibrate")
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root == "engine_hooks":
            raise InputError(
                "semgov calibrate needs engine_hooks (a source checkout, `pip install -e .`)"
            ) from e
        raise InputError(f"semgov calibrate needs {root}, which is not installed: {MODEL_EXTRA_HINT}") from e


def run(args: argparse.Namespace) -> int:
    from semgov import Keyring
    from semgov.policy.calibration import aggregate, overlay_yaml, table
    from semgov.policy.rego.loader import load_rego_policy
    from semgov.policy.yaml.model import POLICY_FILE, load_policy

    policy = load_policy(args.policy)
    base_file = args.policy / POLICY_FILE if args.policy.is_dir() else args.policy
    rego = load_rego_policy(args.rego) if args.rego is not None else None
    keyring = Keyring.load(args.trust)
    if not args.captured.exists():
        raise InputError("captured file not found", source=str(args.captured))
    harness = _harness()
    try:
        harness.trial_policy(policy)
    except ValueError as e:
        raise PolicyError(str(e), source=str(base_file)) from None
    trials, meta = harness.run_calibration(
        args.captured,
        policy,
        keyring,
        model=args.model,
        per_scope=args.sample,
        methods=args.methods,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        threads=args.threads,
        log=lambda m: print(m, file=sys.stderr),
    )
    results = aggregate(trials, args.methods, args.budget)
    note = (
        f"Calibrated by `semgov calibrate` from {base_file} (revision {policy.revision})\n"
        f"on {meta['captured']}: "
        f"{meta['sampled']} allowed candidates of {meta['requests']} requests, model {meta['model']}, "
        f"methods {', '.join(args.methods)}, budget {args.budget:g} (95% upper bound)."
    )
    (args.out / "yaml").mkdir(parents=True, exist_ok=True)
    written = overlay_yaml(base_file.read_bytes(), str(base_file), results, note)
    (args.out / "yaml" / POLICY_FILE).write_bytes(written)
    if rego is not None:
        _write_rego(args.rego, args.out / "rego", results)
    report = {
        **meta,
        "methods": args.methods,
        "budget": args.budget,
        "scopes": [
            {
                "task": s.task,
                "response_contract": s.contract,
                "prefix": {"n": s.prefix.n, "regressions": s.prefix.regressions, "ci95": s.prefix.ci95},
                "shifted": {
                    m: {"n": c.n, "regressions": c.regressions, "ci95": c.ci95} for m, c in s.shifted.items()
                },
                "rule": s.rule(),
            }
            for s in results
        ],
    }
    (args.out / "calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(results, args.methods, args.budget))
    also = f", {args.out / 'rego'}" if rego is not None else ""
    print(f"wrote {args.out / 'yaml' / POLICY_FILE}{also} and {args.out / 'calibration.json'}")
    return 0


def _write_rego(src: Path, dst: Path, results: Any) -> None:
    from semgov.policy.calibration import overlay_rego
    from semgov.policy.files import skipped_name
    from semgov.policy.rego.loader import load_rego_policy

    dst.mkdir(parents=True, exist_ok=True)
    files = [f for f in sorted(src.glob("*.rego")) if not skipped_name(f.name)]
    holder = [
        f for f in files if any(line.startswith("quality_rules := ") for line in f.read_text().splitlines())
    ]
    if len(holder) != 1:
        raise PolicyError(
            "no single module holds a one-line `quality_rules := [...]` parameter", source=str(src)
        )
    for f in files:
        text = f.read_text()
        (dst / f.name).write_text(overlay_rego(text, str(f), results) if f == holder[0] else text)
    load_rego_policy(dst)  # NOTE: the written policy loads, or this is a PolicyError naming it
