"""Per-candidate policy evaluation latency, side by side: YAML, regorus, OPA in-process, OPA over HTTP.

Usage: python benchmarks/engine_latency.py [--n 600] [--repeat 3] [--smoke]

Documents: the policy input documents of the first --n candidates of the shipped
workload (facts computed once, beforehand; facts and signing are not timed
here, see decision_latency.py). Each engine decides the same documents with the
same default policy (policies/default, policies/rego/default). Timed: the engine
call and semgov's interpretation and checks (`Evaluator.decide`).

The HTTP row uses tests/opa_rest_server.py, a test double of OPA's REST API
(Python http.server) evaluating with the real OPA library, in this process: no
`opa` binary can be installed here. Client and server share one pinned core, so
it measures loopback HTTP plus OPA evaluation plus that server's Python overhead,
an upper bound for a real OPA server's per-call cost. "bulk" is one POST per
request for all its candidates (opa-python-client's bulk_query_rule), reported
per candidate. ``--smoke``: 10 documents, their facts computed without the PII scan, one pass
(every engine and row, in seconds; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import NoPii  # noqa: E402
from semgov import CapturedRequest, Evaluator, Keyring, load_policy, load_signing_key  # noqa: E402
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine  # noqa: E402
from semgov.policy.rego.loader import load_rego_policy  # noqa: E402
from semgov.wire.policy_input import PolicyInput  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="candidates (documents) per engine")
    ap.add_argument("--repeat", type=int, default=3, help="passes per engine; the lowest-p99 one is shown")
    ap.add_argument("--smoke", action="store_true", help="10 documents, one pass: every row, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.repeat = 10, 1
    os.sched_setaffinity(0, {0})
    ex = ROOT / "examples"
    kr = Keyring.load(ex / "keyring.json")
    sk = load_signing_key(ex / "keys" / "decision-signing-key.pem")
    yaml_pol = load_policy(ROOT / "policies" / "default")
    rego_pol = load_rego_policy(ROOT / "policies" / "rego" / "default")
    # NOTE: smoke: the facts without the PII scan (Presidio's load alone takes about 10 s)
    base = Evaluator(yaml_pol, kr, sk, pii_scanner=NoPii() if args.smoke else None)
    requests: list[list[PolicyInput]] = []
    total = 0
    with gzip.open(ex / "captured.jsonl.gz", "rb") as f:
        for line in f:
            docs = base.policy_inputs(CapturedRequest.model_validate_json(line))
            if docs:
                requests.append(docs)
            total += len(docs)
            if total >= args.n:
                break
    docs = [d for r in requests for d in r]

    from semgov.policy.rego.opa_server import OpaServerEngine
    from tests.opa_rest_server import OpaRestServer

    server = OpaRestServer()
    engines = {
        "yaml": Evaluator(yaml_pol, kr, sk),
        "regorus": Evaluator(rego_pol, kr, sk, engine=RegorusEngine(rego_pol)),
        "opa-inprocess": Evaluator(rego_pol, kr, sk, engine=OpaInProcessEngine(rego_pol)),
        "opa-server (HTTP)": Evaluator(
            rego_pol, kr, sk, engine=OpaServerEngine(rego_pol, server.url, timeout=5)
        ),
    }
    print(f"policy evaluation per candidate (1 core, {len(docs)} documents from the shipped workload, "
          f"best p99 of {args.repeat} passes)")  # fmt: skip
    print(f"{'engine':<26}{'p50 us':>9}{'p90 us':>9}{'p99 us':>9}{'mean us':>9}")
    rows = []
    for name, ev in engines.items():
        runs = []
        for _ in range(args.repeat):
            ts = []
            for d in docs:
                t = time.perf_counter()
                ev.decide(d)
                ts.append((time.perf_counter() - t) * 1e6)
            runs.append(ts)
        rows.append((name, min(runs, key=lambda xs: pct(xs, 0.99))))
    ev = engines["opa-server (HTTP)"]
    runs = []
    for _ in range(args.repeat):
        ts = []
        for r in requests:
            t = time.perf_counter()
            ev.decide_all(r)
            ts.extend([(time.perf_counter() - t) * 1e6 / len(r)] * len(r))
        runs.append(ts)
    rows.append(("opa-server (HTTP, bulk)", min(runs, key=lambda xs: pct(xs, 0.99))))
    for name, ts in rows:
        mean = sum(ts) / len(ts)
        print(f"{name:<26}{pct(ts, 0.5):>9.0f}{pct(ts, 0.9):>9.0f}{pct(ts, 0.99):>9.0f}{mean:>9.0f}")
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
