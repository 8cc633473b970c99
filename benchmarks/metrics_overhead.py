"""What the hook's Prometheus metrics cost per decision and per engine event.

Usage: python benchmarks/metrics_overhead.py [--n 20000] [--core 0] [--smoke]

Times :class:`~engine_hooks.core.metrics.HookMetrics` calls as the hook makes them, in two
modes, each in a fresh interpreter: in memory (no ``PROMETHEUS_MULTIPROC_DIR``: SGLang without
``--enable-metrics``) and exported (``PROMETHEUS_MULTIPROC_DIR`` set, as ``--enable-metrics``
does: every write goes to a memory-mapped file). Per call, p50/p99 over ``--n`` calls:

- ``decision``: one live decision record (deny with two failed gates, the costlier case) plus
  the latency histogram, on the decision thread or the decision process's reader thread;
- ``event``: one ``realization`` event, the only metrics work on the scheduler thread;
- a baseline in the same process: a bare Python ``dict`` update per call (the floor for
  "doing anything at all"), and the machine baseline (fsync, Ed25519, SHA-256, load).

``--smoke``: n=200 and quick baselines (both modes, in seconds; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time
from engine_hooks.core.metrics import hook_metrics
n = int(sys.argv[1])
m = hook_metrics()
rec = {"decision": "deny", "policy": {"engine": "yaml"}, "approved_tokens": 0,
       "gates": [{"gate": g, "result": "pass"} for g in ("tenant", "namespace", "provenance", "expiry",
                 "policy_version", "pii", "task", "response_contract")]
              + [{"gate": "similarity", "result": "fail"}, {"gate": "token_verification", "result": "fail"}]}
def timed(f):
    out = []
    for _ in range(n):
        t = time.perf_counter_ns(); f(); out.append(time.perf_counter_ns() - t)
    out.sort()
    return out[n // 2] / 1e3, out[int(n * 0.99)] / 1e3
d = {}
def floor(): d["x"] = d.get("x", 0) + 1
def decision(): m.decision(rec); m.latency.observe(0.0012)
def event(): m.event("realization", 512, "")
for f in (floor, decision, event): timed(f)  # warm-up
print(json.dumps({"exported": m.exported, "floor": timed(floor), "decision": timed(decision),
                  "event": timed(event)}))
"""


def run(n: int, multiproc: Path | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    if multiproc is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True, check=True, cwd=ROOT
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    from benchmarks._machine import baseline

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="calls per figure (default 20000)")
    ap.add_argument("--core", type=int, default=None, help="pin to this core (children inherit it)")
    ap.add_argument("--smoke", action="store_true", help="n=200: both modes, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.n = 200
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    with tempfile.TemporaryDirectory(prefix="semgov-prom-", dir=ROOT) as tmp:
        print(baseline(Path(tmp), quick=args.smoke))
        print(f"n={args.n} calls per figure, p50 / p99 in us")
        for label, mp in (("in memory", None), ("exported (multiprocess files)", Path(tmp))):
            r = run(args.n, mp)
            fl, de, ev = r["floor"], r["decision"], r["event"]
            print(
                f"{label:<30} floor {fl[0]:.2f} / {fl[1]:.2f}   decision {de[0]:.2f} / {de[1]:.2f}"  # type: ignore[index]
                f"   event {ev[0]:.2f} / {ev[1]:.2f}"  # type: ignore[index]
            )
        print(baseline(Path(tmp), quick=args.smoke))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
