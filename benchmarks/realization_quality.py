"""Which realization of a shifted span keeps the answer, per model, and at what compute.

For ``--pairs`` donor/recipient pairs of the ``semgov bench`` workload (cohorts ``--cohorts``, default
``shifted`` = a new instruction wrapper before the donor's evidence and ``removed_wrapper`` = the
wrapper left out), each decided by the default policy with shifted spans turned on and nothing
planned (``semgov calibrate``'s trial policy; a deny is skipped and counted), the
recipient is prefilled cold and then warm once per ``--methods`` entry (names:
:mod:`engine_hooks.reference.realize`: ``none``, ``leading:P%``, ``boundary:N``, ``trailing:N``,
``bookend:H+T``, ``selective:P%``), and each greedy answer (``--max-new-tokens``, stopping at the
end of turn) is compared with cold's:

- **changed answer**: the answer's tokens differ from cold's at all;
- **changed required value**: cold's answer stated the value the question asks for (a number the
  evidence states once) and the warm one does not (``lost``); ``gained`` counts the reverse;
- two floors, in the same run: **cold/cold** (the first ``--floor-pairs`` pairs prefilled cold
  twice: the reference engine is deterministic, so any difference voids the run's figures and is
  reported) and **benign rounding** (every pair prefilled cold once more on another kernel grid,
  256 instead of 128 positions: the same arithmetic in another order, what a serving engine's
  batching does between two runs of one prompt).

Rates carry their 95% Wilson interval. Compute is the share of prompt positions the model ran
(cold = 1) and speed the pair's cold prefill time over its warm one (median), its own baseline in
the same run. Rows go to ``OUT/pairs.jsonl`` as they complete (``--resume`` continues a cut-short
run), the summary to ``OUT/summary.json`` and the terminal.

Usage: ``python benchmarks/realization_quality.py --model qwen2.5-coder-0.5b --pairs 40 --tokens
2000 --out /tmp/rq-q05`` (about 55 s per pair with eight methods on 2 cores; the 1.5B about 3x).

``--smoke``: the tiny random two-layer Llama (``--model tiny``), one pair per cohort of 400 tokens,
three methods, 4 answer tokens, one thread, no warm-up, decided without the PII scan (Presidio's
load alone takes about 10 s): the whole run, ``summary.json`` included, in seconds, but a random
model's answers say nothing about quality.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import NoPii  # noqa: E402
from semgov.stats import wilson  # noqa: E402

DEFAULT_METHODS = (
    "none,leading:20%,boundary:16,selective:20%,trailing:64,trailing:128,trailing:256,bookend:16+256"
)
BENIGN_CHUNK = 256


def _interval(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{100 * lo:.0f}-{100 * hi:.0f}%]"


def _pair_row(ctx: Any, pair: Any, methods: list[Any], floor: bool) -> dict[str, Any] | None:
    """Cold, the floors and every method on one pair; None when the policy denies it."""
    from engine_hooks.reference import materialize as mz
    from engine_hooks.reference import realize
    from engine_hooks.reference.bench import first_divergence, kl_divergence
    from engine_hooks.reference.bench_workload import value_present

    lm, bench, trial = ctx
    ids = pair.recipient.token_ids
    trial.register_donor(pair.request.candidates[0].prompt)
    record = trial.evaluate(pair.request)[0].record
    if record["decision"] != "allow" or not any(s["kind"] == "shifted" for s in record["approved_spans"]):
        return None
    donor = mz.donor_kv(lm, pair.donor.token_ids)
    cold = mz.cold_prefill(lm, ids)
    cold_ids = bench.answer(cold)
    cold_text = bench.decode(cold_ids)
    want = pair.required
    stated = [v for v in want if value_present(v, cold_text)]

    def score(answer_ids: list[int], logits: Any, seconds: float, computed: int) -> dict[str, Any]:
        text = bench.decode(answer_ids)
        present = [v for v in want if value_present(v, text)]
        return {
            "answer": text,
            "changed": answer_ids != cold_ids,
            "first_divergence": first_divergence(cold_ids, answer_ids),
            "lost": [v for v in stated if v not in present],
            "gained": [v for v in present if v not in stated],
            "kl_first": kl_divergence(cold.logits_last, logits),
            "seconds": seconds,
            "computed_share": computed / len(ids),
        }

    row: dict[str, Any] = {
        "pair": pair.pair_id,
        "cohort": pair.cohort,
        "tokens": len(ids),
        "question": pair.question,
        "required": want,
        "cold": {"answer": cold_text, "states_required": bool(stated), "seconds": cold.seconds},
        "shifted": [
            {k: s[k] for k in ("recipient_start", "donor_start", "length")}
            for s in record["approved_spans"]
            if s["kind"] == "shifted"
        ],
    }
    if floor:
        again = mz.cold_prefill(lm, ids)
        row["cold_cold_identical"] = bool(
            __import__("torch").equal(again.logits_last, cold.logits_last) and bench.answer(again) == cold_ids
        )
    benign = mz.cold_prefill(lm, ids, chunk=BENIGN_CHUNK)
    row["benign"] = score(bench.answer(benign), benign.logits_last, benign.seconds, len(ids))
    row["methods"] = {}
    for how in methods:
        t0 = time.perf_counter()
        warm, ev = realize.realize(lm, ids, donor, record["approved_spans"], how, decision_id=pair.pair_id)
        dt = time.perf_counter() - t0
        row["methods"][how.name] = {
            **score(bench.answer(warm), warm.logits_last, dt, ev.prefilled_tokens),
            "materialized_tokens": ev.materialized_tokens,
            "speed": cold.seconds / dt if dt > 0 else None,
        }
    return row


def summarize(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    """Per method (and the benign floor): n, changed answers, lost and gained required values,
    their intervals, compute share and speed."""
    out: dict[str, Any] = {}
    for name in ["benign", *methods]:
        cells = [r["benign"] if name == "benign" else r["methods"][name] for r in rows]
        n = len(cells)
        stated = sum(1 for r in rows if r["cold"]["states_required"])
        changed = sum(1 for c in cells if c["changed"])
        lost = sum(1 for c in cells if c["lost"])
        speeds = [c["speed"] for c in cells if c.get("speed")]
        out[name] = {
            "n": n,
            "cold_states_required": stated,
            "changed": changed,
            "changed_ci95": wilson(changed, n),
            "lost": lost,
            "lost_ci95": wilson(lost, n),
            "gained": sum(1 for c in cells if c["gained"]),
            "wording_only": sum(1 for c in cells if c["changed"] and not c["lost"] and not c["gained"]),
            "computed_share_median": statistics.median(c["computed_share"] for c in cells) if cells else None,
            "speed_median": statistics.median(speeds) if speeds else None,
            "kl_first_median": statistics.median(c["kl_first"] for c in cells) if cells else None,
        }
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{'realization':<16}{'changed answers':>22}{'lost a value':>20}{'gained':>8}"
        f"{'wording':>9}{'computed':>10}{'speed':>8}"
    ]
    for name, s in summary.items():
        if not s["n"]:
            continue
        speed = "-" if s["speed_median"] is None else f"{s['speed_median']:.1f}x"
        lines.append(
            f"{name:<16}{_interval(s['changed'], s['n']):>22}{_interval(s['lost'], s['n']):>20}"
            f"{s['gained']:>8}{s['wording_only']:>9}{100 * s['computed_share_median']:>9.0f}%{speed:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--pairs", type=int, default=30, help="pairs per cohort")
    ap.add_argument("--tokens", type=int, default=1500, help="recipient prompt length")
    ap.add_argument("--cohorts", default="shifted,removed_wrapper")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--floor-pairs", type=int, default=5, help="pairs whose cold prefill runs twice")
    ap.add_argument("--seed", type=int, default=7, help="workload seed (another seed: other pairs)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true", help="keep OUT/pairs.jsonl's rows and run the rest")
    ap.add_argument("--smoke", action="store_true", help="the tiny random model, one 400-token pair: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.pairs, args.tokens, args.max_new_tokens = "tiny", 1, 400, 4
        args.methods, args.floor_pairs, args.threads = "none,trailing:64,selective:20%", 1, 1

    from engine_hooks.reference import realize
    from engine_hooks.reference.bench import Bench, BenchConfig, _pin_threads, load_model
    from engine_hooks.reference.bench_workload import WorkloadBuilder, evidence_budget
    from engine_hooks.reference.calibrate import trial_policy
    from semgov import Evaluator

    methods = [realize.parse(m) for m in args.methods.split(",")]
    cohorts = tuple(c for c in args.cohorts.split(",") if c)
    _pin_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lm = load_model(args.model, seed=args.seed)
    load_s = time.perf_counter() - t0
    cfg = BenchConfig(
        out=args.out,
        model=args.model,
        cohorts=cohorts,
        pairs_per_cohort=args.pairs,
        tokens=args.tokens,
        threads=args.threads,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    ).resolved()
    bench = Bench(cfg, lm)
    # NOTE: decided with shifted spans on and nothing planned (what calibration tries): the default
    # policy turns them off, and every method plans the same approved spans its own way.
    # NOTE: smoke: no PII scan (NoPii), whose load alone takes about 10 s
    pii = NoPii() if args.smoke else None
    trial = Evaluator(trial_policy(bench.policy), bench.keys.keyring, bench.keys.decision, pii_scanner=pii)
    progress = args.out / "pairs.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if args.resume and progress.exists():
        for line in progress.read_text().splitlines():
            r = json.loads(line)
            done[r["pair"]] = r
    else:
        progress.write_text("")
    builder = WorkloadBuilder(
        bench.tokenize, evidence_budget(bench.tokenize, args.tokens), bench.keys, seed=args.seed
    )
    rows: list[dict[str, Any]] = []
    denied = 0
    try:
        if not args.smoke:  # NOTE: the warm-up loads Presidio
            bench.warm_up(builder.pair(cohorts[0], 0).request)
        for i, pair in enumerate(builder.pairs(args.pairs, cohorts)):
            if pair.pair_id in done:
                rows.append(done[pair.pair_id])
                continue
            row = _pair_row((lm, bench, trial), pair, methods, floor=i < args.floor_pairs)
            if row is None:
                denied += 1
                continue
            rows.append(row)
            with progress.open("a") as f:
                f.write(json.dumps(row) + "\n")
            marks = " ".join(
                f"{k}:{'L' if m['lost'] else ('c' if m['changed'] else '=')}"
                for k, m in row["methods"].items()
            )
            print(
                f"[{i + 1}] {pair.pair_id} {row['tokens']} tok cold {row['cold']['seconds']:.1f}s  {marks}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        bench.close()
    summary = summarize(rows, [m.name for m in methods])
    floor = [r["cold_cold_identical"] for r in rows if "cold_cold_identical" in r]
    cold_s = [r["cold"]["seconds"] for r in rows]
    result = {
        "model": lm.name,
        "dtype": str(lm.dtype).replace("torch.", ""),
        "cohorts": list(cohorts),
        "pairs": len(rows),
        "denied": denied,
        "tokens_median": statistics.median(r["tokens"] for r in rows) if rows else None,
        "cold_cold": {"n": len(floor), "identical": sum(floor)},
        "machine": {
            "cold_prefill_ms_per_token_median": 1e3
            * statistics.median(s / r["tokens"] for s, r in zip(cold_s, rows, strict=True))
            if rows
            else None,
            "threads": args.threads,
            "load_average": os.getloadavg()[0],
            "model_load_s": load_s,
        },
        "methods": summary,
        "wall_s": time.perf_counter() - t0,
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{lm.name}, {result['dtype']}: {len(rows)} allowed pairs ({', '.join(cohorts)}; {denied} denied), "
        f"median {result['tokens_median']} tokens"
    )
    print(
        f"cold/cold: {result['cold_cold']['identical']} of {result['cold_cold']['n']} bit-identical; "
        f"cold answers stating the required value: {summary['benign']['cold_states_required']}"
    )
    print(table(summary))
    print(
        f"machine baseline: cold prefill {result['machine']['cold_prefill_ms_per_token_median']:.2f} "
        "ms/token, "
        f"{args.threads} threads, load average {result['machine']['load_average']:.2f}; "
        f"wall {result['wall_s']:.0f} s"
    )
    return 0 if all(floor) else 1


if __name__ == "__main__":
    sys.exit(main())
