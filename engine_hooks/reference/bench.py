"""`semgov bench`: what KV reuse saves and what governance costs, on a real model on CPU.

For every donor/recipient pair of the workload (:mod:`engine_hooks.reference.bench_workload`)
the recipient is prefilled cold, then warm in three arms, each compared with that cold twin in
the same run:

- ``exact_only``: materialize the common prefix only (one ``prefix`` span from position 0),
  as serving engines do today, whoever the donor is;
- ``similarity_only``: when the candidate's similarity clears the policy's minimum, materialize
  every token-identical span token verification found (prefix or shifted, any segment role),
  with no other gate;
- ``governed``: semgov decides (:meth:`semgov.Evaluator.evaluate`), the signed record is handed
  to the audit log (:meth:`semgov.audit.store.AuditLog.append`), and the engine acts on the
  record (:func:`~engine_hooks.reference.materialize.governed_prefill`, fail closed). Decision,
  signing and audit hand-off are timed and added to the arm's TTFT.

Reuse is counted only from the engine's realization events (KV physically copied). Quality is
greedy agreement with the cold answer, KL(cold || warm) of the first token's distribution, the
comparison the request's response contract says (:mod:`semgov.contracts`; ``cfg.contracts``, by
default the workload's ``bench_contracts.yaml``: changed answers and changed required values), and
whether the answer states the known value the question asks for (the workload's ground truth). A
cold/cold noise floor is measured in the same run. Outputs: ``results.json``, ``report.md`` and PNG
plots in ``out``.
"""

# NOTE: long module: one benchmark harness (the arms, their timing, the statistics and the
# report) whose parts share the run's types; none of it runs in a server.

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import semgov
from engine_hooks.reference import materialize as mz
from engine_hooks.reference import model as mdl
from engine_hooks.reference.bench_report import plots, report
from engine_hooks.reference.bench_workload import (
    COHORTS,
    BenchKeys,
    Pair,
    PrefixCase,
    TextTokenizer,
    WorkloadBuilder,
    evidence_budget,
    prefix_case,
    value_present,
)
from engine_hooks.reference.workload import QUALITY_GATED, common_prefix, rfc3339
from semgov import CapturedRequest, Evaluator, load_policy
from semgov.audit.store import AuditLog
from semgov.contracts import Contracts, ContractSpec, load_contracts
from semgov.facts.compute import FactContext, PreparedPrompt, compute_facts
from semgov.stats import wilson
from semgov.typing import AuditSink
from semgov.wire.models import span_dict
from semgov.wire.policy_input import SpanFacts

Json = dict[str, Any]
ARMS = ("exact_only", "similarity_only", "governed")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = ROOT / "policies" / "default"
# How answers under the workload's two response contracts are compared (shipped with the package).
DEFAULT_CONTRACTS = Path(__file__).with_name("bench_contracts.yaml")
# How the ungoverned arms realize shifted spans (fixed, so figures stay comparable across policy
# changes); the governed arm follows its record's plan.
UNGOVERNED_RECOMPUTE: dict[str, Any] = {"recompute_share": 0.05, "min_recompute": 16}


@dataclass
class BenchConfig:
    """What to run. ``None`` sizes take the quick or full defaults (:meth:`resolved`)."""

    out: Path
    quick: bool = False
    model: str = "smollm2-135m"
    dtype: str | None = None  # compute dtype name; None: the model's own
    tokens: int | None = None  # recipient prompt length of the pairs
    pairs_per_cohort: int | None = None
    threads: int | None = None
    prefix_tokens: int | None = None  # the prefix-reuse measurement's prompt length
    repeats: int | None = None  # timed prefills per arm (the fastest counts); quality from the first
    noise_pairs: int | None = None  # pairs whose cold run is repeated for the noise floor
    max_new_tokens: int = 32
    overhead_samples: int = 30
    policy: Path = DEFAULT_POLICY
    contracts: Path = DEFAULT_CONTRACTS
    cohorts: tuple[str, ...] = COHORTS
    seed: int = 7
    cache_dir: Path | None = None

    def resolved(self) -> BenchConfig:
        q = self.quick
        return BenchConfig(
            out=self.out,
            quick=q,
            model=self.model,
            dtype=self.dtype,
            tokens=self.tokens or (450 if q else 1500),
            pairs_per_cohort=self.pairs_per_cohort or (1 if q else 3),
            threads=self.threads or len(os.sched_getaffinity(0)),
            prefix_tokens=self.prefix_tokens or 2048,
            repeats=self.repeats or 2,
            noise_pairs=self.noise_pairs if self.noise_pairs is not None else (2 if q else 6),
            max_new_tokens=self.max_new_tokens,
            overhead_samples=self.overhead_samples,
            policy=self.policy,
            contracts=self.contracts,
            cohorts=self.cohorts,
            seed=self.seed,
            cache_dir=self.cache_dir,
        )


# --- small helpers --------------------------------------------------------------------------


def kl_divergence(cold_logits: torch.Tensor, warm_logits: torch.Tensor) -> float:
    """KL(cold || warm) in nats between two next-token distributions (float64)."""
    p = torch.log_softmax(cold_logits.detach().reshape(-1).to(torch.float64), dim=-1)
    q = torch.log_softmax(warm_logits.detach().reshape(-1).to(torch.float64), dim=-1)
    return max(0.0, float(torch.sum(p.exp() * (p - q))))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().reshape(-1) - b.detach().reshape(-1)).abs().max())


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where two greedy outputs differ; None when identical."""
    n = common_prefix(a, b)
    return None if n == len(a) == len(b) else n


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _quantile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _pin_threads(n: int) -> None:
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (tests run the bench more than once)
        pass


def _prefix_span(length: int) -> Json:
    return {"recipient_start": 0, "donor_start": 0, "length": length, "kind": "prefix"}


@dataclass
class _Timed:
    """A prefill run ``repeats`` times: the first run's result and events, every run's seconds."""

    prefill: mz.Prefill
    seconds: list[float]
    events: list[mz.Realization]

    @property
    def best_s(self) -> float:
        """The fastest run: other load on the machine only ever adds time."""
        return min(self.seconds)

    def events_sum(self, name: str) -> int:
        return sum(int(getattr(ev, name)) for ev in self.events)


Runner = Callable[[Callable[[mz.Realization], None]], mz.Prefill]


class _NoGC:
    """The garbage collector paused inside a timed region (its pauses are not the engine's cost)."""

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was:
            gc.enable()


def _timed(run: Runner, repeats: int) -> _Timed:
    """Run a prefill ``repeats`` times (no GC inside a run); events come from the first run."""
    first: mz.Prefill | None = None
    events: list[mz.Realization] = []
    secs: list[float] = []
    for i in range(max(1, repeats)):
        sink: list[mz.Realization] = events if i == 0 else []
        with _NoGC():
            prefill = run(sink.append)
        secs.append(float(prefill.seconds))
        if first is None:
            first = prefill
    assert first is not None
    return _Timed(first, secs, events)


# --- the harness ----------------------------------------------------------------------------


class Bench:
    """One benchmark run's state: model, keys, evaluator, audit log."""

    def __init__(self, cfg: BenchConfig, lm: mdl.LoadedModel, contracts: Contracts | None = None) -> None:
        self.cfg = cfg
        self.lm = lm
        self.contracts = contracts if contracts is not None else load_contracts(cfg.contracts)
        tok = lm.tokenizer
        self.tokenize = TextTokenizer(tok)
        stops = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
        self.stop: set[int] = {int(i) for i in stops if isinstance(i, int) and i >= 0}
        self.keys = BenchKeys.generate()
        self.policy = load_policy(cfg.policy)
        self.min_similarity = float(self.policy.similarity.min)
        self.registrations: list[float] = []
        # The ungoverned arms' span search: same facts code, no PII scan, own caches (the donor's
        # PII scan happens once, at donor registration, as an engine would do it).
        self._span_config = replace(self.policy.fact_config, scan_donor_text=False)
        self._span_ctx = FactContext(self.keys.keyring)
        self._audit_dir = tempfile.TemporaryDirectory(prefix="semgov-bench-audit-")
        self.audit = AuditLog.open(
            Path(self._audit_dir.name), signing_key=self.keys.decision, origin="semgov-bench/audit"
        )
        # NOTE: every decision the evaluator signs (the warm-up's included) goes to the audit log
        # through its sink, inside the timed region: decide + sign + audit hand-off.
        self.evaluator = Evaluator(
            self.policy, self.keys.keyring, self.keys.decision, sink=AuditSink(self.audit)
        )

    def close(self) -> None:
        try:
            self.audit.close()
        finally:
            self._audit_dir.cleanup()

    @property
    def repeats(self) -> int:
        return self.cfg.repeats or 1

    def answer(self, prefill: mz.Prefill) -> list[int]:
        return mz.greedy(self.lm, prefill, self.cfg.max_new_tokens, stop_token_ids=self.stop)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.lm.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()

    def cold(self, ids: list[int], repeats: int | None = None) -> _Timed:
        return _timed(lambda _sink: mz.cold_prefill(self.lm, ids), repeats or self.repeats)

    def warm(
        self,
        ids: list[int],
        donor: mz.DonorKV,
        spans: list[Json],
        decision_id: str,
        repeats: int | None = None,
    ) -> _Timed:
        def run(sink: Callable[[mz.Realization], None]) -> mz.Prefill:
            # NOTE: the ungoverned arms recompute 5% of shifted spans (at least 16 tokens), what the
            # reference engine did before the policy planned it: similarity admission, not no recompute.
            return mz.warm_prefill(
                self.lm, ids, donor, spans, decision_id=decision_id, on_event=sink, **UNGOVERNED_RECOMPUTE
            )[0]

        return _timed(run, repeats or self.repeats)

    def governed(self, pair: Pair, ids: list[int], donor: mz.DonorKV) -> tuple[_Timed, Json, list[float]]:
        """Decide + sign + audit hand-off (timed, every repeat), then act on the record."""
        gov: list[float] = []
        records: list[Json] = []

        def run(sink: Callable[[mz.Realization], None]) -> mz.Prefill:
            t0 = time.perf_counter()
            decision = self.evaluator.evaluate(pair.request)[0]
            gov.append(time.perf_counter() - t0)
            records.append(decision.record)
            prefill, _ = mz.governed_prefill(self.lm, ids, donor, decision.record, on_event=sink)
            return prefill

        timed = _timed(run, self.repeats)
        return timed, records[0], gov

    def register_donor(self, req: CapturedRequest) -> float:
        """Donor registration, as an engine does when a request becomes a donor (off any
        recipient's path): its KV is cached and semgov computes its per-donor facts (the PII
        scan). Returns the seconds semgov spent; collected in ``self.registrations``."""
        t0 = time.perf_counter()
        self.evaluator.register_donor(req.candidates[0].prompt)
        took = time.perf_counter() - t0
        self.registrations.append(took)
        return took

    def verified_spans(self, req: CapturedRequest) -> list[SpanFacts]:
        """Every token-identical span of the request's first candidate (``facts.tokens.spans``)."""
        doc = compute_facts(
            req,
            PreparedPrompt.of(req.prompt),
            req.candidates[0],
            config=self._span_config,
            ctx=self._span_ctx,
            now=req.received_at,
        )
        return list(doc.facts.tokens.spans) if doc.facts.tokens is not None else []

    def warm_up(self, req: CapturedRequest) -> None:
        """Kernels, decoding, Presidio and the decision path, without caching any pair's PII scan."""
        self.answer(mz.cold_prefill(self.lm, req.prompt.token_ids.tolist()))
        fc = self.policy.fact_config
        scanner = self.evaluator.ctx.pii_scanner
        assert scanner is not None
        scanner.scan(
            "Warm-up text without personal data.",
            donor_token_hash="warm-up",
            min_score=fc.pii_min_score,
            phone_regions=fc.phone_regions,
            entities=fc.pii_entities,
        )
        cand = req.candidates[0]
        textless = cand.model_copy(update={"prompt": cand.prompt.model_copy(update={"text": None})})
        self.evaluator.evaluate(req.model_copy(update={"candidates": [textless]}))

    def contract(self, pair: Pair) -> ContractSpec:
        """How the pair's answers are compared: its response contract's entry."""
        return self.contracts.spec(pair.request.response_contract.model_dump())

    def arm_spans(self, arm: str, pair: Pair, lcp: int, verified: Sequence[SpanFacts]) -> list[Json]:
        """What the ungoverned arms materialize: the common prefix, or every verified span."""
        if arm == "exact_only":
            return [_prefix_span(lcp)] if lcp else []
        if arm == "similarity_only" and pair.similarity >= self.min_similarity:
            return [span_dict(s) for s in verified]
        return []

    def run_pair(self, pair: Pair, noise: bool) -> tuple[Json, Json | None]:
        """Cold, then every arm, on one pair; and a second cold run for the noise floor."""
        ids = pair.recipient.token_ids
        donor = mz.donor_kv(self.lm, pair.donor.token_ids)
        self.register_donor(pair.request)
        cold_t = self.cold(ids)
        cold_logits = cold_t.prefill.logits_last.detach().clone()
        cold_ids = self.answer(cold_t.prefill)
        cold_text = self.decode(cold_ids)
        cold: Json = {
            "ttft_s": cold_t.best_s,
            "ttft_runs_s": cold_t.seconds,
            "computed_tokens": cold_t.prefill.computed_tokens,
            "answer": cold_text,
            "answer_ids": cold_ids,
            "values_present": {v: value_present(v, cold_text) for v in pair.required},
        }
        floor: Json | None = None
        if noise:
            again = mz.cold_prefill(self.lm, ids)
            div = first_divergence(cold_ids, self.answer(again))
            floor = {
                "pair": pair.pair_id,
                "greedy_agree": div is None,
                "first_divergence": div,
                "kl": kl_divergence(cold_logits, again.logits_last),
                "logits_max_abs_diff": max_abs_diff(cold_logits, again.logits_last),
            }
        verified = self.verified_spans(pair.request)
        lcp = common_prefix(ids, pair.donor.token_ids)
        arms = {arm: self._arm(arm, pair, ids, donor, lcp, verified, cold, cold_logits) for arm in ARMS}
        row = {
            "pair": pair.pair_id,
            "cohort": pair.cohort,
            "base": pair.base,
            "expect": pair.expect,
            "similarity": pair.similarity,
            "recipient_tokens": len(ids),
            "donor_tokens": len(pair.donor.token_ids),
            "common_prefix": lcp,
            "verified_spans": [
                {**span_dict(s), "recipient_role": s.recipient_role, "donor_role": s.donor_role}
                for s in verified
            ],
            "tokenization_consistent": pair.recipient.consistent and pair.donor.consistent,
            "question": pair.question,
            "response_contract": pair.request.response_contract.model_dump(),
            "contract_spec": self.contract(pair).describe(),
            "required": pair.required,
            "cold": cold,
            "arms": arms,
            **pair.notes,
        }
        return row, floor

    def _arm(
        self,
        arm: str,
        pair: Pair,
        ids: list[int],
        donor: mz.DonorKV,
        lcp: int,
        verified: Sequence[SpanFacts],
        cold: Json,
        cold_logits: torch.Tensor,
    ) -> Json:
        gov: list[float] = []
        record: Json = {}
        error: str | None = None
        spans = self.arm_spans(arm, pair, lcp, verified)
        if arm == "governed":
            timed, record, gov = self.governed(pair, ids, donor)
            action = str(record["decision"])
            spans = list(record["approved_spans"])
        elif spans:
            action = "materialize"
            try:
                timed = self.warm(ids, donor, spans, f"{arm}:{pair.pair_id}")
            except ValueError as e:  # the engine refused the spans: it runs cold, and says so
                error, action = f"{type(e).__name__}: {e}", "cold (refused)"
                timed = self.cold(ids)
        else:
            action = "cold"
            timed = self.cold(ids)
        gov_s = gov[0] if gov else 0.0  # the first decision on this donor: includes its PII scan
        ttft = timed.best_s + gov_s
        answer_ids = self.answer(timed.prefill)
        text = self.decode(answer_ids)
        div = first_divergence(cold["answer_ids"], answer_ids)
        logits = timed.prefill.logits_last
        return {
            "action": action,
            "error": error,
            "spans": spans,
            "span_tokens": sum(int(s["length"]) for s in spans),
            "materialized_tokens": timed.events_sum("materialized_tokens"),
            "recomputed_tokens": timed.events_sum("recomputed_tokens"),
            "realization_events": len(timed.events),
            "computed_tokens": timed.prefill.computed_tokens,
            "prefill_tokens_avoided": len(ids) - timed.prefill.computed_tokens,
            "prefill_s": timed.best_s,
            "prefill_runs_s": timed.seconds,
            "decision_s": gov_s if arm == "governed" else None,
            "decision_runs_s": gov if arm == "governed" else None,
            "gates_failed": [g["gate"] for g in record.get("gates", []) if g["result"] != "pass"],
            "ttft_s": ttft,
            "ttft_ratio": cold["ttft_s"] / ttft if ttft > 0 else None,
            "kl": kl_divergence(cold_logits, logits),
            "top1_agree": int(cold_logits.reshape(-1).argmax()) == int(logits.reshape(-1).argmax()),
            "answer": text,
            "answer_ids": answer_ids,
            "greedy_agree": div is None,
            "first_divergence": div,
            "values_present": {v: value_present(v, text) for v in pair.required},
            "contract": self.contract(pair)
            .compare_answers(cold["answer"], text, cold_ids=cold["answer_ids"], warm_ids=answer_ids)
            .as_dict(),
        }

    # the dedicated measurements

    def prefix_measurement(self) -> tuple[Json, PrefixCase]:
        """Prefix reuse of a ~``prefix_tokens`` prompt: cold vs warm (common prefix copied), one run."""
        case = prefix_case(self.tokenize, self.cfg.prefix_tokens or 2048, self.keys)
        ids = case.recipient.token_ids
        lcp = common_prefix(ids, case.donor.token_ids)
        donor = mz.donor_kv(self.lm, case.donor.token_ids)
        registration_s = self.register_donor(case.request)
        reps = max(3, self.repeats)
        spans = [_prefix_span(lcp)]
        cold = self.cold(ids, reps)
        warm = self.warm(ids, donor, spans, "prefix-measurement", reps)
        c, w = cold.best_s, warm.best_s
        cold_logits = cold.prefill.logits_last.detach().clone()
        cold_ans, warm_ans = self.answer(cold.prefill), self.answer(warm.prefill)
        result = {
            "prompt_tokens": len(ids),
            "donor_registration_s": registration_s,
            "common_prefix": lcp,
            "materialized_tokens": warm.events_sum("materialized_tokens"),
            "chunk_tokens": mz.PREFILL_CHUNK_TOKENS,
            "computed_tokens_cold": int(cold.prefill.computed_tokens),
            "computed_tokens_warm": int(warm.prefill.computed_tokens),
            "runs": reps,
            "cold_ttft_s": c,
            "warm_ttft_s": w,
            "cold_runs_s": cold.seconds,
            "warm_runs_s": warm.seconds,
            "ratio": c / w if w > 0 else None,
            "target_ratio": 5.0,
            "meets_target": w > 0 and c / w >= 5.0,
            "kl": kl_divergence(cold_logits, warm.prefill.logits_last),
            "logits_max_abs_diff": max_abs_diff(cold_logits, warm.prefill.logits_last),
            "greedy_agree": first_divergence(cold_ans, warm_ans) is None,
            "required": case.required,
            "cold_answer": self.decode(cold_ans),
            "warm_answer": self.decode(warm_ans),
        }
        return result, case

    def overhead(self, case: PrefixCase, cold_ttft_s: float) -> Json:
        """Decision + signing + audit hand-off for the prefix case, as a share of its cold TTFT.

        The donor was registered first (its PII scan ran then, off the recipient's path, and is
        reported separately). ``first`` is the first decision on this donor (its provenance
        signature verified for the first time), ``steady`` the median of later decisions on the same
        donor, as when one cached donor serves many requests. The target applies to both.
        """
        samples: list[float] = []
        decision = ""
        for _ in range(max(2, self.cfg.overhead_samples)):
            with _NoGC():
                t0 = time.perf_counter()
                d = self.evaluator.evaluate(case.request)[0]
                samples.append(time.perf_counter() - t0)
            decision = d.decision
        first, rest = samples[0], samples[1:]
        steady = statistics.median(rest)
        return {
            "prompt_tokens": len(case.recipient.token_ids),
            "decision": decision,
            "samples": len(samples),
            "first_s": first,
            "steady_median_s": steady,
            "steady_p90_s": _quantile(rest, 0.9),
            "cold_ttft_s": cold_ttft_s,
            "first_pct_of_cold_ttft": 100 * first / cold_ttft_s,
            "steady_pct_of_cold_ttft": 100 * steady / cold_ttft_s,
            "target_pct": 1.0,
            "meets_target": 100 * max(first, steady) / cold_ttft_s < 1.0,
        }


# --- summaries ------------------------------------------------------------------------------


def noise_floor(samples: Sequence[Json]) -> Json:
    """Cold/cold agreement; ``min_first_divergence`` is None when every rerun agreed."""
    divs = [s["first_divergence"] for s in samples if s["first_divergence"] is not None]
    return {
        "n": len(samples),
        # NOTE: two cold prefills of one prompt, bit for bit (logits and answer); when not, a warm answer
        # only counts as a regression where it diverges earlier than any cold/cold rerun did.
        "bit_identical": all(s["greedy_agree"] and s["logits_max_abs_diff"] == 0.0 for s in samples),
        "greedy_agree": sum(1 for s in samples if s["greedy_agree"]),
        "min_first_divergence": min(divs) if divs else None,
        "max_kl": max((s["kl"] for s in samples), default=None),
        "max_logits_abs_diff": max((s["logits_max_abs_diff"] for s in samples), default=None),
        "samples": list(samples),
    }


def classify(rows: list[Json], floor: Json) -> None:
    """Mark unsafe materializations and quality regressions in every arm, in place.

    A regression is a warm answer that loses a required value the cold answer stated, or whose
    greedy output diverges from cold earlier than any cold/cold rerun did (with a deterministic
    floor: at all).
    """
    limit = floor["min_first_divergence"]
    for row in rows:
        cold_values = row["cold"]["values_present"]
        for a in row["arms"].values():
            lost = [v for v, ok in cold_values.items() if ok and not a["values_present"].get(v, False)]
            div = a["first_divergence"]
            a["values_lost"] = lost
            a["diverged_beyond_floor"] = div is not None and (limit is None or div < limit)
            a["quality_regression"] = bool(lost) or a["diverged_beyond_floor"]
            # NOTE: a quality-gated cohort (shifted spans, off by default) is denied but not unsafe.
            unsafe = row["expect"] == "deny" and row["base"] not in QUALITY_GATED
            a["unsafe_materialization"] = unsafe and a["materialized_tokens"] > 0


def _contract_counts(arms: Sequence[Json]) -> Json:
    """Changed answers and changed required values by each pair's response contract, with their 95%
    Wilson intervals."""
    answers = sum(1 for a in arms if a["contract"]["answer_changed"])
    values = sum(1 for a in arms if a["contract"]["values_changed"])
    return {
        "changed_answers": answers,
        "changed_answers_ci95": wilson(answers, len(arms)),
        "changed_required_values": values,
        "changed_required_values_ci95": wilson(values, len(arms)),
    }


def _cohort_stats(rows: list[Json], arm: str) -> Json:
    arms = [r["arms"][arm] for r in rows]
    ratios = [a["ttft_ratio"] for a in arms if a["ttft_ratio"] is not None]
    decisions = [a["decision_s"] for a in arms if a["decision_s"] is not None]
    return {
        "n": len(rows),
        "expect": rows[0]["expect"],
        "median_ttft_ratio": _median(ratios),
        "median_ttft_cold_ms": 1e3 * statistics.median(r["cold"]["ttft_s"] for r in rows),
        "median_ttft_warm_ms": 1e3 * statistics.median(a["ttft_s"] for a in arms),
        "median_decision_ms": 1e3 * m if (m := _median(decisions)) is not None else None,
        "materialized_pairs": sum(1 for a in arms if a["materialized_tokens"] > 0),
        "materialized_tokens": sum(a["materialized_tokens"] for a in arms),
        "prefill_tokens_avoided": sum(a["prefill_tokens_avoided"] for a in arms),
        "recipient_tokens": sum(r["recipient_tokens"] for r in rows),
        "unsafe_materializations": sum(1 for a in arms if a["unsafe_materialization"]),
        "quality_regressions": (bad := sum(1 for a in arms if a["quality_regression"])),
        "quality_regression_ci95": wilson(bad, len(rows)),
        "values_lost": (lost := sum(1 for a in arms if a["values_lost"])),
        "values_lost_ci95": wilson(lost, len(rows)),
        "wording_only": sum(1 for a in arms if not a["greedy_agree"] and not a["values_lost"]),
        **_contract_counts(arms),
        "approved_tokens": sum(a["span_tokens"] for a in arms),
        "greedy_agree": sum(1 for a in arms if a["greedy_agree"]),
        "top1_agree": sum(1 for a in arms if a["top1_agree"]),
        "median_kl": statistics.median(a["kl"] for a in arms),
        "max_kl": max(a["kl"] for a in arms),
        "values_present_cold": sum(1 for r in rows if all(r["cold"]["values_present"].values())),
        "values_present_warm": sum(1 for a in arms if all(a["values_present"].values())),
        "actions": {x: sum(1 for a in arms if a["action"] == x) for x in sorted({a["action"] for a in arms})},
    }


def summarize(rows: list[Json], cohorts: Sequence[str]) -> Json:
    """Per arm: totals over every pair, and per cohort (:func:`_cohort_stats`)."""
    out: Json = {}
    for arm in ARMS:
        arms = [r["arms"][arm] for r in rows]
        allow = [r["arms"][arm] for r in rows if r["expect"] == "allow"]
        by_cohort = {c: [r for r in rows if r["cohort"] == c] for c in cohorts}
        out[arm] = {
            "pairs": len(rows),
            "unsafe_materializations": sum(1 for a in arms if a["unsafe_materialization"]),
            "quality_regressions": (bad := sum(1 for a in arms if a["quality_regression"])),
            "quality_regression_ci95": wilson(bad, len(rows)),
            "values_lost": (lost := sum(1 for a in arms if a["values_lost"])),
            "values_lost_ci95": wilson(lost, len(rows)),
            "wording_only": sum(1 for a in arms if not a["greedy_agree"] and not a["values_lost"]),
            **_contract_counts(arms),
            "correct_answers": (ok := sum(1 for a in arms if all(a["values_present"].values()))),
            "prefill_tokens_avoided_per_correct": (
                sum(a["prefill_tokens_avoided"] for a in arms) / ok if ok else None
            ),
            "greedy_agree": sum(1 for a in arms if a["greedy_agree"]),
            "materialized_tokens": sum(a["materialized_tokens"] for a in arms),
            "materialized_pairs": sum(1 for a in arms if a["materialized_tokens"] > 0),
            "prefill_tokens_avoided": sum(a["prefill_tokens_avoided"] for a in arms),
            "median_ttft_ratio": _median([a["ttft_ratio"] for a in arms if a["ttft_ratio"] is not None]),
            "median_ttft_ratio_allow_expected": _median(
                [a["ttft_ratio"] for a in allow if a["ttft_ratio"] is not None]
            ),
            "allow_expected_pairs": len(allow),
            "cohorts": {c: _cohort_stats(rs, arm) for c, rs in by_cohort.items() if rs},
        }
    return out


# --- running --------------------------------------------------------------------------------


def _environment(lm: mdl.LoadedModel, load_s: float) -> Json:
    import transformers

    return {
        "model": lm.name,
        "model_short": lm.name.split(" (")[0],
        "source_sha256": lm.source_sha256,
        "model_load_s": load_s,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "semgov": semgov.__version__,
    }


def load_model(
    name: str, *, seed: int = 0, cache_dir: Path | None = None, dtype: torch.dtype | None = None
) -> mdl.LoadedModel:
    """The model called ``name`` (:data:`~engine_hooks.reference.model.MODEL_CHOICES`)."""
    return mdl.load_model(name, seed=seed, cache_dir=cache_dir, dtype=dtype)


@dataclass
class _Run:
    """What one run measured (:func:`_measure`)."""

    rows: list[Json]
    lengths: list[int]  # recipient prompt lengths
    noise_floor: Json
    prefix: Json
    overhead: Json
    audit_records: int


def _run_pairs(
    bench: Bench, pairs: Sequence[Pair], progress: Path, log: Callable[[str], None]
) -> tuple[list[Json], list[Json]]:
    """Every pair's row (also appended to ``progress`` as it completes) and the noise-floor samples."""
    rows: list[Json] = []
    floor_samples: list[Json] = []
    progress.write_text("", encoding="utf-8")
    for i, pair in enumerate(pairs):
        row, floor = bench.run_pair(pair, noise=i < (bench.cfg.noise_pairs or 0))
        rows.append(row)
        with progress.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if floor is not None:
            floor_samples.append(floor)
        ratios = " ".join(f"{a}={row['arms'][a]['ttft_ratio']:.1f}x" for a in ARMS)
        log(
            f"[{i + 1}/{len(pairs)}] {pair.pair_id:<16} expect {pair.expect:<5} "
            f"governed {row['arms']['governed']['action']:<5} cold {1e3 * row['cold']['ttft_s']:7.1f} "
            "ms  " + ratios
        )
    return rows, floor_samples


def _measure(bench: Bench, log: Callable[[str], None]) -> _Run:
    """The pairs, the noise floor, the prefix-reuse measurement and the governance overhead."""
    cfg = bench.cfg
    builder = WorkloadBuilder(
        bench.tokenize, evidence_budget(bench.tokenize, cfg.tokens or 450), bench.keys, seed=cfg.seed
    )
    pairs = builder.pairs(cfg.pairs_per_cohort or 1, cfg.cohorts)
    bench.warm_up(pairs[0].request)
    lengths = [len(p.recipient.token_ids) for p in pairs]
    log(f"{len(pairs)} pairs, prompts {min(lengths)}-{max(lengths)} tokens, {cfg.threads} threads")
    # pairs.jsonl holds each row as it completes: a cut-short run keeps them
    rows, floor_samples = _run_pairs(bench, pairs, cfg.out / "pairs.jsonl", log)
    floor_summary = noise_floor(floor_samples)
    classify(rows, floor_summary)
    log(f"prefix reuse at ~{cfg.prefix_tokens} tokens, governance overhead ...")
    prefix, case = bench.prefix_measurement()
    overhead = bench.overhead(case, prefix["cold_ttft_s"])
    return _Run(rows, lengths, floor_summary, prefix, overhead, bench.audit.flush())


def _results(bench: Bench, run: _Run, env: Json, started: str, t_start: float) -> Json:
    """``results.json``'s content (``plots`` and the final ``wall_s`` are the caller's)."""
    cfg, rows = bench.cfg, run.rows
    gov = [(r["arms"]["governed"]["decision_s"], r["cold"]["ttft_s"]) for r in rows]
    pct = [100 * d / c for d, c in gov if c > 0]
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    config["cohorts"] = list(cfg.cohorts)
    return {
        "schema": "semgov.bench/v1",
        "started_at": started,
        "config": config,
        "environment": env,
        "policy": {
            "name": bench.policy.name,
            "version": bench.policy.version,
            "revision": bench.policy.revision,
            "similarity_min": bench.min_similarity,
        },
        "arms": summarize(rows, cfg.cohorts),
        "prefix_measurement": run.prefix,
        "governance_overhead": run.overhead,
        "donor_registration": {
            "n": len(bench.registrations),
            "median_ms": 1e3 * (_median(bench.registrations) or 0.0),
            "max_ms": 1e3 * max(bench.registrations, default=0.0),
        },
        "pair_overhead": {
            "n": len(pct),
            "median_ms": 1e3 * (_median([d for d, _ in gov]) or 0.0),
            "median_pct_of_cold_ttft": _median(pct),
            "max_pct_of_cold_ttft": max(pct, default=None),
        },
        "noise_floor": run.noise_floor,
        "contracts": {
            "source": bench.contracts.source,
            "sha256": bench.contracts.digest,
            "entries": [e.describe() for e in bench.contracts.entries],
        },
        "audit_records": run.audit_records,
        "tokenization_consistent": all(r["tokenization_consistent"] for r in rows),
        "pairs": rows,
        "wall_s": time.perf_counter() - t_start,
    }


def run_bench(
    cfg: BenchConfig, *, lm: mdl.LoadedModel | None = None, log: Callable[[str], None] = print
) -> Json:
    """Run the benchmark; write ``results.json``, ``report.md`` and the plots to ``cfg.out``."""
    cfg = cfg.resolved()
    t_start = time.perf_counter()
    started = rfc3339(datetime.now(UTC))
    _pin_threads(cfg.threads or 1)
    cfg.out.mkdir(parents=True, exist_ok=True)
    contracts = load_contracts(cfg.contracts)  # before the model: a bad file fails at once
    t0 = time.perf_counter()
    if lm is None:
        log(f"loading model {cfg.model} ...")
        dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
        lm = load_model(cfg.model, seed=cfg.seed, cache_dir=cfg.cache_dir, dtype=dtype)
    load_s = time.perf_counter() - t0
    bench = Bench(cfg, lm, contracts)
    try:
        run = _measure(bench, log)
    finally:
        bench.close()
    env = _environment(lm, load_s)
    env.update(prompt_tokens_min=min(run.lengths), prompt_tokens_max=max(run.lengths))
    results = _results(bench, run, env, started, t_start)
    results["plots"] = plots(results, cfg.out)
    results["wall_s"] = time.perf_counter() - t_start
    (cfg.out / "report.md").write_text(report(results), encoding="utf-8")
    (cfg.out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results


def _rate(s: Json, key: str, n: int) -> str:
    """``k/n [lo-hi%]``: a count of ``s`` and its 95% interval."""
    lo, hi = s[f"{key}_ci95"]
    return f"{s[key]}/{n} [{100 * lo:.0f}-{100 * hi:.0f}%]"


def _quality_lines(arms: Json) -> list[str]:
    """Changed answers and changed required values by the response contracts, and the known value
    lost (the workload's ground truth), per arm and per cohort, each with its 95% interval."""
    lines = [
        "",
        f"{'arm':<16}{'changed answers [95%]':>24}{'changed required values [95%]':>31}"
        f"{'known value lost [95%]':>24}{'avoided/correct':>17}",
    ]
    for a in ARMS:
        s, n = arms[a], arms[a]["pairs"]
        apc = s["prefill_tokens_avoided_per_correct"]
        cells = [
            _rate(s, "changed_answers", n),
            _rate(s, "changed_required_values", n),
            _rate(s, "values_lost", n),
        ]
        per = "-" if apc is None else f"{apc:.0f}"
        lines.append(f"{a:<16}{cells[0]:>24}{cells[1]:>31}{cells[2]:>24}{per:>17}")
    lines += [
        "",
        f"{'cohort':<16}{'n':>4}  similarity / governed, 95% intervals: changed answers; changed required "
        "values (known value lost)",
    ]
    for c, g in arms["governed"]["cohorts"].items():
        sim = arms["similarity_only"]["cohorts"][c]
        n = g["n"]
        cells = [f"{_rate(sim, k, n)} / {_rate(g, k, n)}" for k in _QUALITY_KEYS]
        lines.append(f"{c:<16}{n:>4}  {cells[0]}; {cells[1]} ({cells[2]})")
    return lines


_QUALITY_KEYS = ("changed_answers", "changed_required_values", "values_lost")


def summary(results: Json) -> str:
    """A plain-text digest of ``results`` for the terminal (the report has everything)."""
    arms = results["arms"]
    lines = [f"{'arm':<16}{'pairs':>6}{'unsafe':>8}{'regress':>9}{'materialized':>14}{'TTFT x (allow)':>16}"]
    for a in ARMS:
        s = arms[a]
        ratio = s["median_ttft_ratio_allow_expected"]
        lines.append(
            f"{a:<16}{s['pairs']:>6}{s['unsafe_materializations']:>8}{s['quality_regressions']:>9}"
            f"{s['materialized_tokens']:>14}{'-' if ratio is None else f'{ratio:.2f}':>16}"
        )
    lines.append("")
    lines.append(f"{'cohort':<14}{'expect':>7}{'n':>4}  median TTFT cold/warm: exact / similarity / governed")
    for c, g in arms["governed"]["cohorts"].items():
        cells = " / ".join(
            "-" if (r := arms[a]["cohorts"][c]["median_ttft_ratio"]) is None else f"{r:.2f}" for a in ARMS
        )
        lines.append(f"{c:<14}{g['expect']:>7}{g['n']:>4}  {cells}")
    lines += _quality_lines(arms)
    nf = results["noise_floor"]
    same = (
        "bit-identical"
        if nf.get("bit_identical")
        else "NOT bit-identical (changes within it are not counted)"
    )
    lines.append(f"cold/cold floor: {nf['greedy_agree']} of {nf['n']} reruns gave the same answer, {same}")
    cold_ok = sum(g["values_present_cold"] for g in arms["governed"]["cohorts"].values())
    lines.append(
        f"model limit: {cold_ok} of {arms['governed']['pairs']} cold answers state the known value "
        "(a lost known value can only be counted where cold stated it)"
    )
    pm, ov = results["prefix_measurement"], results["governance_overhead"]
    lines.append("")
    lines.append(
        f"prefix reuse, {pm['prompt_tokens']} tokens: cold {1e3 * pm['cold_ttft_s']:.0f} ms, warm "
        f"{1e3 * pm['warm_ttft_s']:.0f} ms, {pm['ratio']:.1f}x (target >= 5x)"
    )
    lines.append(
        f"governance overhead: {1e3 * ov['steady_median_s']:.2f} ms = {ov['steady_pct_of_cold_ttft']:.3f}% "
        "of cold "
        f"TTFT (target < 1%); first decision on a donor {ov['first_pct_of_cold_ttft']:.3f}%"
    )
    return "\n".join(lines)
