"""``semgov calibrate``: measure answer regressions of governed reuse on captured traffic and write
a policy whose quality rules keep only what stayed within a regression budget.

A thin adapter: the paired runs happen in the team's own server (``--engine sglang``,
:mod:`semgov.calibrate`) or on the CPU reference engine (``--engine reference``,
``engine_hooks.reference.calibrate``, imported only when the command runs); the statistics and the
overlay are :mod:`semgov.policy.calibration`.
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
    """``--methods``: realizations a policy can plan, comma-separated, in order of preference."""
    from semgov.policy.calibration import plan_settings

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


def _seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return x


def _non_negative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


DESCRIPTION = (
    "Paired cold/governed runs of sampled captured requests, compared the way each request's response "
    "contract says (--contracts; token for token without one). The capture is decided locally with "
    "shifted spans on in every scope (whatever the policy's quality section says; nothing else of the "
    "policy changes), and at most --sample allowed candidates per task, response contract and span kind "
    "are measured. --engine sglang runs each pair in your own SGLang server with the semgov backend, on "
    "the model it serves (--server URL with the deployment's --context-key and --audience, or --gateway "
    "URL with an API key allowed to calibrate): the donor, the recipient cold (no reuse, not even the "
    "engine's prefix cache), then governed once per --methods plan, in a scope of the run's own that no "
    "production request shares, the pair's donors released after; reuse counts only from the server's own"
    " audit log (--audit, verified with --trust). --engine reference runs the pairs offline on the CPU "
    "reference engine (--model). Per task id and response contract id it reports regressions, changed "
    "answers and changed required values with 95% Wilson intervals and writes OUT/yaml/policy.yaml: the "
    "YAML policy with quality rules first that turn shifted reuse on, per scope, with the first method of"
    " at least --min-n trials whose regression rate's upper bound is within --budget, or off where none "
    "is; with Turning semantic '     'reuse on"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure reuse's answer regressions on captured traffic; write the policy that stays in budget",
        description=DESCRIPTION,
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
        choices=("reference", "sglang", "vllm"),
        default="reference",
        help="where the pairs run: your SGLang server (sglang), or offline on the CPU reference engine "
        "(reference, the default); vllm is refused, saying why",
    )
    p.add_argument(
        "--contracts", type=Path, metavar="FILE", help="response contracts: how answers are compared"
    )
    _server_args(p)
    p.add_argument(
        "--model",
        choices=MODEL_CHOICES,
        default="smollm2-135m",
        metavar="MODEL",
        help=MODEL_HELP + " (--engine reference only)",
    )
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
        "trailing:128,bookend:16+256,trailing:512)",
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
    p.add_argument(
        "--min-n",
        type=positive,
        default=1,
        metavar="N",
        help="trials a method needs before it can be kept (default 1: the bound alone decides)",
    )
    p.add_argument("--max-new-tokens", type=positive, default=16, metavar="N", help="answer tokens compared")
    p.add_argument("--seed", type=int, default=7, help="sampling seed (default 7)")
    p.add_argument(
        "--threads", type=positive, default=1, metavar="T", help="torch threads (--engine reference)"
    )
    p.set_defaults(func=run)


def _server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("against a running server (--engine sglang)")
    g.add_argument("--server", metavar="URL", help="the SGLang server (its /generate), tokens minted here")
    g.add_argument(
        "--context-key",
        type=Path,
        metavar="FILE",
        help="with --server: the deployment's context key (SEMGOV_CONTEXT_KEY)",
    )
    g.add_argument("--audience", metavar="NAME", help="with --server: SEMGOV_CONTEXT_AUDIENCE of the server")
    g.add_argument(
        "--server-api-key-file",
        type=Path,
        metavar="FILE",
        help="with --server: the server's --api-key, read from FILE",
    )
    g.add_argument(
        "--gateway", metavar="URL", help="semgov gateway in front of the server (instead of --server)"
    )
    g.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="with --gateway: an API key whose tenants-file entry says calibrate: true",
    )
    g.add_argument(
        "--audit",
        type=Path,
        action="append",
        metavar="DIR",
        help="the server's audit directory (SEMGOV_AUDIT_DIR; once per worker of a fleet)",
    )
    g.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    g.add_argument("--budget-s", type=_seconds, metavar="S", help="start no pair past S seconds of the run")
    g.add_argument("--max-pairs", type=positive, metavar="N", help="measure at most N pairs in all")
    g.add_argument(
        "--floor-pairs",
        type=_non_negative,
        default=3,
        metavar="N",
        help="pairs whose cold run is sent twice: the server's cold/cold floor (default 3)",
    )
    g.add_argument(
        "--audit-wait-s",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="how long to wait for a request's records in the audit log (default 30)",
    )
    g.add_argument(
        "--request-timeout-s",
        type=_seconds,
        default=900.0,
        metavar="S",
        help="one request's timeout (default 900: a cold prefill of a long prompt on a big model)",
    )


VLLM_REFUSAL = (
    "--engine vllm: calibration runs against SGLang only for now. vLLM 0.32's connector realizes no shifted "
    "span behind a chat template (the token where the evidence joins the turn header differs, and it loads "
    'only KV that continues vLLM\'s own prefix hit: docs/vllm.md "What it realizes"), so every pair would '
    "compare a cold run with a cold run. Calibrate on SGLang serving the same model, or offline with "
    "--engine reference."
)


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
    from semgov.calibrate.sample import trial_policy
    from semgov.policy.rego.loader import load_rego_policy
    from semgov.policy.yaml.model import POLICY_FILE, load_policy

    if args.engine == "vllm":
        raise InputError(VLLM_REFUSAL)
    _check_mode(args)
    policy = load_policy(args.policy)
    base_file = args.policy / POLICY_FILE if args.policy.is_dir() else args.policy
    rego = load_rego_policy(args.rego) if args.rego is not None else None
    keyring = Keyring.load(args.trust)
    if not args.captured.exists():
        raise InputError("captured file not found", source=str(args.captured))
    try:
        trial_policy(policy)
    except ValueError as e:
        raise PolicyError(str(e), source=str(base_file)) from None
    contracts = _contracts(args.contracts)
    log = _silent if getattr(args, "quiet", False) else _progress
    if args.engine == "reference":
        trials, meta = _harness().run_calibration(
            args.captured,
            policy,
            keyring,
            model=args.model,
            per_scope=args.sample,
            methods=args.methods,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            threads=args.threads,
            log=log,
            contracts=contracts,
        )
    else:
        from semgov.calibrate.engines import EngineUnreachable

        try:
            trials, meta = _on_server(args, policy, rego, keyring, contracts, log)
        except EngineUnreachable as e:
            from semgov.log import get_logger

            get_logger().error(f"{e} (what was measured is kept in {args.out}: --resume continues)")
            return 4
    _write(args, policy, base_file, rego, trials, meta)
    return 0


def _progress(message: str) -> None:
    """The run's progress, on stderr (``-q`` silences it)."""
    print(message, file=sys.stderr)


def _silent(message: str) -> None:
    """``-q``: no progress."""


def _check_mode(args: argparse.Namespace) -> None:
    """The flags of the one place the pairs run, and none of the other's."""
    server_flags = (
        "server",
        "gateway",
        "audit",
        "context_key",
        "audience",
        "api_key_file",
        "budget_s",
        "max_pairs",
        "server_api_key_file",
    )
    if args.engine == "reference":
        given = [f"--{f.replace('_', '-')}" for f in server_flags if getattr(args, f)] + (
            ["--resume"] if args.resume else []
        )
        if given:
            raise InputError(f"{', '.join(given)}: only with --engine sglang (a running server)")
        return
    if (args.server is None) == (args.gateway is None):
        raise InputError(
            "--engine sglang needs --server URL (with --context-key and --audience) or --gateway URL"
        )
    if args.server is not None and (args.context_key is None or args.audience is None):
        raise InputError(
            "--server needs --context-key FILE and --audience NAME: the calibration's tokens are minted here"
        )
    if args.gateway is not None and args.api_key_file is None:
        raise InputError("--gateway needs --api-key-file FILE: a key whose entry says calibrate: true")
    if not args.audit:
        raise InputError(
            "--engine sglang needs --audit DIR: reuse is counted from the server's own audit log"
        )


def _contracts(path: Path | None) -> Any | None:
    if path is None:
        return None
    from semgov.contracts import load_contracts

    return load_contracts(path)


def _read_secret(path: Path, what: str) -> str:
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise InputError(f"cannot read {what} ({e.strerror})", source=str(path)) from e
    if not text:
        raise InputError(f"{what} is empty", source=str(path))
    return text


def _on_server(
    args: argparse.Namespace, policy: Any, rego: Any, keyring: Any, contracts: Any, log: Any
) -> tuple[list[Any], dict[str, Any]]:
    from semgov.calibrate.audit import ServerAudit
    from semgov.calibrate.engines import Engine, SglangServer, ThroughGateway
    from semgov.calibrate.run import RunConfig
    from semgov.calibrate.server import run_against_server
    from semgov.context import ContextKeys
    from semgov.gateway.reload import read_context_key

    engine: Engine
    if args.server is not None:
        keys = ContextKeys(read_context_key(args.context_key), args.audience)
        api_key = (
            _read_secret(args.server_api_key_file, "the server's API key")
            if args.server_api_key_file
            else None
        )
        engine = SglangServer(args.server, keys, api_key=api_key, timeout_s=args.request_timeout_s)
    else:
        engine = ThroughGateway(
            args.gateway, _read_secret(args.api_key_file, "the API key"), timeout_s=args.request_timeout_s
        )
    revisions = {policy.revision} | ({rego.revision} if rego is not None else set())
    config = RunConfig(
        methods=tuple(args.methods),
        max_new_tokens=args.max_new_tokens,
        floor_runs=args.floor_pairs,
        audit_wait_s=args.audit_wait_s,
        budget_s=args.budget_s,
        revisions=frozenset(revisions),
    )
    return run_against_server(
        args.captured,
        policy,
        keyring,
        engine=engine,
        audit=ServerAudit(args.audit, keyring),
        contracts=contracts,
        out=args.out,
        per_scope=args.sample,
        seed=args.seed,
        max_pairs=args.max_pairs,
        config=config,
        resume=args.resume,
        log=log,
    )


def _note(args: argparse.Namespace, policy: Any, base_file: Path, meta: dict[str, Any], results: Any) -> str:
    """The head of the written policy: what was measured, where, on which model, each plan's n."""
    if meta.get("engine") == "server":
        where = f"in the server {meta['server']} (model {meta['model']}, run {meta['run']})"
    else:
        where = f"on the CPU reference engine (model {meta['model']})"
    lines = [
        f"Calibrated by `semgov calibrate` {where}",
        f"from {base_file} (revision {policy.revision}) on {meta['captured']}: {meta['sampled']} allowed "
        f"candidates of {meta['requests']} requests; methods {', '.join(args.methods)}; budget "
        f"{args.budget:g} (95% upper bound), at least {args.min_n} trials; answers compared "
        + ("by the response contracts of " + str(args.contracts) if args.contracts else "token for token"),
    ]
    for s in results:
        for m, c in s.shifted.items():
            lo, hi = c.ci95
            lines.append(
                f"{s.task}/{s.contract} {m}: {c.regressions}/{c.n} regressions [95% {100 * lo:.1f}-"
                f"{100 * hi:.1f}%], {c.changed_answers} changed answers, "
                f"{c.changed_values} changed required values"
            )
    if meta.get("stopped"):
        lines.append(f"Stopped early ({meta['stopped']}).")
    return "\n".join(lines)


def _write(
    args: argparse.Namespace, policy: Any, base_file: Path, rego: Any, trials: list[Any], meta: dict[str, Any]
) -> None:
    from semgov.policy.calibration import aggregate, overlay_yaml, table
    from semgov.policy.yaml.model import POLICY_FILE

    results = aggregate(trials, args.methods, args.budget, args.min_n)
    (args.out / "yaml").mkdir(parents=True, exist_ok=True)
    note = _note(args, policy, base_file, meta, results)
    (args.out / "yaml" / POLICY_FILE).write_bytes(
        overlay_yaml(base_file.read_bytes(), str(base_file), results, note)
    )
    if rego is not None:
        _write_rego(args.rego, args.out / "rego", results)
    report = {
        **meta,
        "methods": args.methods,
        "budget": args.budget,
        "min_n": args.min_n,
        "contracts": str(args.contracts) if args.contracts else None,
        "scopes": [
            {
                "task": s.task,
                "response_contract": s.contract,
                "prefix": s.prefix.doc(),
                "shifted": {m: c.doc() for m, c in s.shifted.items()},
                "rule": s.rule(),
            }
            for s in results
        ],
    }
    (args.out / "calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(results, args.methods, args.budget, args.min_n))
    also = f", {args.out / 'rego'}" if rego is not None else ""
    print(f"wrote {args.out / 'yaml' / POLICY_FILE}{also} and {args.out / 'calibration.json'}")


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
