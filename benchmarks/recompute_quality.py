"""What recompute buys: answer regressions of shifted reuse vs the share recomputed, leading vs selective.

For ``--pairs`` pairs of one ``semgov bench`` cohort (default ``shifted``: another instruction template
before the same evidence), decided by the default policy, the recipient is prefilled cold and then
warm at each ``--percents`` value, two ways: *leading* (each shifted span's first tokens computed,
what every engine does: ``materialize.warm_prefill``) and *selective* (the same number of tokens,
the most deviating ones: ``blend.blend_prefill``). Greedy answers (``--max-new-tokens``) are compared
with cold: a pair *diverged* when the answer differs at all (cold reruns are bit-identical on CPU),
and *lost* a value when the cold answer stated a required value the warm one does not. Speed is
cold TTFT / warm TTFT of the same pair in the same run (its own baseline), median over pairs.

Usage: ``python benchmarks/recompute_quality.py [--pairs 30] [--percents 5,10,20,30] [--tokens 450]``
(SmolLM2-135M-Instruct, one torch thread; about 35 s per pair on a 2-core CI-class machine).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from semgov.stats import wilson  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--percents", default="5,10,20,30")
    ap.add_argument("--tokens", type=int, default=450)
    ap.add_argument("--cohort", default="shifted")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    import tempfile

    from engine_hooks.reference import blend
    from engine_hooks.reference import materialize as mz
    from engine_hooks.reference.bench import Bench, BenchConfig, _pin_threads, first_divergence, load_model
    from engine_hooks.reference.bench_workload import WorkloadBuilder, evidence_budget, value_present

    _pin_threads(1)
    pcts = [int(x) for x in args.percents.split(",")]
    lm = load_model("smollm2")
    cfg = BenchConfig(
        out=Path(tempfile.mkdtemp(prefix="semgov-recompute-")),
        cohorts=(args.cohort,),
        pairs_per_cohort=args.pairs,
        tokens=args.tokens,
        threads=1,
        max_new_tokens=args.max_new_tokens,
    ).resolved()
    bench = Bench(cfg, lm)
    builder = WorkloadBuilder(
        bench.tokenize, evidence_budget(bench.tokenize, args.tokens), bench.keys, seed=cfg.seed
    )
    stats: dict[str, dict[str, Any]] = {}
    stated = 0
    try:
        for pair in builder.pairs(args.pairs, cfg.cohorts):
            ids = pair.recipient.token_ids
            donor = mz.donor_kv(lm, pair.donor.token_ids)
            bench.register_donor(pair.request)
            rec = bench.evaluator.evaluate(pair.request)[0].record
            if rec["decision"] != "allow":
                continue
            cold = mz.cold_prefill(lm, ids)
            answer = bench.answer(cold)
            want = [v for v in pair.required if value_present(v, bench.decode(answer))]
            stated += bool(want)
            for p in pcts:
                spans = [
                    {
                        **s,
                        "recompute": min(s["length"], math.ceil(p * s["length"] / 100))
                        if s["kind"] == "shifted"
                        else 0,
                    }
                    for s in rec["approved_spans"]
                ]
                for name, run in (("leading", mz.warm_prefill), ("selective", blend.blend_prefill)):
                    t0 = time.perf_counter()
                    warm, _ = run(lm, ids, donor, spans, decision_id="q")
                    dt = time.perf_counter() - t0
                    got = bench.answer(warm)
                    st = stats.setdefault(f"{name} {p}%", {"n": 0, "diverged": 0, "lost": 0, "speed": []})
                    st["n"] += 1
                    st["diverged"] += first_divergence(answer, got) is not None
                    st["lost"] += any(not value_present(v, bench.decode(got)) for v in want)
                    st["speed"].append(cold.seconds / dt)
    finally:
        bench.close()
    n = next(iter(stats.values()))["n"] if stats else 0
    print(f"{args.cohort} pairs allowed: {n}; cold answers stating a required value: {stated}")
    print(f"{'realization':<16}{'diverged [95% interval]':>26}{'lost a value':>14}{'speed p50':>11}")
    for k, st in stats.items():
        lo, hi = wilson(st["diverged"], st["n"])
        sp = sorted(st["speed"])
        cell = f"{st['diverged']}/{st['n']} [{100 * lo:.0f}-{100 * hi:.0f}%]"
        print(f"{k:<16}{cell:>26}{st['lost']:>14}{sp[len(sp) // 2]:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
