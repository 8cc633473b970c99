"""How much governed reuse a fleet loses to routing, and how much scope routing wins back.

    python benchmarks/fleet_reuse.py [--n 8] [--words 300] [--out fleet.json]

Real processes: two SGLang CPU workers with the semgov hook (tiny model, one core each, each with its
own audit log and origin), the engines' own router ``smg`` 1.13.0 (``SEMGOV_SMG`` or
``.venv-smg``), and the real ``semgov gateway`` (``--upstream-api generate``) in front. Three cells,
each on the same workload after ``/flush_cache`` on every worker:

- **1 worker**: the router over one worker (every donor is where its recipient is);
- **2 workers, default policy**: ``smg --policy cache_aware`` (its default), no routing key;
- **2 workers, scope routing**: ``smg --policy consistent_hashing`` hashing the gateway's
  ``x-smg-routing-key`` (``--routing-key-header``: an HMAC of tenant, namespace, evidence hash);
- ``--also POLICY ...``: two workers under other smg policies, without the key.

The workload: ``n`` pairs per cell, alternately acme's and globex's, each a donor ``[S][I][E][Q1]``
then (once the donor is registered) a recipient ``[S][E][Q2]`` with the same evidence, every pair
with its own evidence. Realized tokens are read from the workers' audit logs. **Share** = tokens
realized in the cell / tokens approved for the same recipients in the 1-worker cell (the allow
decisions' shifted spans; the exact prefix SGLang serves itself): the governed reuse the fleet
keeps. Every decision of every log is
checked to have donor scope == recipient scope.

``--smoke``: no process started. The workload is built and tokenized as the gateway does, each
request's routing key computed, and the cells' table printed from a stand-in placement (key mod 2
for scope routing, alternation for the default policy) with each recipient's evidence length as its
approved tokens. Not run: the workers, the router, the gateway, the audit logs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.fixtures import tokenizer_dir  # noqa: E402 - the checkout on sys.path first
from tests.sglang_server.test_gateway_server import donor_chat, evidence, recipient_chat  # noqa: E402

CELLS = (
    ("1 worker", 1, "cache_aware", False),
    ("2 workers, default policy (cache_aware)", 2, "cache_aware", False),
    ("2 workers, scope routing (consistent_hashing)", 2, "consistent_hashing", True),
)


@dataclass
class Pair:
    seed: str
    tenant: str
    donor: dict[str, Any]
    recipient: dict[str, Any]


@dataclass
class Cell:
    name: str
    n: int
    colocated: int = 0
    realized: dict[str, int] = field(default_factory=dict)  # by pair seed
    approved: dict[str, int] = field(default_factory=dict)  # by pair seed (allow decisions here)
    failed: int = 0
    seconds: float = 0.0


def workload(n: int, words: int) -> list[Pair]:
    pairs = []
    for i in range(n):
        tenant = "acme" if i % 2 == 0 else "globex"
        ev = evidence(f"fleet-bench-{i}", words)
        ns = f"{tenant}/bench"
        pairs.append(Pair(f"p{i}", tenant, donor_chat(ev, ns), recipient_chat(ev, ns)))
    return pairs


def run_pairs(f: Any, pairs: list[Pair], cell: Cell) -> None:
    """Each pair's donor, then (donor registered) its recipient, through the gateway; the audit read."""
    from tests.sglang_server.fleet import worker_of

    rids: dict[str, str] = {}
    for p in pairs:
        d = f.gateway.post(p.donor, tenant=p.tenant)
        f.settle()
        r = f.gateway.post(p.recipient, tenant=p.tenant)
        if d.status_code != 200 or r.status_code != 200:
            cell.failed += 1
            continue
        rids[p.seed] = r.headers["x-request-id"]
        where = worker_of(f, d.headers["x-request-id"])
        cell.colocated += int(where is not None and where == worker_of(f, rids[p.seed]))
    read_audits(f, rids, cell)


def read_audits(f: Any, rids: dict[str, str], cell: Cell) -> None:
    from tests.sglang_server.rig import read_audit, summarize

    for w in f.workers:
        audit = summarize(read_audit(w.files.audit_dir, wait_s=20))
        for decisions in audit.decisions.values():
            for dec in decisions:  # NOTE: every decision of the log, not only this cell's
                if (dec["donor_tenant"], dec["donor_namespace"]) != (dec["tenant"], dec["namespace"]):
                    raise SystemExit(f"a decision crossed scopes: {dec}")
        for seed, rid in rids.items():
            cell.realized[seed] = cell.realized.get(seed, 0) + audit.realized.get(rid, 0)
            for dec in audit.decisions.get(rid, []):
                if dec["decision"] == "allow":  # NOTE: shifted spans: SGLang serves the exact prefix itself
                    shifted = sum(int(s["length"]) for s in dec["approved_spans"] if s["kind"] == "shifted")
                    cell.approved[seed] = max(cell.approved.get(seed, 0), shifted)


def run_cells(n: int, words: int, work: Path, also: tuple[str, ...] = ()) -> list[Cell]:
    from tests.sglang_server.fleet import (
        Fleet,
        model_dir,
        smg_binary,
        start_gateway,
        start_router,
        start_workers,
    )
    from tests.sglang_server.rig import stop_group

    smg = smg_binary()
    if smg is None:
        raise SystemExit("no smg router: set SEMGOV_SMG or make .venv-smg (../shared/RECIPES.md)")
    pairs = workload(n, words)
    workers = start_workers(model_dir(work / "model"), work, 2)
    cells = []
    try:
        extra = tuple((f"2 workers, {p} (no key)", 2, p, False) for p in also)
        for k, (name, n_workers, policy, routing) in enumerate(CELLS + extra):
            for w in workers:
                w.flush_cache()
            t0 = time.monotonic()
            urls = [f"http://{w.host}:{w.port}" for w in workers[:n_workers]]
            router = start_router(smg, urls, policy, work / f"router-{k}")
            gw = start_gateway(router.url, workers[0].files.context_key, work / f"gateway-{k}", routing)
            cell = Cell(name, n)
            try:
                run_pairs(Fleet(workers[:n_workers], router, gw, work), pairs, cell)
            finally:
                stop_group(gw.proc, term_wait_s=10.0)
                router.stop()
            cell.seconds = time.monotonic() - t0
            cells.append(cell)
    finally:
        for w in workers:
            w.stop()
    return cells


def smoke_cells(n: int, words: int) -> list[Cell]:
    """The table's shape from a stand-in placement (no process started; the figures mean nothing)."""
    from semgov.gateway.fleet import routing_key, routing_secret
    from semgov.gateway.prompt import ModelTokenizer

    tok = ModelTokenizer(tokenizer_dir())
    secret = routing_secret(b"smoke-context-key-0123456789abcdef")
    cells = [Cell(name, n) for name, *_ in CELLS]
    for i, p in enumerate(workload(n, words)):
        ns = p.recipient["semgov"]["namespace"]
        donor = tok.chat(p.donor["messages"], ["system", "instruction", "evidence", "question"])
        recipient = tok.chat(p.recipient["messages"], ["system", "evidence", "question"])
        span = next(e - s for r, s, e in recipient.segments if r == "evidence")
        keys = [routing_key(secret, p.tenant, ns, x.ids, x.segments) for x in (donor, recipient)]
        placed = (True, i % 2 == 0, int(keys[0], 16) % 2 == int(keys[1], 16) % 2)
        for cell, together in zip(cells, placed, strict=True):
            cell.colocated += int(together)
            cell.realized[p.seed] = span if together else 0
            cell.approved[p.seed] = span
    return cells


def report(cells: list[Cell]) -> dict[str, Any]:
    reference = cells[0].approved
    approved = sum(reference.values())
    print(f"{'cell':48} {'n':>3} {'co-located':>10} {'realized':>9} {'approved':>9} {'share':>6} {'s':>6}")
    rows = []
    for c in cells:
        realized = sum(c.realized.values())
        share = realized / approved if approved else 0.0
        placed = f"{c.colocated}/{c.n}"
        print(
            f"{c.name:48} {c.n:>3} {placed:>10} {realized:>9} {approved:>9} {share:>6.0%} {c.seconds:>6.0f}"
        )
        rows.append({"cell": c.name, "n": c.n, "colocated": c.colocated, "realized": realized,
                     "approved_1_worker": approved, "share": share, "failed": c.failed,
                     "seconds": round(c.seconds, 1)})  # fmt: skip
    return {"cells": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="pairs per cell (default 8)")
    ap.add_argument(
        "--words", type=int, default=300, help="evidence words per pair (default 300: ~1,100 tokens)"
    )
    ap.add_argument("--out", type=Path, help="write the table as JSON here")
    ap.add_argument(
        "--also",
        nargs="*",
        default=[],
        metavar="POLICY",
        choices=("random", "round_robin", "power_of_two", "least_load", "prefix_hash", "cache_aware"),
        help="more cells: two workers under these smg policies, without the routing key",
    )
    ap.add_argument("--smoke", action="store_true", help="no process started: a stand-in placement (above)")
    args = ap.parse_args(argv)
    if args.smoke:
        cells = smoke_cells(min(args.n, 4), 60)
    else:
        with tempfile.TemporaryDirectory(prefix="semgov-fleet-") as tmp:
            cells = run_cells(args.n, args.words, Path(tmp), tuple(args.also))
    doc = report(cells)
    if not args.smoke:
        print("scope check: every decision of every log has donor scope == recipient scope")
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
