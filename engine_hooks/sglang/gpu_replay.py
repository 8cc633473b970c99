"""Replay driver of the hook's GPU check (``engine_hooks/sglang/gpu_check.sh``).

Against a running ``python -m sglang.launch_server ... --radix-cache-backend semgov`` (with
``--skip-tokenizer-init``: prompts are token ids), it replays paired cold/warm cohorts over HTTP
(``POST /generate`` with ``input_ids``, ``extra_key`` = a gateway context token,
``stream: true`` so the first chunk times TTFT), then reads the hook's audit log and checks it.

Layout (as ``tests/sglang_hook/scenario.py``, longer): donor ``[S][I][E][Q1]``, recipient
``[S][E][Q2]``. The recipient's exact-prefix match ends after ``S`` and ``E`` sits in the donor
``len(I)`` positions later, so semgov approves a *shifted* span over ``E`` that starts exactly
where the exact match ends: the reuse SGLang's contiguous prefix model can realize.

Cohorts, one pair per cohort and seed (every pair in namespaces of its own):

- ``allowed``: donor and recipient share tenant and namespace: the recipient must be realized
  (warm) from the donor's evidence KV.
- ``other_tenant``: the recipient is another tenant's: never a candidate, must stay cold.
- ``unrelated``: same scope, different evidence: decided and denied (token verification).
- ``no_context``: neither request carries a context token: exact-prefix reuse only.

Each pair's *cold* arm is the same recipient in a fresh scope with no donor; where the warm
arm's exact match covers ``S`` (every cohort but ``other_tenant``), a primer ``[S][Q1]`` runs
first in the cold scope so that the cold arm has the same exact prefix. The ratio reported is
warm TTFT / cold TTFT per pair (median per cohort).

Exit status: 0 invariants held and reuse happened; 1 invariant violated (a violation event in
the audit log, a realization where none is allowed, a failed request, or the server died);
2 bad arguments or server configuration; 3 invariants held but no allowed pair was realized.

``--dry-run`` needs no server and no GPU: it builds every request and context token, checks
the tokens verify and the bodies pass SGLang's own ``/generate`` JSON contract (when SGLang is
importable), and predicts each request's decisions with the hook's :class:`Governor` (the same
policy, provider and settings, without SGLang) to check the plan exercises what it claims.

This module is also the import path of the check's candidate provider
(``SEMGOV_PROVIDER=engine_hooks.sglang.gpu_replay:permissive_minhash``), so its top level
imports the standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}
COHORTS = ("allowed", "other_tenant", "unrelated", "no_context")
TENANT, OTHER_TENANT = "acme", "globex"
TOKEN_LO, TOKEN_HI = 100, 49_000  # inside the 49,152-token vocabulary, clear of special ids

EXIT_OK, EXIT_VIOLATED, EXIT_USAGE, EXIT_NOT_EXERCISED = 0, 1, 2, 3


def permissive_minhash(**kwargs: Any) -> Any:
    """``SEMGOV_PROVIDER`` factory for the check: MinHash proposing every donor of the scope.

    The default ``minhash`` provider drops candidates under 0.05 estimated Jaccard similarity, and
    the ``unrelated`` cohort's donor (same system prompt, other evidence) sits just under it: it
    would never reach the policy. With ``min_similarity=0`` every same-scope donor is proposed
    (best first), so the policy's deny path runs on the GPU too. Scope isolation is unchanged.
    """
    from engine_hooks.sglang.provider import MinHashProvider

    return MinHashProvider(min_similarity=0.0, **kwargs)


# ---- the plan ----------------------------------------------------------------------------------


@dataclass
class Request:
    rid: str
    cohort: str
    seed: int
    role: str  # warmup | primer | cold | donor | warm
    tokens: list[int]
    extra_key: str | None
    tenant: str | None
    namespace: str | None
    segments: list[tuple[str, int, int]] | None
    may_realize: bool  # False: a realization for this request is an invariant violation
    expect_realized: int = 0  # tokens expected to be realized (warm ``allowed`` only)
    settle: bool = False  # wait after it so that the hook registers it as a donor first


@dataclass
class Pair:
    cohort: str
    seed: int
    cold: str
    warm: str
    requests: list[Request] = field(default_factory=list)


def _block(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def _layout(parts: list[tuple[str, list[int]]]) -> tuple[list[int], list[tuple[str, int, int]]]:
    tokens: list[int] = []
    segs: list[tuple[str, int, int]] = []
    for role, toks in parts:
        segs.append((role, len(tokens), len(tokens) + len(toks)))
        tokens += toks
    return tokens, segs


def build_plan(
    key: bytes, run: str, seeds: Sequence[int], s_len: int, i_len: int, e_len: int, q_len: int
) -> tuple[list[Request], list[Pair]]:
    """The warm-up requests and every cohort's pairs, in the order they are sent."""
    from engine_hooks.sglang.context import make_context_token

    def token(tenant: str, namespace: str, segs: list[tuple[str, int, int]]) -> str:
        return make_context_token(
            key, tenant=tenant, namespace=namespace, task=TASK, response_contract=CONTRACT, segments=segs
        )

    # Warm-up (not measured, no context): a cold prompt, the same prompt with a new question (the
    # extend-after-a-long-cached-prefix path the warm arm takes) and a short one.
    rng = random.Random(f"{run}-warmup")
    n = s_len + e_len + q_len
    first = _block(rng, n)
    warmup = [
        Request(f"{run}-warmup-{i}", "warmup", -1, "warmup", toks, None, None, None, None, False)
        for i, toks in enumerate((first, first[: n - q_len] + _block(rng, q_len), _block(rng, 64)))
    ]
    pairs: list[Pair] = []
    for seed in seeds:
        for cohort in COHORTS:
            rng = random.Random(f"semgov-gpu-check-{seed}-{cohort}")
            system, instruction, evidence = _block(rng, s_len), _block(rng, i_len), _block(rng, e_len)
            q1, q2 = _block(rng, q_len), _block(rng, q_len)
            donor_toks, donor_segs = _layout(
                [("system", system), ("instruction", instruction), ("evidence", evidence), ("question", q1)]
            )
            if cohort == "unrelated":
                evidence = _block(rng, e_len)
            rcp_toks, rcp_segs = _layout([("system", system), ("evidence", evidence), ("question", q2)])
            primer_toks, primer_segs = _layout([("system", system), ("question", q1)])
            base = f"{run}-{cohort}-{seed}"
            ns, ns_cold = f"gc-{run}-{cohort}-{seed}", f"gc-{run}-{cohort}-{seed}-cold"
            rcp_tenant = OTHER_TENANT if cohort == "other_tenant" else TENANT
            reqs: list[Request] = []

            # Cold arm: the same recipient in a scope no donor ever reached.
            if cohort == "no_context":
                plain = f"gpu-check-plain-{base}-cold"  # not a context token: an isolated anonymous tree
                reqs.append(
                    Request(
                        f"{base}-primer", cohort, seed, "primer", primer_toks, plain, None, None, None, False
                    )
                )
                reqs.append(
                    Request(f"{base}-cold", cohort, seed, "cold", rcp_toks, plain, None, None, None, False)
                )
            else:
                if cohort != "other_tenant":  # the warm arm's exact match covers S: give cold the same
                    reqs.append(
                        Request(
                            f"{base}-primer",
                            cohort,
                            seed,
                            "primer",
                            primer_toks,
                            token(rcp_tenant, ns_cold, primer_segs),
                            rcp_tenant,
                            ns_cold,
                            primer_segs,
                            False,
                        )
                    )
                reqs.append(
                    Request(
                        f"{base}-cold",
                        cohort,
                        seed,
                        "cold",
                        rcp_toks,
                        token(rcp_tenant, ns_cold, rcp_segs),
                        rcp_tenant,
                        ns_cold,
                        rcp_segs,
                        False,
                    )
                )
            # The donor, then the warm arm.
            if cohort == "no_context":
                reqs.append(
                    Request(f"{base}-donor", cohort, seed, "donor", donor_toks, None, None, None, None, False)
                )
                reqs.append(
                    Request(f"{base}-warm", cohort, seed, "warm", rcp_toks, None, None, None, None, False)
                )
            else:
                reqs.append(
                    Request(
                        f"{base}-donor",
                        cohort,
                        seed,
                        "donor",
                        donor_toks,
                        token(TENANT, ns, donor_segs),
                        TENANT,
                        ns,
                        donor_segs,
                        False,
                        settle=True,
                    )
                )
                allowed = cohort == "allowed"
                reqs.append(
                    Request(
                        f"{base}-warm",
                        cohort,
                        seed,
                        "warm",
                        rcp_toks,
                        token(rcp_tenant, ns, rcp_segs),
                        rcp_tenant,
                        ns,
                        rcp_segs,
                        allowed,
                        expect_realized=e_len if allowed else 0,
                    )
                )
            for r in reqs:
                if r.role == "primer":
                    r.settle = True
            pairs.append(Pair(cohort, seed, f"{base}-cold", f"{base}-warm", reqs))
    return warmup, pairs


def body(req: Request, max_new_tokens: int) -> dict[str, Any]:
    """The ``/generate`` JSON body (GenerateReqInput, sglang/srt/managers/io_struct.py)."""
    out: dict[str, Any] = {
        "rid": req.rid,
        "input_ids": req.tokens,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    if req.extra_key is not None:
        out["extra_key"] = req.extra_key
    return out


# ---- HTTP ----------------------------------------------------------------------------------------


@dataclass
class Result:
    rid: str
    ok: bool
    ttft_ms: float | None = None
    total_ms: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    cached_device: int | None = None
    cached_host: int | None = None
    error: str | None = None


def _conn(host: str, port: int, timeout: float) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(host, port, timeout=timeout)


def get_json(host: str, port: int, path: str, timeout: float = 10.0) -> Any:
    c = _conn(host, port, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        c.close()


def alive(host: str, port: int, timeout: float = 30.0) -> bool:
    """``GET /health`` answers 200 (it runs a one-token generation when the server is idle)."""
    try:
        c = _conn(host, port, timeout)
        try:
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            return r.status == 200
        finally:
            c.close()
    except OSError:
        return False


def generate(host: str, port: int, payload: dict[str, Any], timeout: float) -> Result:
    """One streamed ``/generate``: TTFT = time to the first ``data:`` chunk with output."""
    rid = str(payload["rid"])
    raw = json.dumps(payload).encode()
    c = _conn(host, port, timeout)
    t0 = time.perf_counter()
    res = Result(rid, ok=False)
    try:
        c.request("POST", "/generate", body=raw, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res.error = f"HTTP {r.status}: {r.read()[:500]!r}"
            return res
        meta: dict[str, Any] = {}
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = f"stream error: {chunk['error']}"
                return res
            if res.ttft_ms is None and chunk.get("output_ids"):
                res.ttft_ms = (time.perf_counter() - t0) * 1e3
            res.output_tokens = max(res.output_tokens, len(chunk.get("output_ids") or []))
            meta = chunk.get("meta_info") or meta
        res.total_ms = (time.perf_counter() - t0) * 1e3
        res.output_tokens = int(meta.get("completion_tokens", res.output_tokens) or 0)
        res.cached_tokens = meta.get("cached_tokens")
        details = meta.get("cached_tokens_details") or {}
        res.cached_device, res.cached_host = details.get("device"), details.get("host")
        if res.ttft_ms is None:
            res.error = "no output token streamed"
            return res
        res.ok = True
        return res
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    finally:
        c.close()


# ---- the audit log -------------------------------------------------------------------------------


def _checkpoint_size(audit_dir: Path) -> int | None:
    from semgov.audit.store import read_checkpoint

    note = read_checkpoint(audit_dir)
    if note is None:
        return None
    lines = note.decode("utf-8", "replace").split("\n")
    try:
        return int(lines[1])
    except (IndexError, ValueError):
        return None


def read_audit(audit_dir: Path, wait_s: float) -> tuple[list[dict[str, Any]], str]:
    """Every record, once the writer has committed and checkpointed them (or ``wait_s`` passed)."""
    from semgov.audit.store import AuditLogError, iter_records

    deadline = time.monotonic() + wait_s
    records: list[dict[str, Any]] = []
    last = -1
    note = "log not settled"
    while True:
        try:
            records = [json.loads(r) for _, r in iter_records(audit_dir)]
            cp = _checkpoint_size(audit_dir)
            if len(records) == last and (cp or 0) == len(records):
                return records, f"{len(records)} records, checkpointed"
            last = len(records)
            note = f"{len(records)} records, latest checkpoint covers {cp}"
        except AuditLogError as e:  # a torn tail while the writer is mid-batch: read again
            note = f"log not readable yet: {e}"
        if time.monotonic() > deadline:
            return records, note + f" (gave up waiting after {wait_s:.0f}s)"
        time.sleep(1.0)


@dataclass
class AuditSummary:
    decisions: Counter[str]
    events: Counter[str]
    realized: dict[str, int]  # request id -> materialized tokens
    decided: dict[str, Counter[str]]  # request id -> allow/deny counts
    violations: list[dict[str, Any]]
    failed: list[dict[str, Any]]


def summarize_audit(records: list[dict[str, Any]]) -> AuditSummary:
    from semgov.models import DECISION_SCHEMA, ENGINE_EVENT_SCHEMA

    s = AuditSummary(Counter(), Counter(), {}, {}, [], [])
    for r in records:
        if r.get("schema") == DECISION_SCHEMA:
            s.decisions[str(r["decision"])] += 1
            s.decided.setdefault(str(r["request_id"]), Counter())[str(r["decision"])] += 1
        elif r.get("schema") == ENGINE_EVENT_SCHEMA:
            kind = str(r["kind"])
            s.events[kind] += 1
            if kind == "realization":
                rid = str(r.get("request_id"))
                s.realized[rid] = s.realized.get(rid, 0) + int(r.get("materialized_tokens") or 0)
            elif kind == "realization_failed":
                s.failed.append(r)
            elif kind in ("invariant_violation", "reuse_disabled"):
                s.violations.append(r)
    return s


# ---- report --------------------------------------------------------------------------------------


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def report(
    pairs: list[Pair], results: dict[str, Result], audit: AuditSummary
) -> tuple[list[str], list[dict[str, Any]]]:
    """Print the per-cohort table; return the invariant problems found and the table rows."""
    problems: list[str] = []
    rows = []
    print()
    print(
        f"{'cohort':<13} {'pairs':>5} {'cold ms':>8} {'warm ms':>8} {'warm/cold':>9} "
        f"{'realized':>8} {'host tok':>8} {'decided':>7} {'allow':>5} {'deny':>5}"
    )
    for cohort in COHORTS:
        ps = [p for p in pairs if p.cohort == cohort]
        cold = [results[p.cold].ttft_ms for p in ps if p.cold in results and results[p.cold].ok]
        warm = [results[p.warm].ttft_ms for p in ps if p.warm in results and results[p.warm].ok]
        ratios = [
            results[p.warm].ttft_ms / results[p.cold].ttft_ms  # type: ignore[operator]
            for p in ps
            if p.warm in results and p.cold in results and results[p.warm].ok and results[p.cold].ok
        ]
        realized = sum(1 for p in ps if audit.realized.get(p.warm, 0) > 0)
        hosts = [results[p.warm].cached_host or 0 for p in ps if p.warm in results]
        dec = Counter[str]()
        for p in ps:
            dec.update(audit.decided.get(p.warm, Counter()))
        decided = sum(1 for p in ps if p.warm in audit.decided)
        row: dict[str, Any] = {
            "cohort": cohort,
            "pairs": len(ps),
            "cold_ttft_ms_median": _median([x for x in cold if x is not None]),
            "warm_ttft_ms_median": _median([x for x in warm if x is not None]),
            "warm_over_cold_median": _median(ratios),
            "warm_realized": realized,
            "warm_host_tokens_median": _median([float(h) for h in hosts]),
            "warm_decided": decided,
            "warm_allow": dec["allow"],
            "warm_deny": dec["deny"],
        }
        rows.append(row)
        print(
            f"{cohort:<13} {len(ps):>5} {_fmt(row['cold_ttft_ms_median']):>8} "
            f"{_fmt(row['warm_ttft_ms_median']):>8} {_fmt(row['warm_over_cold_median'], '.3f'):>9} "
            f"{realized:>8} {_fmt(row['warm_host_tokens_median'], '.0f'):>8} {decided:>7} "
            f"{dec['allow']:>5} {dec['deny']:>5}"
        )
    print("(TTFT medians over pairs; warm/cold = median of per-pair ratios; realized = warm requests")
    print(" with a realization event; host tok = SGLang's cached_tokens_details.host of the warm request)")

    every = {r.rid: r for p in pairs for r in p.requests}
    for rid, n in sorted(audit.realized.items()):
        req = every.get(rid)
        if req is None:
            problems.append(f"realization for a request outside the replay plan: {rid}")
        elif not req.may_realize:
            what = "must stay cold" if req.cohort == "other_tenant" else "must not be realized"
            problems.append(f"{rid} ({req.cohort} {req.role}) {what} but got {n} realized tokens")
    not_sent = 0
    for p in pairs:
        for r in p.requests:
            res = results.get(r.rid)
            if res is None:
                not_sent += 1
            elif not res.ok:
                problems.append(f"request {r.rid} failed: {res.error}")
            elif r.expect_realized and audit.realized.get(r.rid) not in (None, r.expect_realized):
                print(f"note: {r.rid} realized {audit.realized[r.rid]} tokens, planned {r.expect_realized}")
            if (
                res is not None
                and res.ok
                and audit.realized.get(r.rid)
                and res.cached_host not in (None, audit.realized[r.rid])
            ):
                print(
                    f"note: {r.rid}: audit says {audit.realized[r.rid]} realized tokens, "
                    f"SGLang reports {res.cached_host} host-hit tokens"
                )
    if not_sent:
        problems.append(f"{not_sent} request(s) of the plan were never sent")
    for v in audit.violations:
        problems.append(f"{v['kind']} event: {v.get('detail')}")
    return problems, rows


# ---- dry run -------------------------------------------------------------------------------------


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _realizable(spans: list[dict[str, Any]], start: int, limit: int) -> int:
    """Tokens of the approved spans contiguous from ``start`` (the hook's plan, page size 1)."""
    by_start = sorted(spans, key=lambda s: int(s["recipient_start"]))
    p = start
    progressed = True
    while p < limit and progressed:
        progressed = False
        for s in by_start:
            rs, n = int(s["recipient_start"]), int(s["length"])
            if rs <= p < rs + n:
                p = min(rs + n, limit)
                progressed = True
                break
    return p - start


def _contract_check(bodies: list[dict[str, Any]]) -> str:
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except Exception as e:  # noqa: BLE001 - SGLang is optional for a dry run
        return f"skipped (SGLang's api_contract not importable: {type(e).__name__})"
    for b in bodies:
        err = generate_contract_error(b)
        if err is not None:
            raise SystemExit(f"dry run: SGLang's /generate contract refuses {b['rid']}: {err}")
    return f"{len(bodies)} bodies accepted by sglang.srt.entrypoints.api_contract.generate_contract_error"


def dry_run(args: argparse.Namespace, key: bytes, warmup: list[Request], pairs: list[Pair]) -> int:
    from engine_hooks.sglang.context import parse_context_token
    from engine_hooks.sglang.governor import DonorSpec, Governor
    from engine_hooks.sglang.settings import HookSettings
    from semgov.errors import SemgovError

    every = [r for p in pairs for r in p.requests]
    bodies = [body(r, args.max_new_tokens) for r in warmup + every]
    for r in every:
        if r.extra_key is None or r.tenant is None:
            continue
        parsed = parse_context_token(key, r.extra_key)
        assert (parsed.tenant, parsed.namespace) == (r.tenant, r.namespace), r.rid
        assert parsed.segments is not None and parsed.segments[-1][2] == len(r.tokens), r.rid
    print(f"dry run: {len(warmup)} warm-up + {len(every)} replay requests in {len(pairs)} pairs")
    print(f"dry run: context tokens verify with the context key ({sum(1 for r in every if r.tenant)} tokens)")
    print(f"dry run: request bodies: {_contract_check(bodies)}")
    sizes = Counter(len(json.dumps(b)) // 1024 for b in bodies)
    print(f"dry run: body sizes {min(sizes)}..{max(sizes)} KiB; sample (ids cut):")
    sample = dict(body(pairs[0].requests[-1], args.max_new_tokens))
    sample["input_ids"] = sample["input_ids"][:6] + ["..."]
    sample["extra_key"] = str(sample.get("extra_key", ""))[:48] + "..."
    print("  " + json.dumps(sample))

    # Predict what the hook decides, with the hook's own Governor (no SGLang).
    env = {k: v for k, v in os.environ.items() if k.startswith("SEMGOV_")}
    tmp = Path(tempfile.mkdtemp(prefix="semgov-gpu-dry-"))
    if "SEMGOV_POLICY" not in env:
        env.update(_scratch_env(tmp, key))
    env["SEMGOV_AUDIT_DIR"] = str(tmp / "audit")  # never the server's log
    env["SEMGOV_ASYNC_REGISTRATION"] = "0"
    env["SEMGOV_STRICT"] = "1"
    try:
        settings = HookSettings.from_env(env)
        gov = Governor(settings, engine_name="gpu-replay dry run", tokenizer_path=None)
    except SemgovError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"dry run: the hook refuses these settings: {e}")
        return EXIT_USAGE
    if gov.context_key != key:
        raise SystemExit("dry run: SEMGOV_CONTEXT_KEY differs from the key the tokens were minted with")
    print(
        f"dry run: predicting with policy {gov.policy_version} ({settings.policy}), "
        f"provider {settings.provider}, min_unmatched_tokens {settings.min_unmatched_tokens}"
    )
    trees: dict[str, list[list[int]]] = {}
    predicted: dict[str, tuple[Counter[str], int]] = {}
    problems: list[str] = []
    try:
        for r in every:
            ctx = gov.context_of(r.extra_key)
            tree = ctx.cache_key(gov.context_key) if ctx is not None else "anon:" + (r.extra_key or "")
            m = max((_lcp(r.tokens, t) for t in trees.get(tree, [])), default=0)
            limit = len(r.tokens) - 1
            dec: Counter[str] = Counter()
            k = 0
            if ctx is not None and limit - m >= settings.min_unmatched_tokens:
                gov.drain_donors()
                cands = gov.candidates(ctx, r.tokens, None)
                if cands:
                    for d in gov.decide(r.rid, ctx, r.tokens, None, cands):
                        dec[d.decision] += 1
                        if d.decision == "allow":
                            k = max(k, _realizable(d.approved_spans, m, limit))
            predicted[r.rid] = (dec, k)
            if k and not r.may_realize:
                problems.append(f"{r.rid} would be realized ({k} tokens) but must not be")
            if r.expect_realized and k != r.expect_realized:
                problems.append(f"{r.rid} would realize {k} tokens, planned {r.expect_realized}")
            if k == 0:
                trees.setdefault(tree, []).append(r.tokens)  # a realized recipient skips the tree
                if ctx is not None:
                    gov.submit_donor(
                        DonorSpec(r.rid, ctx, ctx.cache_key(gov.context_key), tuple(r.tokens), None)
                    )
    finally:
        gov.close()
        shutil.rmtree(tmp, ignore_errors=True)
    head = ("cohort", "role", "requests", "decided", "allow", "deny", "realized")
    print("\n{:<13} {:<6} {:>8} {:>7} {:>5} {:>5} {:>8}".format(*head))
    for cohort in COHORTS:
        for role in ("primer", "cold", "donor", "warm"):
            rs = [r for r in every if r.cohort == cohort and r.role == role]
            if not rs:
                continue
            dec = Counter[str]()
            for r in rs:
                dec.update(predicted[r.rid][0])
            decided = sum(1 for r in rs if predicted[r.rid][0])
            realized = sum(1 for r in rs if predicted[r.rid][1])
            cells = (cohort, role, len(rs), decided, dec["allow"], dec["deny"], realized)
            print("{:<13} {:<6} {:>8} {:>7} {:>5} {:>5} {:>8}".format(*cells))
    want = {
        "allowed": (True, True),
        "other_tenant": (False, False),
        "unrelated": (True, False),
        "no_context": (False, False),
    }
    for cohort, (decided_expected, realized_expected) in want.items():
        for p in pairs:
            if p.cohort != cohort:
                continue
            dec, k = predicted[p.warm]
            if bool(dec) != decided_expected or bool(k) != realized_expected:
                problems.append(f"{p.warm}: predicted decisions {dict(dec)}, {k} realized tokens")
    if problems:
        print("\ndry run: the plan does not exercise what it claims:")
        for pr in problems:
            print(f"  - {pr}")
        return EXIT_USAGE
    print(
        "\ndry run: OK (allowed pairs realize the evidence; other-tenant, unrelated and no-context stay cold)"
    )
    return EXIT_OK


def _scratch_env(tmp: Path, key: bytes) -> dict[str, str]:
    """SEMGOV_* settings on scratch keys (a dry run outside gpu_check.sh)."""
    from semgov.keys import generate_keypair, key_id_for, load_public_key

    priv, pub = generate_keypair(tmp / "keys")
    trust = tmp / "keyring.json"
    trust.write_text(
        json.dumps({"keys": [{"key_id": key_id_for(load_public_key(pub)), "public_key": pub.read_text()}]})
    )
    ck = tmp / "context.key"
    ck.write_bytes(key)
    return {
        "SEMGOV_POLICY": str(Path(__file__).resolve().parent / "gpu_model" / "policy"),
        "SEMGOV_TRUST": str(trust),
        "SEMGOV_SIGNING_KEY": str(priv),
        "SEMGOV_CONTEXT_KEY": str(ck),
        "SEMGOV_PROVIDER": "engine_hooks.sglang.gpu_replay:permissive_minhash",
        "SEMGOV_DETOKENIZER": "none",
    }


# ---- live run ------------------------------------------------------------------------------------


def live_run(args: argparse.Namespace, warmup: list[Request], pairs: list[Pair]) -> int:
    host, port = args.host, args.port
    try:
        info = get_json(host, port, "/server_info")
    except (OSError, RuntimeError, ValueError) as e:
        print(f"cannot read /server_info: {e}")
        return EXIT_VIOLATED
    cfg = {k: info.get(k) for k in ("radix_cache_backend", "page_size", "tp_size", "skip_tokenizer_init")}
    print(f"server: sglang {info.get('version')}, {cfg}")
    if cfg["radix_cache_backend"] != "semgov" or cfg["skip_tokenizer_init"] is not True:
        print("server is not running --radix-cache-backend semgov with --skip-tokenizer-init")
        return EXIT_USAGE

    results: dict[str, Result] = {}
    for r in warmup:
        res = generate(host, port, body(r, args.max_new_tokens), args.request_timeout)
        if not res.ok:
            print(f"warm-up request failed: {res.error}")
            return EXIT_VIOLATED
    t_start = time.perf_counter()
    dead = False
    for i, p in enumerate(pairs):
        for r in p.requests:
            res = generate(host, port, body(r, args.max_new_tokens), args.request_timeout)
            results[r.rid] = res
            if not res.ok:
                print(f"request {r.rid} failed: {res.error}")
                if not alive(host, port):
                    dead = True
                    break
            if r.settle:
                time.sleep(args.settle)  # the hook registers donors on a background thread
        if dead:
            break
        if (i + 1) % len(COHORTS) == 0:
            print(f"  seed {p.seed}: {i + 1}/{len(pairs)} pairs, {time.perf_counter() - t_start:.1f}s")
    audit_dir = Path(args.audit_dir)
    # A dead server's log writer is gone: read what it left without waiting long.
    records, note = read_audit(audit_dir, min(args.audit_wait, 5.0) if dead else args.audit_wait)
    print(f"audit log {audit_dir}: {note}")
    audit = summarize_audit(records)
    problems, rows = report(pairs, results, audit)
    if not dead and not alive(host, port):
        dead = True  # e.g. SGLang's idle leak check raised while the log settled
    if dead:
        problems.append("the server died (see its log)")
    print(
        f"\naudit: decisions allow={audit.decisions['allow']} deny={audit.decisions['deny']}; "
        f"engine events: realization={audit.events['realization']} "
        f"realization_failed={audit.events['realization_failed']} "
        f"invariant_violation={audit.events['invariant_violation']} "
        f"reuse_disabled={audit.events['reuse_disabled']}"
    )
    for f in audit.failed[:10]:
        print(f"  realization_failed {f.get('request_id')}: {f.get('detail')}")
    allowed = next(r for r in rows if r["cohort"] == "allowed")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "audit": {
                        "decisions": dict(audit.decisions),
                        "events": dict(audit.events),
                        "violations": audit.violations,
                        "realization_failed": audit.failed,
                    },
                    "problems": problems,
                    "requests": [asdict(res) for res in results.values()],
                },
                indent=2,
            )
        )
        print(f"results: {args.out}")
    if problems:
        print("\ninvariant problems:")
        for pr in problems:
            print(f"  - {pr}")
        return EXIT_VIOLATED
    if allowed["warm_realized"] == 0:
        print("\nno allowed pair was realized: semantic reuse was not exercised")
        return EXIT_NOT_EXERCISED
    if allowed["warm_realized"] < allowed["pairs"]:
        print(f"\nnote: only {allowed['warm_realized']}/{allowed['pairs']} allowed pairs were realized")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Replay paired cold/warm cohorts against an SGLang server running the semgov "
        "radix-cache backend, then check its audit log (engine_hooks/sglang/gpu_check.sh).",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument(
        "--context-key",
        type=Path,
        default=None,
        help="the gateway HMAC key file (default: $SEMGOV_CONTEXT_KEY; a dry run makes one up)",
    )
    ap.add_argument(
        "--audit-dir", default=os.environ.get("SEMGOV_AUDIT_DIR"), help="default: $SEMGOV_AUDIT_DIR"
    )
    ap.add_argument("--seeds", type=int, default=6, help="pairs per cohort (default 6)")
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--instruction-tokens", type=int, default=64)
    ap.add_argument("--evidence-tokens", type=int, default=3000)
    ap.add_argument("--question-tokens", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds after each donor (async registration)")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--audit-wait", type=float, default=30.0, help="seconds to wait for the log to settle")
    ap.add_argument("--run-id", default=None, help="prefix of request ids and namespaces (default: random)")
    ap.add_argument("--out", default=None, help="write per-request results and the summary as JSON")
    ap.add_argument("--dry-run", action="store_true", help="build and check everything without a server")
    args = ap.parse_args(argv)
    if args.seeds < 1 or min(args.system_tokens, args.evidence_tokens, args.question_tokens) < 1:
        ap.error("--seeds and the segment lengths must be positive")

    from engine_hooks.sglang.settings import HookConfigError, read_context_key

    key_path = args.context_key or (
        Path(os.environ["SEMGOV_CONTEXT_KEY"]) if os.environ.get("SEMGOV_CONTEXT_KEY") else None
    )
    try:
        key = read_context_key(key_path) if key_path is not None else None
    except HookConfigError as e:
        ap.error(str(e))
    if key is None:
        if not args.dry_run:
            ap.error("--context-key or SEMGOV_CONTEXT_KEY is required (the server's gateway key)")
        key = secrets.token_hex(32).encode()  # text, like a key file: whitespace-stripping keeps it whole
    run = args.run_id or secrets.token_hex(3)
    warmup, pairs = build_plan(
        key,
        run,
        range(args.seeds),
        args.system_tokens,
        args.instruction_tokens,
        args.evidence_tokens,
        args.question_tokens,
    )
    if args.dry_run:
        return dry_run(args, key, warmup, pairs)
    if not args.audit_dir:
        ap.error("--audit-dir or SEMGOV_AUDIT_DIR is required")
    return live_run(args, warmup, pairs)


if __name__ == "__main__":
    sys.exit(main())
