"""``semgov calibrate`` on the CPU reference engine: paired cold/warm runs of sampled captured traffic.

The captured requests are decided by a *trial* copy of the policy: shifted spans on for every scope
(``quality.allow_shifted``, its rules' ``allow_shifted`` dropped) with nothing planned (no head, no
tail), so every shifted span the policy's other settings approve is tried. For each sampled
request with an allowed candidate, the donor's KV comes from a cold prefill of the candidate's
prompt, the recipient is prefilled cold and then warm, and the greedy answers are compared: a warm
answer *regresses* when it differs from cold before any cold/cold rerun did (the floor, measured on
the first requests). Shifted decisions are run warm once per method (``trailing:256``, ...:
:mod:`engine_hooks.reference.realize`), each planned on the decision's spans as a policy would
plan it; prefix-only decisions once, as approved. The trials go to :mod:`semgov.policy.calibration`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine_hooks.reference import materialize as mz
from engine_hooks.reference import realize
from engine_hooks.reference.bench import first_divergence, load_model
from semgov import Evaluator, Keyring
from semgov.calibrate.sample import sample_cases, trial_policy
from semgov.policy.calibration import Trial
from semgov.policy.yaml.model import Policy
from semgov.signing.keys import SigningKey


def run_calibration(
    captured: Path,
    policy: Policy,
    keyring: Keyring,
    *,
    model: str = "smollm2-135m",
    per_scope: int = 10,
    methods: Sequence[str] = ("trailing:128", "bookend:16+256", "trailing:512"),
    max_new_tokens: int = 16,
    floor_runs: int = 3,
    seed: int = 7,
    threads: int = 1,
    log: Callable[[str], None] = print,
    contracts: Any | None = None,
) -> tuple[list[Trial], dict[str, Any]]:
    """Trials for every sampled case and method, and what was run (for ``calibration.json``).

    With ``contracts`` (:func:`semgov.contracts.load_contracts`) a regression is what each request's
    response contract compares, on the decoded answers; else a changed greedy answer (before any
    cold/cold rerun diverged). Both figures are kept per trial."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    hows = [realize.parse(m) for m in methods]
    ev = Evaluator(trial_policy(policy), keyring, SigningKey.from_private(Ed25519PrivateKey.generate()))
    cases, requests = sample_cases(captured, ev, per_scope, seed)
    log(
        f"{requests} requests read, {len(cases)} allowed candidates sampled "
        f"(at most {per_scope} per scope and kind; shifted spans tried everywhere)"
    )
    lm = load_model(model, seed=seed)
    runs: list[tuple[Any, str, int | None, Any]] = []  # (case, method, first divergence, comparison)
    floor: list[int | None] = []
    for i, case in enumerate(cases):
        req = case.request
        ids = req.prompt.token_ids.tolist()
        donor = mz.donor_kv(lm, req.candidates[case.candidate].prompt.token_ids.tolist())
        cold = mz.cold_prefill(lm, ids)
        answer = mz.greedy(lm, cold, max_new_tokens)
        if i < floor_runs:
            floor.append(first_divergence(answer, mz.greedy(lm, mz.cold_prefill(lm, ids), max_new_tokens)))
        tried = hows if case.kind == "shifted" else [realize.parse("none")]
        for how in tried:
            warm, _ = realize.realize(
                lm, ids, donor, case.record["approved_spans"], how, decision_id="calibrate"
            )
            name = how.name if case.kind == "shifted" else "as approved"
            out = mz.greedy(lm, warm, max_new_tokens)
            runs.append(
                (case, name, first_divergence(answer, out), _compare(contracts, lm, req, answer, out))
            )
        log(f"[{i + 1}/{len(cases)}] {req.request_id} {case.kind} {req.task.id}/{req.response_contract.id}")
    divergent = [d for d in floor if d is not None]
    limit = min(divergent) if divergent else None
    trials = []
    for c, m, d, cmp in runs:
        changed = d is not None and (limit is None or d < limit)
        trials.append(
            Trial(
                task=c.request.task.id,
                contract=c.request.response_contract.id,
                kind="shifted" if c.kind == "shifted" else "prefix",
                method=m,
                regressed=changed if cmp is None else bool(cmp.regressed),
                changed_answer=changed,
                changed_values=changed if cmp is None else bool(cmp.values_changed),
            )
        )
    meta = {
        "captured": str(captured),
        "requests": requests,
        "sampled": len(cases),
        "model": lm.name,
        "max_new_tokens": max_new_tokens,
        "floor": {"runs": len(floor), "first_divergence": limit},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return trials, meta


def _compare(contracts: Any | None, lm: Any, req: Any, cold: Sequence[int], warm: Sequence[int]) -> Any:
    """The response contract's comparison of two greedy answers (None without contracts)."""
    if contracts is None:
        return None
    decode = lm.tokenizer.decode
    spec = contracts.spec(req.response_contract.model_dump())
    texts = [decode(list(x), skip_special_tokens=True).strip() for x in (cold, warm)]
    return spec.compare_answers(*texts, cold_ids=list(cold), warm_ids=list(warm))
