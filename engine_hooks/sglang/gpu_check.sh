#!/usr/bin/env bash
# GPU check of the semgov SGLang hook (docs/sglang.md, "GPU check").
#
# Needs one NVIDIA GPU and an environment where `pip install -e '.[sglang]'` was run from this
# checkout (full SGLang 0.5.23 with CUDA; the install registers the `sglang.srt.plugins` entry
# point that makes `--radix-cache-backend semgov` exist). It downloads nothing: the model is a
# config only (engine_hooks/sglang/gpu_model: SmolLM2-135M's architecture, --load-format dummy
# weights, --skip-tokenizer-init so no tokenizer is needed and prompts are token ids).
#
#   1. makes fresh keys, a keyring trusting them, a gateway context key and an audit dir;
#   2. checks the replay plan on the CPU (`gpu_replay.py --dry-run`, with these very settings);
#   3. launches SGLang with the semgov backend and SGLang's strict KV-pool checks on;
#   4. replays paired cold/warm cohorts over HTTP (engine_hooks/sglang/gpu_replay.py);
#   5. stops the server, verifies the audit log (`semgov audit verify`) and prints
#      `invariant status: OK (...)` or `invariant status: VIOLATED (...)`.
#
# Exit status: 0 OK; 1 invariant violated (violation event, forbidden realization, failed
# request, server died, leak check fired, audit log does not verify); 2 could not run (no GPU,
# SGLang or plugin missing, dry run failed, server did not start); 3 invariants held but no
# allowed pair was realized (reuse not exercised).
#
# Knobs (environment): PYTHON (default python), GPU_CHECK_PORT (30517), GPU_CHECK_SEEDS (pairs
# per cohort, 6), GPU_CHECK_HEALTH_TIMEOUT (s, 360), GPU_CHECK_REPLAY_TIMEOUT (s, 240),
# GPU_CHECK_SERVER_ARGS (extra launch_server flags), GPU_CHECK_OUT (a directory to copy the
# results, server log and audit log into), GPU_CHECK_KEEP=1 (keep the scratch dir on success).
# Budget on an H200: server start 1-3 min, replay under 1 min, audit settle and verify < 1 min.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
PORT="${GPU_CHECK_PORT:-30517}"
SEEDS="${GPU_CHECK_SEEDS:-6}"
HEALTH_TIMEOUT="${GPU_CHECK_HEALTH_TIMEOUT:-360}"
REPLAY_TIMEOUT="${GPU_CHECK_REPLAY_TIMEOUT:-240}"
OUT_DIR="${GPU_CHECK_OUT:-}"
MODEL="$ROOT/engine_hooks/sglang/gpu_model"

WORK="$(mktemp -d -t semgov-gpu-check.XXXXXX)"
LOG="$WORK/server.log"
SERVER_PID=""
STATUS_PRINTED=0
FINAL_RC=2

log() { printf '[gpu_check %(%H:%M:%S)T] %s\n' -1 "$*"; }

server_alive() { [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; }

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    if server_alive; then
        log "stopping the server (process group $SERVER_PID)"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do
            server_alive || break
            sleep 1
        done
    fi
    # Whatever is left of the group (scheduler, detokenizer), even if the launcher already died.
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

log_tail() {
    if [[ -s "$LOG" ]]; then
        echo "----- server log (last 80 lines of $LOG) -----"
        tail -n 80 "$LOG"
        echo "----- end of server log -----"
    fi
}

finish() {
    # $1 = exit code, $2 = status (OK/VIOLATED), $3 = reason
    FINAL_RC="$1"
    echo "invariant status: $2 ($3)"
    STATUS_PRINTED=1
    exit "$1"
}

cleanup() {
    local rc=$?
    set +e
    stop_server
    if [[ "$STATUS_PRINTED" -eq 0 ]]; then
        log_tail
        echo "invariant status: VIOLATED (the check stopped early, exit $rc; nothing was concluded)"
        [[ "$rc" -eq 0 ]] && rc=2
    elif [[ "$FINAL_RC" -ne 0 ]]; then
        log_tail
    fi
    if [[ -n "$OUT_DIR" ]]; then
        mkdir -p "$OUT_DIR"
        cp -f "$LOG" "$WORK/results.json" "$WORK/audit-stats.txt" "$OUT_DIR/" 2>/dev/null
        [[ -d "$WORK/audit" ]] && cp -rf "$WORK/audit" "$OUT_DIR/audit" 2>/dev/null
        log "copied the server log, results and audit log to $OUT_DIR"
    fi
    if [[ -z "$(ls -A "$WORK" 2>/dev/null)" ]]; then
        rmdir "$WORK" 2>/dev/null
    elif [[ "$rc" -eq 0 && "${GPU_CHECK_KEEP:-0}" != "1" ]]; then
        rm -rf "$WORK"
    else
        log "scratch dir kept: $WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- preflight --------------------------------------------------------------------------------

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
"$PY" - <<'EOF' || finish 2 VIOLATED "not checked: no usable CUDA torch / SGLang 0.5.23 / semgov plugin (run pip install -e '.[sglang]')"
import sys
from importlib.metadata import entry_points
from pathlib import Path

import torch

if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
import sglang

if sglang.__version__ != "0.5.23":
    sys.exit(f"sglang {sglang.__version__}: the hook is written against SGLang 0.5.23")
eps = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "semgov"]
if not eps or eps[0].value != "engine_hooks.sglang.plugin:register":
    sys.exit("the semgov entry point (group sglang.srt.plugins) is not installed")
import engine_hooks.sglang.plugin as plugin

here = Path.cwd().resolve()
if not Path(plugin.__file__).resolve().is_relative_to(here):
    sys.exit(f"engine_hooks is imported from {plugin.__file__}, not from this checkout ({here})")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; sglang {sglang.__version__}; plugin {eps[0].value}")
EOF
if "$PY" - "$PORT" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
then
    finish 2 VIOLATED "not checked: port $PORT is in use (set GPU_CHECK_PORT)"
fi

# ---- keys, keyring, context key, audit dir ---------------------------------------------------

log "scratch dir $WORK"
"$PY" -m semgov.cli.main keys generate --out "$WORK/keys" >/dev/null
"$PY" - "$WORK" <<'EOF'
import json, os, secrets, sys
from pathlib import Path

from semgov.keys import key_id_for, load_public_key

work = Path(sys.argv[1])
pub = work / "keys" / "signing-key.pub.pem"
kid = key_id_for(load_public_key(pub))
(work / "keyring.json").write_text(json.dumps({"keys": [{"key_id": kid, "public_key": pub.read_text()}]}))
# The gateway HMAC key (>= 32 bytes; 64 hex characters here), readable by the server only.
fd = os.open(work / "context.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, secrets.token_hex(32).encode())
os.close(fd)
print(f"hook key {kid}")
EOF
mkdir -p "$WORK/audit"

# Every SEMGOV_* setting (engine_hooks/sglang/settings.py), explicitly.
# Test policy: policies/default without the PII scan. With --skip-tokenizer-init and
# SEMGOV_DETOKENIZER=none donors have no text and are registered unscanned, and the default
# policy (pii.require_scan) would deny every one of them (see the policy file's header).
export SEMGOV_POLICY="$MODEL/policy"
export SEMGOV_TRUST="$WORK/keyring.json"
export SEMGOV_SIGNING_KEY="$WORK/keys/signing-key.pem"
export SEMGOV_CONTEXT_KEY="$WORK/context.key"
export SEMGOV_AUDIT_DIR="$WORK/audit"
export SEMGOV_ENGINE=yaml
# MinHash that proposes every same-scope donor, so the unrelated cohort reaches the policy's deny.
export SEMGOV_PROVIDER=engine_hooks.sglang.gpu_replay:permissive_minhash
export SEMGOV_MIN_UNMATCHED_TOKENS=256
export SEMGOV_MAX_CANDIDATES=4
export SEMGOV_DONOR_TTL_S=3600
export SEMGOV_MAX_DONORS_PER_SCOPE=1024
export SEMGOV_DETOKENIZER=none
export SEMGOV_STRICT=1             # an invariant violation raises in the scheduler: the server dies
export SEMGOV_ASYNC_REGISTRATION=1 # as in production: donors registered off the scheduler thread

# SGLang's own strict KV-pool checks (sglang/srt/environ.py):
# - after every batch, assert available + evictable + protected + session_held + uncached == total
#   (scheduler.py event loops -> invariant_checker.self_check_during_busy; 1 = quiet, assert);
export SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1
# - also in the busy check: no KV slot both owned by a request row and free, no double free;
export SGLANG_CHECK_KV_PAGE_INVARIANTS=1
# - when idle: the same pool identity and the req_to_token pool, raised as ValueError (not just
#   logged) through utils/common.py raise_error_or_warn (the default is already on; pinned here).
export SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1

# ---- the plan, on the CPU, with these settings -------------------------------------------------

log "dry run of the replay plan (CPU, no server)"
"$PY" -m engine_hooks.sglang.gpu_replay --dry-run --seeds "$SEEDS" \
    || finish 2 VIOLATED "not checked: the replay plan's dry run failed"

# ---- the server ---------------------------------------------------------------------------------

# --disable-prefill-cuda-graph and a small decode graph keep the start short (prefill runs eager
# in both arms alike); add or override flags with GPU_CHECK_SERVER_ARGS.
# shellcheck disable=SC2206
EXTRA=(${GPU_CHECK_SERVER_ARGS:-})
log "launching SGLang (log: $LOG)"
# Job control on for this one launch: the server gets a process group of its own (pgid = its
# pid), so stop_server can end it with its scheduler and detokenizer processes, and nothing else.
set -m
"$PY" -m sglang.launch_server \
    --model-path "$MODEL" \
    --load-format dummy \
    --skip-tokenizer-init \
    --radix-cache-backend semgov \
    --page-size 1 \
    --tp-size 1 \
    --dtype bfloat16 \
    --kv-cache-dtype auto \
    --mem-fraction-static 0.3 \
    --max-running-requests 8 \
    --cuda-graph-max-bs-decode 8 \
    --disable-prefill-cuda-graph \
    --random-seed 0 \
    --host 127.0.0.1 \
    --port "$PORT" \
    --log-level info \
    ${EXTRA[@]+"${EXTRA[@]}"} >"$LOG" 2>&1 &
SERVER_PID=$!
set +m
LAUNCHED=$SECONDS

deadline=$((SECONDS + HEALTH_TIMEOUT))
until "$PY" - "$PORT" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=10) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
do
    if ! server_alive; then
        finish 2 VIOLATED "not checked: the server exited during start-up (a refused configuration is named in its log)"
    fi
    if ((SECONDS > deadline)); then
        finish 2 VIOLATED "not checked: /health not ready after ${HEALTH_TIMEOUT}s"
    fi
    sleep 3
done
log "server ready after $((SECONDS - LAUNCHED))s"
if ! grep -q "Executed general plugin: semgov" "$LOG"; then
    log "note: the log does not show the semgov plugin running (it logs at info level)"
fi

# ---- the replay -----------------------------------------------------------------------------------

set +e
timeout "$REPLAY_TIMEOUT" "$PY" -m engine_hooks.sglang.gpu_replay \
    --port "$PORT" --seeds "$SEEDS" --out "$WORK/results.json"
REPLAY_RC=$?
set -e
log "replay exit status $REPLAY_RC"

ALIVE=1
server_alive || ALIVE=0
LEAKS="$(grep -E -c 'Mem Leak Detected|memory leak detected|KV page use-after-free|KV double free|semgov invariant violation|InvariantViolation|Scheduler hit an exception' "$LOG" || true)"
stop_server

# ---- the audit log ------------------------------------------------------------------------------------

set +e
"$PY" -m semgov.cli.main audit verify "$WORK/audit" --pubkey "$WORK/keys/signing-key.pub.pem"
VERIFY_RC=$?
"$PY" -m semgov.cli.main audit stats "$WORK/audit" >"$WORK/audit-stats.txt" 2>&1
cat "$WORK/audit-stats.txt"
set -e

# ---- verdict -------------------------------------------------------------------------------------------

reasons=()
((ALIVE)) || reasons+=("the server died")
((LEAKS == 0)) || reasons+=("$LEAKS leak/violation/crash line(s) in the server log")
((VERIFY_RC == 0)) || reasons+=("semgov audit verify failed (exit $VERIFY_RC)")
case "$REPLAY_RC" in
    0 | 3) ;;
    124) reasons+=("the replay timed out after ${REPLAY_TIMEOUT}s") ;;
    1) reasons+=("the replay found invariant problems (listed above)") ;;
    *) reasons+=("the replay failed (exit $REPLAY_RC)") ;;
esac
if ((${#reasons[@]})); then
    msg="$(printf '%s; ' "${reasons[@]}")"
    finish 1 VIOLATED "${msg%; }"
fi
SUMMARY="$("$PY" - "$WORK/results.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["cohort"]: r for r in d["rows"]}
a, ev = rows["allowed"], d["audit"]["events"]
ratio = a["warm_over_cold_median"]
print(
    f"allowed realized {a['warm_realized']}/{a['pairs']}, warm/cold TTFT {ratio:.2f}" if ratio is not None
    else f"allowed realized {a['warm_realized']}/{a['pairs']}",
    end="",
)
print(
    f"; other-tenant realized {rows['other_tenant']['warm_realized']}/{rows['other_tenant']['pairs']}"
    f"; decisions {d['audit']['decisions']}; realization events {ev.get('realization', 0)}"
    f", failed {ev.get('realization_failed', 0)}, violations 0; audit log verifies"
)
EOF
)"
if ((REPLAY_RC == 3)); then
    finish 3 OK "$SUMMARY; but no allowed pair was realized: reuse NOT exercised"
fi
finish 0 OK "$SUMMARY"
