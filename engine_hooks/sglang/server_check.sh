#!/usr/bin/env bash
# Server check of the semgov SGLang backend: real SGLang servers, on the CPU or on a GPU.
#
#   engine_hooks/sglang/server_check.sh [--engine sglang] [--device cpu|cuda] [--model tiny|smollm2-arch|REAL]
#                                       [--pairs N] [--e-len N] [--seed-tokens N] [--scenarios a,b]
#                                       [--servers a,b] [--out DIR] [--keep]
#   engine_hooks/sglang/server_check.sh --engine vllm [--device cpu|cuda] [--model tiny|REAL] [--pairs N]
#                                       [--e-len N] [--seed-tokens N] [--eager] [--out DIR] [--keep]
#   (REAL: smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b with real weights: docs/models.md)
#   Both engines in one step, one table, on a GPU: benchmarks/gpu_check.sh.
#
# --engine vllm runs the same paired cohorts in two real vLLM 0.32 servers (stock prefix cache,
# and with semgov's connector; tests/vllm/check.py), in vLLM's own environment (.venv-vllm or
# SEMGOV_VLLM_PYTHON; this script's python only drives them), and prints TTFT per cohort: cold,
# stock, semgov. The SGLang check prints the same three columns (a stock SGLang server runs the
# cohorts too).
#
# From a checkout, in an environment where semgov is installed (`pip install -e .`, which
# registers the `semgov` SGLang plugin) with SGLang 0.5.23: on a GPU machine `pip install -e
# '.[sglang]'`; on a CPU machine the CPU install of README.md / docs/sglang.md. Nothing is
# downloaded: the models are configs with dummy weights, or a real model from its registry
# packages (prompts are token ids either way).
#
# It starts one SGLang server per configuration (page size 1 with overlap scheduling, page size
# 16 without it, SGLang's retraction test mode, a pool too small for its traffic; chunked
# prefill below the prompt length in all), each with --radix-cache-backend semgov, SGLang's
# strict KV-pool checks and SEMGOV_STRICT=1, in a process group of its own; runs the scenarios
# (paired cohorts, 40 requests in flight, client aborts, /flush_cache under load, client rid
# collisions, hostile extra_key values, retraction, eviction of donors between decision and
# admission); verifies every audit log with `semgov audit verify`; and prints the scenario
# table, TTFT per cohort, realized tokens, decisions and, last:
#
#   invariant status: OK (...)   or   invariant status: VIOLATED (...)
#
# Exit status: 0 OK; 1 violated; 2 could not run; 3 invariants held but no reuse happened.
# On CPU it takes about 5 minutes on 2 cores (the same scenarios run in CI under pytest,
# tests/sglang_server). PYTHON selects the interpreter (default: python).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
engine=sglang
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:-}"; shift 2 || { echo "--engine needs sglang or vllm" >&2; exit 2; } ;;
    --engine=*) engine="${1#--engine=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$engine" in
  sglang) exec "${PYTHON:-python}" -m tests.sglang_server.check "${args[@]+"${args[@]}"}" ;;
  vllm) exec "${PYTHON:-python}" -m tests.vllm.check "${args[@]+"${args[@]}"}" ;;
  *) echo "--engine $engine: expected sglang or vllm" >&2; exit 2 ;;
esac
