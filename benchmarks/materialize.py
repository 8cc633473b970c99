"""KV materialization on the real model (SmolLM2-135M-Instruct, float32, CPU reference engine).

Usage: python benchmarks/materialize.py [--repeat 3] [--sizes 1024 2048] [--evidence 1500] [--shift 200]
       [--wrapper instructions|filings|both] [--model M] [--smoke]

1. TTFT, cold prefill vs prefix-warm (the donor is the same prompt: copy its KV, compute the
   rest) at each size, min of ``--repeat`` runs. Prefix spans are copied in whole
   ``PREFILL_CHUNK_TOKENS`` chunks and the chunk holding the last position is always
   computed, so two lengths per size: ``N + 1`` (the last chunk is the last token alone: "copy
   all but last, compute last") and ``N`` (a full last chunk computed: the worst case). Also
   a monolithic cold prefill (one model run, no chunk grid) to show what the grid costs.
2. Shifted reuse: donor [A][D][Q1], recipient [B][D][Q2] with D a ``--evidence``-token block of
   filings and B ``--shift`` tokens longer than A: B either more instructions (D only moves) or
   other filings (D also sits in another context). KL(cold || warm) per position over the cold
   greedy answer (teacher-forced), top-1 agreement, first-token KL, greedy answer equal to
   cold, TTFT: keys not re-rotated vs re-rotated, with and without recomputing a leading share.

Pinned to one core and one torch thread. The model is converted from its GGUF on first use
(about a minute) and cached (``$SEMGOV_MODEL_CACHE``).

``--smoke``: the tiny random two-layer Llama (``--model tiny``: SmolLM2's tokenizer, no real
weights), 256 tokens, 200 evidence tokens moved by 40, one run: every table in seconds, but its
KL, top-1 and answers say nothing about a real model.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache

from engine_hooks.reference import materialize as mz
from engine_hooks.reference.model import MODEL_CHOICES, LoadedModel, load_model
from engine_hooks.reference.workload import common_prefix

COMPANIES = ["Northwind Traders", "Contoso Ltd", "Fabrikam Inc", "Tailspin Toys", "Litware Corp", "Adatum"]
GUIDE = (
    "Follow the house style: cite the quarter and the company for every figure, round to whole millions, "
    "never speculate beyond the documents, and flag any figure that looks inconsistent. "
)
SYSTEM = (
    "<|im_start|>system\nYou are a careful financial analyst. Answer from the documents only.<|im_end|>\n"
)


def filings(tokens: int, lm: LoadedModel, seed: int) -> list[int]:
    """Deterministic filing prose, cut to ``tokens`` tokens."""
    r = random.Random(seed)
    ids: list[int] = []
    while len(ids) < tokens:
        c, q, y = (
            r.choice(COMPANIES),
            r.choice(["first", "second", "third", "fourth"]),
            2017 + r.randint(0, 7),
        )
        para = (
            f"In the {q} quarter of {y}, {c} reported revenue of {r.randint(100, 999)} million dollars, up "
            f"{r.randint(1, 30)} percent from a year earlier, while operating costs rose "
            f"{r.randint(1, 20)} percent to {r.randint(50, 600)} million. Net income was "
            f"{r.randint(5, 120)} million and the board declared a dividend of {r.randint(5, 90)} cents "
            "per share. "
        )
        ids += lm.tokenizer(para, add_special_tokens=False)["input_ids"]
    return ids[:tokens]


def enc(lm: LoadedModel, text: str) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(min seconds, last result) over ``repeat`` runs."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def monolithic_cold(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """One model run over the whole prompt (no chunk grid)."""
    with torch.no_grad():
        out = lm.model(
            input_ids=torch.tensor([ids]),
            past_key_values=DynamicCache(config=lm.model.config),
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits[0, -1]


def ttft(lm: LoadedModel, sizes: list[int], repeat: int) -> None:
    c = mz.PREFILL_CHUNK_TOKENS
    print(f"\n## TTFT: cold vs prefix-warm (1 thread, min of {repeat}; chunk grid {c})\n")
    print(
        f"{'tokens':>6} {'computed warm':>13} {'cold mono s':>11} {'cold s':>7} {'warm s':>7} "
        f"{'ratio':>6} bitwise"
    )
    for n in sizes:
        for length in (n + 1, n):
            ids = filings(length, lm, seed=length)
            donor = mz.donor_kv(lm, ids)
            span = [{"recipient_start": 0, "donor_start": 0, "length": length, "kind": "prefix"}]
            t_mono, _ = best(partial(monolithic_cold, lm, ids), repeat)
            t_cold, cold = best(partial(mz.cold_prefill, lm, ids), repeat)
            t_warm, (warm, ev) = best(
                partial(mz.warm_prefill, lm, ids, donor, span, decision_id="bench"), repeat
            )
            same = torch.equal(cold.logits_last, warm.logits_last)
            print(
                f"{length:>6} {ev.prefilled_tokens:>13} {t_mono:>11.3f} {t_cold:>7.3f} {t_warm:>7.3f} "
                f"{t_cold / t_warm:>5.1f}x {same}"
            )


def shifted(lm: LoadedModel, evidence: int, shift: int, wrapper: str, repeat: int) -> None:
    a = enc(lm, SYSTEM + "<|im_start|>user\nHere are the filings you asked about:\n\n")
    if wrapper == "instructions":  # a longer instruction wrapper: D only moves
        lead = enc(lm, SYSTEM + "<|im_start|>user\n")
        guide = enc(lm, GUIDE)
        b = lead + (guide * (shift // len(guide) + 2))[: shift + len(a) - len(lead)] + enc(lm, "\n\n")
    else:  # other filings lead the recipient: D also sits in another context
        b = enc(lm, SYSTEM + "<|im_start|>user\nBackground notes from the archive:\n\n")
        b += filings(shift + len(a) - len(b), lm, seed=99) + enc(lm, "\n\n")
    d = filings(evidence, lm, seed=7)
    q1 = enc(lm, "\n\nWhat was Contoso's revenue?<|im_end|>\n<|im_start|>assistant\n")
    q2 = enc(
        lm, "\n\nSummarize how operating costs changed for each company.<|im_end|>\n<|im_start|>assistant\n"
    )
    donor_ids, ids = a + d + q1, b + d + q2
    common = common_prefix(a, b)
    donor = mz.donor_kv(lm, donor_ids)
    t_cold, cold = best(partial(mz.cold_prefill, lm, ids), repeat)
    answer = mz.greedy(lm, cold, 48)
    ref = mz.teacher_forced_logits(lm, cold, answer)
    spans = [
        {"recipient_start": 0, "donor_start": 0, "length": common, "kind": "prefix"},
        {"recipient_start": len(b), "donor_start": len(a), "length": len(d), "kind": "shifted"},
    ]
    print(
        f"\n## Shifted reuse, new wrapper of {wrapper}: donor {len(donor_ids)} tokens, recipient {len(ids)} "
        f"tokens, D = {len(d)} tokens moved by {len(b) - len(a)} positions (KL over the first token and "
        f"{len(answer)} teacher-forced answer tokens; 1 thread, TTFT min of {repeat}; cold {t_cold:.3f} s)\n"
    )
    print(
        f"{'variant':<36} {'mean KL':>8} {'max KL':>7} {'top-1':>6} {'KL tok1':>8} {'greedy=cold':>11} "
        f"{'copied':>6} {'computed':>8} {'warm s':>7} {'ratio':>6}"
    )
    variants = [
        ("no re-rotation, no recompute", 0.0, 0, False),
        ("re-rotated, no recompute", 0.0, 0, True),
        ("no re-rotation, recompute 5% (>=16)", 0.05, 16, False),
        ("re-rotated, recompute 5% (>=16)", 0.05, 16, True),
        ("re-rotated, recompute 15% (>=16)", 0.15, 16, True),
        ("re-rotated, recompute 100%", 1.0, 0, True),
    ]
    for label, share, least, rotate in variants:

        def run(share: float = share, least: int = least, rotate: bool = rotate) -> Any:
            return mz._warm_prefill(
                lm,
                ids,
                donor,
                spans,
                decision_id="bench",
                recompute_share=share,
                min_recompute=least,
                on_event=None,
                rerotate=rotate,
            )

        t_warm, (warm, ev) = best(run, repeat)
        kl, top1, kl_max = mz.compare_logits(ref, mz.teacher_forced_logits(lm, warm, answer))
        kl1 = mz.compare_logits(ref[0], warm.logits_last)[0]
        same = mz.greedy(lm, warm, len(answer)) == answer
        print(
            f"{label:<36} {kl:>8.5f} {kl_max:>7.4f} {top1:>6.3f} {kl1:>8.5f} {str(same):>11} "
            f"{ev.materialized_tokens:>6} {ev.prefilled_tokens:>8} {t_warm:>7.3f} {t_cold / t_warm:>5.1f}x"
        )
    print(f"\ncold answer ({len(answer)} tokens): {lm.tokenizer.decode(answer)!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--evidence", type=int, default=1500)
    ap.add_argument("--shift", type=int, default=200)
    ap.add_argument("--wrapper", choices=["instructions", "filings", "both"], default="both")
    ap.add_argument("--model", choices=MODEL_CHOICES, default="smollm2-135m", help="docs/models.md")
    ap.add_argument("--smoke", action="store_true", help="the tiny random model, 256 tokens: seconds")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.sizes, args.evidence, args.shift, args.repeat = "tiny", [256], 200, 40, 1
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lm = load_model(args.model)
    print(f"# {lm.name}, loaded in {time.perf_counter() - t0:.1f} s; torch {torch.__version__}, 1 thread")
    ttft(lm, args.sizes, args.repeat)
    for wrapper in ("instructions", "filings") if args.wrapper == "both" else (args.wrapper,):
        shifted(lm, args.evidence, args.shift, wrapper, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
