#!/usr/bin/env bash
# The prepared GPU check of both engines (benchmarks/gpu_check.py): real SGLang and vLLM servers
# with real weights, the paired cohorts and the seed's shape, one table, one exit status.
#
#   bash benchmarks/gpu_check.sh                       # on a GPU: both engines, within 8 minutes
#   bash benchmarks/gpu_check.sh --engines vllm        # one engine (a short GPU window)
#   bash benchmarks/gpu_check.sh --device cpu --small  # the CPU rehearsal CI runs
#   bash benchmarks/gpu_check.sh --help
#
# Runs from a checkout with semgov installed in the current environment (SGLang for the sglang
# piece; the vLLM environment at .venv-vllm or SEMGOV_VLLM_PYTHON for the vllm piece):
# docs/sglang.md and docs/vllm.md, "GPU install". PYTHON selects the interpreter (default: python).
# Exit status: 0 OK; 1 a server died, an invariant was violated or anything crossed a tenant
# boundary; 2 a piece could not run or ran out of time; 3 the invariants held but nothing was realized.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
