"""First-decision latency after start-up, with and without the decision path's warm-up (issue 32).

Usage: python benchmarks/first_decision.py [--n 6] [--process 1] [--json out.json] [--smoke]

Each trial is a fresh Python process (the costs measured are per process: lazy imports, the PII
scanner's models, the policy engine's first evaluation, the first signatures), alternating
``SEMGOV_WARMUP=0`` and ``1``. A trial builds a :class:`~engine_hooks.core.governor.Governor` as a
server does (the real-server rigs' policy, which allows these pairs, or ``--policy DIR`` such as
``policies/default``; the default ``minhash`` provider, donor text
from a detokenizer so the PII scan runs, the decision process unless ``--process 0``, the default
``SEMGOV_DECISION_TIMEOUT_MS`` of 100 ms), waits until the start-up work queued on the decision
path is done (``wait_idle``: with the warm-up, the warm-up), registers one donor, then times one
recipient from ``decide_later`` to ``done`` (polled every 0.1 ms, as the scheduler polls it), then a
second recipient (the steady state). Prints per arm the median, min and max of each, and how many
first decisions took longer than the 100 ms deadline (the engine then runs the request cold).
``--smoke``: one trial per arm (two fresh processes, seconds; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _trial(warm: bool, process: bool, policy: str) -> dict[str, Any]:
    """One fresh process's numbers (runs in the child)."""
    sys.path.insert(0, str(ROOT))
    from engine_hooks.core.donors import DonorSpec
    from engine_hooks.core.governor import Governor
    from engine_hooks.core.settings import HookSettings
    from tests.sglang_server.rig import CONTEXT_SECRET, RIG_POLICY, Gateway, HookFiles, pair_prompts

    work = Path(tempfile.mkdtemp(prefix="semgov-first-"))
    files = HookFiles.make(work / "hook", policy=RIG_POLICY if policy == "rig" else Path(policy))
    env = {**files.env(), "SEMGOV_DETOKENIZER": "tests.sglang_hook.scenario:detokenizer",
           "SEMGOV_WARMUP": "1" if warm else "0",
           "SEMGOV_DECISION_PROCESS": "1" if process else "0"}  # fmt: skip
    t0 = time.perf_counter()
    gov = Governor(HookSettings.from_env(env), engine_name="bench")
    built_ms = (time.perf_counter() - t0) * 1000
    gov.wait_idle(120)
    ready_ms = (time.perf_counter() - t0) * 1000
    gw = Gateway(CONTEXT_SECRET)
    out: dict[str, Any] = {"warm": warm, "built_ms": built_ms, "ready_ms": ready_ms}
    out["warmup_ms"] = gov.warmups[0].seconds * 1000 if gov.warmups else None
    for i, tag in enumerate(("first", "second")):
        p = pair_prompts(f"bench-{tag}", e_len=1024)
        d_ctx = gov.verdict_of(gw.token("acme", "ns", p.donor_segs), None, dedicated=True).context
        r_ctx = gov.verdict_of(gw.token("acme", "ns", p.recipient_segs), None, dedicated=True).context
        assert d_ctx is not None and r_ctx is not None
        t1 = time.perf_counter()
        gov.submit_donor(DonorSpec(f"{tag}-donor", d_ctx, "", None, array("q", p.donor), None))
        gov.wait_registrations(120)
        gov.drain_donors()
        out[f"{tag}_donor_ms"] = (time.perf_counter() - t1) * 1000
        t2 = time.perf_counter()
        job = gov.decide_later(f"{tag}-r", r_ctx, None, array("q", p.recipient))
        while not job.done:
            time.sleep(0.0001)
        out[f"{tag}_decision_ms"] = (time.perf_counter() - t2) * 1000
        out[f"{tag}_outcomes"] = [d.decision for d in job.decisions]
        out[f"{tag}_failed_gates"] = [
            g["gate"] for d in job.decisions for g in d.record["gates"] if g["result"] != "pass"
        ]
        del i
    gov.close()
    return out


def _summary(rows: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return "-"
    return f"{statistics.median(vals):8.1f} ({min(vals):.1f}-{max(vals):.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6, help="trials per arm (fresh processes)")
    ap.add_argument("--process", type=int, default=1, help="1: the decision process (default); 0: the thread")
    ap.add_argument(
        "--policy", default="rig", help="rig (the real-server rigs' policy, which allows) or a path"
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=("0", "1"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="one trial per arm: both arms, in seconds")
    a = ap.parse_args()
    if a.smoke:
        a.n = 1
    if a.child is not None:
        print(json.dumps(_trial(a.child == "1", bool(a.process), a.policy)))
        return 0
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for i in range(2 * a.n):
        warm = i % 2 == 1
        cmd = [sys.executable, __file__, "--child", "1" if warm else "0", "--process", str(a.process),
               "--policy", a.policy]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, decision process: {bool(a.process)}, "
          f"policy {a.policy}, outcomes {sorted({o for r in rows for o in r['first_outcomes']})}, "
          f"n={a.n} fresh processes per arm (ms: median (min-max))")  # fmt: skip
    keys = ("ready_ms", "warmup_ms", "first_donor_ms", "first_decision_ms", "second_decision_ms")
    print(f"{'warm-up':<8}" + "".join(f"{k:>24}" for k in keys) + f"{'first > 100 ms':>16}")
    for warm in (False, True):
        arm = [r for r in rows if r["warm"] is warm]
        late = sum(r["first_decision_ms"] > 100 for r in arm)
        print(f"{'on' if warm else 'off':<8}" + "".join(f"{_summary(arm, k):>24}" for k in keys)
              + f"{late:>13}/{len(arm)}")  # fmt: skip
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
