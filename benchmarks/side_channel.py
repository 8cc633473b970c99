"""Side channels of reuse decisions: does latency reveal whether another tenant holds a similar donor?

Usage: python benchmarks/side_channel.py [--n 2000] [--seed 1] [--quick] [--smoke] [--out FILE.json]

For each scenario, an attacker's probes fall in two classes and the per-probe latency of the
timed region is collected for each class; the distinguishing advantage of a classifier on one
latency sample is summarized by the ROC AUC, computed exactly as the Mann-Whitney U statistic
over all (class 1, class 0) pairs divided by n1*n0 (ties count one half): 0.5 means no signal;
the advantage is |AUC - 0.5|; the 95% CI is a percentile bootstrap (each class resampled with
replacement). Class 1 is always "similar donor present / tokens match"; AUC > 0.5 means class 1
is slower.

Scenarios:

- core, cross-tenant (``Evaluator.evaluate``, YAML and regorus engines): tenant ``globex``'s
  request and a candidate donor of tenant ``acme`` (denied by the tenant gate; every gate runs).
  Class 1: the donor's evidence tokens equal the probe's; class 0: they do not (same lengths).
  Two layouts: ``prefix`` (the evidence at the same position: [S][I][E][Q'] vs [S][I][E][Q]) and
  ``shifted`` (the hook's layout: [S][E][Q'] vs [S][I][E][Q]). Caches are warm (the donors are a
  pool of --pool, each probed in both classes), so the timing is the steady state an attacker
  repeating probes sees.
- core, same tenant (reference): allow (evidence matches) vs deny (it does not). A difference
  here is no leak: the caller is entitled to its own reuse, and sees it anyway.
- core, null control: class 1 probes are copies of the class 0 probes (same content, distinct
  objects): what memory placement alone does to the AUC (seen up to ~0.03 from 0.5 here).
- hook, cross-tenant (the real ``GovernedRadixCache`` on CPU, SGLang 0.5.23 objects, the test
  harness of tests/sglang_hook): ``globex``'s probe request through one scheduling round
  (``Req.init_next_round_input`` -> ``match_prefix``, including the decision round if there is
  one). ``acme`` holds --pool donors; class 1 probes are similar to one of them (the same
  evidence, the hook's shifted layout), class 0 probes to nothing ``acme`` holds. ``globex``
  holds one unrelated donor of its own, so its candidate query is not trivially empty. Also
  reported: what SGLang would tell the caller (prefix length, host hit, ``cached_tokens`` after
  the prefill) for a probe of each class, and for a same-tenant reuse.
- hook, same tenant (reference): ``acme``'s own request similar to its own donor (decided,
  allowed) vs one with other evidence (decided and denied, or no candidate at all: MinHash then
  sees only the shared system prompt).

Conditions: the process and every thread it starts are pinned to one core (--core), torch and
BLAS use one thread, the two classes are interleaved in a random order, the first --warmup
probes are discarded, and the garbage collector is off while timing (it runs between probes
every 256 probes, outside the timed region). Load from other processes falls on both classes
alike, because of the interleaving; it widens the distributions, it does not bias the AUC.

When a cross-tenant scenario's CI excludes 0.5 and |AUC - 0.5| > 0.05, the core path is run
again with per-stage timing (facts without token verification, token verification
``find_spans``, policy engine, signing) and each stage's AUC is printed, to say which differs.

``--quick``: n=300, a shorter warm-up and bootstrap (minutes). ``--smoke``: n=30, warm-up 5,
bootstrap 50, 4 donors, 512-token core probes: every scenario, the hook's included, in seconds
after SGLang's import (the AUCs mean nothing at that n).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from engine_hooks.reference.workload import (  # noqa: E402
    VOCAB_SIZE,
    candidate,
    captured_json,
    donor_payload,
    token_prompt,
)
from semgov import CapturedRequest, Evaluator, Keyring, SigningKey, load_policy  # noqa: E402
from semgov.facts import compute as facts_mod  # noqa: E402
from semgov.signing.keys import TrustedKey  # noqa: E402
from semgov.signing.provenance import sign_provenance  # noqa: E402
from semgov.wire.models import DECISION_SCHEMAS  # noqa: E402

TASK_ID = "extract_financials"
CONTRACT = {"id": "financials", "schema_sha256": "ab" * 32}
NAMESPACE = "research/entity-001"
VICTIM, ATTACKER = "acme", "globex"
LEAK_MARGIN = 0.05
GC_EVERY = 256

# ---- statistics ------------------------------------------------------------------------------


Samples = Sequence[float] | npt.NDArray[Any]


def auc_counts(pos: Samples, neg: Samples) -> tuple[int, int]:
    """(pairs with pos > neg, pairs with pos == neg) over all n1*n0 pairs, exactly (integers)."""
    p = np.asarray(pos)
    q = np.sort(np.asarray(neg))
    lo = np.searchsorted(q, p, side="left")
    hi = np.searchsorted(q, p, side="right")
    return int(lo.sum()), int((hi - lo).sum())


def auc(pos: Samples, neg: Samples) -> float:
    """ROC AUC of "pos scores higher": Mann-Whitney U / (n1*n0), ties counted one half."""
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("AUC needs at least one sample per class")
    greater, ties = auc_counts(pos, neg)
    return (2 * greater + ties) / (2 * len(pos) * len(neg))


def bootstrap_ci(
    pos: Samples, neg: Samples, rng: np.random.Generator, b: int = 1000, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of :func:`auc`, each class resampled with replacement."""
    p, q = np.asarray(pos), np.asarray(neg)
    stats = np.empty(b)
    for i in range(b):
        stats[i] = auc(p[rng.integers(0, len(p), len(p))], q[rng.integers(0, len(q), len(q))])
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def mwu_p(pos: Samples, neg: Samples) -> float:
    """Two-sided p-value of Mann-Whitney U (normal approximation, tie-corrected)."""
    n1, n0 = len(pos), len(neg)
    n = n1 + n0
    greater, ties = auc_counts(pos, neg)
    u = greater + ties / 2
    _, counts = np.unique(np.concatenate([np.asarray(pos), np.asarray(neg)]), return_counts=True)
    tie_term = float(((counts.astype(np.float64) ** 3) - counts).sum()) / (n * (n - 1))
    var = n1 * n0 / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return 1.0
    z = (u - n1 * n0 / 2) / math.sqrt(var)
    return math.erfc(abs(z) / math.sqrt(2))


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * len(s)))])


# ---- timing ----------------------------------------------------------------------------------

Probe = Callable[[int, int], dict[str, int]]
"""probe(cls, k) -> {stage: ns} for one probe of class ``cls`` from pool entry ``k`` ("total" required)."""


def interleaved(
    probe: Probe, n: int, warmup: int, pool: int, rng: np.random.Generator
) -> dict[int, dict[str, list[int]]]:
    """n probes per class in a random interleaved order (pool entries at random), warm-up discarded."""
    order = np.array([0] * n + [1] * n)
    rng.shuffle(order)
    ks = rng.integers(0, pool, len(order))
    for i in range(warmup):
        probe(i % 2, int(rng.integers(0, pool)))
    out: dict[int, dict[str, list[int]]] = {0: {}, 1: {}}
    gc.collect()
    gc.disable()
    try:
        for i, (c, k) in enumerate(zip(order.tolist(), ks.tolist(), strict=True)):
            if i % GC_EVERY == GC_EVERY - 1:
                gc.collect()  # between probes, never inside a timed region
            for stage, ns in probe(c, k).items():
                out[c].setdefault(stage, []).append(ns)
    finally:
        gc.enable()
    return out


def summarize(
    scenario: str,
    method: str,
    samples: dict[int, dict[str, list[int]]],
    rng: np.random.Generator,
    *,
    kind: str,
    boot: int,
    stage: str = "total",
) -> dict[str, Any]:
    """AUC, CI, p-value and percentiles of one scenario; ``kind``: ``cross``, ``ref`` or ``null``."""
    t1 = [x / 1000 for x in samples[1][stage]]
    t0 = [x / 1000 for x in samples[0][stage]]
    a = auc(t1, t0)
    lo, hi = bootstrap_ci(t1, t0, rng, boot)
    leak = kind == "cross" and (lo > 0.5 or hi < 0.5) and abs(a - 0.5) > LEAK_MARGIN
    return {
        "scenario": scenario,
        "method": method,
        "kind": kind,
        "n": [len(t0), len(t1)],
        "auc": a,
        "advantage": abs(a - 0.5),
        "ci95": [lo, hi],
        "mwu_p": mwu_p(t1, t0),
        "leak": leak,
        "us": {
            str(c): {
                "p50": pct(ts, 0.5),
                "p90": pct(ts, 0.9),
                "p99": pct(ts, 0.99),
                "mean": sum(ts) / len(ts),
            }
            for c, ts in ((0, t0), (1, t1))
        },
    }


# ---- core decisions --------------------------------------------------------------------------


@dataclass
class CoreKeys:
    provenance: SigningKey
    decision: SigningKey
    keyring: Keyring

    @classmethod
    def generate(cls) -> CoreKeys:
        prov = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1")
        return cls(
            prov,
            SigningKey.from_private(Ed25519PrivateKey.generate()),
            Keyring([TrustedKey("k1", prov.public_key, False)]),
        )


def core_pool(
    keys: CoreKeys, *, tokens: int, layout: str, tenant: str, pool: int, seed: int, null: bool = False
) -> dict[int, list[CapturedRequest]]:
    """Probe requests of ``tenant``, each with one ``acme`` donor candidate: {1: match, 0: no match}.

    Entry k of both classes has the same donor and the same lengths; only the probe's evidence
    differs (class 1: the donor's evidence; class 0: other tokens). ``layout`` is ``prefix``
    ([S][I][E][Q'] vs the donor's [S][I][E][Q]) or ``shifted`` ([S][E][Q'], the hook's layout).
    ``null``: class 1 is a copy of class 0 (the same content, parsed separately at the same point).
    """
    if layout not in ("prefix", "shifted"):
        raise ValueError(f"layout {layout!r}")
    rng = np.random.default_rng(seed)

    def toks(n: int) -> np.ndarray:
        return rng.integers(0, VOCAB_SIZE, n, dtype=np.int64)

    out: dict[int, list[CapturedRequest]] = {0: [], 1: []}
    for k in range(pool):
        sys_, instr, q, q2 = toks(24), toks(40), toks(30), toks(30)
        evidence = toks(tokens - 94)
        donor = token_prompt(
            [("system", sys_), ("instruction", instr), ("evidence", evidence), ("question", q)]
        )
        payload = donor_payload(
            donor_id=f"d-{k}",
            tenant=VICTIM,
            namespace=NAMESPACE,
            task_id=TASK_ID,
            contract=CONTRACT,
            created_at=datetime(2026, 11, 28, 10, tzinfo=UTC),
            prompt=donor,
        )
        cand = candidate(f"d-{k}", 0.9, donor, sign_provenance(payload, keys.provenance))
        other = toks(len(evidence))
        # NOTE: which class is built first alternates, so that allocation order (where the parsed
        # objects land in memory, worth ~1% of the latency here) falls on both classes alike.
        built = [(1, other if null else evidence), (0, other)]
        for cls, ev in built if k % 2 == 0 else built[::-1]:
            if layout == "prefix":
                parts = [("system", sys_), ("instruction", instr), ("evidence", ev), ("question", q2)]
            else:
                parts = [("system", sys_), ("evidence", ev), ("question", q2)]
            req = captured_json(
                request_id=f"r-{k}-{cls}",
                received_at=datetime(2026, 11, 29, 10, tzinfo=UTC),
                tenant=tenant,
                namespace=NAMESPACE,
                task_id=TASK_ID,
                contract=CONTRACT,
                prompt=token_prompt(parts),
                candidates=[cand],
            )
            out[cls].append(CapturedRequest.model_validate_json(json.dumps(req)))
    return out


def core_evaluator(engine: str, keys: CoreKeys) -> Evaluator:
    if engine == "yaml":
        return Evaluator(load_policy(ROOT / "policies" / "default"), keys.keyring, keys.decision)
    if engine == "regorus":
        from semgov.policy.rego.engines import RegorusEngine
        from semgov.policy.rego.loader import load_rego_policy

        pol = load_rego_policy(ROOT / "policies" / "rego" / "default")
        return Evaluator(pol, keys.keyring, keys.decision, engine=RegorusEngine(pol))
    raise ValueError(f"engine {engine!r}")


def core_probe(ev: Evaluator, reqs: dict[int, list[CapturedRequest]]) -> Probe:
    def probe(cls: int, k: int) -> dict[str, int]:
        req = reqs[cls][k]
        t = time.perf_counter_ns()
        ev.evaluate(req)
        return {"total": time.perf_counter_ns() - t}

    return probe


class _SpanTimer:
    """Stands in for ``semgov.facts.compute.find_spans`` and adds up the time spent in it."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.ns = 0

    def __call__(self, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return self.inner(*a, **kw)
        finally:
            self.ns += time.perf_counter_ns() - t


STAGES = ("facts w/o tokens", "token verification", "policy engine", "signing", "total")


def core_staged_probe(ev: Evaluator, reqs: dict[int, list[CapturedRequest]], timer: _SpanTimer) -> Probe:
    """``Evaluator.evaluate`` step by step (the same calls), each stage timed."""

    def probe(cls: int, k: int) -> dict[str, int]:
        req = reqs[cls][k]
        clock = req.received_at
        timer.ns = 0
        t0 = time.perf_counter_ns()
        docs = ev.policy_inputs(req, clock)
        t1 = time.perf_counter_ns()
        results = ev.decide_all(docs)
        t2 = time.perf_counter_ns()
        for doc, r in zip(docs, results, strict=True):
            ev._record(req, doc, r)
        t3 = time.perf_counter_ns()
        return {
            "facts w/o tokens": t1 - t0 - timer.ns,
            "token verification": timer.ns,
            "policy engine": t2 - t1,
            "signing": t3 - t2,
            "total": t3 - t0,
        }

    return probe


def run_stages(
    ev: Evaluator, reqs: dict[int, list[CapturedRequest]], n: int, warmup: int, rng: np.random.Generator
) -> dict[str, Any]:
    """:func:`interleaved` over :func:`core_staged_probe`: each stage's AUC and p50 per class."""
    names = vars(facts_mod)  # compute_facts looks find_spans up here at each call
    timer = _SpanTimer(names["find_spans"])
    names["find_spans"] = timer
    try:
        samples = interleaved(core_staged_probe(ev, reqs, timer), n, warmup, len(reqs[0]), rng)
    finally:
        names["find_spans"] = timer.inner
    out = {}
    for stage in STAGES:
        t1 = [x / 1000 for x in samples[1][stage]]
        t0 = [x / 1000 for x in samples[0][stage]]
        out[stage] = {"auc": auc(t1, t0), "p50_us": [pct(t0, 0.5), pct(t1, 0.5)]}
    return out


# ---- the SGLang hook -------------------------------------------------------------------------


def _harness_module() -> Any:
    """tests/sglang_hook/conftest.py (importing it puts the torchvision stub on sys.path if needed)."""
    import tests.sglang_hook.conftest as hc

    return hc


def hook_runtime() -> Any:
    """What tests/sglang_hook's ``sglang_runtime`` fixture does: SGLang's config for the tiny model."""
    hc = _harness_module()
    from sglang.srt import runtime_context as rc
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    from engine_hooks.sglang.plugin import register

    args = ServerArgs(model_path=str(hc.TINY_MODEL), device="cpu", skip_tokenizer_init=True)
    rc.publish(args, role="scheduler")
    register()
    from types import SimpleNamespace

    return SimpleNamespace(server_args=args, model_config=ModelConfig.from_server_args(args), rc=rc)


def hook_files(directory: Path) -> Any:
    """What tests/sglang_hook's ``hook_files`` fixture does: real keys, keyring, context key, policy
    (the default's gates, no recompute planned: the in-tenant reference reuse is a front copy)."""
    hc = _harness_module()
    from semgov.signing.keys import generate_keypair, key_id_for, load_public_key
    from tests.core.files import copy_policy

    priv, pub = generate_keypair(directory / "keys")
    trust = directory / "keyring.json"
    trust.write_text(
        json.dumps({"keys": [{"key_id": key_id_for(load_public_key(pub)), "public_key": pub.read_text()}]})
    )
    secret = b"gateway-secret-for-side-channel-0123456789"
    ck = directory / "context.key"
    ck.write_bytes(secret)
    return hc.HookFiles(directory, priv, trust, ck, secret, directory / "audit", copy_policy(directory))


@dataclass(frozen=True)
class Seen:
    """What one scheduling round tells about a request (what SGLang acts on and reports)."""

    prefix_len: int
    host_hit_length: int
    decisions: int


class HookRig:
    """A governed radix cache on CPU where ``acme`` holds ``pool`` donors and ``globex`` one.

    ``probes[scenario][cls][k]`` are (tokens, context token) of requests:
    ``cross``: ``globex`` requests similar (1) to ``acme``'s donor k or to nothing ``acme`` holds (0);
    ``own``: ``acme`` requests similar (1) to its own donor k, or with other evidence (0).
    """

    def __init__(self, runtime: Any, files: Any, *, pool: int, seed: int) -> None:
        from tests.sglang_hook.conftest import Harness
        from tests.sglang_hook.scenario import E_LEN, I_LEN, Q_LEN, S_LEN, blocks

        self.size = (pool + 4) * (S_LEN + I_LEN + E_LEN + Q_LEN) * 2
        self.h = Harness(runtime, files, size=self.size)
        base = 1_000_003 * (seed + 1)
        held = [blocks(base + i) for i in range(pool)]
        unheld = [blocks(base + pool + i) for i in range(pool)]
        for i, b in enumerate(held):
            self._donor(f"acme-donor-{i}", b.donor(), VICTIM)
        self._donor("globex-donor", blocks(base + 2 * pool).donor(), ATTACKER)
        self.probes: dict[str, dict[int, list[tuple[list[int], str]]]] = {
            "cross": {
                1: [self._req(b.recipient(), ATTACKER) for b in held],
                0: [self._req(b.recipient(), ATTACKER) for b in unheld],
            },
            "own": {
                1: [self._req(b.recipient(), VICTIM) for b in held],
                0: [self._req(b.other_evidence(base + 3 * pool + i), VICTIM) for i, b in enumerate(held)],
            },
        }
        self.seen: dict[str, dict[int, Counter[Seen]]] = {
            s: {0: Counter(), 1: Counter()} for s in self.probes
        }
        self.n = 0

    def _req(self, lay: Any, tenant: str) -> tuple[list[int], str]:
        return list(lay.tokens), self.h.context(tenant, "ns1", lay.segments)

    def _donor(self, rid: str, lay: Any, tenant: str) -> None:
        req = self.h.new_req(rid, lay.tokens, self.h.context(tenant, "ns1", lay.segments), text=lay.text)
        self.h.run(req)
        self.h.finish(req)

    def probe(self, scenario: str) -> Probe:
        """One scheduling round of a fresh waiting request, timed; then the request is aborted."""

        def probe(cls: int, k: int) -> dict[str, int]:
            tokens, ctx = self.probes[scenario][cls][k]
            self.n += 1
            req = self.h.new_req(f"{scenario}-probe-{self.n}", tokens, ctx)
            before = self.h.tree.stats["decisions"]
            t = time.perf_counter_ns()
            self.h.match(req)
            dt = time.perf_counter_ns() - t
            seen = Seen(
                int(req.prefix_len), int(req.host_hit_length), self.h.tree.stats["decisions"] - before
            )
            self.seen[scenario][cls][seen] += 1
            self.h.abort_waiting(req)
            return {"total": dt}

        return probe

    def caller_view(self, scenario: str, cls: int, k: int = 0) -> dict[str, Any]:
        """A request run to its prefill: what SGLang reports for it (its response's cached_tokens).

        The request is aborted after its prefill, so it never becomes a donor; its own KV does stay
        in its tenant's exact-prefix tree (SGLang caches every request's prefix), so a later
        identical request of that tenant matches it: run the timed probes first.
        """
        tokens, ctx = self.probes[scenario][cls][k]
        self.n += 1
        rid = f"{scenario}-view-{self.n}"
        req = self.h.new_req(rid, tokens, ctx)
        before = self.h.tree.stats["decisions"]
        self.h.match(req)
        matched = {"prefix_len": int(req.prefix_len), "host_hit_length": int(req.host_hit_length)}
        decisions = self.h.tree.stats["decisions"] - before
        self.h.admit(req)
        self.h.prefill([req])
        out = {
            **matched,
            "prefix_len_after_admission": int(req.prefix_len),
            "cached_tokens": int(req.cached_tokens),
            "cached_tokens_device": int(req.cached_tokens_device),
            "cached_tokens_host": int(req.cached_tokens_host),
            "hook_decisions": decisions,
        }
        self.h.finish(req, abort=True)
        return out

    def decision_records_for(self, prefix: str) -> int:
        """Decision records in the audit log whose request id starts with ``prefix``."""
        return sum(
            1
            for r in self.h.records()
            if r["schema"] in DECISION_SCHEMAS and str(r["request_id"]).startswith(prefix)
        )

    def clean(self) -> bool:
        return not self.h.tree.live_states() and self.h.tree.pins == 0

    def close(self) -> None:
        self.h.close()


# ---- main ------------------------------------------------------------------------------------


def _row(r: dict[str, Any]) -> str:
    u0, u1 = r["us"]["0"], r["us"]["1"]
    flag = "LEAK" if r["leak"] else {"cross": "no"}.get(r["kind"], r["kind"])
    ci = f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
    return (
        f"{r['scenario']:<44} {r['n'][0]:>5}/{r['n'][1]:<5} {r['method']:<15} {r['auc']:>6.3f} "
        f"{r['advantage']:>6.3f} {ci:>16} {u0['p50']:>8.1f} {u1['p50']:>8.1f} {u0['p99']:>8.1f} "
        f"{u1['p99']:>8.1f} {flag:>5}"
    )


HEADER = (
    f"{'scenario (class 1 vs class 0)':<44} {'n c0/c1':>11} {'method':<15} {'AUC':>6} {'adv':>6} "
    f"{'95% CI':>16} {'p50 c0':>8} {'p50 c1':>8} {'p99 c0':>8} {'p99 c1':>8} {'leak':>5}"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="timed probes per class and scenario")
    ap.add_argument("--seed", type=int, default=1, help="seed of the workloads, the order and the bootstrap")
    ap.add_argument("--quick", action="store_true", help="n=300, warm-up 50, 200 bootstrap rounds")
    ap.add_argument("--smoke", action="store_true", help="n=30, 4 donors, 512 tokens: seconds")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--core", type=int, default=0, help="CPU core to pin to (-1: no pinning)")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length of the core probes")
    ap.add_argument("--pool", type=int, default=32, help="donors (and probes per class) per scenario")
    ap.add_argument("--warmup", type=int, default=200, help="probes discarded before timing")
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples for the CI")
    ap.add_argument("--engines", nargs="+", default=["yaml", "regorus"], choices=["yaml", "regorus"])
    ap.add_argument("--no-hook", action="store_true", help="skip the SGLang hook scenarios")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.warmup, args.boot = min(args.n, 300), min(args.warmup, 50), min(args.boot, 200)
    if args.smoke:
        args.n, args.warmup, args.boot, args.pool, args.tokens = 30, 5, 50, 4, 512
    if args.core >= 0:
        os.sched_setaffinity(0, {args.core})
    started = time.perf_counter()
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    keys = CoreKeys.generate()
    results: list[dict[str, Any]] = []
    stages: dict[str, Any] = {}
    print(
        f"side-channel timing: n={args.n} probes per class, warm-up {args.warmup} discarded, random "
        f"interleaved order, GC off while timing, pinned to core {args.core}, 1 thread; seed {args.seed}"
    )
    print(
        "AUC = Mann-Whitney U / (n1*n0) on per-probe latency (class 1 = similar donor / tokens match; "
        f"> 0.5: class 1 slower), exact; CI: percentile bootstrap, B={args.boot}; times in us"
    )
    print(HEADER, flush=True)
    pools = {
        (layout, tenant): core_pool(
            keys, tokens=args.tokens, layout=layout, tenant=tenant, pool=args.pool, seed=args.seed + i
        )
        for i, (layout, tenant) in enumerate(
            (("prefix", ATTACKER), ("shifted", ATTACKER), ("prefix", VICTIM))
        )
    }
    # The null control: class 1 probes are copies of the class 0 probes (same content, other objects),
    # so its AUC shows what differences of memory placement alone produce (the method's floor).
    null = core_pool(
        keys, tokens=args.tokens, layout="prefix", tenant=ATTACKER, pool=args.pool, seed=args.seed, null=True
    )
    for engine in args.engines:
        ev = core_evaluator(engine, keys)
        runs = [
            (f"core {engine} x-tenant prefix: match/none", "cross", "prefix", pools[("prefix", ATTACKER)]),
            (f"core {engine} x-tenant shifted: match/none", "cross", "shifted", pools[("shifted", ATTACKER)]),
            (f"core {engine} same tenant: allow/deny (ref)", "ref", "prefix", pools[("prefix", VICTIM)]),
            (f"core {engine} x-tenant none/none copy (null)", "null", "prefix", null),
        ]
        for name, kind, layout, reqs in runs:
            samples = interleaved(core_probe(ev, reqs), args.n, args.warmup, args.pool, rng)
            r = summarize(name, "evaluate()", samples, rng, kind=kind, boot=args.boot)
            r.update(engine=engine, layout=layout, tokens=args.tokens)
            results.append(r)
            print(_row(r), flush=True)
            if r["leak"]:
                stages[name] = run_stages(ev, reqs, args.n, args.warmup, rng)
    caller: dict[str, Any] = {}
    if not args.no_hook:
        import torch

        warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory(prefix="semgov-side-channel-") as tmp:
            rig = HookRig(hook_runtime(), hook_files(Path(tmp)), pool=args.pool, seed=args.seed)
            try:
                for scenario, kind, name in (
                    ("cross", "cross", "hook x-tenant probe: donor held/not"),
                    ("own", "ref", "hook same tenant: own donor/other (ref)"),
                ):
                    samples = interleaved(rig.probe(scenario), args.n, args.warmup, args.pool, rng)
                    r = summarize(name, "match_prefix()", samples, rng, kind=kind, boot=args.boot)
                    r["seen"] = {
                        str(c): {
                            f"{s.prefix_len}/{s.host_hit_length}/{s.decisions}": v for s, v in cnt.items()
                        }
                        for c, cnt in rig.seen[scenario].items()
                    }
                    results.append(r)
                    print(_row(r), flush=True)
                caller = {
                    "cross_tenant_probe": {str(c): rig.caller_view("cross", c) for c in (1, 0)},
                    "same_tenant_reuse": rig.caller_view("own", 1),
                    "probe_decision_records": rig.decision_records_for("cross-"),
                    "clean_after": rig.clean(),
                }
            finally:
                rig.close()
    for name, st in stages.items():
        print(f"\nper-stage timing of '{name}' (AUC; p50 us class 0 -> class 1):")
        for stage, v in st.items():
            print(f"  {stage:<20} AUC {v['auc']:.3f}   p50 {v['p50_us'][0]:8.1f} -> {v['p50_us'][1]:8.1f}")
    if caller:
        print("\nwhat the caller is told (SGLang's request after one round / after its prefill):")
        for c in ("1", "0"):
            v = caller["cross_tenant_probe"][c]
            print(
                f"  x-tenant probe, class {c}: prefix_len {v['prefix_len']}, "
                f"host_hit {v['host_hit_length']}, "
                f"cached_tokens {v['cached_tokens']} (device {v['cached_tokens_device']}, host "
                f"{v['cached_tokens_host']}), hook decisions {v['hook_decisions']}"
            )
        v = caller["same_tenant_reuse"]
        print(
            f"  same-tenant reuse (ref): prefix_len {v['prefix_len']}, host_hit {v['host_hit_length']}, "
            f"cached_tokens {v['cached_tokens']} (device {v['cached_tokens_device']}, host "
            f"{v['cached_tokens_host']}), hook decisions {v['hook_decisions']}"
        )
        seen = next(r["seen"] for r in results if r["scenario"].startswith("hook x-tenant"))
        print(
            f"  every x-tenant probe run, warm-up included (prefix_len/host_hit/decisions: count): "
            f"class 1 {seen['1']}, "
            f"class 0 {seen['0']}; decision records for probes in the audit log: "
            f"{caller['probe_decision_records']}"
        )
    wall = time.perf_counter() - started
    leaks = [r["scenario"] for r in results if r["leak"]]
    print(
        f"\ncross-tenant leaks (CI excludes 0.5 and |AUC-0.5| > {LEAK_MARGIN}): "
        f"{', '.join(leaks) or 'none'}; "
        f"wall {wall:.0f} s; load avg {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    if args.out:
        doc = {
            "conditions": {
                "n_per_class": args.n,
                "warmup": args.warmup,
                "bootstrap": args.boot,
                "seed": args.seed,
                "core": args.core,
                "tokens": args.tokens,
                "pool": args.pool,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "load_avg_before": load_before,
                "load_avg_after": os.getloadavg(),
                "wall_s": wall,
                "method": "AUC = Mann-Whitney U/(n1*n0) on per-probe latency, exact; percentile bootstrap CI",
            },
            "results": results,
            "stages": stages,
            "caller_view": caller,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
