"""``semgov calibrate --server``: the run's loop, its budget, its progress and what it measured."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semgov.calibrate.audit import ServerAudit
from semgov.calibrate.engines import Engine
from semgov.calibrate.run import (
    Compare,
    RunConfig,
    ServerRun,
    append_row,
    cases_sha256,
    open_run,
    trials_of,
)
from semgov.calibrate.sample import sample_cases, trial_policy
from semgov.decide import Evaluator
from semgov.policy.calibration import Trial
from semgov.policy.yaml.model import Policy
from semgov.signing.keys import Keyring, SigningKey


def run_against_server(
    captured: Path,
    policy: Policy,
    keyring: Keyring,
    *,
    engine: Engine,
    audit: ServerAudit,
    contracts: Any | None,
    out: Path,
    per_scope: int,
    seed: int,
    max_pairs: int | None,
    config: RunConfig,
    resume: bool,
    log: Callable[[str], None],
) -> tuple[list[Trial], dict[str, Any]]:
    """Every sampled pair measured in the server (what a resumed run measured before included), the
    trials and what was run (for ``calibration.json`` and the policy's header)."""
    t0 = time.monotonic()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    local = Evaluator(trial_policy(policy), keyring, SigningKey.from_private(Ed25519PrivateKey.generate()))
    cases, requests = sample_cases(captured, local, per_scope, seed, max_pairs)
    model = engine.model()
    identity = {
        "cases_sha256": cases_sha256(cases),
        "policy_revision": policy.revision,
        "sample": per_scope,
        "seed": seed,
        "max_pairs": max_pairs,
        "methods": list(config.methods),
        "max_new_tokens": config.max_new_tokens,
        "server": engine.where,
        "model": model,
    }
    run_id, done, unfinished = open_run(out, identity, resume)
    run = ServerRun(engine, audit, Compare(contracts, log), config, out, run_id, log)
    audit.poll()  # NOTE: what the log held before the run is read once, never waited on
    for k in unfinished:
        if k < len(cases):
            run.release(cases[k], k)
            log(f"pair {k}: released its donors, left by the interrupted run; measuring it again")
    log(
        f"{requests} requests read, {len(cases)} allowed pairs sampled (at most {per_scope} per scope and "
        f"kind{'' if max_pairs is None else f', {max_pairs} in all'}), {len(done)} measured before; "
        f"server {engine.where} ({model}), run {run_id}"
    )
    stopped = _loop(run, cases, done, config, out, log, t0)
    rows = [done[k] for k in sorted(done)]
    meta = _meta(rows, cases, requests, identity, run_id, stopped, time.monotonic() - t0)
    meta["captured"] = str(captured)
    return trials_of(rows), meta


def _loop(
    run: ServerRun,
    cases: list[Any],
    done: dict[int, dict[str, Any]],
    config: RunConfig,
    out: Path,
    log: Callable[[str], None],
    t0: float,
) -> str | None:
    """Measure every pair not done yet, within the budget (the first pair of a run always starts);
    why it stopped early (None: it did not)."""
    spent: list[float] = []
    todo = [k for k in range(len(cases)) if k not in done]
    for n, k in enumerate(todo):
        elapsed = time.monotonic() - t0
        typical = sorted(spent)[len(spent) // 2] if spent else 0.0
        if n and config.budget_s is not None and elapsed + typical > config.budget_s:
            left = len(todo) - n
            log(f"--budget-s {config.budget_s:g} reached after {elapsed:.0f} s: {left} pair(s) not measured "
                "(--resume with a larger budget continues)")  # fmt: skip
            return f"budget: {left} of {len(cases)} pairs not measured"
        case = cases[k]
        append_row(out, {"case": k, "state": "started"})
        row = run.measure(case, k)
        append_row(out, row)
        done[k] = row
        spent.append(row["seconds"])
        eta = sorted(spent)[len(spent) // 2] * (len(todo) - n - 1)  # NOTE: the median pair so far
        took = elapsed + row["seconds"]
        log(f"[{len(done)}/{len(cases)}] {_line(row)}  ({took:.0f} s, about {eta:.0f} s left)")
    return None


def _line(row: dict[str, Any]) -> str:
    """One pair's progress line: its scope, and per plan what was realized and whether it changed."""
    parts = []
    for plan, m in row["methods"].items():
        mark = "R" if m["regressed"] else ("c" if m["changed_answer"] else "=")
        what = f"{m['realized']}/{m['approved']}" if m["counted"] else f"not counted: {m['why_not']}"
        parts.append(f"{plan} {what} {mark}")
    return f"{row['request_id']} {row['kind']} {row['task']}/{row['contract']}: " + "; ".join(parts)


def _meta(
    rows: list[dict[str, Any]],
    cases: list[Any],
    requests: int,
    identity: dict[str, Any],
    run_id: str,
    stopped: str | None,
    seconds: float,
) -> dict[str, Any]:
    floor = [r["cold_cold_identical"] for r in rows if r["cold_cold_identical"] is not None]
    runs = [m for r in rows for m in r["methods"].values()]
    return {
        "engine": "server",
        "server": identity["server"],
        "model": identity["model"],
        "run": run_id,
        "requests": requests,
        "sampled": len(cases),
        "measured": len(rows),
        "governed_runs": len(runs),
        "counted": sum(1 for m in runs if m["counted"]),
        "not_counted": sorted({m["why_not"] for m in runs if not m["counted"]}),
        "approved_tokens": sum(m["approved"] for m in runs),
        "realized_tokens": sum(m["realized"] for m in runs),
        "max_new_tokens": identity["max_new_tokens"],
        "floor": {"runs": len(floor), "identical": sum(floor)},
        "stopped": stopped,
        "seconds": round(seconds, 1),
    }
